"""The verdict rules (artifact/experiments/rules.py, docs/verdicts.md): three outcomes, one interval, an
equivalence test for "no difference", and a "faster" verdict that a crossing interval cannot pass."""
from __future__ import annotations

import numpy as np
import pytest

from artifact.experiments import rules
from artifact.experiments.claims import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.rules import Interval, combine, faster, gated, no_difference, not_faster
from artifact.experiments.stats import paired_difference

M = thresholds.EQUIV_MARGIN


def iv(low, high, n=8):
    return Interval((low + high) / 2, low, high, n)


# --- the three rules the issue names ---------------------------------------------------------------
def test_no_difference_with_a_wide_interval_is_inconclusive_not_reproduced():
    # 05's stored interval before this rule: it includes 0, and it decided "reproduced"
    assert no_difference(iv(-41.1, 38.2, 4)).verdict == INCONCLUSIVE
    assert no_difference(iv(-M - 0.1, 0.5)).verdict == INCONCLUSIVE     # one bound outside the margin


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    assert no_difference(iv(-1.16, 2.63)).verdict == REPRODUCED          # the paper's own interval at C/W 0.43
    assert no_difference(iv(-M, M)).verdict == REPRODUCED
    assert no_difference(iv(0.5, 2.0)).verdict == REPRODUCED              # excludes 0, but inside the margin
    assert no_difference(iv(-0.5, M + 0.01)).verdict == INCONCLUSIVE
    assert no_difference(iv(8.6, 29.4)).verdict == NOT_REPRODUCED        # wholly outside: a difference
    assert no_difference(iv(-20.0, -M - 0.1)).verdict == NOT_REPRODUCED
    assert "inside +-3 by 0.4 points" in no_difference(iv(-1.16, 2.63)).margin


@pytest.mark.parametrize("low, high", [(-9.8, 10.0), (-1.6, 17.2), (-0.01, 30.0), (-16.3, 15.4)])
def test_a_faster_claim_whose_interval_crosses_zero_is_never_reproduced(low, high):
    r = faster(iv(low, high), paper.FASTER_PCT)
    assert r.verdict in (INCONCLUSIVE, NOT_REPRODUCED)
    assert "the paper's" in r.margin and "lower bound" in r.margin


def test_faster_rules_and_the_position_against_the_papers_range():
    lo, hi = paper.FASTER_PCT
    assert faster(iv(7.5, 22.3), paper.FASTER_PCT).verdict == REPRODUCED
    assert "overlapping the paper's" in faster(iv(7.5, 22.3), paper.FASTER_PCT).margin
    assert "inside the paper's" in faster(iv(lo + 0.1, hi - 0.1), paper.FASTER_PCT).margin
    assert "above the paper's" in faster(iv(hi + 1, hi + 5), paper.FASTER_PCT).margin
    assert faster(iv(0.2, 1.0), paper.FASTER_PCT).verdict == REPRODUCED      # faster, below the paper's size
    assert "below the paper's" in faster(iv(0.2, 1.0), paper.FASTER_PCT).margin
    assert faster(iv(-5.0, -1.0)).verdict == NOT_REPRODUCED                 # the other one is faster
    assert faster(iv(-1.0, 2.0), paper.FASTER_PCT).verdict == NOT_REPRODUCED   # excludes the paper's effect
    assert faster(iv(-1.0, 2.0)).verdict == INCONCLUSIVE                      # no range given: undecided
    assert faster(iv(-1.0, lo + 1), paper.FASTER_PCT).verdict == INCONCLUSIVE


def test_too_few_pairs_is_inconclusive_whatever_the_interval():
    n = thresholds.MIN_PAIRS - 1
    for rule in (faster, no_difference, not_faster):
        r = rule(iv(5.0, 6.0, n))
        assert r.verdict == INCONCLUSIVE and f"{n} pairs" in r.why
    assert faster(Interval(1.0, float("nan"), float("nan"), 8)).verdict == INCONCLUSIVE


def test_not_faster_is_non_superiority():
    assert not_faster(iv(-20.0, M - 0.1)).verdict == REPRODUCED
    assert not_faster(iv(-3.3, 12.8, 4)).verdict == INCONCLUSIVE
    assert not_faster(iv(0.5, 6.0)).verdict == NOT_REPRODUCED
    assert not_faster(iv(-41.1, 38.2, 4)).verdict == INCONCLUSIVE


def test_an_aa_control_that_excludes_zero_makes_its_cells_inconclusive():
    ok = not_faster(iv(-20.0, -5.0))
    assert gated(ok, iv(-12.2, -2.0)).verdict == INCONCLUSIVE
    assert "A/A control" in gated(ok, iv(-12.2, -2.0)).why
    assert gated(ok, iv(-2.0, 1.0)) == ok and gated(ok, None) == ok
    # an A/A interval on too few pairs cannot show equivalence: the cell cannot be ruled either
    assert gated(ok, iv(-1.0, 1.0, 2)).verdict == INCONCLUSIVE and "needs >= 4" in gated(ok, iv(-1.0, 1.0, 2)).why


def test_combine_over_cells():
    r, nr, inc = faster(iv(1, 2)), faster(iv(-3, -1)), faster(iv(-1, 1))
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
    assert got.low == pytest.approx(d.ci_low) and got.excludes_zero and faster(got).verdict == REPRODUCED
    assert rules.METHOD == "95% t interval over pairs"


def test_margins_name_the_threshold():
    assert rules.margin_below(0.090, thresholds.FEW) == "9.0% vs < 10%: 1.0 points under"
    assert rules.margin_below(0.12, thresholds.FEW) == "12.0% vs < 10%: 2.0 points over"
    assert rules.margin_at_least(0.83, thresholds.STABLE) == "83.0% vs >= 80%: 3.0 points over"


def test_every_threshold_is_named_once_in_thresholds_py():
    """The claim modules take their thresholds from criteria/thresholds.py and define none of their own."""
    import ast
    from pathlib import Path

    names = ("FEW", "FACTOR", "STABLE", "HEADROOM", "EQUIV_MARGIN", "MIN_PAIRS", "CONFIDENCE", "EVICTION_GAIN",
             "GAP_LEFT", "MIN_RUNS", "MODEL_ERROR")
    for n in names:
        assert isinstance(getattr(thresholds, n), (int, float))
    here = Path(thresholds.__file__).parent.parent
    for path in here.rglob("*.py"):
        if path.name in ("thresholds.py", "stats.py"):       # stats.CONFIDENCE = thresholds.CONFIDENCE (its default)
            continue
        tree = ast.parse(path.read_text())
        defined = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
                   if isinstance(t, ast.Name) and node.col_offset == 0}
        assert not defined & set(names), f"{path.name} defines {defined & set(names)}; name it in thresholds.py"


# --- a GPU cell that timed the host (issue 30) -----------------------------------------------------
def host_rows(device: str, host: dict, wall: float = 10.0):
    """Two policies x 4 repetitions per C/W; host[C/W] = (demand's host ms, last_step's host ms) per forward."""
    import pandas as pd
    return pd.DataFrame([{"device": device, "cache_ratio": r, "policy": pol, "rep": k,
                          "host_ms_per_forward": h + 0.1 * k, "wall_ms_per_forward": wall}
                         for r, hs in host.items() for pol, h in zip(("demand", "last_step"), hs) for k in range(4)])


def test_host_shares_of_gpu_cells_and_none_on_the_cpu():
    rows = host_rows("cuda:0", {1.0: (2.0, 3.0), 1.73: (7.0, 4.0)})
    s = rules.host_shares(rows, ["cache_ratio"])
    assert s[(1.0,)] == pytest.approx(0.315) and s[(1.73,)] == pytest.approx(0.715)   # the larger policy's median
    assert rules.host_shares(host_rows("cpu", {1.0: (9.0, 9.0)}), ["cache_ratio"]) == {}   # CPU: not applied
    assert rules.host_shares(rows.drop(columns=["host_ms_per_forward"]), ["cache_ratio"]) == {}   # old rows
    nan = rows.assign(host_ms_per_forward=float("nan"))                      # written before host time: unmeasured
    assert rules.host_shares(nan, ["cache_ratio"]) == {}


def test_a_host_bound_gpu_cell_is_inconclusive():
    ok = faster(iv(1.0, 4.0))
    assert ok.verdict == REPRODUCED
    flipped = gated(ok, None, host=0.74)
    assert flipped.verdict == INCONCLUSIVE and "host-bound: host 74% of wall" in flipped.why
    assert flipped.margin == ok.margin
    assert gated(ok, None, host=0.5) == ok and gated(ok, None, host=None) == ok      # at the bound: judged
    no = faster(iv(-4.0, -1.0))
    assert gated(no, iv(-1.0, 1.0), host=0.9).verdict == INCONCLUSIVE             # not reproduced flips too
