"""Which engine the model prices, and how much of a modelled step is host work.

Two engines (ENGINES), on the same virtual clock, cache, policies and link timeline; only the compute charges
differ:

  eager       the hardware profile's costs as they are (offload/links/costs.py): PyTorch launches one kernel
              at a time, kernels_per_layer per (forward, MoE layer)'s non-expert forward and kernels_per_group
              per expert group, each charge the slowest of its rooflines and its launches (launch_us each). On
              the h200 and a5000 profiles the launch costs are measured (gpu_check on an H200, hardware.py):
              the forward the stored H200 reports ran.
  segmented   the forward="segmented" engine (artifact/model/segments.py): the forward cut at the router
              syncs, each segment a CUDA graph replayed, so a (forward, MoE layer) issues one replay (two at
              the forward's first MoE layer: segment 0 with the dense layers, and the last segment with the LM
              head) and an expert group one replay. Each charge is REPLAY_US of host time plus its roofline
              compute (the host issues the replay, then waits at the router sync for the device: the two add,
              where the eager launches overlap the kernels they issue). The host time per copy and per layer
              stays the profile's: the copy path and the planning are the same Python in both engines.

REPLAY_US is an assumption, not a measurement: no graph replay cost of this engine has been measured on a GPU
(scripts/gpu_check_graphs.py measures `graph_replay_us` and the segmented rows' host ms per forward, but
data/gpu_check/h200_graphs.json does not exist; hardware.h200_graphs says so). It is the top of the 10-20 us
a CUDA graph launch and its small index copy cost the host, so the assumption leans towards host work.

Host work (`host_work`): a modelled step (model_run) is compute (non-expert) + experts + host + exposed
transfer (stall). Its device part is every compute charge on the device's rooflines alone (Costs.device_only:
FLOPs and memory reads, no launches), added up as the run charges them (Metered); its link part is the stall.
The rest is host work: the host term (the per-layer sync and planning, the Python per copy) plus the
launch-bound part of both compute terms (what the launches or replays add above the rooflines). The host
share is host work over the step, the modelled counterpart of a measured GPU cell's host ms over wall ms per
forward (rules.host_shares), ruled by the same limit (rules.host_bound, thresholds.HOST_SHARE_LIMIT); a cell's
share is the larger of its policies' (as host_shares takes the largest over the policies).
"""

from __future__ import annotations

import dataclasses

from artifact.errors import SettingError
from artifact.model.routing import Demand
from artifact.offload.links.costs import Costs, Hardware, Shape

EAGER, SEGMENTED = "eager", "segmented"
ENGINES = (EAGER, SEGMENTED)
# host time of one CUDA graph replay of a segment or an expert stage, us: ASSUMED, unmeasured (docstring)
REPLAY_US = 20.0


class SegmentedCosts(Costs):
    """The segmented engine's charges (module docstring): REPLAY_US of host time per replay plus the roofline
    compute of what it replays."""

    def __init__(self, hw: Hardware, shape: Shape, replay_us: float = REPLAY_US):
        if hw.calibrated:
            raise SettingError(
                f"the segmented engine is priced on rooflines; {hw.name!r} is a calibrated profile "
                "(its compute measured as a whole): price it eager"
            )
        super().__init__(hw, shape)
        self.replay = replay_us * 1e-6
        self.dev = Costs(dataclasses.replace(hw, launch_us=0.0), shape)

    def compute(self, d: Demand, first_layer: bool) -> float:
        return self.dev.compute(d, first_layer) + (2 if first_layer else 1) * self.replay

    def group(self, tokens: list[int]) -> float:
        return self.dev.group(tokens) + self.replay

    def device_only(self) -> Costs:
        return self.dev


def costs_for(hw: Hardware, shape: Shape, engine: str = EAGER) -> Costs:
    """The costs of `engine` (ENGINES) on `hw` for `shape`."""
    if engine == EAGER:
        return Costs(hw, shape)
    if engine == SEGMENTED:
        return SegmentedCosts(hw, shape)
    raise SettingError(f"unknown engine {engine!r}; choose one of {ENGINES}")


class Metered(Costs):
    """`base`'s charges, unchanged, with the device's part of each compute charge added up as the run makes
    it (`device`: seconds of non-expert compute and of experts on the rooflines alone)."""

    def __init__(self, base: Costs):
        super().__init__(base.hw, base.shape)
        self.base, self.dev = base, base.device_only()
        self.per_copy = base.per_copy
        self.device = {"compute": 0.0, "experts": 0.0}

    def compute(self, d: Demand, first_layer: bool) -> float:
        self.device["compute"] += self.dev.compute(d, first_layer)
        return self.base.compute(d, first_layer)

    def group(self, tokens: list[int]) -> float:
        self.device["experts"] += self.dev.group(tokens)
        return self.base.group(tokens)

    def host(self) -> float:
        return self.base.host()

    def device_only(self) -> Costs:
        return self.dev


def host_work(run: dict) -> dict:
    """A modelled run's (model_run's) step split by who paces it, seconds per step: `device` (the rooflines of
    both compute terms), `link` (the stall), `host` (the rest: the host term plus the launch-bound parts,
    `launch_compute` of the non-expert compute and `launch_experts` of the experts), and `share`, host over
    the step."""
    launch_c = run["compute_per_step"] - run["device_compute_per_step"]
    launch_e = run["experts_per_step"] - run["device_experts_per_step"]
    host = run["host_per_step"] + launch_c + launch_e
    step = run["seconds_per_step"]
    return {
        "device": run["device_compute_per_step"] + run["device_experts_per_step"],
        "link": run["stall_per_step"],
        "host": host,
        "launch_compute": launch_c,
        "launch_experts": launch_e,
        "share": host / step if step > 0 else float("nan"),
    }
