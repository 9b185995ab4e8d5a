"""The verdict rules (docs/verdicts.md), one function per kind of claim. A timing claim is ruled per cell on
the plain paired effect of A over B (nothing added to it or subtracted from it) and its 95% interval; a claim
over several cells combines them. Three outcomes:

  FASTER (direction)          reproduced: the A/A gate is clean and, in every cell, the 95% interval lies
                              above 0 (the paper's criterion: "all paired 95% confidence intervals excluding
                              zero"; an intersection needs no multiplicity correction). Not reproduced: some
                              cell's interval at the simultaneous level over the claim's cells (Bonferroni,
                              statsmodels' multipletests) lies at or below 0. Else inconclusive.
  NO_DIFFERENCE (equivalence) reproduced: the 95% interval lies inside +-MARGIN (TOST at 2.5% per side); not
                              reproduced: it lies wholly outside; else inconclusive.
  NOT_FASTER (non-superior.)  reproduced: the interval lies below +MARGIN; not reproduced: above it.

The A/A gate: a cell whose A/A interval (demand against demand, or the stand-in on runs recorded before the
true A/A existed) does not lie inside +-MARGIN is inconclusive, with the reason. It never corrects the effect.
A GPU cell whose host time is over HOST_SHARE_LIMIT of its wall time is inconclusive too (host_shares).
Exact counts compare a number with a threshold (at_most, margin_below, margin_at_least)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

from artifact.experiments.criteria import paper, thresholds

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NOT_MEASURABLE = "not measurable on this profile"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_MEASURABLE)
FASTER, NO_DIFFERENCE, NOT_FASTER = "faster", "no difference", "not faster"
QUESTIONS = (FASTER, NO_DIFFERENCE, NOT_FASTER)
CONFIDENCE = thresholds.CONFIDENCE
ABOVE_ZERO = paper.ABOVE_ZERO  # a bound stated only as "above 0" (the paper's direction intervals)


@dataclass(frozen=True)
class Interval:
    """An effect and its CONFIDENCE interval. `se` and `df` (a t interval: scipy.stats.t) let it be asked at
    another level; an interval known only by its bounds (the `rule` command's) is re-levelled on the normal
    scale. `n` counts `unit`: "runs" (pooled over runs), "run" (one run widened by the run-to-run spread),
    "pairs" (within one run: no run-to-run variation) or "stated" (given by hand)."""

    mean: float
    low: float
    high: float
    n: int = 0
    unit: str = "stated"
    se: float | None = None
    df: float | None = None

    @classmethod
    def t(cls, mean: float, se: float, df: float, n: int, unit: str) -> "Interval":
        lo, hi = stats.t.interval(CONFIDENCE, df, loc=mean, scale=se) if se > 0 else (mean, mean)
        return cls(float(mean), float(lo), float(hi), n, unit, float(se), float(df))

    @property
    def usable(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def excludes_zero(self) -> bool:
        return self.usable and (self.low > 0 or self.high < 0)

    def at(self, confidence: float) -> "Interval":
        """The same effect at another two-sided level."""
        if confidence == CONFIDENCE or not self.usable:
            return self
        if self.se is not None and self.se > 0:
            lo, hi = stats.t.interval(confidence, self.df, loc=self.mean, scale=self.se)
            return replace(self, low=float(lo), high=float(hi))
        k = stats.norm.ppf(0.5 + confidence / 2) / stats.norm.ppf(0.5 + CONFIDENCE / 2)
        return replace(
            self, low=self.mean - k * (self.mean - self.low), high=self.mean + k * (self.high - self.mean)
        )

    def p_value(self) -> float:
        """Two-sided p of H0 "the effect is 0" (on the interval's t, or normal, scale)."""
        if self.se is not None and self.se > 0:
            return float(2 * stats.t.sf(abs(self.mean) / self.se, self.df))
        half = (self.high - self.low) / 2 / stats.norm.ppf(0.5 + CONFIDENCE / 2)
        return float(2 * stats.norm.sf(abs(self.mean) / half)) if half > 0 else float(self.mean == 0)

    def text(self, unit: str = "%") -> str:
        def bound(x):
            return ">0" if x == ABOVE_ZERO else f"{x:+.1f}"

        return f"{self.mean:+.1f}{unit} [{bound(self.low)}, {bound(self.high)}]"


@dataclass(frozen=True)
class Ruling:
    verdict: str
    why: str  # one phrase: what decided it


def rule_cell(kind: str, iv: Interval, margin: float = thresholds.MARGIN, unit: str = "%") -> Ruling:
    """One cell's ruling on one interval (rule_claim_cells reads `not reproduced` at the simultaneous one)."""
    if kind not in QUESTIONS:
        raise ValueError(f"question {kind!r}: expected one of {', '.join(QUESTIONS)}")
    if not iv.usable:
        return Ruling(INCONCLUSIVE, "no interval (fewer than 2 runs, or pairs without spread)")
    m = f"{margin:g}{unit}"
    if kind == FASTER:
        if iv.low > 0:
            return Ruling(REPRODUCED, "interval above 0")
        return (
            Ruling(NOT_REPRODUCED, "interval at or below 0")
            if iv.high <= 0
            else Ruling(INCONCLUSIVE, "interval reaches 0")
        )
    if kind == NO_DIFFERENCE:
        if -margin <= iv.low and iv.high <= margin:
            return Ruling(REPRODUCED, f"interval inside +-{m}")
        if iv.low > margin or iv.high < -margin:
            return Ruling(NOT_REPRODUCED, f"interval wholly outside +-{m}")
        return Ruling(INCONCLUSIVE, f"interval too wide for +-{m}")
    if iv.high < margin:
        return Ruling(REPRODUCED, f"interval below +{m}")
    if iv.low > margin:
        return Ruling(NOT_REPRODUCED, f"interval above +{m}: faster by more than the margin")
    return Ruling(INCONCLUSIVE, f"interval crosses +{m}")


def simultaneous(cells: Sequence[Interval]) -> float:
    """The per-cell level at which a claim over these cells reads `not reproduced` (a union over the cells):
    Bonferroni, 1 - 0.05 / k (statsmodels' multipletests over the cells' p of "the effect is 0")."""
    usable = [iv for iv in cells if iv.usable]
    return 1 - multipletests([iv.p_value() for iv in usable] or [1.0], 1 - CONFIDENCE, "bonferroni")[3]


def aa_gate(aa: Interval | None, margin: float = thresholds.MARGIN, label: str = "A/A") -> str | None:
    """Why a cell's A/A makes it inconclusive, or None when clean: its interval must lie inside +-margin
    (containing 0 is not enough: a wide A/A says the instrument is too noisy to rule)."""
    if aa is None:
        return f"no {label} in this cell"
    if not aa.usable:
        return f"{label} has no interval"
    if -margin <= aa.low and aa.high <= margin:
        return None
    return f"{label} {aa.text()} is not inside +-{margin:g}%"


def host_bound(host: float | None) -> str | None:
    if host is not None and host > thresholds.HOST_SHARE_LIMIT:
        return (
            f"host-bound: host {host:.0%} of wall time per forward (> {thresholds.HOST_SHARE_LIMIT:.0%}), "
            "so it timed the host, not the link"
        )
    return None


def rule_claim_cells(
    kind: str,
    cells: Sequence[tuple[str, Interval]],
    gates: Sequence[str | None] = (),
    margin: float = thresholds.MARGIN,
    unit: str = "%",
) -> tuple[str, str]:
    """(verdict, reason) of a claim over its labelled cells. `gates`: per cell, why its A/A (or host) makes it
    inconclusive, or None (a gated cell is inconclusive whatever its interval says). Not reproduced if any
    cell is at the simultaneous level (Bonferroni over the cells), reproduced if every cell is at the 95%
    level, else inconclusive; the reason names the cells that decided it."""
    if not cells:
        return INCONCLUSIVE, "no cells"
    gates = list(gates) or [None] * len(cells)
    rulings = [rule_cell(kind, iv, margin, unit) for _, iv in cells]
    level = simultaneous([iv for _, iv in cells])
    for i, ((_, iv), r) in enumerate(zip(cells, rulings)):
        if (
            r.verdict == NOT_REPRODUCED
            and rule_cell(kind, iv.at(level), margin, unit).verdict != NOT_REPRODUCED
        ):
            rulings[i] = Ruling(
                INCONCLUSIVE, f"{r.why}, but not at the simultaneous level over {len(cells)} cells"
            )
        elif r.verdict == NOT_REPRODUCED and len(cells) > 1:
            rulings[i] = Ruling(NOT_REPRODUCED, f"{r.why} at the simultaneous level over {len(cells)} cells")
    rulings = [Ruling(INCONCLUSIVE, g) if g else r for r, g in zip(rulings, gates)]
    verdicts = [r.verdict for r in rulings]
    if NOT_REPRODUCED in verdicts:
        verdict = NOT_REPRODUCED
    elif all(v == REPRODUCED for v in verdicts):
        verdict = REPRODUCED
    else:
        verdict = INCONCLUSIVE
    if verdict == REPRODUCED:
        return verdict, f"every cell's {CONFIDENCE:.0%} interval: " + rulings[0].why
    return verdict, "; ".join(
        f"{label}: {r.why}" for (label, _), r in zip(cells, rulings) if r.verdict == verdict
    )


def host_shares(rows, by: Sequence[str]) -> dict:
    """{key tuple of `by`: the cell's host share of wall time per forward} over GPU rows: per row host ms over
    wall ms, the median per policy, the largest over the policies. {} for CPU rows (the CPU computes on the
    host, so the rule does not apply) and rows without host time."""
    if rows is None or not {"host_ms_per_forward", "wall_ms_per_forward", "device"} <= set(rows.columns):
        return {}
    gpu = rows[rows.device.astype(str).str.startswith("cuda")]
    wall = gpu.wall_ms_per_forward.astype(float)
    share = (gpu.host_ms_per_forward.astype(float) / wall).where(wall > 0)
    per = gpu.assign(_share=share).dropna(subset=["_share"]).groupby([*by, "policy"])._share.median()
    out = per.groupby(level=list(range(len(by)))).max()
    return {(k if isinstance(k, tuple) else (k,)): float(v) for k, v in out.items()}


# --- figures judged against a threshold (exact counts, the performance model's error) ---------------------
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


def median_at_most(figures: Sequence[float], limit: float) -> tuple[str, float, tuple[float, float]]:
    """(verdict, median, interval): the runs' figures ruled `<= limit` on the interval of their median."""
    low, high = median_interval(figures)
    return at_most(low, high, limit), float(np.median(np.asarray(figures, dtype=float))), (low, high)


def margin_below(value: float, threshold: float, pct: bool = True) -> str:
    """A number judged `< threshold`: how far below (or above) it lies."""
    if pct:
        d = (threshold - value) * 100
        return f"{value:.1%} vs < {threshold:.0%}: " + (
            f"{d:.1f} points under" if d > 0 else f"{-d:.1f} points over"
        )
    side = "under" if value < threshold else "over"
    return f"{value:.3g} vs < {threshold:.3g}: {side} by {abs(threshold - value):.3g}"


def margin_at_least(value: float, threshold: float) -> str:
    """A share judged `>= threshold`."""
    d = (value - threshold) * 100
    return f"{value:.1%} vs >= {threshold:.0%}: " + (
        f"{d:.1f} points over" if d >= 0 else f"{-d:.1f} points under"
    )
