"""What would decide an inconclusive claim, in one line: the cell that blocks it, and whether (roughly how
many) more pairs per cell or more runs would help. An estimate: how small the cell's standard error must be
for its interval, at the same t quantile, to clear its nearest boundary, and how that error shrinks
(docs/verdicts.md, "What would decide it"):

    a fresh run ("run")     se^2 = s^2 + e / n: the stored runs' spread s^2 stays; the run's excess noise
                            e / n falls with more pairs n. When t s alone is too wide, one run cannot decide:
                            k runs pooled, se = s / sqrt(k)
    stored runs ("runs")    se = s / sqrt(k) over k runs
    an A/A that gates       the same, asked of the A/A's interval against +-MARGIN

A cell nearer its boundary than a tenth of its standard error, or one that needs more than MAX_RUNS runs, is
out of reach. Host-bound GPU cells and single runs without stored runs name their own remedy."""

from __future__ import annotations

import math

import numpy as np

from artifact.experiments.criteria.thresholds import MARGIN, MIN_RUNS
from artifact.experiments.verdicts.rules import FASTER, NO_DIFFERENCE, Interval

MAX_RUNS = 100  # beyond this many runs a cell is out of a reviewer's reach


def distance(kind: str, mean: float, margin: float = MARGIN) -> float:
    """How far an effect lies from the boundary of a claim of kind `kind`, signed: > 0 on the side that reads
    reproduced (the calibration's scenarios ask it of a true effect too)."""
    if kind == FASTER:
        return mean
    if kind == NO_DIFFERENCE:
        return margin - abs(mean)
    return margin - mean


def needs(iv: Interval, r, d: float) -> tuple[str, int] | None:
    """("pairs", n) or ("runs", k): what brings the interval's half-width under `d` (r: its cell's
    pooling.Replicated); None when out of reach."""
    if not iv.usable or not iv.se or iv.se <= 0 or d < 0.1 * iv.se:
        return None
    means = [float(np.mean(p)) for p in r.per if p is not None and len(p)]
    if len(means) < 2:
        return None
    target = (d * iv.se / (iv.high - iv.mean)) ** 2  # the se^2 at which the interval clears d
    s2 = float(np.var(means, ddof=1))
    if iv.unit == "run" and s2 < target and r.own is not None and iv.se**2 > s2:
        return "pairs", math.ceil(len(r.own) * (iv.se**2 - s2) / (target - s2))
    k = math.ceil(s2 / target)
    return ("runs", k) if k <= MAX_RUNS else None


def hint(label: str, kind: str, r, iv: Interval, aa_r, aa: Interval | None, why: str) -> tuple[float, str]:
    """(cost, one line) of what would decide one inconclusive cell; the costliest cell blocks the claim."""
    if why.startswith("host-bound"):
        return math.inf, f"{label} is host-bound: run the segmented forward (forward: segmented)"
    if iv.unit == "pairs":
        return math.inf, f"{label}: record >= {MIN_RUNS} runs of this profile (scripts/record_runs.py)"
    gated = aa is not None and aa_r is not None and "A/A" in why
    if gated and abs(aa.mean) >= MARGIN:
        return (
            math.inf,
            f"{label}: its A/A {aa.text()} centres beyond +-{MARGIN:g}%: rerun on a quiet machine",
        )
    what, asked, rep = ("its A/A ", aa, aa_r) if gated else ("", iv, r)
    d = MARGIN - abs(aa.mean) if gated else abs(distance(kind, iv.mean))
    need = needs(asked, rep, d)
    if need is None:
        return (
            math.inf,
            f"{label}: {what}{asked.text()} sits on its boundary: no feasible number of runs would decide it",
        )
    unit, k = need
    if unit == "pairs":
        return k / (MAX_RUNS + 1), f"{label}: {what}about {k} pairs per cell in one run would decide it"
    if asked.unit == "run":
        return k, f"{label}: one run cannot; about {k} runs pooled would (scripts/record_runs.py)"
    return k, f"{label}: about {max(k - asked.n, 1)} more stored runs ({k} in all) would decide it"
