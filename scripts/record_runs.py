"""Record N runs of the timing notebooks' measurements on a profile, each into
data/results/<profile>/runs/run<k>/ (its raw row files, run.json and manifest.json): the stored runs behind
every timing verdict (artifact/experiments/stored_runs/).

    PYTHONPATH=. python scripts/record_runs.py --profile cpu --runs 9
    PYTHONPATH=. python scripts/record_runs.py --profile h200_ae --model DIR --runs 3 --only 04

Every argument, the profile, the model (config.json and each weight file's header), the results folder, the
stored runs and the checkout are checked first: a bad one prints one line, `error: ...`, and exits 2 with
nothing changed. The checkout must have no uncommitted change (modified, staged, or untracked and not ignored)
under the code the runs measure (recording.CODE_PATHS: artifact/, scripts/, the environment's pins, the
prompts in data/tasks/): a run records its commit, so that commit must be the code that measured it.
Each run first moves the working row files aside (recording.working_aside: put back if the run fails), then
measures what the timing notebooks time (stored_runs.TIMED_STUDIES: 03's throttle grid, 04's bench grid,
05's TIDE-style grid, 06's two link-priority grids, 07's synthetic streams, 08's model validation cells, 09's
end-to-end bench), each with its study's `measure`, in notebook order; then copies the row files into a new
stored run (recording.record_run). Stored run k measures with Settings.rotation = k - 1 (kept in its
run.json), so the policies' run order (bench/order.py) continues from run to run and each policy sits in each
slot equally often over whole cycles. `./run_all.sh PROFILE --force --store` afterwards rules every timing
claim on the stored runs (it finds the last run's rows in place and measures nothing again).

A set can be recorded in parts, each part committed (e.g. `--runs 3` three times, with
`git add data/results/cpu/runs && git commit` after each, and the claims re-ruled on them if you like): a run
records the newest commit that changed the code it measures (recording.runs_commit: artifact/, scripts/, the
environment's pins, the prompts), so the parts are runs of one commit; a code change in between is refused."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import time

from tqdm.auto import tqdm


def studies(only=None) -> list:
    """The timing studies to measure (stored_runs.TIMED_STUDIES, in notebook order): all, or those whose
    notebook number is in `only` (e.g. ["04"]: a GPU reviewer grid's stored runs for notebook 04 alone)."""
    from artifact.experiments.outputs.stored_runs import TIMED_STUDIES

    return [t for t in TIMED_STUDIES if not only or t.notebook[:2] in only]


def measure(P, log=print, only=None) -> None:
    """Each timing study's `measure` (studies(only)), in notebook order."""
    for t in tqdm(studies(only), desc="timing notebooks' measurements"):
        t0 = time.time()
        importlib.import_module(f"artifact.experiments.studies.{t.module}").measure(P, progress=False)
        log(f"  {t.notebook}: {time.time() - t0:.0f} s")


MAX_RUNS = 1000  # more runs than anyone records (the stored cpu runs are 9 of about 13 minutes each)


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors (an unknown option, a missing value) as one line, `error: ...`, exit 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def run_count(text: str) -> int:
    """--runs: a whole number from 1 to MAX_RUNS."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give at least 1") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: give at least 1")
    if n > MAX_RUNS:
        raise argparse.ArgumentTypeError(f"{n}: give at most {MAX_RUNS}")
    return n


def main(argv=None) -> int:
    """Record the runs; a bad argument, profile, model or stored run prints one line (`error: ...`) and
    returns 2, before any working row file is touched."""
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument(
        "--model",
        default=None,
        help="checkpoint directory (overrides the profile's model; a GPU profile's is null)",
    )
    ap.add_argument(
        "--runs",
        type=run_count,
        default=9,
        help="how many runs to record (default 9: the stored cpu runs' N, "
        "at which 04's A/A half-width was at most 3 points in 10 of its 10 cells; "
        "7 of 10 at N = 6, docs/verdicts.md)",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="NN",
        default=None,
        help="measure only these timing notebooks (e.g. --only 04: a GPU reviewer grid's verdict, the runs "
        "doctor prices); the other notebooks' timing claims then have no stored runs of this profile",
    )
    a = ap.parse_args(argv)
    from artifact.experiments.outputs.stored_runs import TIMED_STUDIES

    known = [t.notebook[:2] for t in TIMED_STUDIES]
    bad = [x for x in a.only or [] if x not in known]
    if bad:
        ap.error(f"argument --only: {bad[0]!r} is not a timing notebook; expected some of {', '.join(known)}")
    from artifact.cli import USER_OS_ERRORS
    from artifact.errors import UserError

    try:
        record(a)
    except (UserError, *USER_OS_ERRORS) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def check(a):
    """Everything that can be refused before a working row file is touched: the profile and its values, the
    model (its config.json and every weight file's header: prepare.checked_checkpoint), the results folder,
    the stored runs (whole and of this commit) and the checkout (no uncommitted code:
    recording.check_committed). Returns the profile."""
    from artifact.errors import SettingError
    from artifact.experiments import harness
    from artifact.experiments import recording as stored_runs
    from artifact.experiments.outputs.paths import results_dir
    from artifact.experiments.outputs.stored_runs import runs_root
    from artifact.offload.prepare import checked_checkpoint, model_config
    from artifact.paths import check_writable

    P = harness.setup(a.profile, {"model": a.model} if a.model is not None else None)
    if P.model is None:
        raise SettingError(
            f"profile {P.name!r} has model: null: pass --model DIR (a LLaDA2.0 checkpoint directory)"
        )
    model_config(P.model) if P.model == "tiny" else checked_checkpoint(P.model)
    check_writable(results_dir(P) / "bench.csv", "the results folder", exists_ok=True)
    check_writable(runs_root(P.name) / "run.json", "the stored runs' folder", exists_ok=True)
    stored_runs.next_run(P.name)  # the stored runs are whole and of this commit, before any measurement
    stored_runs.check_committed()  # and the commit a run records is the code that measures it
    return P


def record(a) -> None:
    from artifact.experiments import recording as stored_runs

    P = check(a)
    for k in range(a.runs):
        dest, _ = stored_runs.next_run(P.name)
        rotation = int(dest.name[3:]) - 1  # stored run n measures with rotation n - 1
        Pk = dataclasses.replace(P, rotation=rotation)
        with stored_runs.working_aside(Pk):  # put back if this run fails
            t0 = time.time()
            print(f"run {k + 1} of {a.runs} (stored as {dest.name}, rotation {rotation})", flush=True)
            measure(Pk, only=getattr(a, "only", None))
            stored_runs.record_run(
                Pk,
                stems=[s for t in studies(getattr(a, "only", None)) for s in t.stems],
                seconds=round(time.time() - t0, 1),
                rotation=rotation,
                command=f"python scripts/record_runs.py {' '.join(sys.argv[1:])} (run {k + 1})",
            )


if __name__ == "__main__":
    sys.exit(main())
