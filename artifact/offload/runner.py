"""Decode prompts through the model, resident or offloaded, and collect tokens, statistics and a trace.

This is the one place that wires checkpoint -> backend (resident or engine + cache + policy + link)
-> decoder -> stats and trace; the CLI, the benchmark runner and the notebooks all call decode_prompts.

How a run decodes is one frozen RunOptions (decoding, device, forward mode, capture, expert kernel), made once
where the run is set up (Settings.run_options() for a profile, the CLI from its flags) and passed whole: every
forward's ForwardOptions is made from it in one place (RunOptions.forward_options), so no entry point can drop
the forward mode. What is offloaded (OffloadSpec), recorded and which prompts are the call's own arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from artifact.errors import DeviceError, SettingError
from artifact.model.checkpoint import Loaded
from artifact.model.config import ModelConfig
from artifact.model.decode import MAX_BATCH, DecodeConfig, DecodeStats, generate
from artifact.model.experts import ExpertBackend, ResidentExperts
from artifact.model.options import DEFAULT_FORWARD, DEFAULT_KERNEL, ForwardOptions
from artifact.model.segments import SegmentCounts
from artifact.offload.backend.engine import OffloadEngine, install, offload
from artifact.offload.links.link import LINKS, PCIE_LATENCY_US, emulated_bandwidth_gbps
from artifact.offload.links.link_factory import make_link
from artifact.offload.links.timeline import PRIORITIES
from artifact.offload.policy.policies import check_policy, make_policy
from artifact.offload.replay.trace import Trace, TraceError, TraceRecorder
from artifact.validate import check_number

MIN_LINK_GBPS = 1e-4  # 100 KB/s: a 24 MiB LLaDA2.0-flash expert still copies in ~4 minutes
MAX_LATENCY_US = 1e6  # one second of setup per copy (PCIe: ~10 us)


class LinkSettings(Protocol):
    """What OffloadSpec.from_settings reads from a settings object (artifact.experiments.settings.Settings
    has these fields; so does RunSettings below, for callers without a profile)."""

    link: str
    link_gbps: float | None
    latency_us: float
    link_priority: str
    lookahead: int
    tau: int


@dataclass(frozen=True)
class RunSettings:
    """The link and policy knobs of one run, for callers without a profile: the same names and defaults as
    artifact.experiments.settings.Settings (a test keeps them equal; the core cannot import that layer)."""

    link: str = "emulated"
    link_gbps: float | None = None  # None: emulated -> PCIe 4 scaled to the experts; cuda -> the hardware's
    latency_us: float = PCIE_LATENCY_US
    link_priority: str = "fifo"
    lookahead: int = 1
    tau: int = 4


def link_bandwidth(
    s: LinkSettings, expert_bytes: int, scale: float = 1.0, measure: Callable[[], float] | None = None
) -> float | None:
    """A run's link bandwidth in GB/s at `scale` times the settings' nominal one. emulated: link_gbps, or
    PCIe 4 scaled to these experts (emulated_bandwidth_gbps). cuda: None at scale 1 (unpaced hardware
    copies); below 1, a cap of scale * (link_gbps, or `measure()`: the hardware's pinned-copy rate)."""
    check_number("bandwidth scale", scale, low=0, low_open=True)
    if s.link == "emulated":
        nominal = s.link_gbps if s.link_gbps is not None else emulated_bandwidth_gbps(expert_bytes)
        return nominal * scale
    if scale == 1.0:
        return None
    if s.link_gbps is None and measure is None:
        raise SettingError("a cuda link below scale 1 needs link_gbps (or a measured hardware bandwidth)")
    return (s.link_gbps if s.link_gbps is not None else measure()) * scale


@dataclass(frozen=True)
class OffloadSpec:
    """The user's knobs for an offloaded run. Build it with from_settings wherever a profile or the
    command line describes the run, so every caller derives bandwidth, cap, lookahead and tau alike."""

    capacity: int  # C: device slots per MoE layer
    policy: str = "demand"
    link: str = "emulated"
    # emulated: the link's bandwidth (default scaled to the model); cuda: a cap
    bandwidth_gbps: float | None = None
    latency_us: float = PCIE_LATENCY_US
    cap_gbps: float | None = None  # throttle: cap the link's bandwidth
    lookahead: int = 1  # last_step / oracle: prefetch this many MoE layers ahead
    tau: int = 4  # interval_refresh: refresh every tau denoising steps
    link_priority: str = "fifo"  # fifo | demand: speculative copies never delay demand copies (timeline.py)

    @classmethod
    def from_settings(
        cls,
        s: LinkSettings,
        capacity: int,
        policy: str = "demand",
        *,
        expert_bytes: int,
        bandwidth_scale: float = 1.0,
        measure: Callable[[], float] | None = None,
        cap_gbps: float | None = None,
    ) -> OffloadSpec:
        """The run that settings `s` describe at capacity C: on the emulated link the bandwidth is
        link_bandwidth(...) (scaled); on cuda that figure, when not None, caps the copy stream. An explicit
        `cap_gbps` (the CLI's --cap-gbps) throttles either link further."""
        gbps = link_bandwidth(s, expert_bytes, bandwidth_scale, measure)
        if s.link == "cuda":
            caps = [c for c in (gbps, cap_gbps) if c is not None]
            return cls(
                capacity,
                policy,
                s.link,
                bandwidth_gbps=None,
                latency_us=s.latency_us,
                cap_gbps=min(caps) if caps else None,
                lookahead=s.lookahead,
                tau=s.tau,
                link_priority=s.link_priority,
            )
        return cls(
            capacity,
            policy,
            s.link,
            bandwidth_gbps=gbps,
            latency_us=s.latency_us,
            cap_gbps=cap_gbps,
            lookahead=s.lookahead,
            tau=s.tau,
            link_priority=s.link_priority,
        )

    @property
    def link_gbps(self) -> float | None:
        """The bandwidth the run is limited to (None: the cuda link's unpaced hardware rate)."""
        caps = [c for c in (self.bandwidth_gbps, self.cap_gbps) if c is not None]
        return min(caps) if caps else None

    def make_policy(self, num_layers: int, num_experts: int, future=None):
        """This run's policy for an engine over `num_layers` MoE layers of `num_experts` experts."""
        return make_policy(
            self.policy,
            num_layers,
            num_experts,
            future=future,
            engine=True,
            lookahead=self.lookahead,
            tau=self.tau,
        )

    def make_link(self, device: str, expert_bytes: int, clock=None):
        """This run's link (with `clock`: on a virtual clock), each copy `expert_bytes`."""
        return make_link(
            self.link,
            device=device,
            bandwidth_gbps=self.bandwidth_gbps,
            latency_us=self.latency_us,
            cap_gbps=self.cap_gbps,
            expert_bytes=expert_bytes,
            priority=self.link_priority,
            clock=clock,
        )

    def check(self, num_experts: int, device: str) -> None:
        """Every bad value fails here, before a model is touched."""
        if (
            isinstance(self.capacity, bool)
            or not isinstance(self.capacity, int)
            or not 1 <= self.capacity <= num_experts
        ):
            raise SettingError(
                f"cache capacity must be an integer in [1, {num_experts}] experts per layer, "
                f"got {self.capacity!r}"
            )
        if not check_policy(self.policy).engine_ok:
            raise SettingError(
                f"policy {self.policy!r} runs in the simulator only (python -m artifact simulate)"
            )
        if self.link not in LINKS:
            raise SettingError(f"unknown link {self.link!r}; choose one of {LINKS}")
        if self.link_priority not in PRIORITIES:
            raise SettingError(f"unknown link priority {self.link_priority!r}; choose one of {PRIORITIES}")
        if self.link == "cuda" and not torch.cuda.is_available():
            raise DeviceError("--link cuda needs a CUDA GPU, and none is available (use --link emulated)")
        if self.link == "cuda" and torch.device(device).type != "cuda":
            raise SettingError("--link cuda computes on the GPU: pass --device cuda")
        # Finite is not enough: at 1e-300 GB/s or 1e300 us one copy takes longer than a sleep can express
        # (OverflowError mid-run). Bounds far beyond any real link keep every copy under a few minutes.
        check_number("bandwidth_gbps", self.bandwidth_gbps, low=MIN_LINK_GBPS, allow_none=True)
        check_number("cap_gbps", self.cap_gbps, low=MIN_LINK_GBPS, allow_none=True)
        check_number("latency_us", self.latency_us, low=0, high=MAX_LATENCY_US)
        check_number("lookahead", self.lookahead, low=1, integer=True)
        check_number("tau", self.tau, low=1, integer=True)


@dataclass(frozen=True)
class RunOptions:
    """How every forward of a run decodes and computes. Built once per entry point: Settings.run_options() for
    a profile's runs, the CLI from its flags; a test or a script makes one by hand.

      decode         the decoder's settings (DecodeConfig: length, steps, threshold, and `mode`, cached |
      full: its
                     prefix KV cache use, not the forward mode; the name stays, as every trace's meta, profile
                     and bench fingerprint stores it)
      device         cpu | cuda | cuda:N: where the model computes
      forward        eager | segmented (FORWARD_MODES, artifact/model/options.py)
      capture        segmented on CUDA: whether a forward may capture a graph; False for a timed or profiled
                     run (a shape not captured earlier then runs eagerly, counted in RunResult.segments)
      expert_kernel  grouped | loop (EXPERT_KERNELS): how a group of experts computes

    The forward mode and kernel are checked where a ForwardOptions is made (check_forward, check_kernel),
    which making a RunOptions does at once: a bad value fails here, before any weight is read."""

    decode: DecodeConfig = DecodeConfig()
    device: str = "cpu"
    forward: str = DEFAULT_FORWARD
    capture: bool = True
    expert_kernel: str = DEFAULT_KERNEL

    def __post_init__(self):
        if not isinstance(self.decode, DecodeConfig):
            raise SettingError(f"RunOptions.decode must be a DecodeConfig, got {type(self.decode).__name__}")
        if self.forward == "segmented" and self.decode.mode != "cached":  # segments run over the KV cache
            raise SettingError(
                f"forward segmented needs mode cached (mode {self.decode.mode} runs every forward eagerly)"
            )
        self.forward_options()

    def forward_options(
        self, backend: ExpertBackend | None = None, predict_next: bool = False
    ) -> ForwardOptions:
        """The options every forward of the run gets (the one place a run makes them): the run's mode, capture
        and kernel, with its expert backend and whether demands carry the next layer's prediction."""
        return ForwardOptions(
            self.forward,
            predict_next=predict_next,
            backend=backend,
            capture=self.capture,
            expert_kernel=self.expert_kernel,
        )


def check_device(device: str) -> None:
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise SettingError(f"unknown device {device!r}; expected cpu, cuda or cuda:N") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda asked for, but torch.cuda.is_available() is False")


@dataclass
class RunStats:
    """What a run did: the decoder's totals over its batches, and for an offloaded run the engine's counts
    (artifact/offload/backend/cache.py COUNTS, per phase in by_phase) and the link's figures (None when
    resident)."""

    forwards: int  # denoising forwards
    prefill_forwards: int
    tokens_generated: int
    seconds: float
    batches: int
    forward_host_ms: list[float]  # per denoising forward, in run order
    forward_wall_ms: list[float]
    tokens_per_second: float
    tokens_per_forward: float
    demand_hits: int | None = None
    demand_misses: int | None = None
    speculative_transfers: int | None = None
    prefetch_hits: int | None = None
    wasted_prefetches: int | None = None
    bytes_h2d: int | None = None
    by_phase: dict[str, dict[str, int]] | None = None
    transfers: int | None = None
    link_bytes: int | None = None
    stall_seconds: float | None = None
    link_busy_seconds: float | None = None
    achieved_gbps: float | None = None
    cache_experts: int | None = None
    policy: str = "resident"
    link: str | None = None
    link_priority: str | None = None
    offload: bool = False
    link_bandwidth_gbps: float | None = None
    forward: str = DEFAULT_FORWARD  # FORWARD_MODES
    threads: int | None = None  # torch threads, where a caller records them

    def as_dict(self) -> dict:
        """The stats as one flat dict (JSON, tables): a resident run leaves out the engine's and link's
        keys."""
        out = dataclasses.asdict(self)
        if not self.offload:
            out = {k: v for k, v in out.items() if k not in OFFLOAD_ONLY}
        if self.threads is None:
            del out["threads"]
        return out


OFFLOAD_ONLY = (
    "demand_hits",
    "demand_misses",
    "speculative_transfers",
    "prefetch_hits",
    "wasted_prefetches",
    "bytes_h2d",
    "by_phase",
    "transfers",
    "link_bytes",
    "stall_seconds",
    "link_busy_seconds",
    "achieved_gbps",
    "cache_experts",
    "link",
    "link_priority",
    "link_bandwidth_gbps",
)


@dataclass
class RunResult:
    tokens: list[list[int]]
    stats: RunStats
    trace: Trace | None = None
    generations: list = field(default_factory=list)
    segments: SegmentCounts | None = None  # forward "segmented": what its programs did in this run


def expert_bytes(loaded: Loaded) -> int:
    """Bytes of one routed expert as loaded (what one transfer moves)."""
    return loaded.cfg.expert_params * loaded.experts.element_size()


def run_meta(
    loaded: Loaded, prompt_ids: list[str], batch_size: int, dc: DecodeConfig, task: str | None
) -> dict:
    """What makes two runs the same run (the oracle's premise): model, prompts, batching, decoding."""
    cfg = loaded.cfg
    return {
        "model": cfg.name,
        "config_hash": cfg.config_hash(),
        "task": task,
        "prompt_ids": list(prompt_ids),
        "batch_size": batch_size,
        "decode": dataclasses.asdict(dc),
        "moe_layers": cfg.moe_layers,
        "num_experts": cfg.num_experts,
        "expert_bytes": expert_bytes(loaded),
    }


# what an oracle trace must share with the run
ORACLE_KEYS = ("config_hash", "prompt_ids", "batch_size", "decode")


def check_oracle_before_load(
    trace: Trace, cfg: ModelConfig, prompt_ids: list[str], batch_size: int, dc: DecodeConfig
) -> None:
    """check_oracle_trace from what is known before the weights are read: every key it compares comes from
    the config (with the tokenizer's mask/eos ids), the prompts and the decoding settings, so a trace of
    another run is refused before a long load, not after it."""
    check_oracle_trace(
        trace,
        {
            "config_hash": cfg.config_hash(),
            "prompt_ids": list(prompt_ids),
            "batch_size": batch_size,
            "decode": dataclasses.asdict(dc),
        },
    )


def check_oracle_trace(trace: Trace, meta: dict) -> None:
    diff = [k for k in ORACLE_KEYS if trace.meta.get(k) != meta.get(k)]
    if diff:
        raise TraceError(
            f"{trace.path}: the oracle trace is of another run (differs in {diff}); record it "
            "with the same model, prompts, batch size and decoding settings"
        )


def decode_prompts(
    loaded: Loaded,
    prompts: list[list[int]],
    batch_size: int,
    options: RunOptions,
    *,
    spec: OffloadSpec | None = None,
    oracle: Trace | None = None,
    record: bool = False,
    record_logits: bool = False,
    prompt_ids: list[str] | None = None,
    task: str | None = None,
) -> RunResult:
    """Decode `prompts` in batches of `batch_size` as `options` say (RunOptions: decoding, device, forward
    mode, capture, kernel). Offloaded when `spec` is given (an oracle policy reads `oracle`, a trace of an
    identical earlier run); record: the routing trace (RunResult.trace), record_logits: every step's logits
    (RunResult.generations); prompt_ids and task name the prompts in the trace's meta."""
    if not isinstance(options, RunOptions):
        raise SettingError(
            "decode_prompts takes a RunOptions as its 4th argument, got "
            f"{type(options).__name__} "
            "(a DecodeConfig goes inside it: RunOptions(decode=dc, ...))"
        )
    if batch_size < 1 or batch_size > MAX_BATCH:
        raise SettingError(f"batch size must be 1-{MAX_BATCH}, got {batch_size}")
    if not prompts:
        raise SettingError("no prompts to run")
    device, dc = options.device, options.decode
    check_device(device)
    cfg = loaded.cfg
    prompt_ids = prompt_ids or [f"prompt{i}" for i in range(len(prompts))]
    meta = run_meta(loaded, prompt_ids, batch_size, dc, task)
    model = loaded.model
    engine = make_engine(loaded, spec, oracle, meta, device) if spec is not None else None
    if engine is None and not isinstance(model.backend, ResidentExperts):
        # Kept after the run: moving every expert to the device is worth doing once, not per run.
        install(model, ResidentExperts(loaded.experts.to(device), cfg))
    recorder = TraceRecorder() if record else None
    # Cross-layer predictions (Demand.predicted): recorded in every trace (schema 2) so the simulator can
    # replay the cross_layer policy, and computed for a policy that reads them live.
    predict = record or bool(spec is not None and check_policy(spec.policy).needs_prediction)
    forward_options = options.forward_options(engine or model.backend, predict)
    before = dataclasses.replace(model.programs.counts)
    gens = []
    try:
        with model.listening(recorder) if recorder else contextlib.nullcontext():
            for i in range(0, len(prompts), batch_size):
                gens.append(
                    generate(
                        model,
                        prompts[i : i + batch_size],
                        dc,
                        record_logits=record_logits,
                        options=forward_options,
                    )
                )
        engine_stats = engine.finish() if engine else {}
    finally:
        if engine is not None:
            engine.link.close()
    stats = merge_stats([g.stats for g in gens], options.forward)
    if spec is not None:
        stats = dataclasses.replace(
            stats,
            **engine_stats,
            policy=spec.policy,
            link=spec.link,
            link_priority=spec.link_priority,
            offload=True,
            link_bandwidth_gbps=getattr(engine.link, "bandwidth_gbps", None),
        )
    segments = model.programs.counts.since(before) if options.forward == "segmented" else None
    trace = recorder.trace(meta) if recorder else None
    return RunResult([t for g in gens for t in g.tokens], stats, trace, gens, segments)


def make_engine(
    loaded: Loaded, spec: OffloadSpec, oracle: Trace | None, meta: dict, device: str
) -> OffloadEngine:
    """The run's offloaded engine (not installed on the model: the run passes it in its forwards' options)."""
    cfg = loaded.cfg
    spec.check(cfg.num_experts, device)
    future = None
    if check_policy(spec.policy).needs_trace:
        if oracle is None:
            raise SettingError(
                f"policy {spec.policy!r} needs --oracle-trace FILE from an identical earlier run"
            )
        check_oracle_trace(oracle, meta)
        future = oracle.future()
    pol = spec.make_policy(len(cfg.moe_layers), cfg.num_experts, future)
    link = spec.make_link(device, meta["expert_bytes"])
    return offload(loaded.model, loaded.experts, spec.capacity, pol, link, device)


def merge_stats(parts: list[DecodeStats], forward: str = DEFAULT_FORWARD) -> RunStats:
    """The batches' decoder stats as one resident run's (the caller adds the engine's)."""
    forwards = sum(p.forwards for p in parts)
    tokens = sum(p.tokens_generated for p in parts)
    seconds = sum(p.seconds for p in parts)
    return RunStats(
        forwards=forwards,
        prefill_forwards=sum(p.prefill_forwards for p in parts),
        tokens_generated=tokens,
        seconds=seconds,
        batches=len(parts),
        forward_host_ms=[x for p in parts for x in p.forward_host_ms],
        forward_wall_ms=[x for p in parts for x in p.forward_wall_ms],
        tokens_per_second=tokens / seconds if seconds else float("nan"),
        tokens_per_forward=tokens / max(forwards, 1),
        forward=forward,
    )
