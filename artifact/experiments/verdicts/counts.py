"""Figures judged against a threshold (exact counts, the performance model's error): the three outcomes of
rules.py for a number, or a range known to hold it, against a limit."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from artifact.experiments.verdicts.rules import CONFIDENCE, INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED


def at_most(low: float, high: float, limit: float) -> str:
    """A figure known to lie in [low, high], judged `<= limit`: reproduced when all of it is, not reproduced
    when none of it is, else inconclusive."""
    if low > high:
        raise ValueError(f"at_most: the range [{low}, {high}] is empty (expected low <= high)")
    return REPRODUCED if high <= limit else NOT_REPRODUCED if low > limit else INCONCLUSIVE


def median_interval(figures: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The distribution-free interval of the median of the runs' figures: scipy.stats.quantile_test's
    confidence interval for the 0.5 quantile (the whole range when too few figures for the level)."""
    x = np.asarray(figures, dtype=float)
    if len(x) == 0:
        raise ValueError("median_interval: no figures")
    ci = stats.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(confidence)
    lo = float(ci.low) if math.isfinite(ci.low) else float(x.min())
    hi = float(ci.high) if math.isfinite(ci.high) else float(x.max())
    return lo, hi


def margin_below(value: float, threshold: float) -> str:
    """A share judged `< threshold`: how far below (or above) it lies."""
    d = (threshold - value) * 100
    return f"{value:.1%} vs < {threshold:.0%}: " + (
        f"{d:.1f} points under" if d > 0 else f"{-d:.1f} points over"
    )


def margin_at_least(value: float, threshold: float) -> str:
    """A share judged `>= threshold`."""
    d = (value - threshold) * 100
    return f"{value:.1%} vs >= {threshold:.0%}: " + (
        f"{d:.1f} points over" if d >= 0 else f"{-d:.1f} points under"
    )
