"""The verdict rules (artifact/experiments/rules.py, docs/verdicts.md): one question per claim (faster by more
than the margin, no difference within it, not faster by more than it), three outcomes, every rule monotone
under widening and able to decide any true effect off its boundary, the A/A control as a direction claim's
null and an equivalence claim's precision gate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sstats

from artifact.experiments import rules
from artifact.experiments.verdicts.records import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.verdicts.rules import (
    Interval,
    Question,
    bias_bound,
    combine,
    faster,
    hull,
    no_difference,
    not_faster,
    rule_cell,
)
from artifact.experiments.outputs.paired_table import paired_difference

M = thresholds.MARGIN
QUESTIONS = (faster(), faster(paper=paper.FASTER_PCT), no_difference(), not_faster(), faster(unit=" points"))
RANK = {NOT_REPRODUCED: -1, INCONCLUSIVE: 0, REPRODUCED: 1}


def iv(low, high, n=8, unit="pairs"):
    return Interval((low + high) / 2, low, high, n, unit)


# --- the three questions ---------------------------------------------------------------------------
def test_no_difference_with_a_wide_interval_is_inconclusive_not_reproduced():
    assert no_difference()(iv(-41.1, 38.2, 4)).verdict == INCONCLUSIVE
    assert no_difference()(iv(-M - 0.1, 0.5)).verdict == INCONCLUSIVE  # one bound outside the margin


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    q = no_difference()
    assert q(iv(-1.16, 2.63)).verdict == REPRODUCED  # the paper's own interval at C/W 0.43
    assert q(iv(-M, M)).verdict == REPRODUCED
    assert q(iv(0.5, 2.0)).verdict == REPRODUCED  # excludes 0, but inside the margin
    assert q(iv(-0.5, M + 0.01)).verdict == INCONCLUSIVE
    assert q(iv(8.6, 29.4)).verdict == NOT_REPRODUCED  # wholly outside: a difference
    assert q(iv(-20.0, -M - 0.1)).verdict == NOT_REPRODUCED
    assert "inside +-3 by 0.4 points" in q(iv(-1.16, 2.63)).margin


def test_faster_means_faster_by_more_than_the_margin_and_the_papers_range_never_decides():
    q = faster(paper=paper.FASTER_PCT)
    lo, hi = paper.FASTER_PCT
    assert q(iv(7.5, 22.3)).verdict == REPRODUCED and "overlapping the paper's" in q(iv(7.5, 22.3)).margin
    assert "inside the paper's" in q(iv(lo + 0.1, hi - 0.1)).margin
    assert "above the paper's" in q(iv(hi + 1, hi + 5)).margin
    assert q(iv(M + 0.1, M + 0.5)).verdict == REPRODUCED  # below the paper's size: still faster by > m
    assert "below the paper's" in q(iv(M + 0.1, M + 0.5)).margin
    assert q(iv(0.2, 1.0)).verdict == NOT_REPRODUCED  # faster, but not by more than the margin
    assert q(iv(-5.0, -1.0)).verdict == NOT_REPRODUCED  # the other one is faster
    assert q(iv(-1.0, M + 1)).verdict == INCONCLUSIVE  # crosses the boundary
    # the paper's range only labels: the same interval rules the same with or without it
    for a, b in ((-1.0, 2.0), (-1.0, lo + 1), (0.5, 1.0), (4.0, 30.0)):
        assert q(iv(a, b)).verdict == faster()(iv(a, b)).verdict


def test_not_faster_is_non_superiority_by_the_margin():
    q = not_faster()
    assert q(iv(-20.0, M - 0.1)).verdict == REPRODUCED
    assert q(iv(0.5, 2.5)).verdict == REPRODUCED  # faster, by less than the margin
    assert q(iv(-3.3, 12.8, 4)).verdict == INCONCLUSIVE
    assert q(iv(M + 0.5, 6.0)).verdict == NOT_REPRODUCED
    assert q(iv(0.5, 6.0)).verdict == INCONCLUSIVE  # crosses +m: undecided


def test_too_few_pairs_or_runs_is_inconclusive_whatever_the_interval():
    n = thresholds.MIN_PAIRS - 1
    for q in QUESTIONS:
        r = q(iv(5.0, 6.0, n))
        assert r.verdict == INCONCLUSIVE and f"{n} pairs" in r.why
        assert q(iv(5.0, 6.0, thresholds.MIN_RUNS - 1, "runs")).verdict == INCONCLUSIVE
    assert faster()(Interval(1.0, float("nan"), float("nan"), 8)).verdict == INCONCLUSIVE
    with pytest.raises(ValueError, match="question 'quicker'"):
        Question("quicker")


# --- monotone under widening (a property over random intervals, for every rule) ----------------------
bounds = st.floats(-60, 60, allow_nan=False, allow_infinity=False)
widen = st.floats(0, 40, allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(
    bounds, bounds, widen, widen, st.sampled_from(range(len(QUESTIONS))), st.sampled_from([None, 0.5, 4.0])
)
def test_every_rule_is_monotone_under_widening(x, y, wl, wh, which, ctrl):
    """If I lies inside J, verdict(J) is verdict(I) or inconclusive: for the rule alone, and with the A/A
    control gate (the control's interval widened too) as rule_cell applies it."""
    q = QUESTIONS[which]
    inner = iv(min(x, y), max(x, y))
    outer = Interval(inner.mean, inner.low - wl, inner.high + wh, inner.n)
    got_i, got_o = q(inner).verdict, q(outer).verdict
    assert got_o in (got_i, INCONCLUSIVE), (q, inner, outer, got_i, got_o)
    if ctrl is not None:
        ci, co = iv(-ctrl, ctrl / 2), iv(-ctrl - wl, ctrl / 2 + wh)
        a, b = rule_cell(q, inner, ci).verdict, rule_cell(q, outer, co).verdict
        assert b in (a, INCONCLUSIVE)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(bounds, bounds, widen), min_size=1, max_size=6), st.sampled_from(range(len(QUESTIONS)))
)
def test_combining_cells_is_monotone_too(cells, which):
    q = QUESTIONS[which]
    inner = [iv(min(x, y), max(x, y)) for x, y, _ in cells]
    outer = [Interval(i.mean, i.low - w, i.high + w, i.n) for i, (_, _, w) in zip(inner, cells)]
    a = combine((str(k), q(i)) for k, i in enumerate(inner))[0]
    b = combine((str(k), q(o)) for k, o in enumerate(outer))[0]
    assert b in (a, INCONCLUSIVE)


@settings(max_examples=300, deadline=None)
@given(
    st.floats(0.0, 0.4), st.floats(0.0, 0.4), st.floats(0.0, 0.2), st.floats(0.0, 0.2), st.floats(0.0, 0.4)
)
def test_the_model_error_rule_is_monotone_and_a_single_run_never_contradicts_the_median(a, b, wl, wh, own):
    """rules.at_most (08: a figure <= MODEL_ERROR) on a range: widening it gives the same verdict or
    inconclusive; a single run's range (its figure with the pooled median, rules.figure_range) gives the
    pooled verdict or inconclusive, whatever its own figure."""
    limit = thresholds.MODEL_ERROR
    lo, hi = min(a, b), max(a, b)
    inner, outer = rules.at_most(lo, hi, limit), rules.at_most(max(0.0, lo - wl), hi + wh, limit)
    assert outer in (inner, INCONCLUSIVE)
    pooled = rules.at_most(a, a, limit)
    assert rules.at_most(*rules.figure_range(own, a), limit) in (pooled, INCONCLUSIVE)
    assert rules.figure_range(own, None) == (own, own)


def test_the_model_error_rule_decides_off_its_limit_and_refuses_an_empty_range():
    limit = thresholds.MODEL_ERROR
    assert rules.at_most(0.05, limit, limit) == REPRODUCED  # at the limit passes: <= limit
    assert rules.at_most(0.11, 0.2, limit) == NOT_REPRODUCED
    assert rules.at_most(0.05, 0.12, limit) == INCONCLUSIVE
    with pytest.raises(ValueError, match="empty"):
        rules.at_most(0.2, 0.1, limit)


def test_the_old_faster_rule_was_not_monotone_and_this_one_is():
    """The rule this replaces said `not reproduced` for an interval crossing 0 below the paper's range, so
    widening [0.12, 1.24] (reproduced: above 0) to [-0.48, 1.46] gave `not reproduced`. Here neither decides
    the opposite."""
    q = faster(paper=paper.FASTER_PCT)
    narrow, wide = q(iv(0.12, 1.24)).verdict, q(iv(-0.48, 1.46)).verdict
    assert wide in (narrow, INCONCLUSIVE)


# --- decidable off the boundary ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "q, effects",
    [
        (faster(), (-5.0, 0.0, 0.3, 2.0, 4.0, 10.0)),
        (no_difference(), (-8.0, -2.0, 0.0, 0.3, 2.0, 8.0)),
        (not_faster(), (-5.0, 0.0, 2.0, 4.0, 10.0)),
    ],
)
def test_every_rule_decides_any_true_effect_off_its_boundary_given_enough_runs(q, effects):
    """Runs drawn around a true effect (sd 2 points per run mean): with enough runs the pooled interval
    decides, the right way, for every effect not on the claim's boundary (+m, or +-m), 0 included (04 at b=4,
    C/W 1.73 reads +0.3 [-5.5, 6.1]: a direction claim with its boundary at 0 could never decide it)."""
    rng = np.random.default_rng(0)
    for e in effects:
        x = rng.normal(e, 2.0, 400)
        half = sstats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
        got = q(Interval(x.mean(), x.mean() - half, x.mean() + half, len(x), "runs")).verdict
        truth = {rules.FASTER: e > M, rules.NO_DIFFERENCE: abs(e) < M, rules.NOT_FASTER: e < M}[q.kind]
        assert got == (REPRODUCED if truth else NOT_REPRODUCED), (q.kind, e, got)


# --- the A/A control: a direction claim's null, an equivalence claim's gate ---------------------------
def test_the_control_gates_equivalence_and_non_superiority_but_not_a_direction_claim():
    control = iv(-3.6, 3.3)  # 04's kind of control: too wide for +-3
    assert rule_cell(not_faster(), iv(-20.0, -5.0), control).verdict == INCONCLUSIVE
    assert "A/A control" in rule_cell(not_faster(), iv(-20.0, -5.0), control).why
    assert rule_cell(not_faster(), iv(-20.0, -5.0), iv(-2.0, 1.0)).verdict == REPRODUCED
    # too few pairs
    assert rule_cell(no_difference(), iv(-1.0, 1.0), iv(-1.0, 1.0, 2)).verdict == INCONCLUSIVE
    # a direction claim's interval is already net of the control: a control of +-3.6 cannot veto +26.6
    assert rule_cell(faster(), iv(26.6, 29.7), control).verdict == REPRODUCED


def test_the_bias_bound_alternative_widens_by_the_controls_largest_bias():
    b = bias_bound(iv(26.6, 29.7), iv(-3.6, 3.3))
    assert (b.low, b.high) == pytest.approx((23.0, 33.3))
    assert faster()(b).verdict == REPRODUCED
    assert faster()(bias_bound(iv(4.8, 9.3), iv(-3.6, 3.3))).verdict == INCONCLUSIVE


def test_a_hull_holds_both_intervals():
    h = hull(iv(1.0, 2.0, 4, "run"), iv(-1.0, 1.5, 6, "runs"))
    assert (h.low, h.high, h.n, h.unit) == (-1.0, 2.0, 6, "hull") and "pooled 6 runs" in h.count_text()


def test_combine_over_cells():
    q = faster()
    r, nr, inc = q(iv(4, 5)), q(iv(-3, -1)), q(iv(-1, 4))
    assert combine([("a", r), ("b", r)])[0] == REPRODUCED
    verdict, reason, margin = combine([("a", r), ("b", inc)])
    assert verdict == INCONCLUSIVE and reason.startswith("b:") and "a: " in margin and "b: " in margin
    assert combine([("a", r), ("b", inc), ("c", nr)])[0] == NOT_REPRODUCED
    assert combine([])[0] == INCONCLUSIVE


def test_the_interval_is_the_t_interval_of_stats():
    rng = np.random.default_rng(1)
    b = 50 + rng.random(8)
    a = b * (1 + rng.normal(0.05, 0.01, 8))
    d = paired_difference(a, b)
    got = Interval(d.diff_pct, d.ci_low, d.ci_high, d.n_pairs)
    assert got.low == pytest.approx(d.ci_low) and got.excludes_zero and faster(0.0)(got).verdict == REPRODUCED
    assert got.unit == "pairs" and got.count_text() == "8 pairs"


def test_margins_name_the_threshold():
    assert rules.margin_below(0.090, thresholds.FEW) == "9.0% vs < 10%: 1.0 points under"
    assert rules.margin_below(0.12, thresholds.FEW) == "12.0% vs < 10%: 2.0 points over"
    assert rules.margin_at_least(0.83, thresholds.STABLE) == "83.0% vs >= 80%: 3.0 points over"


def test_every_threshold_is_named_once_in_thresholds_py():
    """The claim modules take their thresholds from criteria/thresholds.py and define none of their own."""
    import ast
    from pathlib import Path

    names = (
        "FEW",
        "FACTOR",
        "STABLE",
        "HEADROOM",
        "MARGIN",
        "MIN_PAIRS",
        "CONFIDENCE",
        "EVICTION_GAIN",
        "GAP_LEFT",
        "MIN_RUNS",
        "MODEL_ERROR",
    )
    for n in names:
        assert isinstance(getattr(thresholds, n), (int, float))
    here = Path(thresholds.__file__).parent.parent
    for path in here.rglob("*.py"):
        # stats.CONFIDENCE = thresholds.CONFIDENCE (its default)
        if path.name in ("thresholds.py", "stats.py"):
            continue
        tree = ast.parse(path.read_text())
        defined = {
            t.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name) and node.col_offset == 0
        }
        assert not defined & set(names), (
            f"{path.name} defines {defined & set(names)}; name it in thresholds.py"
        )


# --- a GPU cell that timed the host (issue 30) -----------------------------------------------------
def host_rows(device: str, host: dict, wall: float = 10.0):
    """Two policies x 4 repetitions per C/W; host[C/W] = (demand's host ms, last_step's host ms) per
    forward."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "device": device,
                "cache_ratio": r,
                "policy": pol,
                "rep": k,
                "host_ms_per_forward": h + 0.1 * k,
                "wall_ms_per_forward": wall,
            }
            for r, hs in host.items()
            for pol, h in zip(("demand", "last_step"), hs)
            for k in range(4)
        ]
    )


def test_host_shares_of_gpu_cells_and_none_on_the_cpu():
    rows = host_rows("cuda:0", {1.0: (2.0, 3.0), 1.73: (7.0, 4.0)})
    s = rules.host_shares(rows, ["cache_ratio"])
    # the larger policy's median
    assert s[(1.0,)] == pytest.approx(0.315) and s[(1.73,)] == pytest.approx(0.715)
    assert rules.host_shares(host_rows("cpu", {1.0: (9.0, 9.0)}), ["cache_ratio"]) == {}  # CPU: not applied
    assert rules.host_shares(rows.drop(columns=["host_ms_per_forward"]), ["cache_ratio"]) == {}  # old rows
    nan = rows.assign(host_ms_per_forward=float("nan"))  # written before host time: unmeasured
    assert rules.host_shares(nan, ["cache_ratio"]) == {}


def test_a_host_bound_gpu_cell_is_inconclusive():
    q = faster()
    ok = q(iv(4.0, 6.0))
    assert ok.verdict == REPRODUCED
    flipped = rule_cell(q, iv(4.0, 6.0), None, host=0.74)
    assert flipped.verdict == INCONCLUSIVE and "host-bound: host 74% of wall" in flipped.why
    assert flipped.margin == ok.margin
    # at the bound
    assert rule_cell(q, iv(4.0, 6.0), None, host=0.5) == ok and rule_cell(q, iv(4.0, 6.0)) == ok
    assert rule_cell(q, iv(-4.0, -1.0), iv(-1.0, 1.0), host=0.9).verdict == INCONCLUSIVE  # not reproduced too
