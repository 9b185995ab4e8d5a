"""Reading a profile file and checking its values (artifact.experiments.settings.load_profile): each value
converted to its field's type (int -> float, list -> tuple), then ranges (RANGES) and choices, every error
naming the key, the file or override it came from, the value and what is expected."""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Union

import yaml

from artifact.errors import ProfileError, SettingError, SpecError
from artifact.model.decode import MAX_BATCH
from artifact.model.tasks import TASKS
from artifact.offload.policy.policies import check_policy
from artifact.offload.policy.policy_modules import load_policy_modules
from artifact.validate import check_number, load_yaml

__all__ = ["DEFAULTS_ORIGIN", "RANGES", "check_value", "check_values", "describe", "read_profile", "suggest"]

DEFAULTS_ORIGIN = "defaults (artifact/experiments/settings.py)"

# Ranges of the numeric settings (check_number's keywords), applied to each element of a list setting.
# Every int or float field is listed here or is a run key (settings.RUN_KEYS, checked by RunSpec.check and
# DecodeConfig; a test checks it), so NaN, inf and out-of-range values of a new setting cannot slip through.
_GT0 = {"low": 0, "low_open": True}
_GE0 = {"low": 0}
_BATCH = {"low": 1, "high": MAX_BATCH, "integer": True}
_THREADS = {"low": 1, "high": 1024, "integer": True}  # more only fails later, spawning the threads
RANGES: dict[str, dict] = {
    "torch_threads": _THREADS,
    "n_prompts": _GT0,
    "seed": _GE0,
    "max_prompt_tokens": _GT0,
    "batch_sizes": _BATCH,
    "cache_ratios": _GT0,
    "bandwidth_scales": _GT0,
    "repetitions": _GT0,
    "warmup": _GE0,
    "rotation": _GE0,
    "trace_capacity": _GT0,
    "budget_minutes": _GT0,
    "throttle_scales": _GT0,
    "throttle_ratio": _GT0,
    "trace_n_prompts": _GT0,
    "trace_batch_sizes": _BATCH,
}


def read_profile(path: Path) -> dict:
    """A profile file's mapping of key: value ({} for an empty file), or a ProfileError naming the file."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile is a mapping of key: value, got {type(data).__name__}")
    return data


def suggest(key: str, keys: typing.Sequence[str]) -> str:
    """' (did you mean ...?)' with the closest of `keys`, or ''."""
    close = difflib.get_close_matches(str(key), keys, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def describe(tp) -> str:
    """A field's type in words, for an error message."""
    if tp is str:
        return "a string"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is bool:
        return "true or false"
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args if a is not type(None)) + " or null"
    if typing.get_origin(tp) is tuple:
        inner = describe(args[0]).replace("a string", "strings").replace("an integer", "integers")
        return "a non-empty list of " + inner.replace("a number", "numbers")
    return str(tp)


def check_value(key: str, value, tp, src: str):
    """The value converted to the field's type (int -> float, list -> tuple), or a ProfileError."""

    def bad():
        return ProfileError(f"{src}: {key} must be {describe(tp)}, got {value!r} ({type(value).__name__})")

    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType):
        if value is None:
            return None
        inner = next(a for a in args if a is not type(None))
        try:
            return check_value(key, value, inner, src)
        except ProfileError:
            raise bad() from None
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, list) or not value:
            raise bad()
        out = []
        for v in value:
            try:
                out.append(check_value(key, v, args[0], src))
            except ProfileError:
                raise bad() from None
        if len(set(out)) != len(out):
            raise ProfileError(f"{src}: {key} lists a value twice: {value!r}")
        return tuple(out)
    if tp is bool and isinstance(value, bool):
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    raise bad()


def check_values(P, origin: dict) -> None:
    """Ranges and choices of P (the Settings being loaded; this module sits under settings.py, so untyped),
    each error naming the key, the file it came from (origin: key -> file or 'overrides') and the valid
    values."""

    def src(key):
        return origin.get(key, DEFAULTS_ORIGIN)

    def fail(key, msg):
        raise ProfileError(f"{src(key)}: {key} {msg}")

    _check_ranges(P, src)

    def choices(key, values, valid):
        for v in values:
            if v not in valid:
                fail(key, f"has unknown value {v!r}; choose from {list(valid)}")

    choices("tasks", P.tasks, TASKS)
    choices("trace_tasks", P.trace_tasks, TASKS)
    try:  # before the policy names: a module may define them
        load_policy_modules(P.policy_modules, f"{src('policy_modules')}: policy_modules")
    except SettingError as e:
        raise ProfileError(str(e)) from None
    for spec in P.sim_policies:
        try:
            check_policy(spec, engine=False)
        except SettingError as e:
            fail("sim_policies", f"has {spec!r}: {e}")
    # The run keys: the profile's RunSpec, checked by the one validator (RunSpec.check), once per engine
    # policy and per bandwidth scale; a SpecError names the field, here the key and the file it came from.
    runs = [("policies", {"policy": p}) for p in P.policies]
    runs += [
        (k, {"bandwidth_scale": x}) for k in ("bandwidth_scales", "throttle_scales") for x in getattr(P, k)
    ]
    for key, changes in runs:
        try:
            P.run_spec(**changes)
        except SpecError as e:
            name = key if e.field in ("policy", "bandwidth_scale") else e.field
            if e.field == "policy":  # as sim_policies': the value that failed, then why
                said = f"{name} has {changes['policy']!r}: {e}"
            else:
                said = str(e) if str(e).startswith(name) else f"{name}: {e}"
            raise ProfileError(f"{src(name)}: {said}") from None
    _check_together(P, fail)


def _check_ranges(P, src) -> None:
    """Every RANGES key's value (each element of a list) in its range; null where the field allows it."""
    hints = typing.get_type_hints(type(P))
    for key, rng in RANGES.items():
        value = getattr(P, key)
        nullable = type(None) in typing.get_args(hints[key])
        for v in value if isinstance(value, tuple) else (value,):
            if v is None and nullable:
                continue
            try:
                check_number(key, v, **rng)
            except SettingError as e:
                msg = str(e)
                if rng is _BATCH:
                    msg = f"{key} must be in 1-{MAX_BATCH} (the decoder's batch sizes), got {v!r}"
                elif nullable:
                    msg = msg.replace(", got", " or null, got", 1)
                raise ProfileError(f"{src(key)}: {msg}") from None


def _check_together(P, fail) -> None:
    """The settings that constrain each other beyond one run's (RunSpec.check): enough prompts to fill the
    largest batch."""
    if P.n_prompts < max(P.batch_sizes):
        fail(
            "n_prompts",
            f"= {P.n_prompts} cannot fill a batch of {max(P.batch_sizes)} (batch_sizes); "
            f"give at least {max(P.batch_sizes)}",
        )
    if P.trace_n_prompts < max(P.trace_batch_sizes):
        fail(
            "trace_n_prompts",
            f"= {P.trace_n_prompts} cannot fill a batch of {max(P.trace_batch_sizes)} "
            f"(trace_batch_sizes); give at least {max(P.trace_batch_sizes)}",
        )
