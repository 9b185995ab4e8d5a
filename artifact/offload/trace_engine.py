"""Stream-driven engine: the offloaded engine driven by a routing trace (recorded or synthetic) instead of
the model, so throughput can be measured on routing the model does not produce.

Each demand of the trace goes, in stream order, through the same OffloadEngine, ExpertCache, policy and
link a model-driven run uses; the counts are therefore the model-driven run's (and the simulator's) for
the same stream. What the model would compute is replaced by two calibrated costs:

  expert compute   the demanded expert's FFN on `count` tokens (the demand's token count for it), a real
                   matmul that reads the slot's weights (so a compute that skipped its copy's wait would
                   read stale weights; `verify=True` checks every output against the host store's expert),
                   padded by a spin to `compute_us_per_expert` when that is given;
  everything else  attention, router, dense layers and the decoder's bookkeeping, as a spin of
                   `other_us_per_demand` before each (forward, MoE layer) demand is served: the time in
                   which a prefetch issued at the previous layer lands.

`calibrate` measures both on a resident model run: the time the model spends between receiving an expert
and asking for the next one (its per-expert compute: gather, FFN, weighting, scatter), and the rest of
the run's time spread over its demands. Both spins are host time: they model a CPU run on the emulated
link (on a GPU leave the calibration empty and let the matmul run on the device). The experts are seeded
random tensors of the calibrated model's shape (values do not change what is loaded or how long it takes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from artifact.errors import SettingError
from artifact.model.config import expert_params_of
from artifact.model.decode import generate
from artifact.model.experts import ExpertWeights, ResidentExperts, expert_ffn, expert_views, grouped_ffn
from artifact.model.routing import Demand
from artifact.offload.backend.engine import Layout, build_engine
from artifact.offload.backend.plans import PHASES
from artifact.offload.backend.store import HostStore
from artifact.offload.links.costs import Costs
from artifact.offload.links.timeline import VirtualClock
from artifact.offload.policy.policies import check_policy
from artifact.offload.replay.trace import KINDS, Trace
from artifact.offload.runner import check_device
from artifact.offload.spec import RunSpec
from artifact.validate import check_number


@dataclass(frozen=True)
class ExpertShape:
    """The matrices of one routed expert (expert_views reads these two names)."""

    hidden_size: int  # D
    moe_intermediate_size: int  # I

    @property
    def params(self) -> int:
        return expert_params_of(self.hidden_size, self.moe_intermediate_size)


@dataclass(frozen=True)
class Calibration:
    """Per-demand costs the stream replaces the model by (microseconds on the machine that measured them)."""

    compute_us_per_expert: float | None = None  # None: the bare matmul's own time
    other_us_per_demand: float = 0.0  # non-expert time per (forward, MoE layer)
    source: str = "given"

    def __post_init__(self):
        if self.compute_us_per_expert is not None:
            check_number("compute_us_per_expert", self.compute_us_per_expert, low=0)
        check_number("other_us_per_demand", self.other_us_per_demand, low=0)


# ---------------------------------------------------------------------------------------------
# Calibration on the model
# ---------------------------------------------------------------------------------------------
class TimedExperts:
    """A backend wrapper that times the model's work between receiving an expert and asking for the next."""

    def __init__(self, inner):
        self.inner = inner
        self.expert_seconds = 0.0
        self.experts_computed = 0
        self.demands = 0

    def groups(self, demand: Demand):
        self.demands += 1
        for g in self.inner.groups(demand):
            t0 = time.perf_counter()
            yield g  # the model computes this group before resuming us
            self.expert_seconds += time.perf_counter() - t0
            self.experts_computed += len(g.experts)


def calibrate(loaded, prompts: list[list[int]], spec: RunSpec, batch_size: int = 1) -> Calibration:
    """Per-expert compute and per-demand other time of a resident run of `loaded` on `prompts`, decoded and
    computed as `spec` says (its decoding, forward mode and expert kernel; one run after a warm-up forward
    of the first prompt, so first-call allocations are not counted). An offloaded spec is refused: the
    calibration measures the model's own compute, with every expert resident."""
    if spec.offloaded:
        raise SettingError("calibrate times a resident run: give a RunSpec without a capacity")
    model = loaded.model
    own = model.backend
    resident = own if isinstance(own, ResidentExperts) else ResidentExperts(loaded.experts, loaded.cfg)
    timed = TimedExperts(resident)
    options = spec.forward_options(backend=timed)
    dc = spec.decode
    generate(model, prompts[:1], dc, options=options)  # warm-up
    timed.__init__(resident)
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        generate(model, prompts[i : i + batch_size], dc, options=options)
    total = time.perf_counter() - t0
    if not timed.experts_computed:
        raise ValueError("calibration run computed no routed experts (empty prompts?)")
    return Calibration(
        compute_us_per_expert=1e6 * timed.expert_seconds / timed.experts_computed,
        other_us_per_demand=1e6 * max(total - timed.expert_seconds, 0.0) / timed.demands,
        source=f"{loaded.cfg.name}: {len(prompts)} prompts, {timed.demands} demands, "
        f"{timed.experts_computed} expert computes ({spec.forward}, {spec.expert_kernel})",
    )


# ---------------------------------------------------------------------------------------------
# The stream's compute
# ---------------------------------------------------------------------------------------------
def expert_compute(weights: ExpertWeights, x: torch.Tensor) -> torch.Tensor:
    """The FFN of `x` (n, D) through one expert's weights (the reference a verified run compares with)."""
    return expert_ffn(x, weights)  # (n, D)


def group_compute(group, tokens: list[int], x: torch.Tensor, kernel: str) -> list[torch.Tensor]:
    """The experts of one group, each on its first tokens[j] rows of `x` (n, D), with the run's expert
    kernel (grouped_ffn, as the model computes a group: "grouped" one grouped GEMM where torch has one,
    "loop" one call per expert). -> each member's (tokens[j], D) output, in the group's order."""
    order = sorted(range(len(group.rows)), key=lambda j: group.rows[j])  # grouped_ffn wants rows ascending
    spans, parts, start = [], [], 0
    for j in order:
        n = tokens[j]
        spans.append((group.rows[j], start, start + n))
        parts.append(x[:n])
        start += n
    per_row = [0] * (max(group.rows) + 1)
    for j in order:
        per_row[group.rows[j]] = tokens[j]
    ys = grouped_ffn(torch.cat(parts), group, spans, list(accumulate(per_row)), kernel)  # (sum n, D)
    out = [None] * len(order)
    for j, (_, a, b) in zip(order, spans):
        out[j] = ys[a:b]
    return out


def _spin_until(deadline: float) -> None:
    while time.perf_counter() < deadline:  # microsecond costs: sleep overshoots by ~100 us
        pass


def make_store(
    trace: Trace, shape: ExpertShape, seed: int = 0, pin: bool = False, dtype: torch.dtype = torch.float32
) -> HostStore:
    """Seeded random experts of `shape` for every (MoE layer, expert) of the trace, packed as the engine
    expects: (L_moe, E, 3 I D) (small values, so FFN outputs stay finite)."""
    layers, E = trace.meta["moe_layers"], int(trace.meta["num_experts"])
    g = torch.Generator().manual_seed(seed)
    packed = (torch.randn(len(layers), E, shape.params, generator=g) * 0.05).to(dtype)  # (L_moe, E, P)
    return HostStore(packed, layers, pin=pin)


def run_stream(
    trace: Trace,
    spec: RunSpec,
    shape: ExpertShape,
    calibration: Calibration = Calibration(),
    store: HostStore | None = None,
    seed: int = 0,
    verify: bool = False,
    costs: Costs | None = None,
) -> dict:
    """Serve every demand of `trace` through an offloaded engine built from `spec` (on spec.device; the
    oracle's future is the trace itself), computing as described in the module docstring with the spec's
    expert kernel. Returns the stats of a model-driven run: the cache counts, the link's transfers, bytes,
    busy and stall seconds, wall seconds, forwards (and prefill forwards), plus demands, accesses and
    forwards_per_second.

    With `costs` the run is on virtual time (clock "virtual", see run_virtual): nothing sleeps, spins or
    computes, and `seconds` is the modelled time."""
    check_stream_spec(spec, "a stream-driven run")
    if costs is not None:
        return run_virtual(trace, spec, costs, seed=seed)
    device = spec.device
    E = int(trace.meta["num_experts"])
    check_device(device)
    if store is None:
        store = make_store(trace, shape, seed, pin=torch.device(device).type == "cuda")
    if store.packed.shape[2] != shape.params or store.num_experts != E:
        raise ValueError(
            f"host store holds {tuple(store.packed.shape)} experts; the trace needs "
            f"(L_moe, {E}, {shape.params})"
        )
    engine = _engine(trace, spec, shape, store)
    link = engine.link
    demands = trace.demands
    tokens = max((max(d.counts) for d in demands if d.counts), default=1)
    g = torch.Generator().manual_seed(seed + 1)
    # (T_max, D) tokens
    x = torch.randn(tokens, shape.hidden_size, generator=g).to(device, store.packed.dtype)
    other = calibration.other_us_per_demand * 1e-6
    per_expert = calibration.compute_us_per_expert
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    try:
        sync()
        t0 = time.perf_counter()
        for d in demands:
            if other:
                _spin_until(time.perf_counter() + other)
            count = dict(zip(d.experts, d.counts, strict=True))
            for g in engine.groups(d):
                start = time.perf_counter()
                n = [count[e] for e in g.experts]
                ys = group_compute(g, n, x, spec.expert_kernel)
                if verify:
                    for e, y in zip(g.experts, ys):
                        ref = expert_compute(
                            expert_views(store.expert(d.layer, e).to(device), shape), x[: count[e]]
                        )
                        assert torch.equal(y, ref), f"layer {d.layer} expert {e}: computed from a stale slot"
                if per_expert is not None:  # the calibrated cost of each of the group's experts
                    _spin_until(start + per_expert * 1e-6 * len(n))
        stats = engine.finish()
        sync()
        seconds = time.perf_counter() - t0
    finally:
        link.close()
    return _totals(stats, trace, spec, link, seconds)


def check_stream_spec(spec: RunSpec, what: str) -> None:
    """A stream-driven run replaces the model's forward: it cannot run one segmented. Refused in one line."""
    if not isinstance(spec, RunSpec):
        raise SettingError(f"{what} takes a RunSpec, got {type(spec).__name__}")
    if spec.forward != "eager":
        raise SettingError(
            f"{what} has no model forward to run {spec.forward!r} (the trace replaces it): give forward eager"
        )
    if not spec.offloaded:
        raise SettingError(
            f"{what} serves the trace through an offloaded engine: give the RunSpec a capacity"
        )


def _engine(trace: Trace, spec: RunSpec, shape: ExpertShape, store: HostStore, clock=None, expert_bytes=None):
    """The engine of a stream run; with `clock` (virtual time) every copy stands for `expert_bytes`
    whatever the store's rows hold."""
    future = trace.future() if check_policy(spec.policy).needs_trace else None
    layout = Layout.of_meta(trace.meta)
    return build_engine(spec, layout, store, shape, future=future, clock=clock, expert_bytes=expert_bytes)


# What a stream run reports of its RunSpec beside its counts (the options it ran with).
REPORTED = ("policy", "link", "link_priority", "lookahead", "tau", "expert_kernel")


def _totals(stats: dict, trace: Trace, spec: RunSpec, link, seconds: float) -> dict:
    prefill = trace.kind == KINDS.index("prefill")
    forwards = len(np.unique(trace.forward[~prefill]))  # denoising forwards, as the decoder counts them
    prefills = len(np.unique(trace.forward[prefill]))
    stats.update(
        seconds=seconds,
        forwards=forwards,
        prefill_forwards=prefills,
        demands=len(trace),
        accesses=trace.accesses,
        forwards_per_second=forwards / seconds if seconds else float("nan"),
        **{k: getattr(spec, k) for k in REPORTED},
        link_bandwidth_gbps=getattr(link, "bandwidth_gbps", None),
        offload=True,
        driven_by="stream",
    )
    return stats


# ---------------------------------------------------------------------------------------------
# Virtual time
# ---------------------------------------------------------------------------------------------
STAND_IN = ExpertShape(1, 1)  # the store of a virtual run: 3 numbers per expert (bytes come from costs)


def run_virtual(trace: Trace, spec: RunSpec, costs: Costs, seed: int = 0) -> dict:
    """The stream run on virtual time: the same engine, cache, policy and link (an EmulatedLink on a
    VirtualClock, every copy costs.expert_bytes), with each action charged its modelled cost
    (offload/links/costs.py) instead of being done. The host store is a stand-in (STAND_IN) on the CPU, so
    any model shape replays in kilobytes. The costs model eager forwards with the grouped expert kernel
    (kernels_per_group launches a group): a spec asking for another kernel is refused.

    Besides run_stream's stats, `time` holds the modelled split in seconds: compute (non-expert), experts,
    host, stall, and the same per phase (prefill, first, later), plus steps."""
    check_stream_spec(spec, "a virtual-time run")
    if spec.link != "emulated":
        raise SettingError(
            f"a virtual-time run models the link on its timeline: give link 'emulated', not {spec.link!r}"
        )
    if spec.expert_kernel != "grouped":
        raise SettingError(
            f"a virtual-time run's costs model the grouped expert kernel, not {spec.expert_kernel!r}: "
            "give expert_kernel grouped"
        )
    spec = spec.replace(device="cpu")  # nothing computes: the stand-in slots live on the host
    clock = VirtualClock()
    store = make_store(trace, STAND_IN, seed)
    engine = _engine(trace, spec, STAND_IN, store, clock=clock, expert_bytes=costs.expert_bytes)
    link = engine.link
    first_layer = trace.meta["moe_layers"][0]
    split = {ph: dict.fromkeys(("compute", "experts", "host", "stall", "seconds"), 0.0) for ph in PHASES}
    try:
        for d, phase in zip(trace.demands, trace.phases):
            acc = split[PHASES[phase]]
            t0, stall0, copies0 = clock(), link.stats.stall_seconds, link.stats.transfers
            c = costs.compute(d, d.layer == first_layer)
            h = costs.host()
            clock.advance(c)
            clock.advance(h)
            acc["compute"] += c
            count = dict(zip(d.experts, d.counts, strict=True))
            first = True
            for g in engine.groups(d):
                if first:  # the host issued the layer's copies (Python per copy) before computing
                    dh = costs.per_copy * (link.stats.transfers - copies0)
                    clock.advance(dh)
                    h += dh
                    first = False
                dt = costs.group([count[e] for e in g.experts])
                clock.advance(dt)
                acc["experts"] += dt
            acc["host"] += h
            acc["stall"] += link.stats.stall_seconds - stall0
            acc["seconds"] += clock() - t0
        stats = engine.finish()
    finally:
        link.close()
    stats = _totals(stats, trace, spec, link, clock())
    totals = {k: sum(p[k] for p in split.values()) for k in ("compute", "experts", "host", "stall")}
    stats["time"] = {**totals, "by_phase": split}
    stats["link_bandwidth_gbps"] = link.bandwidth_gbps
    return stats
