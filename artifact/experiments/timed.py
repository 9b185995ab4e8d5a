"""A timing claim over its cells, in every view (docs/verdicts.md): its definition (criteria/timing.py) turned
into comparisons (`claim_parts`, `claim_compared`, `claim_cells`: replication.Replicas per cell), its question
asked of each cell (rules.rule_cell) and the cells combined (rules.combine) by `judge`, which also gives each
stored run's own verdict, the leave-one-out stability, the bias-bound alternative and the paper's criterion;
`timed_claim` makes the Claim a claim cell prints."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from artifact.experiments.claims import INCONCLUSIVE, Claim
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.criteria.timing import OTHERS, TimingClaim
from artifact.experiments.effects import BASES, PERCENT
from artifact.experiments.replication import METHOD, SINGLE, WITHIN, Compared, Replicas, Replicated
from artifact.experiments.rules import Interval, Question, Ruling, bias_bound, combine, rule_cell
from artifact.experiments.settings import CONTROL


def claim_parts(reps: Replicas, c: TimingClaim) -> dict[str, Compared]:
    """A timing claim's comparisons (criteria.timing), every cell of the rows, per A policy: {A: A over B on
    the claim's basis and metric, with the A/A control and the net effect}; with `a` OTHERS, one per other
    policy of the rows (every policy but B, demand and the control)."""
    basis = BASES[c.basis]
    others = (
        [c.a]
        if c.a != OTHERS
        else [p for p in dict.fromkeys(reps.this.policy) if p not in (c.b, "demand", CONTROL)]
    )
    return {p: reps.compare(p, c.b, c.by, c.metric, basis) for p in others}


def merge_others(parts: dict[str, Compared]) -> Compared:
    """Comparisons of several A policies as one, keyed (policy, cell): a claim over OTHERS rules on all of
    them."""
    merged = [
        {(p, k): v for p, x in parts.items() for k, v in getattr(x, f).items()}
        for f in ("effects", "control", "host", "net")
    ]
    return Compared(*merged, next(iter(parts.values())).basis if parts else PERCENT)


def claim_compared(reps: Replicas, c: TimingClaim) -> Compared:
    """A timing claim's comparison, every cell of the rows (claim_parts; merged, keyed (policy, cell), when
    `a` is OTHERS)."""
    parts = claim_parts(reps, c)
    return parts[c.a] if c.a != OTHERS else merge_others(parts)


def claim_cells(compared: Compared, c: TimingClaim) -> Compared:
    """Only the claim's cells (TimingClaim.select) of a comparison made by claim_compared (Compared.where;
    with `a` OTHERS a key is (policy, cell))."""
    return compared.where(lambda k: c.keeps(k[1] if c.a == OTHERS else k))


def question(c: TimingClaim) -> Question:
    """The rules.Question a timing claim asks of each of its cells."""
    return Question(c.question, thresholds.MARGIN, c.paper, c.unit)


@dataclass(frozen=True)
class Timed:
    """The verdict of one timing claim: ruled on this run (or pooled, when this run is a stored one), with
    each stored run's own verdict beside it."""

    verdict: str
    reason: str
    margin: str
    measured: str  # per cell: the ruled interval (and its A/A control)
    ruled_on: str  # METHOD, SINGLE or WITHIN, with N
    per_run: tuple[str, ...] = ()  # each stored run's own verdict (run order), on its SINGLE interval
    this_run: str = ""  # this run's own verdict (equal to `verdict` unless this run is stored)
    pooled: str = ""  # the pooled verdict over the stored runs ("" with fewer than 2)
    alternative: str = ""  # a direction claim: the bias-bound alternative's verdict, printed beside
    half_widths: str = ""  # the achieved half-widths of the ruled intervals (effect and A/A control)
    leave_one_out: tuple[str, ...] = ()  # the pooled verdict with each stored run left out, in run order
    paper_criterion: str = ""  # a direction claim: how many cells' interval lies above 0 (not ruled on)
    key: str = ""  # the claim's definition (criteria/timing.py), when ruled by rule_claim


def table(effects: dict[tuple, Replicated], keys: Sequence[str]) -> pd.DataFrame:
    """One row per cell: the interval it is ruled on, this run's one-run interval, the pooled interval over
    the stored runs and each stored run's mean (% A over B)."""
    out = []
    for k, r in effects.items():
        row = dict(zip(keys, k))
        row.update(
            ruled=r.ruled.unit,
            ruled_mean=r.ruled.mean,
            ruled_low=r.ruled.low,
            ruled_high=r.ruled.high,
            this_mean=r.this.mean,
            this_low=r.this.low,
            this_high=r.this.high,
        )
        if r.pooled is not None:
            row.update(pooled_mean=r.pooled.mean, pooled_low=r.pooled.low, pooled_high=r.pooled.high)
        row.update({f"run{i + 1}_mean": iv.mean for i, iv in enumerate(r.runs) if iv is not None})
        out.append(row)
    return pd.DataFrame(out).round(2)


def half_widths(effects: dict, control: dict, margin: float, pick=lambda r: r.ruled) -> str:
    """'half-widths: effect a..b points (median c); A/A a..b (<= margin in k of n cells)' over the cells of a
    view."""

    def widths(d):
        return [
            (pick(r).high - pick(r).low) / 2 for r in d.values() if math.isfinite(pick(r).high - pick(r).low)
        ]

    e, c = widths(effects), widths(control)
    text = (
        f"half-widths of the ruled intervals: effect {min(e):.1f}..{max(e):.1f} points (median "
        f"{float(np.median(e)):.1f})"
        if e
        else "half-widths: no finite interval"
    )
    if c:
        text += (
            f"; A/A control {min(c):.1f}..{max(c):.1f} (median {float(np.median(c)):.1f}), <= "
            f"{margin:g} in "
            f"{sum(x <= margin for x in c)} of {len(c)} cells"
        )
    return text


def family_level(cells: int, family: str = thresholds.FAMILY) -> float:
    """The confidence level a claim over `cells` cells rules `not reproduced` at: CONFIDENCE for one cell or
    family "none"; 1 - (1 - CONFIDENCE) / cells for "bonferroni" (thresholds.FAMILY)."""
    if family not in ("none", "bonferroni"):
        raise ValueError(f"family {family!r}: expected 'none' or 'bonferroni'")
    return (
        thresholds.CONFIDENCE if family == "none" or cells <= 1 else 1 - (1 - thresholds.CONFIDENCE) / cells
    )


def judge(
    compared: Compared, q: Question, label: Callable[[tuple], str], family: str = thresholds.FAMILY
) -> Timed:
    """Ask question `q` (rules.Question) of every cell of `compared` (rules.rule_cell: a direction claim of
    the effect net of the A/A control, the others of the effect with the control as a precision gate;
    host-bound GPU cells are inconclusive) and combine the cells (rules.combine), in every view: the ruled one
    (this run, or pooled when this run is a stored one), each stored run, this run alone, pooled, and pooled
    with each stored run left out (the leave-one-out stability). `not reproduced` is read off each cell's
    interval at the claim's simultaneous level (family_level). A direction claim also prints its bias-bound
    alternative (rules.bias_bound) and the paper's criterion (how many cells' net interval excludes 0; never
    ruling)."""
    net = q.net_of_control and bool(compared.net)
    effects, controls, host = (compared.net if net else compared.effects), compared.control, compared.host
    gate = {} if q.net_of_control else controls
    level = family_level(len(effects), family)
    wide = {k: r.at(level) for k, r in effects.items()} if level != thresholds.CONFIDENCE else {}

    def view(pick, drop: int | None = None) -> tuple[str, str, str]:
        def one(k, r):
            r = r if drop is None else r.at(drop=drop)
            iv = pick(r)
            if iv is None:
                return Ruling(INCONCLUSIVE, "this run has no rows in the cell", "no interval")
            w = None
            if k in wide:
                w = pick(wide[k] if drop is None else wide[k].at(level, drop))
            return rule_cell(q, iv, pick(gate[k]) if k in gate else None, host.get(k), w)

        return combine((label(k), one(k, r)) for k, r in effects.items())

    cells = list(effects.values())
    n_runs = min((len(r.runs) for r in cells), default=0)
    ruled = view(lambda r: r.ruled)
    this = view(lambda r: r.single())
    pooled = view(lambda r: r.pooled) if cells and all(r.pooled for r in cells) else None
    per_run = tuple(
        view(lambda r, i=i: r.single(r.runs[i]) if r.runs[i] is not None else None)[0] for i in range(n_runs)
    )
    loo = ()
    if pooled and cells[0].stored and all(r.own is not None for r in cells) and n_runs > thresholds.MIN_RUNS:
        loo = tuple(view(lambda r: r.pooled, drop=i)[0] for i in range(n_runs))
    on = ruled_on_text(cells, n_runs, level, family)
    alternative, criterion = direction_notes(compared, effects, q, net, label)
    return Timed(
        ruled[0],
        ruled[1],
        ruled[2],
        cells_text(compared, effects, q, net, label),
        on,
        per_run,
        this[0],
        pooled[0] if pooled else "",
        alternative,
        half_widths(effects, {k: v for k, v in controls.items() if k in effects}, q.margin),
        loo,
        criterion,
    )


def ruled_on_text(cells: Sequence[Replicated], n_runs: int, level: float, family: str) -> str:
    """What a claim's cells are ruled on (judge): METHOD when this run is a stored one, SINGLE with stored
    runs to borrow from, else WITHIN, with N; and the simultaneous level `not reproduced` is read at
    (family_level)."""
    on = (
        f"{METHOD}, N = {n_runs}"
        if cells and cells[0].stored
        else f"{SINGLE}, N = {n_runs}"
        if n_runs >= 2
        else WITHIN
    )
    if level != thresholds.CONFIDENCE:
        on += (
            f"; `not reproduced` at the simultaneous level over the {len(cells)} cells "
            f"({level:.2%}, {family})"
        )
    return on


def direction_notes(
    compared: Compared,
    effects: dict[tuple, Replicated],
    q: Question,
    net: bool,
    label: Callable[[tuple], str],
) -> tuple[str, str]:
    """(the bias-bound alternative, the paper's criterion) that a direction claim prints beside its verdict,
    never ruling (judge; `effects`: the cells it rules on, net of the A/A control when `net`); ("", "") for
    the others."""
    controls, host = compared.control, compared.host
    alternative = criterion = ""
    if q.net_of_control:
        alternative = (
            "no A/A control in these rows: ruled on the effect itself"
            if not net
            else "bias-bound alternative (A over B widened by the control's largest bias, not ruled "
            "on): "
            + combine(
                (label(k), rule_cell(q, bias_bound(r.ruled, controls[k].ruled), None, host.get(k)))
                for k, r in compared.effects.items()
                if k in controls
            )[0]
        )
        above = sum(r.ruled.usable and r.ruled.low > 0 for r in effects.values())
        criterion = (
            f"the paper's criterion (shown, not ruled on): {above} of {len(effects)} cells"
            + (" net of the A/A control" if net else "")
            + " have an interval above 0"
        )
        if q.paper:
            mean, low, high = paper.SMALLEST_FASTER
            like = q(Interval(mean, low, high, thresholds.MIN_RUNS, "runs"))
            criterion += (
                f"; a result like the paper's smallest, {mean:+g}% [{low:+g}, {high:+g}], meets "
                "that "
                f"criterion and reads {like.verdict} under this rule ({like.why})"
            )
    return alternative, criterion


def cells_text(
    compared: Compared,
    effects: dict[tuple, Replicated],
    q: Question,
    net: bool,
    label: Callable[[tuple], str],
) -> str:
    """Each ruled cell's interval (judge's `effects`), with its A over B and A/A control when ruled net of it,
    else with its A/A control when the rows carry one."""
    controls = compared.control

    def cell_text(k) -> str:
        r = effects[k]
        if net:
            return (
                f"{label(k)}: net {r.ruled.text(q.unit)} (A over B "
                f"{compared.effects[k].ruled.text(q.unit)}, A/A "
                f"{controls[k].ruled.text(q.unit)})"
            )
        aa = f" (A/A {controls[k].ruled.text(q.unit)})" if k in controls else ""
        return f"{label(k)}: {r.ruled.text(q.unit)}{aa}"

    return "; ".join(cell_text(k) for k in effects)


def rule_claim(
    compared: Compared, c: TimingClaim, label: Callable[[tuple], str], family: str = thresholds.FAMILY
) -> Timed:
    """A timing claim's verdict (criteria.timing): its question asked of its cells of `compared`
    (claim_compared)."""
    return dataclasses.replace(judge(claim_cells(compared, c), question(c), label, family), key=c.key)


def timed_claim(claim: str, paper_text: str, t: Timed, counting: str, note: str = "") -> Claim:
    """The Claim of a timing verdict: measured per cell (with `note` after it), ruled on t.ruled_on, with
    every stored run's own verdict."""
    measured = t.measured + (f"; {note}" if note else "")
    margin = "; ".join(p for p in (t.margin, t.alternative) if p)
    return Claim(
        claim,
        paper_text,
        measured,
        t.verdict,
        t.reason,
        timing=True,
        counting=counting,
        interval=f"{t.ruled_on}; {t.half_widths}",
        margin=margin,
        per_run=t.per_run,
        pooled=t.pooled,
        this_run=t.this_run,
        leave_one_out=t.leave_one_out,
        paper_criterion=t.paper_criterion,
        key=t.key,
        ruled="pooled" if t.ruled_on.startswith(METHOD) else "this run",
    )
