"""The engine's own host cost per demand (the lean path; printed first by benchmarks/host_overhead.py):
host us of one `engine.groups(demand)` at 60 and 150 queued copies, over a link whose calls cost nothing,
with the planning's share (target <= 50 us at both).

    .venv/bin/python benchmarks/engine_per_demand.py [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from artifact.offload.policy.policies import make_policy

# --- The engine's own host cost per demand (the lean path) --------------------------------------
ENGINE_QUEUED = (60, 150)  # copies the plan of one demand queues
ENGINE_TARGET_US = 50.0  # host us per demand, at each of ENGINE_QUEUED


class _FreeLink:
    """A link whose calls cost ~nothing and whose copies are always ready, as on CUDA (compute waits on
    the device timeline): what is left of a demand's host time is the engine's and the cache's."""

    _TICKET = object()

    def __init__(self):
        from artifact.offload.links.link import LinkStats

        self.stats = LinkStats()

    def copy(self, items, after=None, speculative=False):
        self.stats.transfers += len(items)
        return [self._TICKET] * len(items)

    def landed(self, t):
        return True

    def ready(self, t):
        return True

    def wait(self, tickets):
        pass

    def promote(self, t):
        pass

    def pump(self):
        pass

    def compute_done(self, key):
        return None

    def finish(self):
        return self.stats


def engine_per_demand(queued: int, demands: int = 300, reps: int = 5) -> dict:
    """Host us of one `engine.groups(demand)`, consumed, for a demand of `queued` misses and no waves: C =
    queued slots on one layer of 2 x queued experts, demands alternating between the two halves, so each
    one evicts the other's experts (policy demand). Also the planning share (ExpertCache.serve on its own,
    the same demands). Best of `reps` runs of `demands` demands, in process CPU time: no device, no wait, so
    on an idle machine it is the wall time, and on a shared one it leaves out the time other jobs took."""
    from artifact.model.routing import Demand, StepInfo
    from artifact.offload.backend.engine import OffloadEngine, build_cache
    from artifact.offload.backend.store import HostStore
    from artifact.offload.trace_engine import STAND_IN

    E, layer = 2 * queued, 1
    halves = (tuple(range(queued)), tuple(range(queued, E)))
    stream = [
        Demand(StepInfo(f, 0, f, "denoise"), layer, halves[f % 2], (1,) * queued) for f in range(demands)
    ]

    def cache():
        return build_cache([layer], E, queued, make_policy("demand", 1, E, engine=True), 1)

    def timed(serve) -> float:
        best = float("inf")
        for _ in range(reps):
            serve(stream[0])  # the slots fill: later demands evict
            t0 = time.process_time()
            for d in stream[1:]:
                serve(d)
            best = min(best, (time.process_time() - t0) / (len(stream) - 1))
        return 1e6 * best

    store = HostStore(torch.zeros(1, E, STAND_IN.params), [layer])
    engines = []

    def run_engine(d):
        if d is stream[0]:
            engines.append(OffloadEngine(store, cache(), _FreeLink(), STAND_IN))
        for _ in engines[-1].groups(d):
            pass

    caches = []

    def run_plan(d):
        if d is stream[0]:
            caches.append(cache())
        caches[-1].serve(d)

    engine_us, plan_us = timed(run_engine), timed(run_plan)
    copies = engines[-1].link.stats.transfers / len(stream)
    assert copies == queued, f"the stream meant {queued} copies per demand, the engine issued {copies}"
    return {
        "path": "engine",
        "queued_copies": queued,
        "engine_us_per_demand": engine_us,
        "planning_us_per_demand": plan_us,
        "target_us": ENGINE_TARGET_US,
        "met": engine_us <= ENGINE_TARGET_US,
    }


def print_engine_per_demand(as_json: bool) -> None:
    for queued in ENGINE_QUEUED:
        r = engine_per_demand(queued)
        if as_json:
            print(
                json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}),
                flush=True,
            )
        else:
            print(
                f"engine, {queued} queued copies per demand: "
                f"{r['engine_us_per_demand']:.1f} us host per demand (of which planning "
                f"{r['planning_us_per_demand']:.1f}); "
                f"target <= {ENGINE_TARGET_US:g}: {'met' if r['met'] else 'not met'}",
                flush=True,
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    print_engine_per_demand(ap.parse_args().json)
