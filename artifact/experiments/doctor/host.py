"""Host-bound cells in advance: each cell's predicted host share of wall time per forward, per forward mode.

A GPU cell whose host ms per forward exceed thresholds.HOST_SHARE_LIMIT of its wall ms is ruled inconclusive
(pairs.host_shares: per policy the median, the largest over the policies). Here the performance model runs
each cell and policy on virtual time (trace_engine.run_virtual, one block of the synthetic stream the time
estimate prices), and the host's time is counted as the run charges it: every host-issued launch x its cost
+ every copy x copy_host_us + every (forward, MoE layer) x (sync_us + plan_us), over the modelled wall.

  eager      the hardware profile's costs (hardware.py: on the h200 and a5000 profiles the H200 machine's
             measured host, 120 launches per layer at 41.5 us, 59.8 us per copy; the eager engine measured
             74-100% host there, docs/host_path.md): kernels_per_layer per (forward, MoE layer) and dense
             layer, 2 for the LM head, kernels_per_group per expert group, each charged as the model does.
  segmented  the graphs check's host costs where data/gpu_check/h200_graphs.json has them (graphs_on:
             launches per MoE layer at their measured cost); until then ASSUMED: one graph replay per
             (forward, MoE layer), one more at the first, and one per expert group, each REPLAY_US of host
             time on top of the rooflines' device compute (the host issues the replay, then waits at the
             router sync), and the link's measured host time per copy (segments leave the copy path alone).
"""

from __future__ import annotations

import dataclasses

from artifact.experiments.criteria import thresholds
from artifact.experiments.doctor.report import Cell, HostCell
from artifact.experiments.hardware import HARDWARE, graphs_on, h200_graphs
from artifact.experiments.settings import Settings
from artifact.offload.links.costs import Costs, Shape
from artifact.offload.replay.sim import capacity_for
from artifact.offload.trace_engine import run_virtual

# Host time of one CUDA graph replay of a segment or an expert stage, us: ASSUMED, unmeasured (no graphs check
# has run on a GPU), the top of the 10-20 us a graph launch and its small index copy cost the host.
REPLAY_US = 20.0


class CountedCosts(Costs):
    """The model's costs with the host's launches counted as they are charged. Eager (`replay` None): the
    profile's charges, kernels_per_layer per layer, 2 for the LM head, kernels_per_group per group. Segmented:
    `per_layer` launches per (forward, MoE layer) (one more at the first) and `per_group` per group, each
    `replay` seconds added to the rooflines' device compute."""

    def __init__(self, hw, shape, replay: float | None = None, per_layer: int = 1, per_group: int = 1):
        super().__init__(hw, shape)
        self.replay, self.per_layer, self.per_group = replay, per_layer, per_group
        self.dev = Costs(dataclasses.replace(hw, launch_us=0.0), shape)
        self.launches = 0

    def compute(self, d, first_layer: bool) -> float:
        if self.replay is None:
            k = self.hw.kernels_per_layer
            self.launches += k + ((self.shape.dense_layers * k + 2) if first_layer else 0)
            return super().compute(d, first_layer)
        n = self.per_layer + (1 if first_layer else 0)
        self.launches += n
        return self.dev.compute(d, first_layer) + n * self.replay

    def group(self, tokens: list[int]) -> float:
        if self.replay is None:
            self.launches += self.hw.kernels_per_group
            return super().group(tokens)
        self.launches += self.per_group
        return self.dev.group(tokens) + self.per_group * self.replay

    @property
    def launch_seconds(self) -> float:
        return self.hw.launch_us * 1e-6 if self.replay is None else self.replay

    def device_only(self) -> Costs:
        return self.dev


def segmented_costs(name: str, shape: Shape) -> tuple[CountedCosts, str]:
    """(the segmented forward's costs on hardware profile `name`, what they rest on): measured by the graphs
    check where its report has the figures, else assumed (module docstring)."""
    g = h200_graphs()
    if not {"launch_us", "kernels_per_layer", "copy_host_us"} & set(g["unmeasured"]):
        hw = graphs_on(name)
        costs = CountedCosts(hw, shape, hw.launch_us * 1e-6, hw.kernels_per_layer, 0)
        return costs, f"segmented: the graphs check's host costs ({g['source']})"
    hw = HARDWARE[name]
    return CountedCosts(hw, shape, REPLAY_US * 1e-6), (
        f"segmented: assumed ({g['source']}): one graph replay per layer and per expert group at "
        f"{REPLAY_US:g} us of host time each, and the link's measured {hw.copy_host_us:g} us per copy"
    )


def host_shares(P: Settings, cfg, nbytes: int, cells: list[Cell]) -> tuple[list[HostCell], list[str]]:
    """Each cell's predicted host share under the profile's forward, and under the segmented forward too when
    the profile's is eager and a cell is host-bound; with what the figures rest on."""
    from artifact.experiments.studies.performance_model import estimate as est

    name = est.gpu_hardware(P)
    shape = Shape.of(cfg, nbytes)
    novelty, spread = est.paper_point_stats(P)
    eager = HARDWARE[name]
    basis = [
        f"eager: the {name} profile's host costs ({eager.kernels_per_layer} launches per layer at "
        f"{eager.launch_us:g} us, {eager.copy_host_us:g} us per copy; hardware.py)"
    ]
    seg = segmented_costs(name, shape)
    streams, out, at = {}, [], []
    for c in cells:
        W = c.working_set if c.measured_w else est.stated_working_set(c.batch_size, cfg, novelty)
        if (c.batch_size, W) not in streams:
            streams[c.batch_size, W] = est.block_stream(P, cfg, c.batch_size, W, novelty, spread)
        out.append(HostCell(c.batch_size, c.cache_ratio, {}, {}))
        at.append((streams[c.batch_size, W], capacity_for(c.cache_ratio, W, cfg.num_experts)))

    def price(mode: str) -> None:
        make = (lambda: CountedCosts(eager, shape)) if mode == "eager" else (lambda: _fresh(seg[0]))
        for h, (stream, C) in zip(out, at):
            h.share[mode], h.split[mode] = cell_share(P, stream, make, C)

    price(P.forward)
    if P.forward == "eager" and any(h.share["eager"][1] > thresholds.HOST_SHARE_LIMIT for h in out):
        price("segmented")
    if any("segmented" in h.share for h in out):
        basis.append(seg[1])
    basis.append("W as in the time estimate; every copy counted at the profile's host time per copy")
    return out, basis


def _fresh(c: CountedCosts) -> CountedCosts:
    return CountedCosts(c.hw, c.shape, c.replay, c.per_layer, c.per_group)


def cell_share(P: Settings, stream, make, C: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((low, high) host share, the largest over P's policies; (launch ms, copy ms) per forward of the policy
    with the highest) at C slots; `make()` gives fresh CountedCosts for each run. The model charges a copy's
    host time only when it is issued before its layer's first expert group; the others' time (`rest`) either
    overlaps the link's stall (high: host over the modelled wall, at most 1) or adds to the wall (low)."""
    from artifact.experiments.studies.performance_model.virtual import priced_spec

    low = high = -1.0
    split = (0.0, 0.0)
    for policy in P.policies:
        costs = make()
        spec = P.run_spec(C, policy).replace(link_gbps=None, forward="eager")  # a run on virtual time
        st = run_virtual(stream, priced_spec(costs, spec), costs)
        n = max(st["forwards"], 1)
        launch = 1e3 * costs.launches * costs.launch_seconds / n
        copy = 1e3 * st["transfers"] * costs.hw.copy_host_us * 1e-6 / n
        sync = 1e3 * len(stream.demands) * costs.host() / n
        wall, charged = 1e3 * st["seconds"] / n, 1e3 * st["time"]["host"] / n
        rest = max(0.0, copy + sync - charged)  # the launches are on the clock in the compute charges
        host = launch + copy + sync
        low = max(low, host / (wall + rest))
        if min(1.0, host / wall) > high:
            high, split = min(1.0, host / wall), (launch, copy)
    return (low, high), split
