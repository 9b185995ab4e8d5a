"""Record N runs of the timing notebooks' measurements on a profile, each into data/results/<profile>/runs/run<k>/
(its raw row files and run.json): the stored runs behind every timing verdict (artifact/experiments/replication.py).

    PYTHONPATH=. python scripts/record_runs.py --profile cpu --runs 3

Each run first clears the working row files (replication.clear_working), then measures what notebooks 03-09 time,
with the functions those notebooks call and in their order: 03's throttle grid, 04's bench grid, 05's TIDE-style
grid, 06's two link-priority grids, 07's synthetic streams, 08's model validation cells, 09's end-to-end bench;
then copies the row files into a new stored run (replication.record_run). `./run_all.sh PROFILE --force --store`
afterwards rules every timing claim on the stored runs (it finds the last run's rows in place and measures
nothing again)."""
from __future__ import annotations

import argparse
import sys
import time

from tqdm.auto import tqdm


def measure(P, log=print) -> None:
    from artifact.experiments import harness
    from artifact.experiments.studies import (
        bandwidth_throttling,
        beyond_the_paper,
        cache_design_space,
        capacity_sweep,
        performance_model,
        routing_map,
        tide_head_to_head,
    )
    steps = [("03 throttle grid", lambda: bandwidth_throttling.measure(P, progress=False)),
             ("04 bench grid", lambda: capacity_sweep.measure(P, progress=False)),
             ("05 TIDE-style grid", lambda: tide_head_to_head.measure(P, progress=False)),
             ("06 link-priority grids", lambda: beyond_the_paper.measure(P, progress=False)),
             ("07 synthetic streams", lambda: routing_map.streams(P, progress=False)),
             ("08 validation cells", lambda: performance_model.validation(P, progress=False)),
             ("09 end-to-end bench", lambda: cache_design_space.measure_bench(
                 P, cache_design_space.best_eviction(cache_design_space.summary(
                     cache_design_space.eviction_sweep(harness.traces(P), P))), progress=False))]
    for name, step in tqdm(steps, desc="timing notebooks' measurements"):
        t0 = time.time()
        step()
        log(f"  {name}: {time.time() - t0:.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error(f"--runs {a.runs}: give at least 1")
    from artifact.experiments import harness, replication
    P = harness.setup(a.profile)
    for k in range(a.runs):
        replication.clear_working(P)
        t0 = time.time()
        print(f"run {k + 1} of {a.runs}", flush=True)
        measure(P)
        replication.record_run(P, seconds=round(time.time() - t0, 1),
                               command=f"python scripts/record_runs.py {' '.join(sys.argv[1:])} (run {k + 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
