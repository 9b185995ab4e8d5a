"""Settings: one dataclass holds every default; a profile (cpu, a5000, h200, or your own YAML) overrides some.

    P = load_profile("cpu")                              # or a path: load_profile("my.yaml")
    P = load_profile("h200", {"model": "/ckpt/LLaDA2.0-mini"})
    P.gen_length, P.cache_ratios, ...

The `Settings` fields below, with their comments, are the documentation of every key. A profile file
holds only the keys it changes; values are literals. Loading validates everything once: an unknown key,
a key given twice in one file, a wrong type, NaN or inf, or an out-of-range value fails with the file,
the key, the value and what is expected.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import torch
import yaml

from artifact.errors import ProfileError, SettingError
from artifact.experiments.hardware import HARDWARE
from artifact.model.checkpoint import DTYPES
from artifact.model.decode import MAX_BATCH, MODES, DecodeConfig
from artifact.model.options import DEFAULT_FORWARD
from artifact.model.tasks import TASKS
from artifact.offload.links.link import LINKS, PCIE_LATENCY_US
from artifact.offload.links.timeline import CLOCKS, PRIORITIES
from artifact.offload.policy.policies import check_policy
from artifact.offload.policy.policy_modules import load_policy_modules
from artifact.offload.prepare import RunRequest
from artifact.offload.runner import RunOptions
from artifact.validate import check_number, load_yaml

__all__ = ["PROFILE_DIR", "PROFILE_KEYS", "ProfileError", "Settings", "fingerprint", "list_profiles",
           "load_profile", "parse_override", "profile_path", "resolve_threads"]

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULTS_ORIGIN = "defaults (artifact/experiments/settings.py)"

PAPER_RATIOS = (0.43, 0.83, 1.0, 1.3, 1.73)           # C/W: the paper's grid
PAPER_BATCH_SIZES = (1, 2, 4, 8)
# The A/A control of every timing grid, a policy spec (offload/policy/policies.py): last_step_conservative loads only
# predicted experts that are not resident and never evicts for them, so on every cell it does exactly demand's
# work (every count equal: tests/test_beyond.py, tests/test_priority.py). Its time against demand's measures the
# bench's own bias. Stored rows name it by this spec in their `policy` column.
CONTROL = "last_step_conservative"


@dataclass(frozen=True)
class SlurmSettings:
    """The `slurm:` section of a profile: what each job of a --submit slurm array asks for.
    A profile (or --set slurm.KEY=VALUE) changes single keys; the others keep these defaults."""
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
class Settings:
    """Every setting of a run, a benchmark grid or a notebook, with its default (lists become tuples)."""
    name: str = field(default="defaults", metadata={"internal": True})   # the profile's name (file stem)
    path: str = field(default="", metadata={"internal": True})           # the profile file it came from
    description: str = "defaults shared by every profile"

    # --- model and machine -------------------------------------------------------------------------
    model: str | None = "tiny"           # 'tiny' (embedded, built on first use) or a HF checkpoint dir (None: --model)
    dtype: str | None = None             # float32 | bfloat16 | float16; None: float32 for tiny, bfloat16 otherwise
    device: str = "cpu"                  # cpu | cuda | cuda:N
    link: str = "emulated"               # emulated (a modelled PCIe copy engine, any machine) | cuda (copy stream)
    latency_us: float = PCIE_LATENCY_US  # per-copy setup cost of the emulated link (microseconds)
    link_priority: str = "fifo"          # fifo: one copy queue in issue order | demand: speculative copies wait
                                         # while a demand copy is queued (offload/links/timeline.py)
    # The unthrottled bandwidth, GB/s. None = the link's own: emulated -> PCIe 4 (25 GB/s) scaled to this
    # model's expert size, so one expert costs what a LLaDA2.0-mini expert costs on PCIe 4
    # (offload/links/link.py emulated_bandwidth_gbps); cuda -> the hardware's, measured once with a pinned copy
    # when a scale < 1 needs it.
    link_gbps: float | None = None
    # Time of the stream-driven runs of the performance model (python -m artifact model, notebook 08):
    # wall = the emulated link sleeps and compute spins for real (cpu-emulated only); virtual = a virtual
    # clock advances by the hardware profile's modelled costs, nothing sleeps (offload/links/costs.py).
    clock: str = "virtual"
    # How the model runs its denoising forwards (artifact/model/options.py): eager = the reference forward;
    # segmented = segments between the router syncs, captured as CUDA graphs on a GPU (eager on the CPU).
    forward: str = DEFAULT_FORWARD
    hardware: str = "cpu-emulated"       # the performance model's hardware profile: a5000 | h200 | cpu-emulated
    # torch intra-op threads of every command (CLI --threads) and bench run. None: 1 for the tiny model on
    # the CPU (its ops are too small to gain from threads, and on 2 shared cores OpenMP spin-waiting made
    # `generate` 27 s instead of 1.2 s), else torch's default (one per core): see resolve_threads.
    torch_threads: int | None = None

    # --- decoding (block diffusion, temperature 0) -------------------------------------------------
    mode: str = "cached"                 # cached (prefix KV cache) | full (re-run the whole prefix every step)
    gen_length: int = 256                # tokens generated per prompt (whole 32-token blocks): the paper's length
    steps: int = 32                      # at most this many denoising steps per 32-token block
    threshold: float = 0.95              # accept every masked token whose probability exceeds this

    # --- prompts -----------------------------------------------------------------------------------
    tasks: tuple[str, ...] = TASKS   # bench tasks (data/tasks/*.jsonl)
    n_prompts: int = 8                   # prompts per bench cell, run in batches of the cell's size (>= max batch)
    seed: int = 0                        # which prompts: a seeded sample of each task
    max_prompt_tokens: int | None = None  # keep only the last N prompt tokens; None: the whole prompt

    # --- the paired throughput benchmark (python -m artifact bench) --------------------------------
    # A cell is (task, batch size, C/W, bandwidth scale). W, the mean per-step expert working set, is
    # measured once per (task, batch size) from a traced run of the cell's prompts; C = round(ratio * W).
    batch_sizes: tuple[int, ...] = PAPER_BATCH_SIZES
    cache_ratios: tuple[float, ...] = PAPER_RATIOS
    # A cell's bandwidth = scale * link_gbps. emulated: the link runs at that rate; cuda: 1.0 = unpaced
    # hardware copies, < 1 caps the copy stream (token bucket), > 1 is not possible on real hardware.
    bandwidth_scales: tuple[float, ...] = (1.0,)
    # Run side by side on identical prompts (engine policies). CONTROL, the A/A control, does exactly demand's
    # work: a direction claim rules net of it, an equivalence or non-superiority claim is inconclusive in a cell
    # whose control is not inside the margin (rules.rule_cell).
    policies: tuple[str, ...] = ("demand", "last_step", CONTROL)
    # Your own policies: modules imported before any policy is resolved, each a dotted module name on sys.path
    # or a path to a .py file (relative to the working directory) whose code registers policies
    # (docs/policies.md). Importing runs the module's code: name only your own.
    policy_modules: tuple[str, ...] = ()
    repetitions: int = 5                 # R timed runs of every policy per cell, in balanced order (bench/order.py)
    warmup: int = 1                      # untimed runs of every policy per cell before the R timed ones (listed order)
    rotation: int = 0                    # repetition r of a grid of R runs its policies in slot_order(policies,
                                         # rotation * R + r) (bench/order.py); stored run k: k - 1 (record_runs.py,
                                         # its run.json). In no fingerprint: rows of any rotation are one grid.
    lookahead: int = 1                   # last_step / oracle: prefetch this many MoE layers ahead
    tau: int = 4                         # interval_refresh: refresh every tau denoising steps
    # The traced run that measures W: None = experts resident on the device; an integer C = offloaded
    # (demand, C slots per layer), for a model whose experts do not fit the GPU.
    trace_capacity: int | None = None
    budget_minutes: float | None = None  # stated wall-clock budget of the whole bench (None: none); checked, reported

    # --- bandwidth throttling (notebook 03) --------------------------------------------------------
    # One cell per scale at C/W = throttle_ratio (first task, largest batch size, demand vs last_step):
    # the link's bandwidth (link_gbps, as above) times each scale. On cuda, scales must be <= 1 (caps).
    throttle_scales: tuple[float, ...] = (1.0, 0.5, 0.25)
    throttle_ratio: float = 1.0

    # --- routing traces and the simulator (notebooks) ----------------------------------------------
    trace_tasks: tuple[str, ...] = TASKS
    trace_n_prompts: int = 8
    trace_batch_sizes: tuple[int, ...] = PAPER_BATCH_SIZES
    sim_policies: tuple[str, ...] = ("demand", "last_step", "oracle", "interval_refresh", "belady")

    # --- TIDE head to head -------------------------------------------------------------------------
    tide_path: str | None = None         # a checkout of TIDE's released implementation (None: comparison skipped)

    # --- jobs on a Slurm cluster (python -m artifact bench --submit slurm) ----------------------------
    # A nested mapping (see SlurmSettings): a profile's `slurm:` section or `--set slurm.KEY=VALUE`
    # changes single keys.
    slurm: SlurmSettings = field(default_factory=lambda: SlurmSettings())

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a submitted job's process): the profile's policy modules are imported there too."""
        self.__dict__.update(state)
        load_policy_modules(self.policy_modules, "policy_modules")

    def as_dict(self) -> dict:
        """Plain values (lists, not tuples), e.g. for papermill parameters or JSON."""
        d = dataclasses.asdict(self)
        d["slurm"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["slurm"].items()}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(gen_length=self.gen_length, steps=self.steps, threshold=self.threshold, mode=self.mode)

    def run_options(self, *, capture: bool = True) -> RunOptions:
        """How this profile's runs decode (RunOptions: decoding, device, forward mode), passed whole to decode_prompts
        by every entry point; capture=False for a timed or profiled run (no CUDA graph captured mid-measurement)."""
        return RunOptions(self.decode_config(), self.device, self.forward, capture=capture)

    def run_request(self) -> RunRequest:
        """What artifact.offload.prepare checks before this profile's model is loaded (every path that loads one)."""
        return RunRequest(self.model, self.device, self.torch_dtype, self.gen_length, self.steps, self.threshold,
                          self.mode)

    @property
    def threads(self) -> int:
        """torch_threads, with None resolved (resolve_threads)."""
        return resolve_threads(self.torch_threads, self.model, self.device)

    @property
    def torch_dtype(self) -> str:
        """dtype, with None resolved: float32 for the tiny model, bfloat16 for a real checkpoint."""
        return self.dtype or ("float32" if self.model == "tiny" else "bfloat16")


PROFILE_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Settings) if not f.metadata.get("internal"))
_TYPES = typing.get_type_hints(Settings)

# Ranges of the numeric settings (check_number's keywords), applied to each element of a list setting.
# Every int or float field is listed here (a test checks it), so NaN, inf and out-of-range values of a
# new setting cannot slip through.
_GT0 = {"low": 0, "low_open": True}
_GE0 = {"low": 0}
_BATCH = {"low": 1, "high": MAX_BATCH, "integer": True}
_THREADS = {"low": 1, "high": 1024, "integer": True}   # more only fails later, spawning the threads
RANGES: dict[str, dict] = {
    "latency_us": _GE0, "link_gbps": _GT0, "torch_threads": _THREADS,
    "gen_length": _GT0, "steps": _GT0, "threshold": {"low": 0, "low_open": True, "high": 1},
    "n_prompts": _GT0, "seed": _GE0, "max_prompt_tokens": _GT0,
    "batch_sizes": _BATCH, "cache_ratios": _GT0, "bandwidth_scales": _GT0, "repetitions": _GT0, "warmup": _GE0,
    "rotation": _GE0, "lookahead": _GT0, "tau": _GT0, "trace_capacity": _GT0, "budget_minutes": _GT0,
    "throttle_scales": _GT0, "throttle_ratio": _GT0,
    "trace_n_prompts": _GT0, "trace_batch_sizes": _BATCH,
}


def resolve_threads(threads: int | None, model: str | None, device: str) -> int:
    """The torch intra-op thread count a run uses: `threads` when given; otherwise 1 when the work is the
    tiny model on the CPU, or no model at all (its matmuls are a few KiB: a second thread only adds
    OpenMP spin-waiting; the slowdown measured is beside the torch_threads field), and torch's
    default (one per core) for a real checkpoint or a GPU, where large kernels gain from threads."""
    if threads is not None:
        return check_number("torch_threads", threads, **_THREADS)
    if model in (None, "tiny") and device.split(":")[0] == "cpu":
        return 1
    return torch.get_num_threads()


def list_profiles() -> list[str]:
    """Names of the bundled profiles."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_path(name_or_path: str | Path) -> Path:
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml")) or "/" in s or "\\" in s:
        path = Path(s)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: profile file not found")
        return path
    path = PROFILE_DIR / f"{s}.yaml"
    if not path.is_file():
        raise ProfileError(f"unknown profile {s!r}; choose one of {list_profiles()} or give a path to a .yaml file")
    return path


def load_profile(name_or_path: str | Path, overrides: dict | None = None) -> Settings:
    """The defaults, then the profile file's values, then `overrides` (e.g. from the command line), validated."""
    path = profile_path(name_or_path)
    given: dict = {}
    origin: dict = {}
    for src, data in ((str(path), _read(path)), ("overrides", dict(overrides or {}))):
        for k, v in data.items():
            if str(k).partition(".")[0] == "slurm":        # a nested section: merged key by key
                given["slurm"] = _merge_slurm(given.get("slurm"), k, v, src)
                origin["slurm"] = src
                continue
            if k not in PROFILE_KEYS:
                raise ProfileError(f"{src}: unknown key {k!r}{_suggest(k)}; valid keys: {', '.join(PROFILE_KEYS)}")
            given[k], origin[k] = v, src
    checked = {k: _check(k, v, _TYPES[k], origin[k]) for k, v in given.items()}
    settings = Settings(name=path.stem, path=str(path), **checked)
    _check_values(settings, origin)
    return settings


def parse_override(text: str) -> tuple[str, object]:
    """'key=value' with a YAML value (so 'cache_ratios=[1.0, 1.73]' and 'model=null' work)."""
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
        return key, load_yaml(raw, f"--set {key}")
    except yaml.YAMLError as e:
        raise ProfileError(f"{key}: value {raw!r} is not YAML: {e}") from None


def fingerprint(settings: Settings, keys: typing.Iterable[str]) -> str:
    """A short hash of some of the settings' values (which settings made a result file)."""
    blob = json.dumps({k: getattr(settings, k) for k in sorted(keys)}, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Reading and checking
# ---------------------------------------------------------------------------------------------
def _read(path: Path) -> dict:
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path))
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


def _check_values(P: Settings, origin: dict) -> None:
    """Ranges and choices, each error naming the key, the file it came from and the valid values."""
    def src(key):
        return origin.get(key, DEFAULTS_ORIGIN)

    def fail(key, msg):
        raise ProfileError(f"{src(key)}: {key} {msg}")

    for key, rng in RANGES.items():
        value = getattr(P, key)
        nullable = type(None) in typing.get_args(_TYPES[key])
        for v in (value if isinstance(value, tuple) else (value,)):
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

    def choices(key, values, valid):
        for v in values:
            if v not in valid:
                fail(key, f"has unknown value {v!r}; choose from {list(valid)}")

    choices("device", [P.device.split(":")[0]], ("cpu", "cuda"))
    choices("link", [P.link], LINKS)
    choices("link_priority", [P.link_priority], PRIORITIES)
    choices("clock", [P.clock], CLOCKS)
    choices("hardware", [P.hardware], sorted(HARDWARE))
    choices("mode", [P.mode], MODES)
    choices("tasks", P.tasks, TASKS)
    choices("trace_tasks", P.trace_tasks, TASKS)
    try:                                        # before the policy names: a module may define them
        load_policy_modules(P.policy_modules, f"{src('policy_modules')}: policy_modules")
    except SettingError as e:
        raise ProfileError(str(e)) from None
    for key, engine in (("sim_policies", False), ("policies", True)):
        for spec in getattr(P, key):
            try:
                check_policy(spec, engine=engine)
            except SettingError as e:
                fail(key, f"has {spec!r}: {e}")
    if P.dtype is not None:
        choices("dtype", [P.dtype], list(DTYPES))
    try:                                        # the forward mode: checked where the run's options are made
        P.run_options()
    except SettingError as e:
        raise ProfileError(f"{src('forward')}: forward: {e}") from None
    if P.link == "cuda" and not P.device.startswith("cuda"):
        fail("link", f"'cuda' computes on the GPU, but device is {P.device!r}; use link: emulated on the CPU")
    for key in ("bandwidth_scales", "throttle_scales"):
        if P.link == "cuda" and max(getattr(P, key)) > 1:
            fail(key, f"above 1 ({max(getattr(P, key))}) cannot speed up real hardware; "
                      "on the cuda link use scales <= 1 (a cap)")
    if P.n_prompts < max(P.batch_sizes):
        fail("n_prompts", f"= {P.n_prompts} cannot fill a batch of {max(P.batch_sizes)} (batch_sizes); "
                          f"give at least {max(P.batch_sizes)}")
    if P.trace_n_prompts < max(P.trace_batch_sizes):
        fail("trace_n_prompts", f"= {P.trace_n_prompts} cannot fill a batch of {max(P.trace_batch_sizes)} "
                                f"(trace_batch_sizes); give at least {max(P.trace_batch_sizes)}")
