"""Paired statistics: agree with scipy on known data; a CI excludes zero exactly when it should."""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from artifact.experiments.paired_table import (
    bootstrap_ci,
    format_table,
    paired_difference,
    paired_table,
    pairs,
    percent_differences,
    with_paper,
)

# Known data: tokens/s of policy A and B in 8 pairs.
A = np.array([101.2, 98.7, 105.3, 99.9, 103.1, 100.4, 97.8, 104.6])
B = np.array([96.1, 97.0, 99.8, 98.2, 97.5, 99.1, 95.4, 98.8])


def test_percent_differences_are_per_pair():
    d = percent_differences([110, 90], [100, 100])
    assert d.tolist() == pytest.approx([10.0, -10.0])
    with pytest.raises(ValueError, match="same length"):
        percent_differences([1, 2], [1])
    with pytest.raises(ValueError, match="b > 0"):
        percent_differences([1, 2], [1, 0])
    with pytest.raises(ValueError, match="finite"):
        percent_differences([1, np.nan], [1, 1])


def test_matches_scipy_t_interval_and_ttest():
    res = paired_difference(A, B)
    d = (A - B) / B * 100
    assert res.n_pairs == 8
    assert res.diff_pct == pytest.approx(d.mean(), rel=1e-12)
    assert res.mean_a == pytest.approx(A.mean()) and res.mean_b == pytest.approx(B.mean())
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert (res.ci_low, res.ci_high) == pytest.approx((lo, hi), rel=1e-12)
    one = sps.ttest_1samp(d, 0.0)
    assert (res.ci_low, res.ci_high) == pytest.approx(tuple(one.confidence_interval(0.95)), rel=1e-12)
    # the same test as a paired t-test of a / b * 100 against 100
    rel = sps.ttest_rel(A / B * 100, np.full(len(A), 100.0))
    assert res.p_value == pytest.approx(rel.pvalue, rel=1e-10)
    assert res.p_value == pytest.approx(one.pvalue, rel=1e-10)
    # a 99% interval is wider and still centred on the mean
    wide = paired_difference(A, B, confidence=0.99)
    assert wide.ci_low < res.ci_low and wide.ci_high > res.ci_high
    assert (wide.ci_low + wide.ci_high) / 2 == pytest.approx(res.diff_pct)


def test_excludes_zero_exactly_when_it_should():
    rng = np.random.default_rng(1)
    b = rng.uniform(90, 110, size=20)
    faster = paired_difference(b * 1.10 * (1 + rng.normal(0, 0.005, 20)), b)  # +10% +- 0.5%
    assert faster.excludes_zero and faster.ci_low > 5 and faster.verdict == "A faster"
    slower = paired_difference(b * 0.90 * (1 + rng.normal(0, 0.005, 20)), b)
    assert slower.excludes_zero and slower.ci_high < -5 and slower.verdict == "B faster"
    signs = np.where(np.arange(20) % 2 == 0, 1.0, -1.0)  # +5%, -5%, ...: mean 0
    none = paired_difference(b * (1 + 0.05 * signs), b)
    assert not none.excludes_zero and none.ci_low < 0 < none.ci_high and none.verdict == "no difference"
    # the boundary: shifting the same per-pair percentages so the lower limit sits just above or below 0
    d = percent_differences(A, B)
    half = d.mean() - paired_difference(A, B).ci_low
    for shift, expect in ((half + 1e-6, True), (half - 1e-6, False)):
        e = d - d.mean() + shift
        r = paired_difference(100 * (1 + e / 100), np.full(len(e), 100.0))
        assert r.excludes_zero is expect


def test_degenerate_cases():
    one = paired_difference([110.0], [100.0])
    assert one.n_pairs == 1 and one.diff_pct == pytest.approx(10.0)
    assert np.isnan(one.ci_low) and not one.excludes_zero
    same = paired_difference([110.0, 220.0], [100.0, 200.0])  # +10% in both pairs: no spread
    assert same.ci_low == same.ci_high == pytest.approx(10.0) and same.excludes_zero
    with pytest.raises(ValueError, match="no pairs"):
        paired_difference([], [])


def test_bootstrap_is_seeded_and_sensible():
    d = percent_differences(A, B)
    first = bootstrap_ci(d, seed=3)
    assert bootstrap_ci(d, seed=3) == first
    assert bootstrap_ci(d, seed=4) != first
    assert first[0] < d.mean() < first[1]
    # scipy >= 1.15
    seed_kw = "rng" if "rng" in inspect.signature(sps.bootstrap).parameters else "random_state"
    ref = sps.bootstrap(
        (d,),
        np.mean,
        confidence_level=0.95,
        n_resamples=20_000,
        method="percentile",
        **{seed_kw: np.random.default_rng(0)},
    ).confidence_interval
    assert first == pytest.approx((ref.low, ref.high), abs=0.15)  # Monte Carlo error only
    assert np.isnan(bootstrap_ci([1.0])[0])


def rows(effects: dict, reps: int = 6, seed: int = 0) -> pd.DataFrame:
    """Bench-like rows: for each C/W ratio, demand is `effect` % faster than last_step per pair."""
    rng = np.random.default_rng(seed)
    out = []
    for ratio, effect in effects.items():
        for task in ("gsm8k", "mbpp"):
            for r in range(reps):
                base = rng.uniform(50, 60)
                noise = rng.normal(0, 0.5)
                for pol, tps in (("last_step", base), ("demand", base * (1 + (effect + noise) / 100))):
                    out.append(
                        {
                            "task": task,
                            "batch_size": 1,
                            "cache_ratio": ratio,
                            "bandwidth_scale": 1.0,
                            "rep": r,
                            "policy": pol,
                            "tokens_per_second": tps,
                        }
                    )
    return pd.DataFrame(out)


def test_paired_table_pairs_by_cell_and_rep():
    df = rows({0.43: 0.0, 1.0: 8.0, 1.73: -6.0})
    t = paired_table(df, "demand", "last_step")
    assert list(t.cache_ratio) == [0.43, 1.0, 1.73]
    assert (t.n_pairs == 12).all()
    assert list(t.excludes_zero) == [False, True, True]
    assert list(t.verdict) == ["no difference", "A faster", "B faster"]
    assert t.diff_pct.iloc[1] == pytest.approx(8.0, abs=0.6)
    # pairing is by (cell, rep), not by row order
    shuffled = paired_table(df.sample(frac=1, random_state=5), "demand", "last_step")
    pd.testing.assert_frame_equal(t, shuffled)
    # by hand for one group
    g = pairs(df[df.cache_ratio == 1.0], "demand", "last_step")
    ref = paired_difference(g.demand, g.last_step)
    assert t.ci_low.iloc[1] == pytest.approx(ref.ci_low) and t.ci_high.iloc[1] == pytest.approx(ref.ci_high)
    assert t.boot_low.iloc[1] < t.diff_pct.iloc[1] < t.boot_high.iloc[1]
    # B vs A flips the sign
    flip = paired_table(df, "last_step", "demand")
    assert flip.diff_pct.iloc[2] > 0 and flip.verdict.iloc[2] == "A faster"
    by_task = paired_table(df, by=["cache_ratio", "task"])
    assert len(by_task) == 6 and (by_task.n_pairs == 6).all()


def test_paired_table_errors():
    df = rows({1.0: 5.0})
    with pytest.raises(
        ValueError,
        match=r"policy 'oracle' is not in these rows; they hold \['demand', "
        r"'last_step'\]",
    ):
        paired_table(df, "oracle", "last_step")
    with pytest.raises(ValueError, match="two rows for the same run"):
        paired_table(pd.concat([df, df.iloc[:1]]), "demand", "last_step")
    with pytest.raises(ValueError, match="cannot group by"):
        paired_table(df, by=["policy"])
    with pytest.raises(ValueError, match="lack columns"):
        paired_table(df.drop(columns="rep"))


def test_paper_marks_and_text():
    t = with_paper(paired_table(rows({0.43: 0.0, 0.83: 8.0, 1.73: -6.0})))
    assert list(t.paper_verdict) == ["no difference", "A faster", "A faster"]
    assert list(t.agrees) == [True, True, False]
    assert "[-1.16, +2.63]" in t.paper.iloc[0]
    text = format_table(t)
    assert "demand (A) vs last_step (B)" in text and "0.83" in text and "excl. 0" in text
    other = paired_table(rows({1.0: 1.0}), "last_step", "demand")
    assert "paper" not in with_paper(other)
