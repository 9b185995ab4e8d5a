"""Profiles: one YAML of literal values per setting (cpu, a5000, h200), over a shared base.yaml.

    profile = load_profile("cpu")                   # or a path: load_profile("my.yaml")
    profile = load_profile("h200", {"model": "/ckpt/LLaDA2.0-mini"})

A profile file holds only the keys it changes; base.yaml (documented key by key) supplies the rest,
and a user's profile given as a path is layered over the same base. Loading validates every key and
value: an unknown key, a wrong type or an out-of-range value names the file, the key and what would
be right.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
BASE = PROFILE_DIR / "base.yaml"


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class SlurmSettings:
    """The `slurm:` section of a profile: what each job of a --submit slurm array asks for.
    A profile (or --set slurm.KEY=VALUE) changes single keys; the others keep base.yaml's values."""
    partition: str | None = None        # None: the cluster's default partition
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None       # a node feature, e.g. a GPU type
    time_minutes: int = 240             # wall-clock limit of one job (one shard, or one trace)
    gpus_per_task: int = 1              # 0 for a CPU profile
    cpus_per_task: int = 4
    mem_gb: float | None = None         # None: the partition's default
    array_parallelism: int | None = None   # at most this many array tasks at once (None: all)
    setup: tuple[str, ...] = ()         # shell lines each job runs first, e.g. "module load cuda/12.4"


SLURM_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SlurmSettings))


@dataclass(frozen=True)
class Profile:
    """Validated values of one profile (lists become tuples). base.yaml documents each key."""
    name: str = field(metadata={"internal": True})
    path: str = field(metadata={"internal": True})
    description: str
    # model and machine
    model: str | None
    dtype: str | None
    device: str
    link: str
    latency_us: float
    link_gbps: float | None
    torch_threads: int | None
    # decoding
    mode: str
    gen_length: int
    steps: int
    threshold: float
    # prompts
    tasks: tuple[str, ...]
    n_prompts: int
    seed: int
    max_prompt_tokens: int | None
    # the benchmark grid: cells (task, batch size, C/W, bandwidth scale) x policies x repetitions
    batch_sizes: tuple[int, ...]
    cache_ratios: tuple[float, ...]
    bandwidth_scales: tuple[float, ...]
    policies: tuple[str, ...]
    repetitions: int
    warmup: int
    lookahead: int
    tau: int
    trace_capacity: int | None
    budget_minutes: float | None
    # bandwidth throttling (notebook 03): one C/W, the link's bandwidth times each scale
    throttle_scales: tuple[float, ...]
    throttle_ratio: float
    # traces and the simulator (notebooks)
    trace_tasks: tuple[str, ...]
    trace_n_prompts: int
    trace_batch_sizes: tuple[int, ...]
    sim_policies: tuple[str, ...]
    # TIDE head to head
    tide_path: str | None
    # jobs on a Slurm cluster (python -m artifact bench --submit slurm): a nested mapping, see SlurmSettings
    slurm: SlurmSettings

    def as_dict(self) -> dict:
        """Plain values (lists, not tuples), e.g. for papermill parameters or JSON."""
        d = dataclasses.asdict(self)
        d["slurm"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["slurm"].items()}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def decode_config(self):
        from artifact.model.decode import DecodeConfig
        return DecodeConfig(gen_length=self.gen_length, steps=self.steps, threshold=self.threshold, mode=self.mode)

    @property
    def torch_dtype(self) -> str:
        """dtype, with null resolved: float32 for the tiny model, bfloat16 for a real checkpoint."""
        return self.dtype or ("float32" if self.model == "tiny" else "bfloat16")


PROFILE_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Profile) if not f.metadata.get("internal"))
_TYPES = typing.get_type_hints(Profile)


def list_profiles() -> list[str]:
    """Names of the bundled profiles (base.yaml is not one: it is their shared defaults)."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml") if p.name != BASE.name)


def profile_path(name_or_path: str | Path) -> Path:
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml")) or "/" in s or "\\" in s:
        path = Path(s)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: profile file not found")
        return path
    path = PROFILE_DIR / f"{s}.yaml"
    if s == BASE.stem or not path.is_file():
        raise ProfileError(f"unknown profile {s!r}; choose one of {list_profiles()} or give a path to a .yaml file")
    return path


def load_profile(name_or_path: str | Path, overrides: dict | None = None) -> Profile:
    """base.yaml, then the profile's file, then `overrides` (e.g. from the command line), validated."""
    path = profile_path(name_or_path)
    values: dict = {}
    origin: dict = {}
    for src, data in ((str(BASE), _read(BASE)), (str(path), _read(path)), ("overrides", dict(overrides or {}))):
        for k, v in data.items():
            if str(k).partition(".")[0] == "slurm":        # a nested section: merged key by key
                values["slurm"] = _merge_slurm(values.get("slurm"), k, v, src)
                origin["slurm"] = src
                continue
            if k not in PROFILE_KEYS:
                raise ProfileError(f"{src}: unknown key {k!r}{_suggest(k)}; valid keys: {', '.join(PROFILE_KEYS)}")
            values[k], origin[k] = v, src
    missing = [k for k in PROFILE_KEYS if k not in values]
    if missing:
        raise ProfileError(f"{path}: missing keys {missing} (base.yaml should define every key)")
    checked = {k: _check(k, values[k], _TYPES[k], origin[k]) for k in PROFILE_KEYS}
    profile = Profile(name=path.stem, path=str(path), **checked)
    _check_values(profile, origin)
    return profile


def parse_override(text: str) -> tuple[str, object]:
    """'key=value' with a YAML value (so 'cache_ratios=[1.0, 1.73]' and 'model=null' work)."""
    import yaml
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ProfileError(f"expected KEY=VALUE, got {text!r}")
    head, dot, sub = key.partition(".")
    if dot and head == "slurm":
        if sub not in SLURM_KEYS:
            raise ProfileError(f"unknown key {key!r}{_suggest(sub, SLURM_KEYS)}; slurm keys: {', '.join(SLURM_KEYS)}")
    elif key not in PROFILE_KEYS:
        raise ProfileError(f"unknown key {key!r}{_suggest(key)}; valid keys: {', '.join(PROFILE_KEYS)}")
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ProfileError(f"{key}: value {raw!r} is not YAML: {e}") from None


def fingerprint(profile: Profile, keys: typing.Iterable[str]) -> str:
    """A short hash of some of a profile's values (which settings made a result file)."""
    import hashlib
    blob = json.dumps({k: getattr(profile, k) for k in sorted(keys)}, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Reading and checking
# ---------------------------------------------------------------------------------------------
def _read(path: Path) -> dict:
    import yaml
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile is a mapping of key: value, got {type(data).__name__}")
    return data


def _suggest(key: str, keys: typing.Sequence[str] = PROFILE_KEYS) -> str:
    close = difflib.get_close_matches(str(key), keys, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _describe(tp) -> str:
    if tp is str:
        return "a string"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None)) + " or null"
    if typing.get_origin(tp) is tuple:
        inner = _describe(args[0]).replace("a string", "strings").replace("an integer", "integers")
        return "a non-empty list of " + inner.replace("a number", "numbers")
    return str(tp)


def _check(key: str, value, tp, src: str):
    """The value converted to the field's type (int -> float, list -> tuple), or a ProfileError."""
    def bad():
        return ProfileError(f"{src}: {key} must be {_describe(tp)}, got {value!r} ({type(value).__name__})")

    if tp is SlurmSettings:
        return _check_slurm(value, src)
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType):
        if value is None:
            return None
        inner = next(a for a in args if a is not type(None))
        try:
            return _check(key, value, inner, src)
        except ProfileError:
            raise bad() from None
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, list) or not value:
            raise bad()
        out = []
        for v in value:
            try:
                out.append(_check(key, v, args[0], src))
            except ProfileError:
                raise bad() from None
        if len(set(out)) != len(out):
            raise ProfileError(f"{src}: {key} lists a value twice: {value!r}")
        return tuple(out)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    raise bad()


# ---------------------------------------------------------------------------------------------
# The slurm section: a mapping whose keys are layered one by one (base, profile, --set slurm.KEY=V)
# ---------------------------------------------------------------------------------------------
_SLURM_TYPES = typing.get_type_hints(SlurmSettings)


def _merge_slurm(current: dict | None, key: str, value, src: str) -> dict:
    """`slurm: {...}` (a mapping) or `slurm.KEY: value` (one key, from --set) laid over the keys so far,
    each value checked where it came from (so an error names the file or the override that set it)."""
    merged = dict(current or {})
    _, dot, sub = str(key).partition(".")
    if dot:
        updates = {sub: value}
    elif isinstance(value, dict):
        updates = value
    else:
        raise ProfileError(f"{src}: slurm must be a mapping of {', '.join(SLURM_KEYS)}, got {value!r} "
                           f"({type(value).__name__})")
    for k, v in updates.items():
        if k not in SLURM_KEYS:
            raise ProfileError(f"{src}: unknown key slurm.{k}{_suggest(str(k), SLURM_KEYS)}; "
                               f"slurm keys: {', '.join(SLURM_KEYS)}")
        merged[k] = _check_slurm_key(k, v, src)
    return merged


_SLURM_LOWEST = {"time_minutes": 1, "gpus_per_task": 0, "cpus_per_task": 1, "array_parallelism": 1}


def _check_slurm_key(k: str, v, src: str):
    """One slurm value, typed and in range (submitit checks the assembled sbatch parameters again)."""
    if k == "setup":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ProfileError(f"{src}: slurm.setup must be a list of shell lines (strings), got {v!r}")
        return tuple(v)
    v = _check(f"slurm.{k}", v, _SLURM_TYPES[k], src)
    if k in _SLURM_LOWEST and v is not None and v < _SLURM_LOWEST[k]:
        raise ProfileError(f"{src}: slurm.{k} must be >= {_SLURM_LOWEST[k]}, got {v}")
    if k == "mem_gb" and v is not None and not 0 < v < float("inf"):
        raise ProfileError(f"{src}: slurm.mem_gb must be a finite number > 0 or null, got {v}")
    if isinstance(v, str) and (not v.strip() or any(c.isspace() for c in v)):
        raise ProfileError(f"{src}: slurm.{k} must be a name without spaces or null, got {v!r}")
    return v


def _check_slurm(value, src: str) -> SlurmSettings:
    if not isinstance(value, dict):           # the mapping's keys were checked as they were merged
        raise ProfileError(f"{src}: slurm must be a mapping of {', '.join(SLURM_KEYS)}, got {value!r}")
    return SlurmSettings(**value)


def _check_values(p: Profile, origin: dict) -> None:
    """Ranges and choices, each error naming the key, the file it came from and the valid values."""
    from artifact.model.checkpoint import DTYPES
    from artifact.model.decode import MODES
    from artifact.offload.link import LINKS
    from artifact.offload.policies import POLICIES
    from artifact.model.tasks import TASKS

    def fail(key, msg):
        raise ProfileError(f"{origin[key]}: {key} {msg}")

    def choices(key, values, valid):
        for v in values:
            if v not in valid:
                fail(key, f"has unknown value {v!r}; choose from {list(valid)}")

    choices("device", [p.device.split(":")[0]], ("cpu", "cuda"))
    choices("link", [p.link], LINKS)
    choices("mode", [p.mode], MODES)
    choices("tasks", p.tasks, TASKS)
    choices("trace_tasks", p.trace_tasks, TASKS)
    choices("sim_policies", p.sim_policies, list(POLICIES))
    choices("policies", p.policies, [n for n, s in POLICIES.items() if s.engine_ok])
    if p.dtype is not None:
        choices("dtype", [p.dtype], list(DTYPES))
    if p.link == "cuda" and not p.device.startswith("cuda"):
        fail("link", f"'cuda' computes on the GPU, but device is {p.device!r}; use link: emulated on the CPU")
    for key in ("bandwidth_scales", "throttle_scales"):
        if p.link == "cuda" and max(getattr(p, key)) > 1:
            fail(key, f"above 1 ({max(getattr(p, key))}) cannot speed up real hardware; "
                      "on the cuda link use scales <= 1 (a cap)")
    for key in ("batch_sizes", "trace_batch_sizes"):
        for b in getattr(p, key):
            if not 1 <= b <= 8:
                fail(key, f"must be in 1-8 (the decoder's batch sizes), got {b}")
    for key in ("cache_ratios", "bandwidth_scales", "throttle_scales"):
        for r in getattr(p, key):
            if r <= 0:
                fail(key, f"must be > 0, got {r}")
    if p.throttle_ratio <= 0:
        fail("throttle_ratio", f"must be > 0, got {p.throttle_ratio}")
    positive = ("gen_length", "steps", "n_prompts", "trace_n_prompts", "repetitions", "lookahead", "tau",
                "latency_us")
    for key in positive:
        if getattr(p, key) <= 0 and not (key == "latency_us" and p.latency_us == 0):
            fail(key, f"must be > 0, got {getattr(p, key)}")
    for key in ("warmup", "seed"):
        if getattr(p, key) < 0:
            fail(key, f"must be >= 0, got {getattr(p, key)}")
    for key in ("link_gbps", "budget_minutes", "max_prompt_tokens", "trace_capacity", "torch_threads"):
        v = getattr(p, key)
        if v is not None and v <= 0:
            fail(key, f"must be > 0 or null, got {v}")
    if not 0.0 < p.threshold <= 1.0:
        fail("threshold", f"must be in (0, 1], got {p.threshold}")
    if p.n_prompts < max(p.batch_sizes):
        fail("n_prompts", f"= {p.n_prompts} cannot fill a batch of {max(p.batch_sizes)} (batch_sizes); "
                          f"give at least {max(p.batch_sizes)}")
    if p.trace_n_prompts < max(p.trace_batch_sizes):
        fail("trace_n_prompts", f"= {p.trace_n_prompts} cannot fill a batch of {max(p.trace_batch_sizes)} "
                                f"(trace_batch_sizes); give at least {max(p.trace_batch_sizes)}")
