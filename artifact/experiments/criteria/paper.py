"""The paper's numbers, written once. Claim texts, figure marks, the verdict rules (rules.py) and the paired
table's paper column all derive from here; the thresholds this artifact judges them by are in thresholds.py
(the claims are listed in docs/DESIGN.md, the rules in docs/verdicts.md)."""

from __future__ import annotations

from dataclasses import dataclass

RATIOS = (0.43, 0.83, 1.0, 1.3, 1.73)  # the C/W values the paper measures end to end

ORACLE_CUT = 6.7  # LRU's demand misses / the oracle prefetcher's

# demand-async over async last-step prefetch, % tokens/s with a 95% CI over pairs
FASTER_RANGE = (0.83, 1.73)  # at every C/W in this range demand-async is faster ...
FASTER_PCT = (4.9, 11.8)  # ... by this much, each CI excluding zero


@dataclass(frozen=True)
class PairedResult:
    cache_ratio: float
    diff_pct: float
    ci_low: float
    ci_high: float


AT_LOW = PairedResult(0.43, 0.73, -1.16, 2.63)  # at C/W 0.43: no difference
SMALLEST_FASTER = (4.9, 1.0, 8.8)  # the paper's smallest direction result, % with its 95% CI

TIDE_SPEEDUP = {1.0: 14.4, 0.5: 6.1}  # engine / TIDE's released code at C/W 1 (the same budget) and 0.5

# verdicts in the words of stats.PairedDifference.verdict
FASTER, NO_DIFFERENCE = "A faster", "no difference"


def faster_text() -> str:
    return f"+{FASTER_PCT[0]}..+{FASTER_PCT[1]}, CI excludes 0"


def paired_text(r: PairedResult, unit: str = "") -> str:
    return f"{r.diff_pct:+.2f}{unit} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]"


def demand_vs_last_step(cache_ratio: float) -> tuple[str, str] | None:
    """(the paper's figure as text, its verdict) at a C/W the paper measured, else None."""
    r = round(float(cache_ratio), 2)
    if r == AT_LOW.cache_ratio:
        return paired_text(AT_LOW), NO_DIFFERENCE
    if r in RATIOS and FASTER_RANGE[0] <= r <= FASTER_RANGE[1]:
        return faster_text(), FASTER
    return None
