"""06 beyond the paper, what notebook 06 reports from both parts: their numbers (Numbers), the verdicts (the
tokens claim, the priority claim (1) from throughput.py, the count claims (2) from misses.py) and the
figure."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments.bench.order import AA
from artifact.experiments.bench.results import same_tokens
from artifact.experiments.counting import BASIS_SHORT, EXACT, PER_RUN
from artifact.experiments.criteria.timing import DEMAND
from artifact.experiments.outputs.figures import (
    CONTROL_COLOR,
    UNDER,
    in_order,
    interval_fields,
    mark_margin,
    mark_zero,
    style,
    title,
)
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.studies.beyond_the_paper.misses import BOUNDS, count_claims, counts
from artifact.experiments.studies.beyond_the_paper.throughput import CLAIM, PRIORITIES, priority_claim
from artifact.experiments.verdicts.judge import claim_parts
from artifact.experiments.verdicts.pairs import BASES, STAND_IN
from artifact.experiments.verdicts.pooling import Replicas
from artifact.experiments.verdicts.records import Claim, stated, verdict_of
from artifact.offload.replay.sim import ruling_basis


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    same_cells: int  # cells where every policy and repetition decoded the same tokens ...
    cells: int  # ... of all cells (both priorities)
    table: pd.DataFrame  # this run's every predictor over demand, per link priority and cell
    basis: str  # the counting basis the count claims rule on (sim.ruling_basis)
    by_prefill: dict  # counting basis -> Counts
    timed: dict  # {policy: Compared} predictor over demand per cell, with the A/A and host shares
    shown: dict  # {policy: Compared} demand over predictor (04's sign): what the figure draws, never ruled


def numbers(summary, table, reps: Replicas) -> Numbers:
    rows = reps.rows
    n_same, n_cells = same_tokens(rows.assign(task=rows.task + "/" + rows.link_priority))
    by_prefill = {p: counts(g) for p, g in summary.groupby("prefill", sort=False)}
    timed = claim_parts(reps, CLAIM)
    shown = {p: reps.compare(DEMAND, p, CLAIM.by, CLAIM.metric, BASES[CLAIM.basis]) for p in timed}
    return Numbers(n_same, n_cells, table, ruling_basis(summary), by_prefill, timed, shown)


def verdicts(n: Numbers) -> list[Claim]:
    claims = [
        stated(
            "06-exact",
            f"{n.same_cells} of {n.cells} cells identical",
            verdict_of(n.same_cells == n.cells),
            counting=PER_RUN,
            interval=EXACT,
            margin=f"{n.cells - n.same_cells} cells differ",
        )
    ]
    # (1) does prediction still lose once it can never delay a demand transfer?
    if any(k[0] == "demand" for c in n.timed.values() for k in c.effects):
        claims.append(priority_claim(n.timed, n.table))
    # (2) is last-step the right predictor to judge prediction by? Exact counts, ruled on n.basis
    return claims + count_claims(n.by_prefill, n.basis)


# --- figure ---------------------------------------------------------------------------------------
COUNT_AXES = {  # a count panel's column: (title, y label)
    "misses_vs_lru": ("demand misses", "demand misses (% of LRU's)"),
    "transfers_vs_lru": (
        "transfers (demand + speculative)",
        "transfers (% of LRU's transfers\n= LRU's demand misses)",
    ),
}
EFFECT_LABEL = "demand over predictor (% tokens/s; as 04:\n> 0 = demand faster), 95% intervals"


def plot(summary, n: "Numbers", P: Settings):
    """(a) demand misses and (b) all transfers (demand + speculative) relative to LRU's demand misses per
    policy vs C/W, (b) with the floors belady and min (a prefetch can be postponed to its first use), on the
    basis the claims rule on (sim.ruling_basis; the saved data holds both); (c, d) demand over each predictor
    (% tokens/s: the claim's 95% intervals with A and B swapped, 04's sign) vs C/W under FIFO and demand
    priority, with the A/A (demand over demand, or the stand-in) the claim gates with."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    basis = ruling_basis(summary)
    counted = summary[summary.prefill == basis]
    for ax, col in zip(axes[0], COUNT_AXES):
        _counts_panel(ax, counted, col, f"{COUNT_AXES[col][0]}, exact replay, {BASIS_SHORT[basis]}")
    first = next(iter(n.timed.values()), None)
    aa = (first.aa_label if first else None) or AA
    series = {**{p: c.effects for p, c in (n.shown or n.timed).items()}, aa: first.aa if first else {}}
    rows = []
    for ax, pr in zip(axes[1], PRIORITIES):
        rows += _throughput_panel(ax, pr, series, aa)
    lo = min(a.get_ylim()[0] for a in axes[1])
    hi = max(a.get_ylim()[1] for a in axes[1])
    for a in axes[1]:
        a.set_ylim(lo, hi)  # one scale, so the two priorities compare by eye
    for ax in axes[:, 1]:  # beside each row, over no curve
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    for ax in axes.flat:
        ax.title.set_fontsize(10)
    title(fig, P, "06 beyond the paper (this artifact's own results)")
    df = pd.concat([summary.assign(panel="misses"), pd.DataFrame(rows)], ignore_index=True)
    return fig, df


def _counts_panel(ax, counted: pd.DataFrame, col: str, heading: str) -> None:
    """One count (`col`, relative to LRU's demand misses) per policy vs C/W; the floors only on transfers.
    LRU is drawn wide and pale under the rest, so that a policy equal to it (last_step_conservative) shows
    on top; the lookahead-2 variants with larger hollow markers over their lookahead-1 ones."""
    for pol in in_order(counted.policy):
        if pol in BOUNDS and col == "misses_vs_lru":
            continue  # a floor on loads, not on a prefetcher's demand misses
        g = counted[counted.policy == pol]
        label = pol + (" (LRU)" if pol == "demand" else " (floor)" if pol in BOUNDS else "")
        look = dict(style(pol), ms=4, zorder=3)
        if pol == "demand":
            look = dict(color=look["color"], **UNDER)
        elif "lookahead=2" in pol:
            look.update(ms=8, mew=1.3, zorder=4)
        ax.plot(g.cache_ratio, 100 * g[col], label=label, **look)
    ax.axhline(100, color="gray", lw=0.8, ls=":")
    ax.set(xlabel="cache capacity C/W", ylabel=COUNT_AXES[col][1], title=heading)
    ax.set_ylim(bottom=0)


def _throughput_panel(ax, pr: str, series: dict, aa: str) -> list[dict]:
    """Demand's effect over each predictor (and the A/A, the series named `aa`) per cell under link priority
    `pr`, with its interval, beside the margin; `series` is {policy or `aa`: {cell: Replicated}}. Returns the
    figure data."""
    batches = sorted({k[2] for eff in series.values() for k in eff})
    rows = []
    for k, (pol, cells) in enumerate(series.items()):
        name = aa if pol == aa else f"demand over {pol}"
        look = dict(color=CONTROL_COLOR, marker="s") if pol == aa else style(pol)
        policy = (CONTROL if aa == STAND_IN else DEMAND) if pol == aa else pol
        for j, b in enumerate(batches):
            keys = sorted(c for c in cells if c[0] == pr and c[2] == b)
            if not keys:
                continue
            iv = [cells[c].ruled for c in keys]
            offset = (k * len(batches) + j - (len(series) * len(batches) - 1) / 2) * 0.02  # side by side
            ax.errorbar(
                [c[3] + offset for c in keys],
                [i.mean for i in iv],
                yerr=[[i.mean - i.low for i in iv], [i.high - i.mean for i in iv]],
                fmt=look["marker"] if j == 0 else "x",
                color=look["color"],
                capsize=3,
                ms=4,
                label=f"{name}, b={b}",
            )
            row = dict(panel="throughput", effect=name, link_priority=pr, policy=policy, batch_size=b)
            rows += [dict(row, cache_ratio=c[3], **interval_fields(i)) for c, i in zip(keys, iv)]
    mark_margin(ax, "the margin")
    mark_zero(ax)
    ax.set(
        xlabel="cache capacity C/W",
        ylabel=EFFECT_LABEL,
        title=f"demand-async vs each predictor, link_priority {pr}",
    )
    return rows
