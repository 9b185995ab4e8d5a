"""The verdict rules (docs/verdicts.md). A timing claim asks one question (`Question`), ruled on one interval
per cell (one task, batch size, C/W, bandwidth: no interval pools cells), with three outcomes: reproduced, not
reproduced, inconclusive. Which interval: a stored result's is the t interval over its runs' per-cell means, a
single run's the hull of its own interval and the stored pooled one (replication.py: the run is the unit of
replication); `Interval.unit` says which. The three questions share one margin m (thresholds.MARGIN):

  FASTER         "A is faster than B by more than m" (direction, its boundary at +m): reproduced when the
                 interval lies above +m, not reproduced when it lies below +m, else inconclusive. Ruled on the
                 effect net of the A/A control (a difference in differences per matched pair, replication.py):
                 the control is the null, not a veto. The paper's magnitude is reported beside, never decides.
  NO_DIFFERENCE  "A and B do not differ" (equivalence within +-m, TOST at 2.5% per side): reproduced when the
                 whole interval lies inside +-m, not reproduced when it lies wholly outside, else
                 inconclusive.
  NOT_FASTER     "A is not faster than B by more than m" (non-superiority): reproduced when the interval lies
                 below +m, not reproduced when it lies above +m, else inconclusive.

Every rule is monotone under widening: if interval I lies inside J, the verdict on J is the verdict on I or
inconclusive (tests/test_rules.py checks it over random intervals). So a single run, ruled on the hull of its
interval and the pooled one, says the pooled verdict or inconclusive, never the opposite. Every rule decides,
given enough runs, any true effect but one on its boundary (+m; or -m and +m).

Equivalence and non-superiority ask about precision, so there the A/A control (settings.CONTROL, exactly
demand's work, timed against demand in the same cells) gates: a cell whose control interval does not lie
inside +-m is inconclusive (`control_ruling`). Beside every direction verdict the bias-bound alternative is
printed: the undifferenced interval widened by the largest bias the control's interval allows (`bias_bound`).
Exact counts have no interval; their verdicts compare a number with a threshold of criteria/thresholds.py and
print the margin (`margin_below`, `margin_at_least`).

A GPU timing cell whose host time per forward is more than thresholds.HOST_SHARE_LIMIT of its wall time
(`host_shares`, from the rows' host_ms_per_forward and wall_ms_per_forward) timed the host's Python and
launches, not the link: its ruling is inconclusive (`rule_cell(..., host=)`). On the CPU the rule does not
apply: the CPU computes on the host, so host time is the compute itself (host_shares returns nothing for CPU
rows)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from artifact.experiments.claims import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.experiments.criteria import thresholds
from artifact.experiments.settings import CONTROL
from artifact.experiments.stats import paired_table


@dataclass(frozen=True)
class Interval:
    """An effect (A over B, % per pair) and its 95% interval. `unit` says what the interval is over: "pairs"
    (within one run), "runs" (pooled over runs: replication.METHOD), "run" (one run widened by the stored
    runs' spread: replication.ONE_RUN) or "hull" (that one-run interval's hull with the pooled one, what a
    single run is ruled on: replication.SINGLE); `n` counts that unit (for "run" and "hull", the stored
    runs)."""

    mean: float
    low: float
    high: float
    n: int
    unit: str = "pairs"

    @classmethod
    def of(cls, row) -> "Interval":
        """From a stats.paired_table row (diff_pct, ci_low, ci_high, n_pairs): an interval over pairs."""
        return cls(float(row.diff_pct), float(row.ci_low), float(row.ci_high), int(row.n_pairs))

    def text(self, unit: str = "%") -> str:
        return f"{self.mean:+.1f}{unit} [{self.low:+.1f}, {self.high:+.1f}]"

    @property
    def needed(self) -> int:
        return thresholds.MIN_PAIRS if self.unit == "pairs" else thresholds.MIN_RUNS

    @property
    def usable(self) -> bool:
        return self.n >= self.needed and math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def excludes_zero(self) -> bool:
        return self.usable and (self.low > 0 or self.high < 0)

    def count_text(self) -> str:
        return {
            "pairs": f"{self.n} pairs",
            "runs": f"{self.n} runs",
            "hull": f"1 run and the pooled {self.n} runs",
        }.get(self.unit, f"1 run, sd of {self.n} runs")


@dataclass(frozen=True)
class Ruling:
    verdict: str
    why: str  # one phrase: what decided it
    margin: str  # where the interval lies against the rule's bounds (printed by the claim cell)
    # `faster` with a paper range: below, inside or above it (the direction is the verdict)
    magnitude: str = ""


def _few(iv: Interval) -> Ruling | None:
    if iv.usable:
        return None
    if iv.n < iv.needed:
        return Ruling(
            INCONCLUSIVE,
            f"{iv.count_text()}, the rule needs >= {iv.needed} {iv.unit.rstrip('s')}s",
            iv.count_text(),
        )
    return Ruling(INCONCLUSIVE, "no interval (the pairs have no spread to size it)", iv.count_text())


def position(iv: Interval, lo: float, hi: float) -> str:
    """Where the interval lies against a range [lo, hi] (the paper's): below, inside, above or overlapping."""
    if iv.high < lo:
        where = "below"
    elif iv.low > hi:
        where = "above"
    elif lo <= iv.low and iv.high <= hi:
        where = "inside"
    else:
        where = "overlapping"
    return f"{where} the paper's {lo:+g}..{hi:+g}"


FASTER, NO_DIFFERENCE, NOT_FASTER = "faster", "no difference", "not faster"
QUESTIONS = (FASTER, NO_DIFFERENCE, NOT_FASTER)


@dataclass(frozen=True)
class Question:
    """What a timing claim asks of each cell's interval (A over B), with its margin m and, for a direction
    claim with a figure in the paper, the paper's range (reported beside the verdict, never deciding it)."""

    kind: str
    margin: float = thresholds.MARGIN
    paper: tuple[float, float] | None = None
    unit: str = "%"

    def __post_init__(self):
        if self.kind not in QUESTIONS:
            raise ValueError(f"question {self.kind!r}: expected one of {', '.join(QUESTIONS)}")
        if not self.margin >= 0:
            raise ValueError(f"margin {self.margin!r}: expected a number >= 0")

    @property
    def net_of_control(self) -> bool:
        """A direction claim rules on the effect net of its A/A control; the others on the effect itself, with
        the control as a precision gate."""
        return self.kind == FASTER

    def text(self) -> str:
        m = f"{self.margin:g}{self.unit}"
        return {
            FASTER: f"faster by more than +{m}",
            NO_DIFFERENCE: f"no difference beyond +-{m}",
            NOT_FASTER: f"not faster by more than +{m}",
        }[self.kind]

    def __call__(self, iv: Interval) -> Ruling:
        few = _few(iv)
        if few:
            return few
        return {FASTER: _faster, NO_DIFFERENCE: _no_difference, NOT_FASTER: _not_faster}[self.kind](iv, self)


def faster(
    margin: float = thresholds.MARGIN, paper: tuple[float, float] | None = None, unit: str = "%"
) -> Question:
    return Question(FASTER, margin, paper, unit)


def no_difference(margin: float = thresholds.MARGIN, unit: str = "%") -> Question:
    return Question(NO_DIFFERENCE, margin, None, unit)


def not_faster(margin: float = thresholds.MARGIN, unit: str = "%") -> Question:
    return Question(NOT_FASTER, margin, None, unit)


def _faster(iv: Interval, q: Question) -> Ruling:
    m = q.margin
    where = position(iv, *q.paper) if q.paper else ""
    margin = f"lower bound {iv.low:+.1f} vs +{m:g}" + (f"; {where}" if where else "")
    magnitude = f"magnitude {where}" if where else ""
    if iv.low > m:
        return Ruling(REPRODUCED, f"interval above +{m:g}{q.unit}", margin, magnitude)
    if iv.high < m:
        return Ruling(
            NOT_REPRODUCED,
            f"interval below +{m:g}{q.unit}: not faster by more than the margin",
            margin,
            magnitude,
        )
    return Ruling(INCONCLUSIVE, f"interval crosses +{m:g}{q.unit}", margin, magnitude)


def _significant(iv: Interval) -> str:
    return (
        f"; the interval also excludes 0 ({iv.text()}): a significant difference, smaller than the margin"
        if iv.excludes_zero
        else ""
    )


def _no_difference(iv: Interval, q: Question) -> Ruling:
    m = q.margin
    spare = m - max(abs(iv.low), abs(iv.high))
    text = (
        f"interval inside +-{m:g} by {spare:.1f} points"
        if spare >= 0
        else f"interval exceeds +-{m:g} by {-spare:.1f} points"
    )
    if spare >= 0:
        return Ruling(REPRODUCED, f"interval inside +-{m:g}{q.unit}" + _significant(iv), text)
    if iv.low > m or iv.high < -m:
        return Ruling(NOT_REPRODUCED, f"interval wholly outside +-{m:g}{q.unit}", text)
    return Ruling(INCONCLUSIVE, f"interval too wide for +-{m:g}{q.unit}", text)


def _not_faster(iv: Interval, q: Question) -> Ruling:
    m = q.margin
    text = f"upper bound {iv.high:+.1f} vs +{m:g}"
    if iv.high < m:
        return Ruling(REPRODUCED, f"interval below +{m:g}{q.unit}" + _significant(iv), text)
    if iv.low > m:
        return Ruling(NOT_REPRODUCED, f"interval above +{m:g}{q.unit}: faster by more than the margin", text)
    return Ruling(INCONCLUSIVE, f"interval crosses +{m:g}{q.unit}", text)


def control_ruling(control: Interval | None, margin: float = thresholds.MARGIN) -> str | None:
    """Why an A/A control disqualifies its cell of an equivalence or non-superiority claim, or None when it
    shows the instrument precise enough: its interval must lie inside +-margin (containing 0 is not enough: a
    wide interval contains 0 and says the instrument is too noisy; a bias smaller than the margin passes)."""
    if control is None:
        return None
    r = no_difference(margin)(control)
    if r.verdict == REPRODUCED:
        return None
    if not control.usable:
        return f"A/A control {control.text()}: {r.why}"
    if control.excludes_zero:
        return (
            f"A/A control {control.text()} excludes 0 and is not inside +-{margin:g}%: the "
            "instrument is biased here"
        )
    return (
        f"A/A control {control.text()} is not inside +-{margin:g}%: the instrument is too noisy here to rule"
    )


def rule_cell(
    q: Question,
    effect: Interval,
    control: Interval | None = None,
    host: float | None = None,
    wide: Interval | None = None,
) -> Ruling:
    """One cell's ruling. `effect` is the interval the question is asked of: for a direction claim, the effect
    net of the A/A control (no gate: the control is its null); for the others, the effect itself, inconclusive
    when the control's interval does not lie inside +-margin (control_ruling). Inconclusive when the cell is
    host-bound (`host`: its host share of wall time on a GPU, host_shares; None: not measured, or not a GPU).

    `wide`: the same cell's interval at the claim's simultaneous level (a claim over k cells is `not
    reproduced` when any cell is, a union of k tests: replication.judge passes the Bonferroni interval at 1 -
    0.05 / k). Then `reproduced` is read off `effect` (every cell must be: an intersection, valid at the
    per-cell level) and `not
    reproduced` off `wide`; monotone in both, since `wide` holds `effect`."""
    ruling = q(effect)
    if wide is not None and ruling.verdict == NOT_REPRODUCED and q(wide).verdict != NOT_REPRODUCED:
        ruling = Ruling(
            INCONCLUSIVE,
            f"{ruling.why}, but not at the simultaneous level over the claim's cells ({wide.text(q.unit)})",
            ruling.margin,
            ruling.magnitude,
        )
    bad = None if q.net_of_control else control_ruling(control, q.margin)
    if bad:
        return Ruling(INCONCLUSIVE, bad, ruling.margin, ruling.magnitude)
    if host is not None and host > thresholds.HOST_SHARE_LIMIT:
        return Ruling(
            INCONCLUSIVE,
            f"host-bound: host {host:.0%} of wall time per forward "
            f"(> {thresholds.HOST_SHARE_LIMIT:.0%}), so it timed the host, not the "
            "link",
            ruling.margin,
            ruling.magnitude,
        )
    return ruling


def bias_bound(effect: Interval, control: Interval) -> Interval:
    """The bias-bound alternative to the difference in differences: the undifferenced interval widened on both
    sides by the largest bias the control's interval allows, max(|low|, |high|). Printed beside a direction
    verdict; it never decides one."""
    b = max(abs(control.low), abs(control.high))
    return Interval(effect.mean, effect.low - b, effect.high + b, min(effect.n, control.n), effect.unit)


def hull(a: Interval, b: Interval) -> Interval:
    """The smallest interval holding both (a's mean, b's count): a single run's interval is the hull of its
    own and the stored pooled one, so a monotone rule on it says the pooled verdict or inconclusive."""
    return Interval(a.mean, min(a.low, b.low), max(a.high, b.high), b.n, "hull")


def host_shares(rows, by: Sequence[str]) -> dict:
    """{key tuple of `by`: the cell's host share of wall time per forward} over GPU rows (device cuda): per
    row host_ms_per_forward / wall_ms_per_forward, the median per policy, the largest over the policies (one
    host-bound policy makes the comparison one of host work). {} for CPU rows, where the rule does not apply,
    and for rows recorded before they carried host time."""
    if rows is None or not {"host_ms_per_forward", "wall_ms_per_forward", "device"} <= set(rows.columns):
        return {}
    gpu = rows[rows.device.astype(str).str.startswith("cuda")]
    share = (gpu.host_ms_per_forward.astype(float) / gpu.wall_ms_per_forward.astype(float)).where(
        gpu.wall_ms_per_forward.astype(float) > 0
    )
    per = gpu.assign(_share=share).dropna(subset=["_share"]).groupby([*by, "policy"])._share.median()
    out = per.groupby(level=list(range(len(by)))).max()
    return {(k if isinstance(k, tuple) else (k,)): float(v) for k, v in out.items()}


def controls(rows, by: Sequence[str], metric: str = "tokens_per_second", base: str = "demand") -> dict:
    """The A/A control per group of `by`: {key tuple: Interval of CONTROL over `base` in `metric`}; {} when
    the rows carry no CONTROL runs (a grid recorded before the control existed)."""
    if CONTROL not in set(rows.policy) or base not in set(rows.policy):
        return {}
    t = paired_table(rows, CONTROL, base, list(by), metric=metric)
    return {tuple(getattr(r, k) for k in by): Interval.of(r) for r in t.itertuples()}


def combine(rulings: Iterable[tuple[str, Ruling]]) -> tuple[str, str, str]:
    """(verdict, reason, margin) over labelled cells: not reproduced if any is, reproduced if all are, else
    inconclusive; the reason names the cells that decided it (for a reproduced `faster`, the magnitude of each
    cell), the margin lists every cell's."""
    rulings = list(rulings)
    if not rulings:
        return INCONCLUSIVE, "no cells", ""
    verdicts = [r.verdict for _, r in rulings]
    verdict = (
        NOT_REPRODUCED
        if NOT_REPRODUCED in verdicts
        else REPRODUCED
        if all(v == REPRODUCED for v in verdicts)
        else INCONCLUSIVE
    )
    if verdict == REPRODUCED:
        parts = [f"{label}: {r.magnitude}" for label, r in rulings if r.magnitude]
        extra = [f"{label}: {r.why.split('; ', 1)[1]}" for label, r in rulings if "; " in r.why]
        reason = "; ".join((["direction reproduced; " + "; ".join(parts)] if parts else []) + extra)
    else:
        reason = "; ".join(f"{label}: {r.why}" for label, r in rulings if r.verdict == verdict)
    return verdict, reason, "; ".join(f"{label}: {r.margin}" for label, r in rulings)


def at_most(low: float, high: float, limit: float) -> str:
    """A figure judged `<= limit` that is known only to lie in [low, high]: reproduced when all of the range
    is at most the limit, not reproduced when all of it is over, inconclusive when it straddles. Monotone: a
    wider range never flips the verdict, it can only make it inconclusive. A single run's model error (08) is
    ruled on the range between its own figure and the stored runs' median (`figure_range`), so it says the
    pooled verdict or inconclusive, as `hull` does for an interval."""
    if low > high:
        raise ValueError(f"at_most: the range [{low}, {high}] is empty (expected low <= high)")
    if high <= limit:
        return REPRODUCED
    if low > limit:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def median_interval(
    figures: Sequence[float], confidence: float = thresholds.CONFIDENCE
) -> tuple[float, float]:
    """A distribution-free interval for the median of the runs' figures: the order statistics x_(k) and
    x_(n-k+1), k the largest with 2 P(Binomial(n, 1/2) <= k - 1) <= 1 - confidence (n = 9: x_(2)..x_(8), about
    96%); the whole range when n is too small for the level (n <= 5 at 95%: n = 3 covers 75%)."""
    x = np.sort(np.asarray(figures, dtype=float))
    n = len(x)
    if n == 0:
        raise ValueError("median_interval: no figures")
    k = 0
    for j in range(1, n // 2 + 1):
        if 2 * stats.binom.cdf(j - 1, n, 0.5) <= 1 - confidence:
            k = j
    return (float(x[k - 1]), float(x[n - k])) if k else (float(x[0]), float(x[-1]))


def median_at_most(figures: Sequence[float], limit: float) -> tuple[str, float, tuple[float, float]]:
    """(verdict, median, interval): the stored runs' figures (08: each run's model error) ruled with `at_most`
    on the distribution-free interval of their median (`median_interval`): reproduced only when all of it is
    at most `limit`, so a median exactly at the limit is not reproduced by the luck of the draw."""
    low, high = median_interval(figures)
    return at_most(low, high, limit), float(np.median(np.asarray(figures, dtype=float))), (low, high)


def figure_range(own: float, pooled: float | tuple[float, float] | None) -> tuple[float, float]:
    """The range a single run's figure is ruled on: its own figure with the stored runs' pooled one (a figure,
    or the interval of their median), the smallest range holding both (its own figure alone when nothing is
    pooled)."""
    if pooled is None:
        return own, own
    lo, hi = pooled if isinstance(pooled, tuple) else (pooled, pooled)
    return min(own, lo), max(own, hi)


def margin_below(value: float, threshold: float, pct: bool = True) -> str:
    """A number judged `< threshold`: how far below (or above) it lies."""
    if pct:
        return f"{value:.1%} vs < {threshold:.0%}: " + (
            f"{(threshold - value) * 100:.1f} points under"
            if value < threshold
            else f"{(value - threshold) * 100:.1f} points over"
        )
    side = "under" if value < threshold else "over"
    return f"{value:.3g} vs < {threshold:.3g}: {side} by {abs(threshold - value):.3g}"


def margin_at_least(value: float, threshold: float) -> str:
    """A share judged `>= threshold`."""
    d = (value - threshold) * 100
    return f"{value:.1%} vs >= {threshold:.0%}: " + (
        f"{d:.1f} points over" if d >= 0 else f"{-d:.1f} points under"
    )
