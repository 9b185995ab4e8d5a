"""06 beyond the paper, what notebook 06 reports from both parts: their numbers (Numbers), the verdicts (the
tokens claim, the priority claim (1) from throughput.py, the count claims (2) from misses.py) and the
figure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments.bench.results import same_tokens
from artifact.experiments.counting import BASIS_SHORT, EXACT, PER_RUN, on_basis
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.outputs.figures import (
    COLORS,
    CONTROL_COLOR,
    interval_fields,
    mark_margin,
    mark_zero,
    title,
)
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.studies.beyond_the_paper.misses import BOUNDS, MIN, OWN, count_claims, counts
from artifact.experiments.studies.beyond_the_paper.throughput import CLAIM, PRIORITIES, priority_claim
from artifact.experiments.verdicts.judge import claim_parts
from artifact.experiments.verdicts.pooling import Replicas
from artifact.experiments.verdicts.records import Claim, verdict_of
from artifact.offload.replay.sim import ruling_basis


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    same_cells: int  # cells where every policy and repetition decoded the same tokens ...
    cells: int  # ... of all cells (both priorities)
    faster: pd.DataFrame  # throughput rows where a predictor beats demand (CI excludes zero)
    table: pd.DataFrame  # every predictor over demand, per link priority and C/W
    basis: str  # the counting basis the count claims rule on (sim.ruling_basis)
    by_prefill: dict  # counting basis -> Counts
    # {policy: Compared} predictor over demand per cell,
    timed: dict = dataclasses.field(default_factory=dict)
    # with the A/A control and host shares

    # the counts on the basis the count claims rule on
    conservative_is_lru, removed, of_oracle = (
        on_basis(f) for f in ("conservative_is_lru", "removed", "of_oracle")
    )


def numbers(summary, table, reps: Replicas) -> Numbers:
    rows = reps.rows
    n_same, n_cells = same_tokens(rows.assign(task=rows.task + "/" + rows.link_priority))
    fast = table[(table.verdict == paper.FASTER)]
    by_prefill = {p: counts(g) for p, g in summary.groupby("prefill", sort=False)}
    return Numbers(n_same, n_cells, fast, table, ruling_basis(summary), by_prefill, claim_parts(reps, CLAIM))


def verdicts(n: Numbers) -> list[Claim]:
    claims = [
        Claim(
            "[own result] offloading changes time, never results: "
            "every policy under both link priorities decoded the same tokens in every cell",
            f"{OWN}; the engine is exact (design invariant)",
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
    # (docs/verdicts.md)
    return claims + count_claims(n.by_prefill, n.basis)


# --- figure ---------------------------------------------------------------------------------------
STYLE = {
    "demand": ("tab:blue", "o", "-"),
    "last_step": ("tab:orange", "o", "-"),
    "last_step:lookahead=2": ("tab:orange", "^", "--"),
    "last_step_conservative": ("tab:brown", "s", "-"),
    "last_step_conservative:lookahead=2": ("tab:brown", "v", "--"),
    "cross_layer": ("tab:red", "D", "-"),
    "oracle": (COLORS["oracle"], "o", "-"),
    "belady": ("black", "", ":"),
    MIN: ("black", "", "--"),
}


def plot(summary, n: "Numbers", P: Settings):
    """(a) demand misses relative to LRU per policy vs C/W; (b) all transfers (demand + speculative) relative
    to LRU's misses, with the floors belady and min (they bound every policy's transfers: a prefetch can be
    postponed to its first use); (c, d) each predictor's throughput over demand (% tokens/s, 95% CIs) vs C/W
    under FIFO and under demand priority. The counts are drawn on the basis the claims rule on
    (sim.ruling_basis); the saved data holds both."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    basis = ruling_basis(summary)
    counted = summary[summary.prefill == basis]
    for ax, col, what in (
        (axes[0, 0], "misses_vs_lru", "demand misses"),
        (axes[0, 1], "transfers_vs_lru", "transfers (demand + speculative)"),
    ):
        _counts_panel(ax, counted, col, f"{what}, exact replay, {BASIS_SHORT[basis]}")
    control = next(iter(n.timed.values())).aa if n.timed else {}
    series = {**{p: c.effects for p, c in n.timed.items()}, CONTROL: control}
    rows = []
    for ax, pr in zip(axes[1], PRIORITIES):
        rows += _throughput_panel(ax, pr, series)
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
    """One count (`col`, relative to LRU's demand misses) per policy vs C/W; the floors only on transfers."""
    for pol in [p for p in STYLE if p in set(counted.policy)]:
        if pol in BOUNDS and col == "misses_vs_lru":
            continue  # a floor on loads, not on a prefetcher's demand misses
        g = counted[counted.policy == pol]
        color, marker, ls = STYLE[pol]
        label = pol + (" (LRU)" if pol == "demand" else " (floor)" if pol in BOUNDS else "")
        ax.plot(g.cache_ratio, 100 * g[col], marker=marker, ms=4, ls=ls, color=color, label=label)
    ax.axhline(100, color="gray", lw=0.8, ls=":")
    ax.set(xlabel="cache capacity C/W", ylabel="% of LRU's demand misses", title=heading)
    ax.set_ylim(bottom=0)


def _throughput_panel(ax, pr: str, series: dict) -> list[dict]:
    """Each predictor's (and the A/A control's) effect over demand per cell under link priority `pr`, with the
    interval it is ruled on, beside the margin; `series` is {policy: {cell: Compared}}. Returns the figure
    data."""
    pols = list(series)
    batches = sorted({k[2] for eff in series.values() for k in eff})
    width = 0.02
    rows = []
    for k, pol in enumerate(pols):
        for j, b in enumerate(batches):
            keys = sorted(c for c in series[pol] if c[0] == pr and c[2] == b)
            if not keys:
                continue
            iv = [series[pol][c].ruled for c in keys]
            x = [c[3] + (k * len(batches) + j - (len(pols) * len(batches) - 1) / 2) * width for c in keys]
            color, marker, _ = STYLE.get(pol, ("gray", "o", "-"))
            if pol == CONTROL:
                color = CONTROL_COLOR
            ax.errorbar(
                x,
                [i.mean for i in iv],
                yerr=[[i.mean - i.low for i in iv], [i.high - i.mean for i in iv]],
                fmt=marker if j == 0 else "x",
                color=color,
                capsize=3,
                ms=4,
                label=f"{pol}{' (A/A control)' if pol == CONTROL else ''}, b={b}",
            )
            rows += [
                dict(
                    panel="throughput",
                    link_priority=pr,
                    policy=pol,
                    batch_size=b,
                    cache_ratio=c[3],
                    **interval_fields(i),
                )
                for c, i in zip(keys, iv)
            ]
    mark_margin(ax, f"+-{thresholds.MARGIN:g}% (margin)")
    mark_zero(ax)
    ax.set(
        xlabel="cache capacity C/W",
        ylabel="predictor over demand (% tokens/s,\n95% intervals as ruled)",
        title=f"tokens/s vs demand-async, link_priority {pr}",
    )
    return rows
