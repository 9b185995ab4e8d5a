"""Decode prompts through the model, resident or offloaded, and collect tokens, statistics and a trace.

This is the one place that wires checkpoint -> backend (resident, or the engine that build_engine makes from
the RunSpec) -> decoder -> stats and trace; the CLI, the bench and the notebooks all call decode_prompts.

A run is one RunSpec (artifact/offload/spec.py: decoding, device, forward mode, capture, kernel, and when
`capacity` is set, how it offloads), made once where the run is set up (Settings.run_spec for a profile, the
CLI from its flags) and passed whole: every forward's ForwardOptions comes from RunSpec.forward_options, the
engine from build_engine(spec, ...). What is recorded and which prompts are the call's own arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

from artifact.errors import DeviceError, SettingError
from artifact.model.checkpoint import Loaded
from artifact.model.config import ModelConfig
from artifact.model.decode import MAX_BATCH, DecodeConfig, DecodeStats, generate
from artifact.model.experts import ResidentExperts
from artifact.model.options import DEFAULT_FORWARD
from artifact.model.segments import SegmentCounts
from artifact.offload.backend.engine import OffloadEngine, build_engine, install
from artifact.offload.backend.plans import COUNTS
from artifact.offload.backend.store import HostStore, check_slots_fit
from artifact.offload.policy.policies import check_policy
from artifact.offload.replay.trace import Trace, TraceError, TraceRecorder
from artifact.offload.spec import RunSpec


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
    *COUNTS,
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
    spec: RunSpec,
    *,
    oracle: Trace | None = None,
    record: bool = False,
    record_logits: bool = False,
    prompt_ids: list[str] | None = None,
    task: str | None = None,
) -> RunResult:
    """Decode `prompts` in batches of `batch_size` as `spec` says (RunSpec: decoding, device, forward mode,
    capture, kernel; offloaded when spec.capacity is set, an oracle policy reading `oracle`, a trace of an
    identical earlier run). record: the routing trace (RunResult.trace), record_logits: every step's logits
    (RunResult.generations); prompt_ids and task name the prompts in the trace's meta."""
    if not isinstance(spec, RunSpec):
        raise SettingError(
            f"decode_prompts takes a RunSpec as its 4th argument, got {type(spec).__name__} "
            "(a DecodeConfig goes inside it: RunSpec(decode=dc, ...))"
        )
    if batch_size < 1 or batch_size > MAX_BATCH:
        raise SettingError(f"batch size must be 1-{MAX_BATCH}, got {batch_size}")
    if not prompts:
        raise SettingError("no prompts to run")
    device, dc = spec.device, spec.decode
    check_device(device)
    cfg = loaded.cfg
    prompt_ids = prompt_ids or [f"prompt{i}" for i in range(len(prompts))]
    meta = run_meta(loaded, prompt_ids, batch_size, dc, task)
    model = loaded.model
    engine = make_engine(loaded, spec, oracle, meta) if spec.offloaded else None
    if engine is None and not isinstance(model.backend, ResidentExperts):
        # Kept after the run: moving every expert to the device is worth doing once, not per run.
        install(model, ResidentExperts(loaded.experts.to(device), cfg))
    recorder = TraceRecorder() if record else None
    # Cross-layer predictions (Demand.predicted): recorded in every trace (schema 2) so the simulator can
    # replay the cross_layer policy, and computed for a policy that reads them live.
    predict = record or bool(spec.offloaded and check_policy(spec.policy).needs_prediction)
    forward_options = spec.forward_options(engine or model.backend, predict)
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
    stats = merge_stats([g.stats for g in gens], spec.forward)
    if engine is not None:
        stats = dataclasses.replace(
            stats,
            **engine_stats,
            policy=spec.policy,
            link=spec.link,
            link_priority=spec.link_priority,
            offload=True,
            link_bandwidth_gbps=getattr(engine.link, "bandwidth_gbps", None),
        )
    segments = model.programs.counts.since(before) if spec.forward == "segmented" else None
    trace = recorder.trace(meta) if recorder else None
    return RunResult([t for g in gens for t in g.tokens], stats, trace, gens, segments)


def make_engine(loaded: Loaded, spec: RunSpec, oracle: Trace | None, meta: dict) -> OffloadEngine:
    """The run's offloaded engine (not installed on the model: the run passes it in its forwards' options)."""
    cfg = loaded.cfg
    spec.fits(cfg.num_experts)
    future = None
    if check_policy(spec.policy).needs_trace:
        if oracle is None:
            raise SettingError(
                f"policy {spec.policy!r} needs --oracle-trace FILE from an identical earlier run"
            )
        check_oracle_trace(oracle, meta)
        future = oracle.future()
    check_slots_fit(cfg, spec.capacity, loaded.experts.dtype, spec.device, weights_loaded=True)
    store = HostStore(loaded.experts, cfg.moe_layers, pin=torch.device(spec.device).type == "cuda")
    return build_engine(spec, cfg, store, cfg, future=future, slot_pool=loaded.model.slot_pool)


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
