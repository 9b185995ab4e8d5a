"""The calibration (artifact/experiments/verdicts/calibration.py) in the unit tier: small fixed-seed runs
through the real rules (pooling.replicate, judge.judge), each cell's noise read from the stored cpu runs.
The full run (`python -m artifact calibrate`, data/results/cpu/calibration.csv) is a benchmark. Every bound
allows 3 Monte-Carlo standard errors."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from artifact.errors import UserError
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.outputs.stored_runs import stored_rows
from artifact.experiments.settings import load_profile
from artifact.experiments.verdicts import calibration as cal
from artifact.experiments.verdicts import pooling
from artifact.experiments.verdicts.pairs import run_effects

ZERO = cal.Scenario("zero", 0.0, "false reproduced")
PLANTED = cal.Scenario("planted +30", 30.0, "power")


@pytest.fixture(scope="module")
def cpu():
    return load_profile("cpu")


@pytest.fixture(scope="module")
def noises(cpu):
    return {k: cal.noise(cpu, CLAIMS[k]) for k in ("04-faster", "09-eviction")}


def _row(noise, scenario, studies, seed=3):
    t = cal.calibrate([noise], studies, seed=seed, processes=1, progress=False, plan=[scenario])
    assert len(t) == 1 and t.studies.iloc[0] == studies
    return t.iloc[0]


def test_a_planted_effect_far_above_zero_reads_reproduced(noises):
    r = _row(noises["09-eviction"], PLANTED, 100)
    assert r.reproduced >= 95, r
    assert r.power == r.reproduced and r.not_reproduced == 0, r


def test_a_true_zero_reads_reproduced_at_most_five_percent(noises):
    """One cell (09): a one-sided 95% interval above 0 by chance, about 2.5% of studies."""
    r = _row(noises["09-eviction"], ZERO, 300)
    assert r.reproduced <= 5 + 3 * max(r.reproduced_se, math.sqrt(0.05 * 0.95 / 300) * 100), r


@pytest.fixture(scope="module")
def zero_04(noises):
    return _row(noises["04-faster"], ZERO, 60)


def test_the_pooled_interval_covers_the_truth_95_percent(zero_04):
    r = zero_04
    assert abs(r.coverage - 95) <= 3 * r.coverage_se, r


def test_a_single_fresh_runs_interval_covers_the_truth_at_least_93_percent(zero_04):
    r = zero_04
    assert r.coverage_single >= 93 - 3 * r.coverage_single_se, r


def test_a_one_run_interval_without_the_run_to_run_spread_fails_the_coverage_check(noises, monkeypatch):
    """The check above can fail: a fresh run's interval narrowed as if pooled (divided by sqrt N)
    covers the truth far less often than 93%."""
    real = pooling.one_run

    def narrow(d, others, *within):
        iv = real(d, others, *within)
        k = math.sqrt(max(len(others), 1))
        return dataclasses.replace(
            iv, low=iv.mean - (iv.mean - iv.low) / k, high=iv.mean + (iv.high - iv.mean) / k
        )

    monkeypatch.setattr(pooling, "one_run", narrow)
    r = _row(noises["04-faster"], ZERO, 20)
    assert r.coverage_single < 93 - 3 * r.coverage_single_se, r


def test_each_cells_noise_is_its_own_read_from_the_stored_runs(cpu, noises):
    c = CLAIMS["04-faster"]
    cells = noises["04-faster"].cells
    sds = np.array([z.sd for z in cells.values()])
    taus = np.array([z.tau for z in cells.values()])
    assert len(cells) == 8 and sds.max() / sds.min() > 1.5 and taus.max() - taus.min() > 1, cells
    per = [run_effects(rows, c.a, c.b, c.by, c.metric) for _, rows in stored_rows(cpu, "bench")]
    for key, z in cells.items():
        runs = [p[key] for p in per if key in p]
        assert z.sd == pytest.approx(math.sqrt(np.mean([d.var(ddof=1) for d in runs])))
        means = np.array([d.mean() for d in runs])
        assert z.tau**2 == pytest.approx(max(0.0, means.var(ddof=1) - z.sd**2 / z.n), abs=1e-9)
        assert z.mean == pytest.approx(means.mean())


def test_claims_are_checked_and_counted_once():
    assert cal.claim_keys(["09-eviction", "04-faster", "09-eviction"]) == ["09-eviction", "04-faster"]
    with pytest.raises(ValueError, match="claim 'nope'"):
        cal.claim_keys(["nope"])


def _cli():
    """artifact/cli/calibrate.py, loaded by path (its argparse parser)."""
    import argparse

    path = Path(__file__).resolve().parents[1] / "artifact" / "cli" / "calibrate.py"
    spec = importlib.util.spec_from_file_location("calibrate_cli", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    ap = argparse.ArgumentParser()
    m.add_cli(ap.add_subparsers(dest="cmd"))
    return ap


@pytest.mark.parametrize("argv", [["--claim", "nope"], ["--studies", "0"], ["--processes", "0"]])
def test_the_command_refuses_bad_arguments_in_one_line(argv):
    a = _cli().parse_args(["calibrate", *argv])
    with pytest.raises(UserError) as e:
        a.fn(a)
    assert "\n" not in str(e.value) and argv[0] in str(e.value)


def test_the_command_writes_the_table(tmp_path, capsys):
    out = tmp_path / "calibration.csv"
    argv = [
        "calibrate",
        "--claim",
        "09-eviction",
        "--claim",
        "09-eviction",
        "--studies",
        "2",
        "--processes",
        "1",
    ]
    a = _cli().parse_args([*argv, "--out", str(out), "--quiet"])
    assert a.fn(a) == 0
    import pandas as pd

    t = pd.read_csv(out)
    assert (
        list(t.claim) == ["09-eviction"] * len(cal.scenarios(CLAIMS["09-eviction"]))
        and (t.studies == 2).all()
    )
    for name in ("coverage", "coverage_single", "reproduced", "not_reproduced", "power", "fresh_decides"):
        assert name in t and f"{name}_se" in t
    assert "stored_decide" in t and "09-eviction" in capsys.readouterr().out


# --- the planted answers of a reviewer's own run, read from the committed table ----------------------------
TABLE = Path(__file__).resolve().parents[1] / "data" / "results" / "cpu" / "calibration.csv"


@pytest.fixture(scope="module")
def table():
    import pandas as pd

    return pd.read_csv(TABLE)


def _bound(rate, se, studies):
    """A rate's allowance: 3 Monte-Carlo standard errors (at least that of a 5% rate over the studies)."""
    return 3 * max(se, math.sqrt(0.05 * 0.95 / studies) * 100)


def test_the_committed_table_holds_every_scenario_of_every_claim(table):
    for key, c in CLAIMS.items():
        assert list(table[table.claim == key].scenario) == [s.name for s in cal.scenarios(c)], key


def test_twice_the_noise_still_decides_04_equal_and_nothing_reads_wrong(table):
    x2 = table[table.scenario == "as stored, x2 noise"]
    eq = x2[x2.claim == "04-equal"].iloc[0]
    assert eq.fresh_decides >= 80, eq  # not reproduced, the stored verdict, or nothing at all
    for _, r in x2.iterrows():
        assert r.fresh_wrong <= 5 + _bound(r.fresh_wrong, r.fresh_wrong_se, r.studies), r


def test_three_times_the_noise_reads_wrong_in_at_most_five_percent(table):
    x3 = table[table.scenario.str.contains("x3 noise")]
    assert len(x3) == 2 * len(CLAIMS)
    for _, r in x3.iterrows():
        assert r.fresh_wrong <= 5 + _bound(r.fresh_wrong, r.fresh_wrong_se, r.studies), r


def test_clear_cells_decide_in_their_direction_in_at_least_80_percent(table):
    """Cells >= 4 between-run sds from their boundary, at the stored noise. 07's streams are left out: they
    have no A/A pair of their own, and their stand-in A/A (last_step_conservative over demand, sd 6.9 points
    within a run) is wide enough to gate most fresh runs whatever the effect (docs/verdicts.md)."""
    stored = table[(table.scenario == "as stored") & (table.claim != "07-streams")]
    clear = stored.dropna(subset=["clear_decide"])
    assert len(clear) >= 4, stored  # claims with a cell >= 4 between-run sds from its boundary
    for _, r in clear.iterrows():
        assert r.clear_decide >= 80 - 3 * r.clear_decide_se, r


def test_a_fresh_run_noisier_than_stored_reads_wrong_no_more_often_live(noises):
    """The table's x3 bound, live on one claim: 60 studies of 09 at a true 0 with three times the noise."""
    r = _row(noises["09-eviction"], cal.Scenario("zero, x3", 0.0, "false reproduced", noise=3.0), 60)
    assert r.fresh_wrong <= 5 + _bound(r.fresh_wrong, r.fresh_wrong_se, 60), r
