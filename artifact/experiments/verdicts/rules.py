"""The verdict rules (docs/verdicts.md), one function per kind of claim. A timing claim is ruled per cell on
the plain paired effect of A over B (nothing added to it or subtracted from it) and its 95% interval; a claim
over several cells combines them. Three outcomes:

  FASTER (direction)          reproduced: the A/A gate is clean and, in every cell, the 95% interval lies
                              above 0 (the paper's criterion: "all paired 95% confidence intervals excluding
                              zero"; an intersection needs no multiplicity correction). Not reproduced: some
                              cell's interval at the simultaneous level over the claim's cells (Bonferroni,
                              statsmodels' multipletests) lies at or below 0. Else inconclusive.
  NO_DIFFERENCE (equivalence) reproduced: the 95% interval lies inside +-MARGIN, a bound on the margin
                              counting as inside (TOST at 2.5% per side, closed margin); not reproduced: it
                              lies wholly outside; else inconclusive (it straddles -MARGIN, +MARGIN or both).
  NOT_FASTER (non-superior.)  reproduced: the interval lies at or below +MARGIN (the same closed margin);
                              not reproduced: wholly above it; else inconclusive (it straddles +MARGIN).

The A/A gate (demand against demand, or the stand-in on runs recorded before the true A/A existed) gates a
cell, never corrects it: a cell with no A/A, or whose A/A interval lies wholly outside +-MARGIN (a bias beyond
the margin is shown), is inconclusive; a cell whose A/A interval is not inside +-MARGIN keeps its ruling only
when the ruling also holds on its interval widened by the A/A's furthest bound. A GPU cell whose host time is
over HOST_SHARE_LIMIT of its wall time is inconclusive too (host_shares). Exact counts: counts.py."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

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
        bounds = ", ".join(">0" if x == ABOVE_ZERO else f"{x:+.1f}" for x in (self.low, self.high))
        return f"{self.mean:+.1f}{unit} [{bounds}]"


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
        if iv.high <= 0:
            return Ruling(NOT_REPRODUCED, "interval at or below 0")
        return Ruling(INCONCLUSIVE, "interval reaches 0")
    # one comparison at the margin for both: a bound on it counts as inside (a closed margin)
    if kind == NO_DIFFERENCE:
        if -margin <= iv.low and iv.high <= margin:
            on = " (a bound on the margin)" if margin in (-iv.low, iv.high) else ""
            return Ruling(REPRODUCED, f"interval inside +-{m}{on}")
        if iv.low > margin or iv.high < -margin:
            return Ruling(NOT_REPRODUCED, f"interval wholly outside +-{m}")
        if iv.low < -margin and iv.high > margin:
            return Ruling(INCONCLUSIVE, f"interval straddles both -{m} and +{m}")
        return Ruling(INCONCLUSIVE, f"interval straddles {'+' if iv.high > margin else '-'}{m}")
    if iv.high <= margin:
        return Ruling(REPRODUCED, f"interval {'below' if iv.high < margin else 'at or below'} +{m}")
    if iv.low > margin:
        return Ruling(NOT_REPRODUCED, f"interval above +{m}: faster by more than the margin")
    return Ruling(INCONCLUSIVE, f"interval straddles +{m}")


def aa_gate(aa: Interval | None, margin: float = thresholds.MARGIN, label: str = "A/A") -> str | None:
    """Why a cell's A/A makes it inconclusive whatever its effect, or None: no A/A, one without an interval,
    or one wholly outside +-margin (the instrument is broken in this cell); a merely wide one: `aa_bias`."""
    if aa is None:
        return f"no {label} in this cell"
    if not aa.usable:
        return f"{label} has no interval"
    if aa.low > margin or aa.high < -margin:
        return f"{label} {aa.text()} lies wholly outside +-{margin:g}%: the two arms differ in this cell"
    return None


def aa_bias(aa: Interval | None, margin: float = thresholds.MARGIN) -> float | None:
    """The largest bias (its bound furthest from 0) a cell's A/A leaves possible when its interval is not
    inside +-margin, else None: the cell keeps its ruling only if it also holds on the effect's interval
    widened by it on both sides (rule_cells); the effect itself is never moved."""
    if aa is None or not aa.usable or (-margin <= aa.low and aa.high <= margin):
        return None
    return max(abs(aa.low), abs(aa.high))


def host_bound(host: float | None) -> str | None:
    if host is not None and host > thresholds.HOST_SHARE_LIMIT:
        return (
            f"host-bound: host {host:.0%} of wall time per forward (> {thresholds.HOST_SHARE_LIMIT:.0%}), "
            "so it timed the host, not the link"
        )
    return None


def _ruled(kind: str, iv: Interval, level: float, k: int, margin: float, unit: str, bias: float = 0.0):
    """One cell's ruling among k, on its interval widened by `bias` on both sides (aa_bias); `not reproduced`
    read at the simultaneous `level`."""

    def at(confidence: float) -> Ruling:
        x = iv.at(confidence)
        return rule_cell(kind, replace(x, low=x.low - bias, high=x.high + bias), margin, unit)

    r = at(CONFIDENCE)
    if r.verdict != NOT_REPRODUCED:
        return r
    if at(level).verdict != NOT_REPRODUCED:
        return Ruling(INCONCLUSIVE, f"{r.why}, but not at the simultaneous level over {k} cells")
    return Ruling(NOT_REPRODUCED, f"{r.why} at the simultaneous level over {k} cells") if k > 1 else r


def rule_cells(
    kind: str,
    cells: Sequence[tuple[str, Interval]],
    gates: Sequence[str | None] = (),
    margin: float = thresholds.MARGIN,
    unit: str = "%",
    aa: Sequence[Interval | None] = (),
    aa_name: str = "A/A",
) -> list[Ruling]:
    """Each cell's ruling. `gates`: per cell, why it is inconclusive whatever its interval says (no A/A, an
    A/A shown biased beyond the margin, a host-bound GPU cell), or None. `aa`: per cell, its A/A (aa_bias)."""
    gates = list(gates) or [None] * len(cells)
    aa = list(aa) or [None] * len(cells)
    # the per-cell level at which `not reproduced` is read (a union over the cells): Bonferroni, 1 - 0.05 / k
    p = [iv.p_value() for _, iv in cells if iv.usable] or [1.0]
    level = 1 - multipletests(p, 1 - CONFIDENCE, "bonferroni")[3]
    out = []
    for (_, iv), gate, a in zip(cells, gates, aa):
        r = _ruled(kind, iv, level, len(cells), margin, unit)
        bias = aa_bias(a, margin)
        wide = r if bias is None else _ruled(kind, iv, level, len(cells), margin, unit, bias)
        if gate:
            r = Ruling(INCONCLUSIVE, gate)
        elif r.verdict not in (INCONCLUSIVE, wide.verdict):  # a bias the A/A leaves possible changes it
            r = Ruling(
                INCONCLUSIVE,
                f"{r.why}, but {aa_name} {a.text()} is not inside +-{margin:g}% and a bias of "
                f"{bias:.1f}{unit} could change it",
            )
        out.append(r)
    return out


def rule_claim_cells(kind: str, cells: Sequence[tuple[str, Interval]], *options, **named) -> tuple[str, str]:
    """(verdict, reason) of a claim over its labelled cells: rule_cells (`options`: its gates, margin, unit,
    aa, aa_name), then claim_verdict."""
    return claim_verdict([label for label, _ in cells], rule_cells(kind, cells, *options, **named))


def claim_verdict(labels: Sequence[str], rulings: Sequence[Ruling]) -> tuple[str, str]:
    """(verdict, reason) from the cells' rulings: not reproduced if any is, reproduced if all are, else
    inconclusive; the reason names the cells that decided it."""
    verdicts = [r.verdict for r in rulings]
    if not verdicts:
        return INCONCLUSIVE, "no cells"
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED, f"every cell's {CONFIDENCE:.0%} interval: " + rulings[0].why
    verdict = NOT_REPRODUCED if NOT_REPRODUCED in verdicts else INCONCLUSIVE
    return verdict, "; ".join(
        f"{label}: {r.why}" for label, r in zip(labels, rulings) if r.verdict == verdict
    )
