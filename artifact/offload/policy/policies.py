"""Cache policies: the registry of prefetch policies, their specs, and the one factory.

A policy decides who to evict, who to keep when a demand outgrows the cache, and what to prefetch. Its
interface (`Policy`, `Prediction`, `TraceFuture`) is prefetch_base.py, the registered policies (demand,
last_step, last_step_conservative, cross_layer, oracle, interval_refresh, belady) are prefetch.py, and
eviction policies are eviction.py. A policy of your own imports `Policy`, `Prediction` and `register` from
here.

The registry is built from the classes: `@register` reads the class attributes (name, needs_trace,
engine_ok, needs_prediction, summary) and takes the options from the constructor's keyword parameters.
`make_policy` is the one factory; it reads a policy spec `name[:key=value,...]` (e.g.
`last_step:lookahead=2`) and rejects unknown options by name. A spec may add an eviction policy after a
'+' (`last_step+token_lru`, eviction.py); without one, eviction is LRU. See docs/policies.md.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from artifact.errors import SettingError
from artifact.offload.policy.eviction import EVICTIONS, LRU, Eviction
from artifact.offload.policy.prefetch import BUILT_IN
from artifact.offload.policy.prefetch_base import Policy, TraceFuture
from artifact.offload.policy.prefetch_base import Prediction as Prediction  # what a user's policy returns

# ---------------------------------------------------------------------------------------------
# The registry and the one factory
# ---------------------------------------------------------------------------------------------
POLICIES: dict[str, type[Policy]] = {}
_POSITIONAL = ("self", "num_layers", "num_experts", "future")


def options_of(cls: type[Policy]) -> dict[str, Any]:
    """A policy's options: its constructor's keyword parameters and their defaults."""
    return {
        p.name: p.default
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name not in _POSITIONAL and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: add a Policy subclass to POLICIES under its `name`. Every constructor parameter
    after (num_layers, num_experts[, future]) is an option and needs a default."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)) or cls is Policy:
        raise TypeError(f"{cls!r} is not a Policy subclass")
    if not cls.name:
        raise TypeError(f"policy class {cls.__qualname__} has no name (set the class attribute `name`)")
    params = inspect.signature(cls.__init__).parameters.values()
    bad = [
        p.name
        for p in params
        if p.name not in _POSITIONAL
        and p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if bad:
        raise TypeError(
            f"policy {cls.name!r}: options {bad} need defaults (they are keyword options of the spec)"
        )
    if cls.needs_trace != ("future" in inspect.signature(cls.__init__).parameters):
        raise TypeError(
            f"policy {cls.name!r}: needs_trace={cls.needs_trace} but its constructor "
            f"{'lacks' if cls.needs_trace else 'takes'} a `future` parameter"
        )
    old = POLICIES.get(cls.name)
    files = (
        [getattr(sys.modules.get(c.__module__), "__file__", c.__module__) for c in (old, cls)] if old else []
    )
    if files and files[0] != files[1]:  # a class of the same file (a module imported twice) replaces
        raise TypeError(
            f"policy name {cls.name!r} is taken by {old.__module__}.{old.__qualname__} ({files[0]}); "
            f"give {cls.__qualname__} another name"
        )
    POLICIES[cls.name] = cls
    return cls


for _cls in BUILT_IN:
    register(_cls)


def _coerce(name: str, option: str, raw: str, default: Any):
    """A spec option's text as the type of its default."""
    try:
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes"):
                return True
            if raw.lower() in ("0", "false", "no"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise SettingError(
            f"policy {name!r}: option {option}={raw!r} is not a {type(default).__name__}"
        ) from None
    return raw


# Names the simulator replays that are bounds, not policies (sim.BOUNDS): refused here with their reason.
SIMULATOR_BOUNDS = ("min",)


def _options(kind: str, cls, spec: str, rest: str) -> dict[str, Any]:
    """The `key=value,...` text after a name's ':' as options, each checked against the class."""
    valid = options_of(cls)
    options = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if not eq or not key:
            raise SettingError(f"policy spec {spec!r}: expected key=value after ':', got {item!r}")
        if key not in valid:
            raise SettingError(
                f"{kind} {cls.name!r} has no option {key!r}; its options: "
                f"{', '.join(f'{k}={v!r}' for k, v in valid.items()) or 'none'}"
            )
        options[key] = _coerce(cls.name, key, raw, valid[key])
    return options


def split_spec(spec: str) -> tuple[str, str | None]:
    """'prefetch[:opts][+eviction[:opts]]' -> (prefetch part, eviction part or None)."""
    head, plus, tail = spec.partition("+")
    if plus and ("+" in tail or not tail.strip() or not head.strip()):
        raise SettingError(
            f"policy spec {spec!r}: expected 'prefetch[:opts]+eviction[:opts]' (one '+', "
            "a name on each side), e.g. 'last_step+token_lru'"
        )
    return head, (tail if plus else None)


def parse_eviction(text: str, spec: str | None = None) -> tuple[type[Eviction], dict[str, Any]]:
    """`name[:key=value,...]` of an eviction policy -> (class, options)."""
    name, _, rest = text.strip().partition(":")
    cls = EVICTIONS.get(name.strip())
    if cls is None:
        raise SettingError(
            f"unknown eviction policy {name.strip()!r} in {spec or text!r}; choose one of {sorted(EVICTIONS)}"
        )
    return cls, _options("eviction", cls, spec or text, rest)


def parse_spec(spec: str) -> tuple[type[Policy], dict[str, Any], type[Eviction], dict[str, Any]]:
    """`prefetch[:key=value,...][+eviction[:key=value,...]]` -> (policy class, options, eviction class,
    options); the eviction is LRU when none is named. Every name and option is checked."""
    if not isinstance(spec, str) or not spec.strip():
        raise SettingError(
            f"a policy spec is 'name[:key=value,...][+eviction[:key=value,...]]', got {spec!r}"
        )
    head, tail = split_spec(spec.strip())
    name, _, rest = head.strip().partition(":")
    cls = POLICIES.get(name.strip())
    if cls is None and name.strip() in SIMULATOR_BOUNDS:
        raise SettingError(
            f"{name.strip()!r} is a bound (bounds.relaxed_min, the demand-paging floor), "
            "not a cache policy: the engine, the bench and a profile's policy lists do not take it; "
            "the simulator replays it (python -m artifact simulate --policies demand,belady,min; "
            "notebook 02 adds it)"
        )
    if cls is None and name.strip() in EVICTIONS:
        raise SettingError(
            f"{name.strip()!r} is an eviction policy, not a prefetch policy: combine it with one, "
            f"e.g. 'demand+{head.strip()}' (LRU's place in the demand policy)"
        )
    if cls is None:
        raise SettingError(
            f"unknown policy {name.strip()!r}; choose one of {sorted(POLICIES)} (a policy of your own: "
            "name its module with --policy-module or the profile key policy_modules)"
        )
    options = _options("policy", cls, spec, rest)
    if tail is None:
        return cls, options, LRU, {}
    if cls.owns_eviction:
        raise SettingError(
            f"policy {cls.name!r} decides eviction itself; it takes no '+eviction' (got {spec!r})"
        )
    ev, ev_options = parse_eviction(tail, spec)
    return cls, options, ev, ev_options


def parse_policy(spec: str) -> tuple[type[Policy], dict[str, Any]]:
    """A spec -> (prefetch policy class, its options); the `+eviction` part, if any, is checked too."""
    cls, options, _, _ = parse_spec(spec)
    return cls, options


def split_policies(text: str) -> list[str]:
    """A comma-separated list of policy specs, where a spec's own options also use commas:
    'demand,last_step:lookahead=2,conservative=true,oracle' -> 3 specs (a piece with '=' and no ':'
    continues the spec before it)."""
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and ":" not in piece and out:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def check_policy(spec: str, engine: bool = False) -> type[Policy]:
    """Validate a policy spec without building it (for checking arguments before a model loads)."""
    cls, _ = parse_policy(spec)
    if engine and not cls.engine_ok:
        raise SettingError(
            f"policy {cls.name!r} needs the whole future and runs in the simulator only "
            "(python -m artifact simulate); the engine takes 'oracle' for future knowledge"
        )
    return cls


def make_policy(
    spec: str,
    num_layers: int,
    num_experts: int,
    future: TraceFuture | None = None,
    engine: bool = False,
    **settings,
) -> Policy:
    """The one factory. `spec` is a policy name with optional options, `name[:key=value,...]`, and
    optionally an eviction policy after a '+' (`last_step+token_lru`, `demand+lrfu:lam=0.25`; eviction.py;
    LRU without one); an option the policy does not take is an error naming the policy's valid options.
    `settings` are run-wide values (e.g. lookahead=, tau= from the command line or a profile) given to every
    policy that takes an option of that name; a setting no registered policy takes is an error. Spec
    options win."""
    cls, options, ev_cls, ev_options = parse_spec(spec)
    check_policy(spec, engine)
    known = {k for c in POLICIES.values() for k in options_of(c)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise SettingError(f"no policy takes the option(s) {unknown}; policy options are {sorted(known)}")
    valid = options_of(cls)
    kwargs = {k: v for k, v in settings.items() if k in valid}
    kwargs.update(options)
    if cls.needs_trace:
        if future is None:
            raise SettingError(
                f"policy {cls.name!r} needs a trace of an identical earlier run (--oracle-trace FILE)"
            )
        kwargs["future"] = future
    policy = cls(num_layers, num_experts, **kwargs)
    if ev_cls is not LRU or ev_options:
        policy.eviction = ev_cls(num_layers, num_experts, **ev_options)
    return policy


def describe_evictions() -> list[dict]:
    """One row per registered eviction policy (name, options, summary)."""
    return [{"name": n, "options": options_of(c), "summary": c.summary} for n, c in EVICTIONS.items()]


def describe() -> list[dict]:
    """One row per registered policy (name, options, flags, summary), for help texts and docs."""
    return [
        {
            "name": n,
            "options": options_of(c),
            "needs_trace": c.needs_trace,
            "engine_ok": c.engine_ok,
            "needs_prediction": c.needs_prediction,
            "summary": c.summary,
        }
        for n, c in POLICIES.items()
    ]
