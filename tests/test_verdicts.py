"""The verdict rules (artifact/experiments/verdicts/) on planted answers: the paper's own printed results read
as the paper says; 04's effect is the plain paired effect of demand over last_step and moves when demand's
rows move; the A/A gates; leave-one-out drops a run from the effect and the gate alike; a run that lacks a
cell; a fresh run ruled on its own evidence, never bounded by the stored verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.weightstats import DescrStatsW

from artifact.experiments.criteria import paper
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.paired_table import cell_label
from artifact.experiments.settings import CONTROL, load_profile
from artifact.experiments.studies import capacity_sweep as cs
from artifact.experiments.verdicts.judge import claim_compared, judge, paper_ruled, rule_stated
from artifact.experiments.verdicts.pooling import Replicas, pooled
from artifact.experiments.verdicts.rules import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Interval,
    rule_cell,
    rule_claim_cells,
)

FASTER, EQUAL = CLAIMS["04-faster"], CLAIMS["04-equal"]


# --- the paper's own printed results ------------------------------------------------------------------
def test_the_papers_printed_results_read_reproduced():
    assert paper_ruled("04-faster") == REPRODUCED  # +4.9..+11.8%, every interval above 0
    assert paper_ruled("04-equal") == REPRODUCED  # +0.73% [-1.16, +2.63] inside +-3%
    assert set(paper.RESULTS) == {"04-faster", "04-equal"}


def test_the_rule_command_rules_given_intervals():
    def rule(*args):
        return subprocess.run(
            [sys.executable, "-m", "artifact", "rule", *args], capture_output=True, text=True
        )

    assert "reproduced" in rule("04-equal", "--cell", "0.73", "-1.16", "2.63").stdout
    got = rule("04-faster", "--cell", "4.9", ">0", "?", "--cell", "-2", "-4", "-1")
    assert "verdict: not reproduced" in got.stdout, got
    bad = rule("04-faster", "--cell", "4.9", "6", "8")  # the effect outside its interval
    assert bad.returncode == 2 and "not inside its interval" in bad.stderr and "Traceback" not in bad.stderr
    assert "04-faster" in rule("--list").stdout


@pytest.mark.parametrize(
    "claim, cell, refusal",
    [
        # '>0' states a low bound only: never its internal stand-in (the smallest float above 0)
        ("04-faster", ("1", "0.5", ">0"), "--cell 1 (1 0.5 >0): HIGH '>0': expected a finite number or '?'"),
        # a NaN effect is not a number to place in an interval
        ("04-equal", ("nan", "-1", "1"), "--cell 1 (nan -1 1): EFFECT 'nan': expected a finite number"),
        # -inf is a value, not a flag, and is refused as a bound
        (
            "04-equal",
            ("0", "-inf", "1"),
            "--cell 1 (0 -inf 1): LOW '-inf': expected a finite number, '>0' or '?'",
        ),
    ],
)
def test_the_rule_command_names_a_refused_value_as_typed(claim, cell, refusal, capsys, tmp_path, monkeypatch):
    """One line, exit 2, the argument and its value as typed and what is expected; nothing written."""
    from artifact.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "results"))
    assert main(["rule", claim, "--cell", *cell]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: rule: {refusal}") and err.count("\n") == 1, err
    assert "e-324" not in err and "+nan" not in err
    assert list(tmp_path.iterdir()) == []


def test_direction_needs_every_cell_above_zero_and_excludes_at_the_simultaneous_level():
    above = Interval(5.0, 1.0, 9.0)
    assert rule_stated("04-faster", [(5, 1, 9), (8, 2, 14)])[0] == REPRODUCED
    assert rule_stated("04-faster", [(5, 1, 9), (1, -1, 3)])[0] == INCONCLUSIVE
    # below 0 at 95% but not at the Bonferroni level over 2 cells: inconclusive, not "not reproduced"
    assert rule_stated("04-faster", [(5, 1, 9), (-1.0, -1.95, -0.05)])[0] == INCONCLUSIVE
    assert rule_stated("04-faster", [(5, 1, 9), (-3, -5, -1)])[0] == NOT_REPRODUCED
    # a gate makes a cell inconclusive whatever its interval says
    assert rule_claim_cells("faster", [("a", above)], ["A/A wholly outside +-3%"])[0] == INCONCLUSIVE


@pytest.mark.parametrize(
    "kind, low, high, verdict, why",
    [
        # no difference: the reason says which bound the interval straddles, never "too wide" for one side
        ("no difference", -1.0, 2.0, REPRODUCED, "interval inside +-3%"),
        ("no difference", -1.0, 6.0, INCONCLUSIVE, "interval straddles +3%"),  # 7 wide, one side only
        ("no difference", -6.0, 1.0, INCONCLUSIVE, "interval straddles -3%"),
        ("no difference", -4.0, 4.0, INCONCLUSIVE, "interval straddles both -3% and +3%"),
        ("no difference", 3.5, 6.0, NOT_REPRODUCED, "interval wholly outside +-3%"),
        # one comparison at the margin for both: a bound on +-3 counts as inside (a closed margin)
        ("no difference", -3.0, 3.0, REPRODUCED, "interval inside +-3% (a bound on the margin)"),
        ("not faster", -1.0, 2.0, REPRODUCED, "interval below +3%"),
        ("not faster", -1.0, 3.0, REPRODUCED, "interval at or below +3%"),
        ("not faster", -1.0, 5.0, INCONCLUSIVE, "interval straddles +3%"),
        ("not faster", 3.5, 6.0, NOT_REPRODUCED, "interval above +3%: faster by more than the margin"),
    ],
)
def test_each_reason_names_what_its_interval_did(kind, low, high, verdict, why):
    r = rule_cell(kind, Interval((low + high) / 2, low, high))
    assert (r.verdict, r.why) == (verdict, why)


def test_equivalence_is_tost_at_2_5_percent_per_side():
    """The 95% interval inside +-3 is statsmodels' TOST at 2.5% per side, on the same pairs."""
    rng = np.random.default_rng(1)
    for shift in (0.0, 1.5, 2.5, 4.0):
        x = rng.normal(shift, 2.0, 12)
        iv = pooled(x)
        p = DescrStatsW(x).ttost_mean(-3.0, 3.0)[0]
        inside = rule_claim_cells("no difference", [("c", iv)])[0] == REPRODUCED
        assert inside == (p < 0.025), (shift, p, iv)


def test_pooled_interval_is_scipys_t_interval():
    x = np.array([1.0, 2.5, 0.5, 3.0])
    ci = stats.t.interval(0.95, 3, loc=x.mean(), scale=stats.sem(x))
    assert pooled(x).low == pytest.approx(ci[0]) and pooled(x).high == pytest.approx(ci[1])


# --- the stored runs, planted ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stored():
    return cs.replicas(load_profile("cpu"), None).last_stored()


def _scaled(reps: Replicas, policy: str, factor: float, arm: str | None = None) -> Replicas:
    """The stored runs with `policy`'s throughput times `factor` (in `arm` only, when given)."""

    def scale(rows):
        rows = rows.copy()
        m = (rows.policy == policy) & ((rows.arm == arm) if arm else True)
        rows.loc[m, "tokens_per_second"] = rows.loc[m, "tokens_per_second"] * factor
        return rows

    return Replicas(None, tuple((n, scale(r)) for n, r in reps.stored))


def _plain_effect(reps: Replicas, ratio: float, batch: int) -> float:
    """demand over last_step, % per pair, mean over each run's pairs, then over runs: by hand."""
    means = []
    for _, rows in reps.stored:
        r = rows[(rows.cache_ratio == ratio) & (rows.batch_size == batch) & (rows.arm == "A")]
        w = r.pivot_table(index="rep", columns="policy", values="tokens_per_second")
        means.append(((w["demand"] / w["last_step"] - 1) * 100).mean())
    return float(np.mean(means))


def test_04_effect_is_the_plain_paired_effect(stored):
    t = judge(claim_compared(stored, FASTER), FASTER, cell_label)
    for c in t.cells:
        want = _plain_effect(stored, c["cell"]["cache_ratio"], c["cell"]["batch_size"])
        assert c["effect"] == pytest.approx(want, abs=0.3)
        assert c["low"] < c["effect"] < c["high"] and c["aa_low"] is not None
        assert c["runs"] == len(stored.stored)


@pytest.mark.parametrize("factor", [0.5, 1.5])
def test_demands_rows_move_04s_effect(stored, factor):
    before = judge(claim_compared(stored, FASTER), FASTER, cell_label)
    after = judge(claim_compared(_scaled(stored, "demand", factor), FASTER), FASTER, cell_label)
    for b, a in zip(before.cells, after.cells):
        assert a["effect"] == pytest.approx(((1 + b["effect"] / 100) * factor - 1) * 100, abs=1.0)
        # the true A/A is demand over demand: both arms scale, so it holds still and the gate stays quiet
        assert (a["aa_low"], a["aa_high"]) == pytest.approx((b["aa_low"], b["aa_high"]), abs=0.5)
    assert after.verdict == (REPRODUCED if factor > 1 else NOT_REPRODUCED), after.reason
    # demand's arm A alone scaled: the A/A (arm B over arm A) moves with it and the gate speaks
    one_arm = judge(claim_compared(_scaled(stored, "demand", factor, arm="A"), FASTER), FASTER, cell_label)
    assert one_arm.verdict == INCONCLUSIVE and "A/A" in one_arm.reason


def _synthetic(runs: int, effect: float, aa_bias=None, seed: int = 0, cells=((1, 1.0), (4, 1.0))) -> list:
    """Runs of rows with demand's A/A pair (arm B), demand over last_step `effect` % in every cell."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(runs):
        shift = rng.normal(0, 0.5)
        rows = []
        for b, ratio in cells:
            for rep in range(6):
                base = 100 * (1 + rng.normal(0, 0.01))
                bias = (aa_bias or {}).get(k, 0.0)
                for pol, arm, x in (
                    ("last_step", "A", base),
                    ("demand", "A", base * (1 + (effect + shift + rng.normal(0, 1)) / 100)),
                    ("demand", "B", base * (1 + (effect + shift + bias + rng.normal(0, 1)) / 100)),
                ):
                    rows.append(
                        dict(
                            task="gsm8k",
                            batch_size=b,
                            cache_ratio=ratio,
                            bandwidth_scale=1.0,
                            rep=rep,
                            policy=pol,
                            arm=arm,
                            tokens_per_second=x,
                        )
                    )
        out.append((f"run{k + 1}", pd.DataFrame(rows)))
    return out


def _label(k):
    return f"b={k[1]} C/W {k[2]:g}"


def test_the_true_aa_pair_is_read_from_the_arm_column():
    reps = Replicas(None, tuple(_synthetic(5, 8.0)))
    c = claim_compared(reps, FASTER)
    assert c.aa_label.startswith("A/A (demand over demand)")
    assert judge(c, FASTER, _label).verdict == REPRODUCED


def test_leave_one_out_drops_the_run_from_the_gate_too():
    """Run 3's A/A is 12% off: the pooled gate fails; left out, the rest read reproduced."""
    reps = Replicas(None, tuple(_synthetic(5, 8.0, aa_bias={2: 60.0})))
    t = judge(claim_compared(reps, FASTER), FASTER, _label)
    assert t.verdict == INCONCLUSIVE and "A/A" in t.reason
    assert t.leave_one_out[2] == REPRODUCED
    assert all(v == INCONCLUSIVE for i, v in enumerate(t.leave_one_out) if i != 2)


def test_a_run_that_lacks_a_cell_is_pooled_over_the_runs_that_hold_it(stored):
    def drop(rows):
        return rows[~((rows.cache_ratio == 1.73) & (rows.batch_size == 4))]

    last = stored.stored[-1][0]
    partial = Replicas(None, tuple((n, drop(r) if n == last else r) for n, r in stored.stored))
    full = judge(claim_compared(stored, FASTER), FASTER, cell_label)
    got = judge(claim_compared(partial, FASTER), FASTER, cell_label)
    cell = {c["label"]: c for c in got.cells}["C/W 1.73 b=4"]
    assert cell["runs"] == len(stored.stored) - 1 and len(got.cells) == len(full.cells)
    assert got.verdict == full.verdict


def test_a_fresh_run_that_contradicts_the_stored_runs_reads_not_reproduced():
    stored_runs = tuple(_synthetic(6, 10.0, seed=1))
    fresh = _synthetic(1, -25.0, seed=2)[0][1]
    assert judge(claim_compared(Replicas(None, stored_runs), FASTER), FASTER, _label).verdict == REPRODUCED
    t = judge(claim_compared(Replicas(fresh, stored_runs), FASTER), FASTER, _label)
    assert t.verdict == NOT_REPRODUCED and t.agreement == "differs from the stored verdict"
    assert t.pooled == REPRODUCED  # shown beside, never an input


def test_a_single_run_without_stored_runs_is_inconclusive():
    fresh = _synthetic(1, 30.0)[0][1]
    t = judge(claim_compared(Replicas(fresh, ()), FASTER), FASTER, _label)
    assert t.verdict == INCONCLUSIVE and "record >= 3 runs" in t.reason


def test_the_verdict_layer_is_one_small_package_on_standard_statistics():
    """artifact/experiments/verdicts/: at most 1,950 lines (the single-run rule, the calibration's scenarios
    and next_step grew it from 1,700), no module over 300, statistics from scipy.stats and statsmodels."""
    root = Path(__file__).resolve().parent.parent / "artifact" / "experiments" / "verdicts"
    sizes = {p.name: len(p.read_text().splitlines()) for p in root.glob("*.py")}
    assert sum(sizes.values()) <= 1950, sizes
    assert max(sizes.values()) <= 300, sizes
    text = "".join(p.read_text() for p in root.glob("*.py"))
    assert "from scipy import stats" in text and "statsmodels" in text


def _stand_in_only(runs: list) -> tuple:
    """Runs as recorded before the A/A pair: no arm B, and the stand-in (CONTROL) run beside demand."""
    out = []
    for name, rows in runs:
        a = rows[rows.arm == "A"]
        control = a[a.policy == "demand"].assign(policy=CONTROL)
        out.append((name, pd.concat([a, control], ignore_index=True).drop(columns="arm")))
    return tuple(out)


def test_a_fresh_run_with_the_aa_pair_beside_stand_in_runs_names_both():
    """A fresh run with demand's A/A pair beside stored runs with only the stand-in: the label names both."""
    fresh = _synthetic(1, 20.0)[0][1]
    c = claim_compared(Replicas(fresh, _stand_in_only(_synthetic(4, 8.0, seed=3))), FASTER)
    assert "A/A (demand over demand)" in c.aa_label and "stand-in A/A" in c.aa_label
    assert all(r.this is not None and r.this.unit == "run" for r in c.effects.values())


def _planted(reps: Replicas, effect: float, seed: int = 0) -> Replicas:
    """A copy of the stored runs with demand set to last_step x (1 + effect %) in every pair, and the stand-in
    A/A to demand's own throughput, each with 0.5% noise per run: a known answer in the real rows' shape."""
    rng = np.random.default_rng(seed)
    out = []
    for name, rows in reps.stored:
        rows = rows.copy()
        key = ["task", "batch_size", "cache_ratio", "bandwidth_scale", "rep"]
        base = rows[rows.policy == "last_step"].set_index(key).tokens_per_second
        for pol, shift in (("demand", effect), (CONTROL, effect)):
            m = rows.policy == pol
            b = base.reindex(pd.MultiIndex.from_frame(rows.loc[m, key])).to_numpy()
            noise = rng.normal(0, 0.5, m.sum())
            rows.loc[m, "tokens_per_second"] = b * (1 + (shift + noise) / 100)
        out.append((name, rows))
    return Replicas(None, tuple(out))


@pytest.mark.parametrize(
    "effect, faster, equal",
    [(10.0, REPRODUCED, NOT_REPRODUCED), (-10.0, NOT_REPRODUCED, NOT_REPRODUCED), (0.0, None, REPRODUCED)],
)
def test_a_planted_effect_in_the_stored_runs_reads_as_it_should(stored, effect, faster, equal):
    """Demand faster by 10%, slower by 10%, or no different, planted in every pair of the 9 stored runs: 04's
    direction claim reads reproduced, not reproduced, and (at 0) never reproduced; its equivalence claim at
    C/W 0.43 reads not reproduced, not reproduced and reproduced."""
    planted = _planted(stored, effect)
    t_faster = judge(claim_compared(planted, FASTER), FASTER, cell_label)
    t_equal = judge(claim_compared(planted, EQUAL), EQUAL, cell_label)
    if faster is None:
        assert t_faster.verdict != REPRODUCED, t_faster.reason
    else:
        assert t_faster.verdict == faster, t_faster.reason
    assert t_equal.verdict == equal, t_equal.reason
    assert all(abs(c["effect"] - effect) < 1.0 for c in t_faster.cells + t_equal.cells)
