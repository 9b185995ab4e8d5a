"""The stored cpu runs measured the engine that ships: since their commit nothing under artifact/offload/ or
artifact/model/ has changed (the release's rule: record the runs last, then leave the engine alone)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from artifact.experiments.verdicts.stored_runs import run_meta, stored_runs

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
    commits = {run_meta(r)["commit"] for r in stored_runs("cpu")}
    assert len(commits) == 1, f"the stored cpu runs are of {sorted(commits)}: {AGAIN}"
    (at,) = commits
    diff = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--stat", at, "HEAD", "--", *ENGINE],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert diff.returncode == 0, f"git cannot compare the runs' commit {at} with HEAD: {diff.stderr.strip()}"
    changed = f"{', '.join(ENGINE)} changed since the runs' commit {at}"
    assert diff.stdout == "", f"{changed}:\n{diff.stdout}{AGAIN}"
