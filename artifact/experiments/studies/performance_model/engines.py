"""Which engine the model prices, and how much of a modelled step is host work.

The engines (ENGINES) share the virtual clock, cache, policies and link timeline, not the compute charges:

  eager       the hardware profile's costs as they are (offload/links/costs.py): kernels launched one at a
              time, each charge the slowest of its rooflines and its launches (launch_us each); on the h200
              and a5000 profiles the launch costs are measured (gpu_check on an H200, hardware.py).
  segmented   forward="segmented" (artifact/model/segments.py): the forward cut at the router syncs, each
              segment a CUDA graph replay: one per (forward, MoE layer), two at the forward's first, one per
              expert group, each REPLAY_US of host time plus its roofline compute (the two add: the host
              waits at the router sync). Host time per copy and per layer stays the profile's.

REPLAY_US is assumed, not measured (scripts/gpu_check_graphs.py would measure it; data/gpu_check/
h200_graphs.json does not exist): the top of a CUDA graph launch's 10-20 us, leaning towards host work.

Host work (host_work): a modelled step is compute + experts + host + stall. Its device part is every compute
charge on the rooflines alone (Costs.device_only, added up by Metered), its link part the stall, the rest
host work (the host term plus what launches or replays add above the rooflines). The host share, host work
over the step, is the modelled counterpart of a measured cell's host ms over wall ms (pairs.host_shares),
ruled by the same limit (rules.host_bound); a cell's share is the larger of its policies'.
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
    """The segmented engine's charges: REPLAY_US of host time per replay plus the roofline compute."""

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
    """`base`'s charges, unchanged, adding up the device's part of each (`device`: seconds of non-expert
    compute and of experts on the rooflines alone)."""

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
    """A modelled run's (model_run's) step split by who paces it, seconds per step: `device` (both compute
    terms' rooflines), `link` (the stall), `host` (the host term plus the launch-bound parts,
    `launch_compute` and `launch_experts`), and `share`, host over the step."""
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
