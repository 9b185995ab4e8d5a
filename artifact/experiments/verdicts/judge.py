"""A timing claim (criteria/timing.py) over its cells: its comparisons (`claim_parts`, `claim_compared`), its
question asked of every cell with the A/A gate (rules.rule_cells) in every view (`judge`: the ruled one, each
stored run alone, pooled, leave-one-out), and the Claim a notebook prints (`timed_claim`; its `cells` hold the
numbers the verdict used). `rule_stated` rules intervals given by hand (`python -m artifact rule`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.criteria.timing import CLAIMS, OTHERS, STALL_SHARE, TimingClaim
from artifact.experiments.settings import CONTROL
from artifact.experiments.verdicts import next_step
from artifact.experiments.verdicts.pairs import BASES
from artifact.experiments.verdicts.pooling import Compared, Replicas, Replicated
from artifact.experiments.verdicts.records import Claim, stated
from artifact.experiments.verdicts.rules import (
    INCONCLUSIVE,
    Interval,
    aa_gate,
    claim_verdict,
    host_bound,
    rule_cells,
    rule_claim_cells,
)

ONE_RUN_ALONE = (
    "one run, and no stored runs of this profile to size the run-to-run variation: record >= 3 runs "
    "(scripts/record_runs.py) to rule it"
)


def claim_parts(reps: Replicas, c: TimingClaim) -> dict[str, Compared]:
    """{A: A over B on the claim's basis and metric, every cell of the rows}; with `a` OTHERS, one per other
    policy of the rows (every policy but B, demand and the stand-in)."""
    others = [p for p in dict.fromkeys(reps.rows.policy) if p not in (c.b, "demand", CONTROL)]
    return {
        p: reps.compare(p, c.b, c.by, c.metric, BASES[c.basis]) for p in ([c.a] if c.a != OTHERS else others)
    }


def merge_others(parts: dict[str, Compared]) -> Compared:
    """Several A policies' comparisons as one, cells keyed (policy, cell); the A/A stays keyed by cell."""
    first = next(iter(parts.values()), Compared({}))
    effects = {(p, k): v for p, x in parts.items() for k, v in x.effects.items()}
    return Compared(effects, first.aa, first.host, first.basis, first.aa_label)


def claim_compared(reps: Replicas, c: TimingClaim) -> Compared:
    parts = claim_parts(reps, c)
    return parts[c.a] if c.a != OTHERS else merge_others(parts)


def claim_cells(compared: Compared, c: TimingClaim) -> Compared:
    """Only the claim's cells (TimingClaim.select)."""
    return compared.where(lambda k: c.keeps(k[1] if c.a == OTHERS else k))


@dataclass(frozen=True)
class Timed:
    verdict: str
    reason: str
    cells: list  # per cell: cell, effect, low, high, runs, aa_low, aa_high (the numbers the verdict used)
    interval: str  # what the intervals are over
    per_run: tuple[str, ...] = ()
    pooled: str = ""
    leave_one_out: tuple[str, ...] = ()
    agreement: str = ""
    stored: bool = False  # ruled on the stored runs, pooled (else on this run alone)
    to_decide: str = ""  # inconclusive: what would decide it, in one line (next_step.py)


def _num(x: float) -> float | None:
    return round(float(x), 3) if math.isfinite(x) else None


def _ruling(c: TimingClaim, compared: Compared, label, pick: Callable[[Replicated], Interval | None]):
    """(verdict, reason, cells, to_decide) of one view (`pick`: which interval of a Replicated)."""
    aa_name, others = compared.aa_label or "A/A", c.a == OTHERS
    by = ("policy", *c.by) if others else c.by
    labelled, gates, aa_reps, aas, cells = [], [], [], [], []
    for k, r in compared.effects.items():
        iv = pick(r) or Interval(math.nan, math.nan, math.nan, 0, "runs")
        aa_r = compared.aa.get(k[1] if others else k)
        aa = pick(aa_r) if aa_r is not None else None
        gate = ONE_RUN_ALONE if iv.unit == "pairs" else aa_gate(aa, thresholds.MARGIN, aa_name)
        gates.append(gate or host_bound(compared.host.get(k[1] if others else k)))
        aa_reps.append(aa_r)
        aas.append(aa)
        labelled.append((label(k), iv))
        cells.append(
            dict(
                label=label(k),
                cell=dict(zip(by, (k[0], *k[1]) if others else k)),
                effect=_num(iv.mean),
                low=_num(iv.low),
                high=_num(iv.high),
                runs=r.n_runs if iv.unit == "runs" else 1,
                aa_low=_num(aa.low) if aa else None,
                aa_high=_num(aa.high) if aa else None,
            )
        )
    rulings = rule_cells(c.question, labelled, gates, thresholds.MARGIN, c.unit, aas, aa_name)
    for x, r in zip(cells, rulings):
        x["ruling"] = r.verdict
    verdict, reason = claim_verdict([name for name, _ in labelled], rulings)
    to_decide = ""
    if verdict == INCONCLUSIVE:
        hints = [
            next_step.hint(name, c.question, r, iv, aa_r, a, x.why)
            for (name, iv), r, aa_r, a, x in zip(labelled, compared.effects.values(), aa_reps, aas, rulings)
            if x.verdict == INCONCLUSIVE
        ]
        to_decide = max(hints, key=lambda h: h[0])[1] if hints else ""
    return verdict, reason, cells, to_decide


def judge(compared: Compared, c: TimingClaim, label: Callable[[tuple], str]) -> Timed:
    """The claim ruled on its cells of `compared`: pooled over the stored runs when it has no run of its own,
    else this run alone; beside it each stored run's own verdict, the leave-one-out (a stored run dropped
    from the effect and the A/A alike) and a fresh run's agreement with the stored verdict."""
    compared = claim_cells(compared, c)
    cells = list(compared.effects.values())
    stored = all(r.this is None for r in cells)
    verdict, reason, numbers, to_decide = _ruling(c, compared, label, lambda r: r.ruled)

    def view(pick: Callable[[Replicated], Interval | None], of: Compared = compared) -> str:
        return _ruling(c, of, label, pick)[0]

    n_runs = max((len(r.per) for r in cells), default=0)
    per_run = tuple(view(lambda r, i=i: r.runs[i] if r.runs else None) for i in range(n_runs))
    pooled = (verdict if stored else view(lambda r: r.pooled)) if n_runs >= 2 else ""
    loo = ()
    if stored and n_runs > thresholds.MIN_RUNS:
        loo = tuple(view(lambda r: r.ruled, compared.without(i)) for i in range(n_runs))
    agreement = ""
    if not stored and pooled:
        same = "agrees with" if verdict == pooled else "differs from"
        alone = INCONCLUSIVE in (verdict, pooled)
        agreement = "is inconclusive alone" if alone else f"{same} the stored verdict"
    unit = cells[0].ruled.unit if cells else "runs"
    over = {
        "runs": f"{thresholds.CONFIDENCE:.0%} t interval over the per-run means of {n_runs} stored runs",
        "run": f"this run alone: {n_runs} stored runs' spread, widened by this run's excess noise",
        "pairs": "this run's pairs alone (no run-to-run variation)",
    }.get(unit, unit)
    gate = compared.aa_label or "no A/A"
    return Timed(
        verdict, reason, numbers, f"{over}; gate: {gate}", per_run, pooled, loo, agreement, stored, to_decide
    )


def cells_text(t: Timed, unit: str = "%") -> str:
    """The text columns, rendered from the cells' fields."""
    out = []
    for x in t.cells:
        name = x.get("label") or ", ".join(f"{k} {v}" for k, v in x["cell"].items())
        iv = Interval(*(math.nan if x[f] is None else x[f] for f in ("effect", "low", "high")))
        aa = f"; A/A [{x['aa_low']:+.1f}, {x['aa_high']:+.1f}]" if x["aa_low"] is not None else ""
        runs = f" ({x['runs']} runs)" if x["runs"] > 1 else ""
        out.append(f"{name}: {iv.text(unit)}{runs}{aa}")
    return "; ".join(out)


def timed_claim(key: str, t: Timed, counting: str, note: str = "", **fill) -> Claim:
    """The timing claim `key` as a notebook prints it: its text and the paper's words from the registry
    (criteria/claims.py), the cells' intervals from `t`."""
    c = CLAIMS[key]
    carried = ("reason", "interval", "per_run", "pooled", "leave_one_out", "agreement", "cells", "to_decide")
    return stated(
        key,
        cells_text(t, c.unit) + (f"; {note}" if note else ""),
        t.verdict,
        {"question": question(c), **fill},
        timing=True,
        counting=counting,
        ruled="pooled" if t.stored else "this run",
        **{f: getattr(t, f) for f in carried},  # Timed's fields of the same name
    )


def question(c: TimingClaim) -> str:
    """The claim's question in words (a stall-share claim asks whether A stalls longer)."""
    m = f"{thresholds.MARGIN:g}{c.unit}"
    faster = "A stalls longer than B" if c.basis == STALL_SHARE else "A faster than B"
    return {
        "faster": f"{faster}: every cell's {thresholds.CONFIDENCE:.0%} interval above 0",
        "no difference": f"no difference: the interval inside +-{m}",
        "not faster": f"not faster by more than +{m}",
    }[c.question]


# --- intervals given by hand: the paper's printed results, a reviewer's own table ---------------------------
def rule_stated(key: str, cells: Sequence[tuple[float, float, float]]) -> tuple[str, str]:
    """(verdict, reason) of the claim `key` (criteria/timing.py) on 95% intervals given by hand, one per cell
    (effect, low, high), with no A/A to gate them (the paper prints none)."""
    if key not in CLAIMS:
        raise ValueError(f"claim {key!r}: expected one of {', '.join(CLAIMS)}")
    c = CLAIMS[key]
    ivs = []
    for i, (e, lo, hi) in enumerate(cells):
        if not lo <= e <= hi:
            raise ValueError(f"cell {i + 1}: effect {e:+g} is not inside its interval [{lo:+g}, {hi:+g}]")
        ivs.append((f"cell {i + 1}", Interval(e, lo, hi)))
    return rule_claim_cells(c.question, ivs, (), thresholds.MARGIN, c.unit)


def paper_ruled(key: str) -> str:
    """The paper's own result for a claim (paper.RESULTS), ruled here: it must read reproduced ("" when the
    paper prints none for it)."""
    return rule_stated(key, paper.RESULTS[key])[0] if key in paper.RESULTS else ""
