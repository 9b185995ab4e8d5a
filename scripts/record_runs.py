"""Record N runs of the timing notebooks' measurements on a profile, each into
data/results/<profile>/runs/run<k>/ (its raw row files, run.json and manifest.json): the stored runs behind
every timing verdict (artifact/experiments/stored_runs/).

    PYTHONPATH=. python scripts/record_runs.py --profile cpu --runs 9
    PYTHONPATH=. python scripts/record_runs.py --profile h200_ae --model /models/LLaDA2.0-mini --runs 3

Each run first clears the working row files (recording.clear_working), then measures what the timing
notebooks time (stored_runs.TIMED_STUDIES: 03's throttle grid, 04's bench grid, 05's TIDE-style grid, 06's two
link-priority grids, 07's synthetic streams, 08's model validation cells, 09's end-to-end bench), each with
its study's `measure`, in notebook order; then copies the row files into a new stored run
(recording.record_run). Stored run k measures with Settings.rotation = k - 1 (kept in its run.json), so the
policies' run order (bench/order.py) continues from run to run and each policy sits in each slot equally often
over whole cycles. `./run_all.sh PROFILE --force --store` afterwards rules every timing claim on the stored
runs (it finds the last
run's rows in place and measures nothing again)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import time

from tqdm.auto import tqdm


def measure(P, log=print) -> None:
    """Each timing study's `measure` (stored_runs.TIMED_STUDIES), in notebook order."""
    from artifact.experiments.verdicts.stored_runs import TIMED_STUDIES

    for t in tqdm(TIMED_STUDIES, desc="timing notebooks' measurements"):
        t0 = time.time()
        importlib.import_module(f"artifact.experiments.studies.{t.module}").measure(P, progress=False)
        log(f"  {t.notebook}: {time.time() - t0:.0f} s")


def main(argv=None) -> int:
    """Record the runs; a bad argument, profile or stored run prints one line (`error: ...`) and returns 2."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument(
        "--model",
        default=None,
        help="checkpoint directory (overrides the profile's model; a GPU profile's is null)",
    )
    ap.add_argument(
        "--runs",
        type=int,
        default=9,
        help="how many runs to record (default 9: the stored cpu "
        "runs' N, "
        "at which 04's A/A half-width was at most 3 points in 10 of its 10 cells; 7 of 10 at N = "
        "6, "
        "docs/verdicts.md)",
    )
    a = ap.parse_args(argv)
    from artifact.errors import UserError

    try:
        record(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def record(a) -> None:
    from artifact.errors import SettingError
    from artifact.experiments import harness
    from artifact.experiments import recording as stored_runs

    if a.runs < 1:
        raise SettingError(f"--runs {a.runs}: give at least 1")
    P = harness.setup(a.profile, {"model": a.model} if a.model is not None else None)
    if P.model is None:
        raise SettingError(
            f"profile {P.name!r} has model: null: pass --model DIR (a LLaDA2.0 checkpoint directory)"
        )
    stored_runs.next_run(P.name)  # the stored runs are whole and of this commit, before any measurement
    for k in range(a.runs):
        dest, _ = stored_runs.next_run(P.name)
        rotation = int(dest.name[3:]) - 1  # stored run n measures with rotation n - 1
        Pk = dataclasses.replace(P, rotation=rotation)
        stored_runs.clear_working(Pk)
        t0 = time.time()
        print(f"run {k + 1} of {a.runs} (stored as {dest.name}, rotation {rotation})", flush=True)
        measure(Pk)
        stored_runs.record_run(
            Pk,
            seconds=round(time.time() - t0, 1),
            rotation=rotation,
            command=f"python scripts/record_runs.py {' '.join(sys.argv[1:])} (run {k + 1})",
        )


if __name__ == "__main__":
    sys.exit(main())
