"""The paper's numbers, written once, and the thresholds this artifact judges them by (the second section:
each named once, with its reason). Claim texts, figure marks, verdict rules (rules.py) and the paired
table's paper column all derive from here (the claims are listed in docs/DESIGN.md, the rules in
docs/verdicts.md)."""
from __future__ import annotations

from dataclasses import dataclass

RATIOS = (0.43, 0.83, 1.0, 1.3, 1.73)       # the C/W values the paper measures end to end

ORACLE_CUT = 6.7                             # LRU's demand misses / the oracle prefetcher's

# demand-async over async last-step prefetch, % tokens/s with a 95% CI over pairs
FASTER_RANGE = (0.83, 1.73)                  # at every C/W in this range demand-async is faster ...
FASTER_PCT = (4.9, 11.8)                     # ... by this much, each CI excluding zero


@dataclass(frozen=True)
class PairedResult:
    cache_ratio: float
    diff_pct: float
    ci_low: float
    ci_high: float


AT_LOW = PairedResult(0.43, 0.73, -1.16, 2.63)   # at C/W 0.43: no difference

TIDE_SPEEDUP = {1.0: 14.4, 0.5: 6.1}         # engine / TIDE's released code at C/W 1 (the same budget) and 0.5

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


# ---------------------------------------------------------------------------------------------
# Thresholds: this artifact's readings of the paper's words, and the interval rule's parameters.
# Every claim cell prints its margin to the threshold it is judged by (docs/verdicts.md).
# ---------------------------------------------------------------------------------------------
CONFIDENCE = 0.95        # the one interval of every timing verdict: the 95% t interval over pairs (the paper's
                         # own intervals are 95%)
MIN_PAIRS = 4            # fewer pairs than this: inconclusive. With 3 pairs t_{0.975, 2} = 4.30 makes the
                         # interval about 1.6x wider than with 4 (4.30 / sqrt 3 vs 3.18 / sqrt 4), and the sd of
                         # 2 or 3 differences is too unstable to size it
MIN_RUNS = 3             # a stored (headline) result is at least 3 runs of the timing notebooks at one commit: the
                         # pooled interval is a t interval over per-run means with N - 1 degrees of freedom
EQUIV_MARGIN = 3.0       # points of tokens/s: "no difference" means the whole interval lies inside +-3%, and
                         # "not faster" that it lies below +3% (the paper's smallest effect, +4.9%, is
                         # well outside it; its own no-difference interval, [-1.16, +2.63], inside it)
STABLE = 0.80            # "very stable" routing: >= 80% of D(t, l) already in D(t-1, l) on every task (the paper
                         # gives no number; 80% is the share at which most of a step's experts are a repeat)
FEW = 0.10               # "few or no misses removed": under 10% of LRU's misses (an order of magnitude below
                         # LRU's own misses, and below the oracle's 6.7x cut by far)
FACTOR = 1.5             # a paper ratio (the oracle's 6.7x) is reproduced within a factor of 1.5 either way: the
                         # tiny model's routing is not LLaDA2.0's, so only the order of the cut can carry over
HEADROOM = 0.5           # (06, 2a) last_step "understates" prediction when it removes < half of the misses the
                         # oracle removes beyond LRU (the oracle is every predictor's ceiling)
EVICTION_GAIN = 0.10     # (09) an eviction policy "beats" LRU when it removes more than 10% of LRU's misses: the
                         # margin FlashMoE-style reports of +51% hits would clear by far, and FEW's mirror image
GAP_LEFT = 0.5           # (09) "most of the gap to min is left" when the best eviction closes under half of it

MODEL_ERROR = 0.10       # (08) the performance model is validated when the median absolute error of its seconds per
                         # step over measured cells is at most 10% (LLM inference simulators such as Vidur report ~9%)
