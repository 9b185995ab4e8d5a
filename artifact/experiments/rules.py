"""The verdict rules (docs/verdicts.md). Every timing verdict is ruled on one interval per cell (one task, batch
size, C/W, bandwidth: no interval pools cells) and has three outcomes: reproduced, not reproduced, inconclusive.
Which interval: a stored result's is the t interval over its runs' per-cell means, a single run's is its own mean
widened by the stored runs' spread (replication.py: the run is the unit of replication); `Interval.unit` says which.

  faster(iv)          "A is faster than B": the verdict is the direction. Reproduced when the interval lies above
                      0; not reproduced when it lies below 0, or crosses 0 but lies below the paper's range;
                      inconclusive when it crosses 0 and reaches the paper's range. The magnitude is ruled apart
                      (`Ruling.magnitude`): below, inside, above or overlapping the paper's range.
  no_difference(iv)   "A and B do not differ" (equivalence, TOST at 2.5% per side): reproduced when the whole
                      interval lies inside +-thresholds.EQUIV_MARGIN, even when it excludes 0 (the reason says both);
                      not reproduced when it lies wholly outside; inconclusive otherwise.
  not_faster(iv)      "A is not faster than B" (non-superiority by +EQUIV_MARGIN): reproduced when the upper bound
                      lies below +EQUIV_MARGIN, even when the interval lies above 0 (the reason says both); not
                      reproduced when it lies above 0 and reaches the margin; inconclusive otherwise.

A claim over cells combines them (`combine`): not reproduced if any cell is, reproduced if every cell is, else
inconclusive. Every timing grid carries an A/A control: settings.CONTROL, which does exactly demand's work, timed
against demand in the same cells (`controls`). A cell whose control does not show equivalence (inside +-EQUIV_MARGIN;
containing 0 is not enough) is inconclusive (`gated`, `control_ruling`): the instrument is biased or too noisy
there. Exact counts have no interval; their verdicts compare a number with a threshold of
criteria/thresholds.py and print the margin (`margin_below`, `margin_at_least`).

A GPU timing cell whose host time per forward is more than thresholds.HOST_SHARE_LIMIT of its wall time
(`host_shares`, from the rows' host_ms_per_forward and wall_ms_per_forward) timed the host's Python and
launches, not the link: its ruling is inconclusive (`gated(..., host=)`). On the CPU the rule does not apply:
the CPU computes on the host, so host time is the compute itself (host_shares returns nothing for CPU rows)."""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from artifact.experiments.claims import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.experiments.criteria import thresholds
from artifact.experiments.settings import CONTROL
from artifact.experiments.stats import paired_table

METHOD = f"{thresholds.CONFIDENCE:.0%} t interval over pairs"


@dataclass(frozen=True)
class Interval:
    """An effect (A over B, % per pair) and its 95% interval. `unit` says what the interval is over: "pairs"
    (within one run), "runs" (pooled over runs: replication.METHOD) or "run" (one run widened by the stored runs'
    spread: replication.ONE_RUN); `n` counts that unit (for "run", the stored runs whose spread it borrows)."""
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
        return {"pairs": f"{self.n} pairs", "runs": f"{self.n} runs"}.get(self.unit, f"1 run, sd of {self.n} runs")


@dataclass(frozen=True)
class Ruling:
    verdict: str
    why: str            # one phrase: what decided it
    margin: str         # where the interval lies against the rule's bounds (printed by the claim cell)
    magnitude: str = ""  # `faster` with a paper range: below, inside or above it (the direction is the verdict)


def _few(iv: Interval) -> Ruling | None:
    if iv.usable:
        return None
    if iv.n < iv.needed:
        return Ruling(INCONCLUSIVE, f"{iv.count_text()}, the rule needs >= {iv.needed} {iv.unit.rstrip('s')}s",
                      iv.count_text())
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


def faster(iv: Interval, paper_range: tuple[float, float] | None = None) -> Ruling:
    """"A is faster than B": the verdict is the direction (reproduced when the interval lies above 0); the
    magnitude is ruled apart, as below, inside, above or overlapping the paper's range."""
    few = _few(iv)
    if few:
        return few
    where = position(iv, *paper_range) if paper_range else ""
    margin = f"lower bound {iv.low:+.1f} vs 0" + (f"; {where}" if where else "")
    magnitude = f"magnitude {where}" if where else ""
    if iv.low > 0:
        return Ruling(REPRODUCED, "direction: interval above 0", margin, magnitude)
    if iv.high < 0:
        return Ruling(NOT_REPRODUCED, "interval below 0: the other one is faster", margin, magnitude)
    if paper_range and iv.high < paper_range[0]:
        return Ruling(NOT_REPRODUCED, f"interval below the paper's +{paper_range[0]:g}", margin, magnitude)
    return Ruling(INCONCLUSIVE, "interval crosses 0", margin, magnitude)


def _significant(iv: Interval) -> str:
    return (f"; the interval also excludes 0 ({iv.text()}): a significant difference, smaller than the margin"
            if iv.excludes_zero else "")


def no_difference(iv: Interval, margin: float = thresholds.EQUIV_MARGIN) -> Ruling:
    """"A and B do not differ": equivalence within +-margin. One answer per interval: inside the margin is
    reproduced even when the interval excludes 0 (the reason then says both)."""
    few = _few(iv)
    if few:
        return few
    spare = margin - max(abs(iv.low), abs(iv.high))
    text = (f"interval inside +-{margin:g} by {spare:.1f} points" if spare >= 0 else
            f"interval exceeds +-{margin:g} by {-spare:.1f} points")
    if spare >= 0:
        return Ruling(REPRODUCED, f"interval inside +-{margin:g}%" + _significant(iv), text)
    if iv.low > margin or iv.high < -margin:
        return Ruling(NOT_REPRODUCED, f"interval wholly outside +-{margin:g}%", text)
    return Ruling(INCONCLUSIVE, f"interval too wide for +-{margin:g}%", text)


def not_faster(iv: Interval, margin: float = thresholds.EQUIV_MARGIN) -> Ruling:
    """"A is not faster than B" (non-superiority by +margin). One answer per interval: reproduced when the upper
    bound lies below +margin, even when the interval lies above 0 (then A is faster by less than the margin, and
    the reason says both); not reproduced when the interval lies above 0 and reaches +margin; else inconclusive."""
    few = _few(iv)
    if few:
        return few
    text = f"upper bound {iv.high:+.1f} vs +{margin:g}"
    if iv.high < margin:
        return Ruling(REPRODUCED, f"interval below +{margin:g}%" + _significant(iv), text)
    if iv.low > 0:
        return Ruling(NOT_REPRODUCED, "interval above 0 and reaching the margin: faster", text)
    return Ruling(INCONCLUSIVE, f"interval reaches +{margin:g}% and crosses 0", text)


def control_ruling(control: Interval | None) -> str | None:
    """Why an A/A control disqualifies its cell, or None when it shows equivalence: its interval must lie inside
    +-EQUIV_MARGIN. Containing 0 is not enough (a wide interval contains 0 and says the instrument is too noisy);
    excluding 0 inside the margin is a bias smaller than the margin, so, as in no_difference, one answer: it passes."""
    if control is None:
        return None
    r = no_difference(control)
    if r.verdict == REPRODUCED:
        return None
    if not control.usable:
        return f"A/A control {control.text()}: {r.why}"
    if control.excludes_zero:
        return (f"A/A control {control.text()} excludes 0 and is not inside +-{thresholds.EQUIV_MARGIN:g}%: the "
                "instrument is biased here")
    return (f"A/A control {control.text()} is not inside +-{thresholds.EQUIV_MARGIN:g}%: the instrument is too noisy "
            "here to rule")


def gated(ruling: Ruling, control: Interval | None, host: float | None = None) -> Ruling:
    """The ruling, or inconclusive when the A/A control of its cell does not show equivalence (control_ruling),
    or when the cell is host-bound (`host`: its host share of wall time on a GPU, host_shares; None: not
    measured, or not a GPU)."""
    bad = control_ruling(control)
    if bad:
        return Ruling(INCONCLUSIVE, bad, ruling.margin, ruling.magnitude)
    if host is not None and host > thresholds.HOST_SHARE_LIMIT:
        return Ruling(INCONCLUSIVE, f"host-bound: host {host:.0%} of wall time per forward "
                      f"(> {thresholds.HOST_SHARE_LIMIT:.0%}), so it timed the host, not the link", ruling.margin,
                      ruling.magnitude)
    return ruling


def host_shares(rows, by: Sequence[str]) -> dict:
    """{key tuple of `by`: the cell's host share of wall time per forward} over GPU rows (device cuda): per
    row host_ms_per_forward / wall_ms_per_forward, the median per policy, the largest over the policies (one
    host-bound policy makes the comparison one of host work). {} for CPU rows, where the rule does not apply,
    and for rows recorded before they carried host time."""
    if rows is None or not {"host_ms_per_forward", "wall_ms_per_forward", "device"} <= set(rows.columns):
        return {}
    gpu = rows[rows.device.astype(str).str.startswith("cuda")]
    share = (gpu.host_ms_per_forward.astype(float) / gpu.wall_ms_per_forward.astype(float)).where(
        gpu.wall_ms_per_forward.astype(float) > 0)
    per = gpu.assign(_share=share).dropna(subset=["_share"]).groupby([*by, "policy"])._share.median()
    out = per.groupby(level=list(range(len(by)))).max()
    return {(k if isinstance(k, tuple) else (k,)): float(v) for k, v in out.items()}


def controls(rows, by: Sequence[str], metric: str = "tokens_per_second", base: str = "demand") -> dict:
    """The A/A control per group of `by`: {key tuple: Interval of CONTROL over `base` in `metric`}; {} when the
    rows carry no CONTROL runs (a grid recorded before the control existed)."""
    if CONTROL not in set(rows.policy) or base not in set(rows.policy):
        return {}
    t = paired_table(rows, CONTROL, base, list(by), metric=metric)
    return {tuple(getattr(r, k) for k in by): Interval.of(r) for r in t.itertuples()}


def controls_text(aa: dict, label=lambda key: ", ".join(f"{k:g}" if isinstance(k, float) else str(k)
                                                       for k in key)) -> str:
    """'A/A control (CONTROL over demand): <cell> +x% [lo, hi]; ...', or a note that the grid has none."""
    if not aa:
        return f"no A/A control in these rows (rerun the grid: it now times {CONTROL} beside demand)"
    return f"A/A control ({CONTROL} over demand): " + "; ".join(f"{label(k)} {iv.text()}" for k, iv in aa.items())


def combine(rulings: Iterable[tuple[str, Ruling]]) -> tuple[str, str, str]:
    """(verdict, reason, margin) over labelled cells: not reproduced if any is, reproduced if all are, else
    inconclusive; the reason names the cells that decided it (for a reproduced `faster`, the magnitude of each
    cell), the margin lists every cell's."""
    rulings = list(rulings)
    if not rulings:
        return INCONCLUSIVE, "no cells", ""
    verdicts = [r.verdict for _, r in rulings]
    verdict = (NOT_REPRODUCED if NOT_REPRODUCED in verdicts else REPRODUCED if all(v == REPRODUCED for v in verdicts)
               else INCONCLUSIVE)
    if verdict == REPRODUCED:
        parts = [f"{label}: {r.magnitude}" for label, r in rulings if r.magnitude]
        extra = [f"{label}: {r.why.split('; ', 1)[1]}" for label, r in rulings if "; " in r.why]
        reason = "; ".join((["direction reproduced; " + "; ".join(parts)] if parts else []) + extra)
    else:
        reason = "; ".join(f"{label}: {r.why}" for label, r in rulings if r.verdict == verdict)
    return verdict, reason, "; ".join(f"{label}: {r.margin}" for label, r in rulings)


def margin_below(value: float, threshold: float, pct: bool = True) -> str:
    """A number judged `< threshold`: how far below (or above) it lies."""
    if pct:
        return (f"{value:.1%} vs < {threshold:.0%}: " +
                (f"{(threshold - value) * 100:.1f} points under" if value < threshold else
                 f"{(value - threshold) * 100:.1f} points over"))
    side = "under" if value < threshold else "over"
    return f"{value:.3g} vs < {threshold:.3g}: {side} by {abs(threshold - value):.3g}"


def margin_at_least(value: float, threshold: float) -> str:
    """A share judged `>= threshold`."""
    d = (value - threshold) * 100
    return f"{value:.1%} vs >= {threshold:.0%}: " + (f"{d:.1f} points over" if d >= 0 else f"{-d:.1f} points under")
