"""The paper's words and numbers, written once. Its only source is its abstract, kept verbatim in
docs/paper-abstract.txt. PHRASES are the words this artifact attributes to the paper, each a verbatim
phrase of the abstract (its LaTeX math written as plain text by `plain`) beside the sentence it comes from;
`said` renders them for a claim, with this artifact's reading marked as such. The numbers below feed the
claim texts, figure marks, the verdict rules (rules.py) and the paired table's paper column; the thresholds
this artifact judges them by are in thresholds.py, the claims in claims.py (the rules in docs/verdicts.md)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache

from artifact.paths import repo_root

TITLE = "Rethinking Expert Prefetching for Offloaded Diffusion MoE Inference"
ABSTRACT = "docs/paper-abstract.txt"  # the abstract, verbatim: the only source of the paper's words here
READING = "this artifact's reading: "  # what follows is this artifact's, not the paper's
OWN = "this artifact's own result (not a claim of the paper)"


def plain(text: str) -> str:
    """The abstract's LaTeX math as plain text ($6.7\\times$ -> 6.7x, \\% -> %, $\\cap /W$ -> C/W, an en dash
    -> '-'), whitespace collapsed: the form its phrases are quoted in."""
    for latex, word in (("\\cap /W", "C/W"), ("\\times", "x"), ("\\%", "%"), ("$", ""), ("\u2013", "-")):
        text = text.replace(latex, word)
    return re.sub(r"\s+", " ", text).strip()


@cache
def abstract() -> str:
    """The abstract's text, plain (its first line, the title, left out)."""
    return plain((repo_root() / ABSTRACT).read_text().split("\n", 1)[1])


def sentences() -> list[str]:
    return [s if s.endswith(".") else s + "." for s in re.split(r"(?<=\.) (?=[A-Z])", abstract())]


@dataclass(frozen=True)
class Phrase:
    words: str  # verbatim in the plain abstract
    short: str  # its core, verbatim in `words`: what a table cell quotes

    @property
    def sentence(self) -> str:
        """The abstract's sentence the phrase comes from."""
        return next(s for s in sentences() if self.words in s)


PHRASES = {  # each: the words, then their core (what a table cell quotes)
    "stable": Phrase("making expert routing highly stable over time", "highly stable over time"),
    "few or no": Phrase(
        "near and above the working-set scale, last-step prefetching reduces few or no demand misses beyond "
        "LRU while still introducing speculative transfers",
        "reduces few or no demand misses beyond LRU",
    ),
    "oracle": Phrase("an oracle with true future routing cuts misses by 6.7x", "cuts misses by 6.7x"),
    "compete": Phrase(
        "these speculative transfers compete with demand traffic for host-to-device bandwidth",
        "compete with demand traffic for host-to-device bandwidth",
    ),
    "faster": Phrase(
        "improves throughput by 4.9-11.8% over asynchronous last-step prefetching near and above the "
        "per-step working-set scale, with all paired 95% confidence intervals excluding zero",
        "improves throughput by 4.9-11.8%",
    ),
    "significant": Phrase(
        "the no-prefetch advantage is significant for C/W=0.83-1.73", "significant for C/W=0.83-1.73"
    ),
    "at low": Phrase(
        "falls to +0.73% (95% CI [-1.16,+2.63]) at C/W=0.43", "falls to +0.73% (95% CI [-1.16,+2.63])"
    ),
    "ordering": Phrase(
        "The same ordering holds across five tasks and batch sizes 1-8",
        "across five tasks and batch sizes 1-8",
    ),
    "refresh": Phrase(
        "An interval-refresh placement policy inspired by TIDE does not reduce misses below LRU in our "
        "execution setting",
        "does not reduce misses below LRU",
    ),
    "tide budget": Phrase(
        "Head-to-head against TIDE's released implementation at the same expert budget",
        "at the same expert budget",
    ),
    "tide": Phrase(
        "our system achieves a 14.4x speedup (6.1x at half the budget)",
        "a 14.4x speedup (6.1x at half the budget)",
    ),
}


def quote(*keys: str) -> str:
    """The phrases, quoted as the abstract's; two or more are said to be joined by this artifact."""
    said = " + ".join(f'"{PHRASES[k].words}"' for k in keys)
    return f"abstract: {said}" + (" (joined by this artifact)" if len(keys) > 1 else "")


def quote_short(*keys: str) -> str:
    """The phrases' cores, quoted as a table cell quotes them (the whole phrases: `quote`)."""
    said = " + ".join(f'"{PHRASES[k].short}"' for k in keys)
    return f"abstract: {said}"


def said(keys: tuple[str, ...], reading: str = "") -> str:
    """A claim's paper field: its phrases quoted, this artifact's reading after them; with no phrase, this
    artifact's own result (`reading` then says how it is judged)."""
    if not keys:
        return f"{OWN}; judged: {reading}" if reading else OWN
    return quote(*keys) + (f"; {READING}{reading}" if reading else "")


# The C/W values this artifact's grids measure (its own choice): the abstract names C/W 0.43 and the range
# 0.83-1.73 ("significant for C/W=0.83-1.73, but falls to +0.73% ... at C/W=0.43"); 1.0 and 1.3 are points
# this artifact adds inside that range.
RATIOS = (0.43, 0.83, 1.0, 1.3, 1.73)

ORACLE_CUT = 6.7  # abstract: "an oracle with true future routing cuts misses by 6.7x"

# abstract: "improves throughput by 4.9-11.8% over asynchronous last-step prefetching near and above the
# per-step working-set scale, with all paired 95% confidence intervals excluding zero" and "significant for
# C/W=0.83-1.73". The abstract prints no interval for these effects, only that each excludes zero.
FASTER_RANGE = (0.83, 1.73)
FASTER_PCT = (4.9, 11.8)


@dataclass(frozen=True)
class PairedResult:
    cache_ratio: float
    diff_pct: float
    ci_low: float
    ci_high: float


AT_LOW = PairedResult(
    0.43, 0.73, -1.16, 2.63
)  # abstract: "falls to +0.73% (95% CI [-1.16,+2.63]) at C/W=0.43"

# abstract: "our system achieves a 14.4x speedup (6.1x at half the budget)" against TIDE's released code at
# the same expert budget (this artifact reads "the same budget" as C/W 1, its own choice) and half of it
TIDE_SPEEDUP = {1.0: 14.4, 0.5: 6.1}

# The paper's own printed results by timing claim (criteria/timing.py), as 95% intervals (effect, low, high),
# ruled by `python -m artifact rule CLAIM --paper` and in the README's column "paper's result, ruled here":
# 04-faster from "4.9-11.8% ... with all paired 95% confidence intervals excluding zero" (its two ends, each
# interval only known to lie above 0: ABOVE_ZERO, the high end mirrored), 04-equal from "+0.73% (95% CI
# [-1.16,+2.63]) at C/W=0.43".
ABOVE_ZERO = math.nextafter(0.0, 1.0)  # a bound the paper states only as "above 0"
RESULTS = {
    "04-faster": [(x, ABOVE_ZERO, 2 * x - ABOVE_ZERO) for x in FASTER_PCT],
    "04-equal": [(AT_LOW.diff_pct, AT_LOW.ci_low, AT_LOW.ci_high)],
}

# verdicts in the words of the paired table (paired_table.paired_table, its verdict column)
FASTER, NO_DIFFERENCE = "A faster", "no difference"


def faster_text() -> str:
    return f"+{FASTER_PCT[0]}..+{FASTER_PCT[1]}, CI excludes 0"


def paired_text(r: PairedResult, unit: str = "") -> str:
    return f"{r.diff_pct:+.2f}{unit} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]"


def demand_vs_last_step(cache_ratio: float) -> tuple[str, str] | None:
    """(the abstract's figure as text, its verdict) at a C/W of the grid it speaks of, else None: C/W 0.43 its
    interval; a C/W in 0.83-1.73 its gain range "4.9-11.8%", which this artifact reads as holding at each C/W
    of that range (the abstract names the range, not the gain per C/W: this artifact's reading)."""
    r = round(float(cache_ratio), 2)
    if r == AT_LOW.cache_ratio:
        return paired_text(AT_LOW), NO_DIFFERENCE
    if r in RATIOS and FASTER_RANGE[0] <= r <= FASTER_RANGE[1]:
        return faster_text(), FASTER
    return None
