"""The stored cpu runs measured the engine that ships: since their commit nothing under artifact/offload/ or
artifact/model/ has changed (the release's rule: record the runs last, then leave the engine alone); and
the set is the release's: nine runs at one commit, each naming its environment, each bench with demand's
A/A pair."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from artifact.experiments.outputs.provenance import VERSIONED
from artifact.experiments.outputs.stored_runs import check_stored_runs, run_meta

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ("artifact/offload", "artifact/model")
RECORD = "`PYTHONPATH=. python scripts/record_runs.py --profile cpu --runs 9`"
AGAIN = (
    "record the stored runs again at this commit: move data/results/cpu/runs/ to "
    f"data/results/cpu/earlier_runs/<their commit>/, then {RECORD} (or in parts: --runs 3, "
    "committing data/results/cpu/runs after each), then `./run_all.sh cpu --force --store`"
)


def test_the_engine_has_not_changed_since_the_stored_runs_were_recorded():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the runs' commit cannot be compared")
    commits = {run_meta(r)["commit"] for r in check_stored_runs("cpu")}
    assert len(commits) == 1, f"the stored cpu runs are of {sorted(commits)}: {AGAIN}"
    (at,) = commits
    shallow = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
    ).stdout.strip()
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{at}^{{commit}}"], capture_output=True
    )
    if shallow == "true" and known.returncode != 0:
        pytest.skip(f"a shallow clone without the runs' commit {at}: fetch the history to compare")
    diff = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--stat", at, "HEAD", "--", *ENGINE],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert diff.returncode == 0, f"git cannot compare the runs' commit {at} with HEAD: {diff.stderr.strip()}"
    changed = f"{', '.join(ENGINE)} changed since the runs' commit {at}"
    assert diff.stdout == "", f"{changed}:\n{diff.stdout}{AGAIN}"


def test_the_stored_set_is_nine_runs_with_their_environment_and_the_aa_pair():
    runs = check_stored_runs("cpu")
    assert len(runs) == 9, f"{len(runs)} stored cpu runs, the release's set is 9: {AGAIN}"
    for run in runs:
        versions = run_meta(run)["environment"]["versions"]
        assert {"python", *VERSIONED} <= set(versions), run.name
        bench = pd.read_csv(run / "bench.csv")
        arms = bench.groupby("policy").arm.agg(set)
        assert arms["demand"] == {"A", "B"} and all(a == {"A"} for p, a in arms.items() if p != "demand")
