"""Settings: one dataclass holds every default; a profile (cpu, a5000, h200, or your own YAML) overrides some.

    P = load_profile("cpu")                              # or a path: load_profile("my.yaml")
    P = load_profile("h200", {"model": "/ckpt/LLaDA2.0-mini"})
    P.gen_length, P.cache_ratios, ...

The `Settings` fields below, with their comments, are the documentation of every key. A profile file
holds only the keys it changes; values are literals. Loading validates everything once: an unknown key,
a key given twice in one file, a wrong type, NaN or inf, or an out-of-range value fails with the file,
the key, the value and what is expected (profiles/checks.py reads and checks; profiles/slurm.py holds the
`slurm:` section, layered key by key).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from artifact.errors import ProfileError
from artifact.experiments.profiles.checks import RANGES, check_value, check_values, read_profile, suggest
from artifact.experiments.profiles.slurm import SLURM_KEYS, SlurmSettings, merge_slurm
from artifact.model.decode import DecodeConfig
from artifact.model.tasks import TASKS
from artifact.offload.policy.policy_modules import load_policy_modules
from artifact.offload.spec import RunSpec
from artifact.validate import check_number, load_yaml

__all__ = [
    "CONTROL",
    "PROFILE_DIR",
    "PROFILE_KEYS",
    "RANGES",
    "ProfileError",
    "Settings",
    "SlurmSettings",
    "fingerprint",
    "list_profiles",
    "load_profile",
    "parse_override",
    "profile_path",
    "resolve_threads",
]

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"

# C/W grid: this artifact's choice. 0.43 and the ends 0.83 and 1.73 are the abstract's ("significant for
# C/W=0.83-1.73, but falls to +0.73% ... at C/W=0.43"); 1.0 and 1.3 are points this artifact adds inside
# that range (the abstract names no other C/W).
PAPER_RATIOS = (0.43, 0.83, 1.0, 1.3, 1.73)
# Batch sizes: this artifact's choice of points in the abstract's range ("batch sizes 1-8").
PAPER_BATCH_SIZES = (1, 2, 4, 8)
# A decomposition of every timing grid, a policy spec (offload/policy/policies.py): last_step_conservative
# loads only predicted experts that are not resident and never evicts for them, so on every cell it does
# exactly demand's loads (every count equal: tests/test_beyond.py, tests/test_priority.py) but runs the
# prediction code on the host. Its time against demand's measures that host cost with the bench's bias; the
# true A/A pair is demand timed twice (aa_pair). Stored rows name it by this spec in their `policy` column.
CONTROL = "last_step_conservative"

# A run's defaults live in RunSpec and DecodeConfig (artifact/offload/spec.py, artifact/model/decode.py); the
# profile keys below that a run reads take theirs from there (RUN_KEYS; a test keeps the lists whole).
_RUN, _DECODE = RunSpec(), DecodeConfig()
RUN_KEYS = ("model", "dtype", "device", "link", "latency_us", "link_priority", "link_gbps", "forward")
RUN_KEYS += ("expert_kernel", "lookahead", "tau", "gen_length", "steps", "threshold", "mode")


@dataclass(frozen=True)
class Settings:
    """Every setting of a run, a benchmark grid or a notebook, with its default (lists become tuples)."""

    name: str = field(default="defaults", metadata={"internal": True})  # the profile's name (file stem)
    path: str = field(default="", metadata={"internal": True})  # the profile file it came from
    description: str = "defaults shared by every profile"

    # --- model and machine -------------------------------------------------------------------------
    model: str | None = (
        _RUN.model
    )  # 'tiny' (embedded, built on first use) or a HF checkpoint dir (None: --model)
    dtype: str | None = _RUN.dtype  # float32 | bfloat16 | float16; None: float32 for tiny, bfloat16 otherwise
    device: str = _RUN.device  # cpu | cuda | cuda:N
    link: str = _RUN.link  # emulated (a modelled PCIe copy engine, any machine) | cuda (copy stream)
    latency_us: float = _RUN.latency_us  # per-copy setup cost of the emulated link (microseconds)
    # fifo: one copy queue in issue order | demand: speculative copies wait while a demand copy is queued
    # (offload/links/timeline.py)
    link_priority: str = _RUN.link_priority
    # The unthrottled bandwidth, GB/s. None = the link's own: emulated -> PCIe 4 (25 GB/s) scaled to this
    # model's expert size, so one expert costs what a LLaDA2.0-mini expert costs on PCIe 4
    # (offload/links/link.py emulated_bandwidth_gbps); cuda -> the hardware's, measured once with a pinned
    # copy when a scale < 1 needs it.
    link_gbps: float | None = _RUN.link_gbps
    # How the model runs its denoising forwards (artifact/model/options.py): eager = the reference forward;
    # segmented = segments between the router syncs, captured as CUDA graphs on a GPU (eager on the CPU).
    forward: str = _RUN.forward
    # How a group of experts computes (artifact/model/experts.py): grouped = one grouped GEMM
    # (torch._grouped_mm, where torch has one); loop = one call per expert. Same results, other time.
    expert_kernel: str = _RUN.expert_kernel
    # torch intra-op threads of every command (CLI --threads) and bench run. None: 1 for the tiny model on
    # the CPU (its ops are too small to gain from threads, and on 2 shared cores OpenMP spin-waiting made
    # `generate` 27 s instead of 1.2 s), else torch's default (one per core): see resolve_threads.
    torch_threads: int | None = None

    # --- decoding (block diffusion, temperature 0; defaults: DecodeConfig) ---------------------------
    mode: str = _DECODE.mode  # cached (prefix KV cache) | full (re-run the whole prefix every step)
    gen_length: int = _DECODE.gen_length  # tokens generated per prompt (whole 32-token blocks)
    steps: int = _DECODE.steps  # at most this many denoising steps per 32-token block
    threshold: float = _DECODE.threshold  # accept every masked token whose probability exceeds this

    # --- prompts -----------------------------------------------------------------------------------
    tasks: tuple[str, ...] = TASKS  # bench tasks (data/tasks/*.jsonl)
    n_prompts: int = 8  # prompts per bench cell, run in batches of the cell's size (>= max batch)
    seed: int = 0  # which prompts: a seeded sample of each task
    max_prompt_tokens: int | None = None  # keep only the last N prompt tokens; None: the whole prompt

    # --- the paired throughput benchmark (python -m artifact bench) --------------------------------
    # A cell is (task, batch size, C/W, bandwidth scale). W, the mean per-step expert working set, is
    # measured once per (task, batch size) from a traced run of the cell's prompts; C = round(ratio * W).
    batch_sizes: tuple[int, ...] = PAPER_BATCH_SIZES
    cache_ratios: tuple[float, ...] = PAPER_RATIOS
    # A cell's bandwidth = scale * link_gbps. emulated: the link runs at that rate; cuda: 1.0 = unpaced
    # hardware copies, < 1 caps the copy stream (token bucket), > 1 is not possible on real hardware.
    bandwidth_scales: tuple[float, ...] = (1.0,)
    # Run side by side on identical prompts (engine policies). CONTROL does exactly demand's loads with the
    # prediction code on the host (a decomposition of a predictor's effect; see CONTROL above).
    policies: tuple[str, ...] = ("demand", "last_step", CONTROL)
    # The A/A pair: a grid whose policies include demand runs it twice per repetition, two arms of the
    # balanced order with the same code; rows `policy` demand, `arm` A and B (every other row arm A).
    aa_pair: bool = True
    # Your own policies: modules imported before any policy is resolved, each a dotted module name on sys.path
    # or a path to a .py file (relative to the working directory) whose code registers policies
    # (docs/policies.md). Importing runs the module's code: name only your own.
    policy_modules: tuple[str, ...] = ()
    repetitions: int = 5  # R timed runs of every policy per cell, in balanced order (bench/order.py)
    warmup: int = 1  # untimed runs of every policy per cell before the R timed ones (listed order)
    rotation: int = 0  # repetition r of a grid of R runs its policies in slot_order(policies,
    # rotation * R + r) (bench/order.py); stored run k: k - 1
    # (record_runs.py,
    # its run.json). In no fingerprint: rows of any rotation are one
    # grid.
    lookahead: int = _RUN.lookahead  # last_step / oracle: prefetch this many MoE layers ahead
    tau: int = _RUN.tau  # interval_refresh: refresh every tau denoising steps
    # The traced run that measures W: None = experts resident on the device; an integer C = offloaded
    # (demand, C slots per layer), for a model whose experts do not fit the GPU.
    trace_capacity: int | None = None
    # stated wall-clock budget of the whole bench (None: none); checked, reported
    budget_minutes: float | None = None

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
    tide_path: str | None = None  # a checkout of TIDE's released implementation (None: comparison skipped)

    # --- jobs on a Slurm cluster (python -m artifact bench --submit slurm) ----------------------------
    # A nested mapping (SlurmSettings, profiles/slurm.py): a profile's `slurm:` section or `--set
    # slurm.KEY=VALUE`
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
        return DecodeConfig(
            gen_length=self.gen_length, steps=self.steps, threshold=self.threshold, mode=self.mode
        )

    def run_spec(self, capacity: int | None = None, policy: str | None = None, **changes) -> RunSpec:
        """The one way a profile makes a run: its run keys (RUN_KEYS) as a RunSpec, resident (capacity None)
        or offloaded at `capacity` with `policy` (default: the first of `policies`); `changes` set the fields
        a profile does not hold (bandwidth_scale, capture, oracle_trace, cap_gbps), checked."""
        fields = dict(
            model=self.model,
            dtype=self.dtype,
            device=self.device,
            decode=self.decode_config(),
            forward=self.forward,
            expert_kernel=self.expert_kernel,
            capacity=capacity,
            policy=self.policies[0] if policy is None else policy,
            link=self.link,
            link_gbps=self.link_gbps,
            latency_us=self.latency_us,
            link_priority=self.link_priority,
            lookahead=self.lookahead,
            tau=self.tau,
        )
        return RunSpec(**{**fields, **changes})

    @property
    def threads(self) -> int:
        """torch_threads, with None resolved (resolve_threads)."""
        return resolve_threads(self.torch_threads, self.model, self.device)

    @property
    def torch_dtype(self) -> str:
        """dtype, with None resolved: float32 for the tiny model, bfloat16 for a real checkpoint."""
        return self.dtype or ("float32" if self.model == "tiny" else "bfloat16")


PROFILE_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(Settings) if not f.metadata.get("internal")
)
_TYPES = typing.get_type_hints(Settings)


def resolve_threads(threads: int | None, model: str | None, device: str) -> int:
    """The torch intra-op thread count a run uses: `threads` when given; otherwise 1 when the work is the
    tiny model on the CPU, or no model at all (its matmuls are a few KiB: a second thread only adds
    OpenMP spin-waiting; the slowdown measured is beside the torch_threads field), and torch's
    default (one per core) for a real checkpoint or a GPU, where large kernels gain from threads."""
    if threads is not None:
        return check_number("torch_threads", threads, **RANGES["torch_threads"])
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
        raise ProfileError(
            f"unknown profile {s!r}; choose one of {list_profiles()} or give a path to a .yaml file"
        )
    return path


def load_profile(name_or_path: str | Path, overrides: dict | None = None) -> Settings:
    """The defaults, then the profile file's values, then `overrides` (e.g. from the command line),
    validated."""
    path = profile_path(name_or_path)
    given: dict = {}
    origin: dict = {}
    for src, data in ((str(path), read_profile(path)), ("overrides", dict(overrides or {}))):
        for k, v in data.items():
            if str(k).partition(".")[0] == "slurm":  # a nested section: merged key by key
                given["slurm"] = merge_slurm(given.get("slurm"), k, v, src)
                origin["slurm"] = src
                continue
            if k not in PROFILE_KEYS:
                raise ProfileError(
                    f"{src}: unknown key {k!r}{suggest(k, PROFILE_KEYS)}; "
                    f"valid keys: {', '.join(PROFILE_KEYS)}"
                )
            given[k], origin[k] = v, src
    checked = {
        k: SlurmSettings(**v) if k == "slurm" else check_value(k, v, _TYPES[k], origin[k])
        for k, v in given.items()
    }
    settings = Settings(name=path.stem, path=str(path), **checked)
    check_values(settings, origin)
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
            raise ProfileError(
                f"unknown key {key!r}{suggest(sub, SLURM_KEYS)}; slurm keys: {', '.join(SLURM_KEYS)}"
            )
    elif key not in PROFILE_KEYS:
        raise ProfileError(
            f"unknown key {key!r}{suggest(key, PROFILE_KEYS)}; valid keys: {', '.join(PROFILE_KEYS)}"
        )
    try:
        return key, load_yaml(raw, f"--set {key}")
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at column {where.column + 1}" if where is not None else ""
        raise ProfileError(
            f"{key}: value {raw!r} is not YAML ({getattr(e, 'problem', None) or 'unparsable'}{at})"
        ) from None


def fingerprint(settings: Settings, keys: typing.Iterable[str]) -> str:
    """A short hash of some of the settings' values (which settings made a result file)."""
    blob = json.dumps({k: getattr(settings, k) for k in sorted(keys)}, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
