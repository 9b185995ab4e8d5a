"""Real fresh runs of ./run_all.sh (data/results/cpu/fresh_runs/, artifact/experiments/fresh_runs.py) against
the calibration's model of one: the noise the harness assumes is the one measured, the README's column reads
the kept runs, and each kept run is ruled the way ./run_all.sh rules it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from artifact.experiments import fresh_runs
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.verdicts.rules import VERDICTS
from artifact.experiments.verdicts.scenarios import FRESH_NOISE


@pytest.fixture(scope="module")
def tables():
    return fresh_runs.tables("cpu")


def test_at_least_three_real_fresh_runs_are_kept_two_of_them_quiet(tables):
    per, summary = tables
    runs = fresh_runs.fresh_runs("cpu")
    assert len(runs) >= 3 and set(per.run) == {p.name for p in runs}
    assert set(per.claim) == set(CLAIMS) and set(per.verdict) <= set(VERDICTS)
    assert (summary.runs == len(runs)).all()


def quiet_ratio(per, profile: str = "cpu") -> float:
    """The median noise ratio over the kept runs whose note says "quiet" (claims with a true A/A pair: 07's
    streams carry none, so its within-run noise is not a pair's), what scenarios.FRESH_NOISE states."""
    runs = fresh_runs.fresh_runs(profile)
    notes = {p.name: json.loads((p / "run.json").read_text()).get("note", "") for p in runs}
    quiet = [name for name, note in notes.items() if "quiet" in note]
    rows = per[per.run.isin(quiet) & (per.claim != "07-streams")]
    return float(rows.noise_ratio.median())


def test_the_harness_assumes_the_noise_the_quiet_fresh_runs_measured(tables):
    per, _ = tables
    assert FRESH_NOISE == pytest.approx(quiet_ratio(per), abs=0.15)


def test_the_committed_summary_is_what_the_kept_runs_give(tables):
    _, summary = tables
    stored = pd.read_csv(fresh_runs.root("cpu") / "decided.csv")
    assert list(stored.claim) == list(summary.claim)
    assert list(stored.decided) == list(summary.decided) and list(stored.agree) == list(summary.agree)


def test_keep_never_overwrites_a_kept_run(tmp_path):
    with pytest.raises(FileExistsError, match="never overwritten"):
        fresh_runs.keep(tmp_path, fresh_runs.fresh_runs("cpu")[0].name)
