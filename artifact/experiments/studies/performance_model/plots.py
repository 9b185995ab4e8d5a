"""Notebook 08's figure: the validation, the modelled demand-over-last_step difference the claims read, and
modelled tokens/s per policy on each GPU and stream, with the physical floor. Each panel group carries its
legend beside it: the validation's in its panel, the difference's under it (colour = GPU, marker = stream),
the policies' (every tokens/s panel's) beside the top right panel, with what the paper point is."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from artifact.experiments.criteria import paper
from artifact.experiments.outputs.figures import (
    HARDWARE,
    LEGEND_PT,
    PAPER_STYLE,
    entries,
    legend,
    mark_margin,
    mark_paper_04,
    style,
    title,
)
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.studies.performance_model.virtual import CLAIM_SHAPE, GPUS, TABLE_COLUMNS, diffs

# each policy's look (outputs/figures.style) in every panel: demand and last_step differ by a few percent at
# most, so last_step is a larger hollow square around demand's dot, and CONTROL (demand's work, the same
# modelled time) its marker alone on it
STYLE = {
    "demand": dict(style("demand"), ms=5),
    "last_step": dict(style("last_step"), ms=9, mfc="none", mew=1.5),
    CONTROL: dict(style(CONTROL), ms=7, ls="none"),
    "cross_layer": dict(style("cross_layer"), ms=5),
    "oracle": dict(style("oracle"), ms=6),
}
LABELS = {CONTROL: f"{CONTROL}: last_step's prediction\non the host, no transfers (demand's work)"}
LIMIT = "physical limit (min's misses)"
# the difference panel: colour = GPU (figures.HARDWARE's greys: no policy's colour), marker and line = stream
STREAM_MARKERS = "o^sv"
PAPER_POINT_NOTE = (
    "paper point: a synthetic stream at the\nrouting point this artifact infers from\n"
    f"the abstract's {paper.ORACLE_CUT}x oracle cut (notebook 07's\n'paper point'; an illustration, not a\n"
    "recorded trace)"
)
NARROW_SUBS = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0)
WIDE_SUBS = (1.0, 2.0, 3.0, 5.0, 7.0)


def plot(grid: pd.DataFrame, rows: pd.DataFrame, P: Settings, full: str = "paper point"):
    """A grid of at most 3 columns. Top left: modelled vs measured seconds per step (`rows`, the cpu
    validation, one dot per cell). Bottom left: the modelled demand-over-last_step difference (fifo) the
    claims read, per GPU and stream, with the paper's figures and the +-3% margin. The others: modelled
    tokens/s (log scale) per policy on each GPU and stream the claims rule on (CLAIM_SHAPE, fifo), the
    physical floor dotted. The saved data holds every cell of `grid` (gpu_grid's)."""
    streams = list(dict.fromkeys(grid.trace))
    streams = [full] + [s for s in streams if s != full] if full in streams else streams
    panels = [(hw, st) for hw in GPUS for st in streams]
    per_row = min(2, len(streams))
    nrows = max(2, -(-len(panels) // per_row))
    fig = plt.figure(figsize=(4.3 * (1 + per_row) + 2.4, 3.5 * nrows + 1.4), layout="constrained")
    gs = fig.add_gridspec(nrows, 1 + per_row)
    val = fig.add_subplot(gs[0, 0])
    _plot_validation(val, rows)
    legend(val, loc="upper left")
    tok = []
    for i, (hw, st) in enumerate(panels):
        tok.append(fig.add_subplot(gs[i // per_row, 1 + i % per_row]))
        _plot_stream(tok[-1], grid, hw, st)
    dif = fig.add_subplot(gs[1, 0])
    _plot_diffs(dif, grid, panels, streams)
    legend(dif, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    policies = [LABELS.get(p, p) for p in STYLE]
    pairs = sorted(zip(*entries(tok)), key=lambda e: e[1] not in policies)  # policies first
    handles, labels = [h for h, _ in pairs], [label for _, label in pairs]
    if full in streams:
        handles.append(Line2D([], [], ls="none"))
        labels.append(PAPER_POINT_NOTE)
    tok[per_row - 1].legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        fontsize=LEGEND_PT,
        title="every tokens/s panel",
        title_fontsize=LEGEND_PT,
        frameon=False,
    )
    for ax in fig.axes:
        ax.title.set_fontsize(10)
    title(
        fig,
        P,
        "08 performance model: validation, and modelled tokens/s on the streams the claims rule on "
        f"({CLAIM_SHAPE}, fifo; shaded: C/W {paper.FASTER_RANGE[0]}-{paper.FASTER_RANGE[1]})",
    )
    return fig, grid[["hardware", "shape", "trace", "cache_ratio", *TABLE_COLUMNS]]


def _plot_validation(ax, rows: pd.DataFrame) -> None:
    """Modelled against measured ms per step, one dot per validation cell (batch x C/W x policy)."""
    cells = rows.groupby(["batch_size", "cache_ratio", "policy"], as_index=False)[
        ["measured_seconds_per_step", "modeled_seconds_per_step"]
    ].mean()
    for pol, g in cells.groupby("policy"):
        look = {**STYLE.get(pol, {}), "ls": "none", "label": LABELS.get(pol, pol)}
        ax.plot(1e3 * g.measured_seconds_per_step, 1e3 * g.modeled_seconds_per_step, **look)
    hi = 1e3 * float(cells[["measured_seconds_per_step", "modeled_seconds_per_step"]].max().max()) * 1.05
    ax.plot([0, hi], [0, hi], "k:", label="modelled = measured")
    ax.set(
        xlabel="measured ms per step (cpu, wall clock)",
        ylabel="modelled ms per step (cpu-emulated)",
        title="validation cells (cpu: batch x C/W x policy)",
        xlim=(0, hi),
        ylim=(0, hi),
    )


def _plot_stream(ax, grid: pd.DataFrame, hw: str, st: str) -> None:
    """Modelled tokens/s per policy vs C/W on one GPU and stream (the claims' shape, fifo), with the floor."""
    sel = grid[
        (grid.hardware == hw)
        & (grid["shape"] == CLAIM_SHAPE)
        & (grid.trace == st)
        & (grid.link_priority == "fifo")
    ]
    for pol, g in sel.groupby("policy", sort=False):
        g = g.sort_values("cache_ratio")
        look = {"ls": "-", **STYLE.get(pol, {}), "label": LABELS.get(pol, pol)}
        ax.plot(g.cache_ratio, g.tokens_per_second, **look)
    fl = sel[sel.policy == "demand"].sort_values("cache_ratio")
    ax.plot(fl.cache_ratio, fl.floor_tokens_per_second, "k:", label=LIMIT)
    lo, hi = paper.FASTER_RANGE
    ax.axvspan(lo, hi, color=PAPER_STYLE["color"], alpha=0.06, label=f"C/W {lo}-{hi}: the claims' range")
    ax.set_yscale("log")
    # labels at 1, 2, 3, 5, 7 x 10^k (and 1.5, 4 on an axis spanning under a decade), minor ticks unlabelled
    bottom, top = ax.get_ylim()
    ax.yaxis.set_major_locator(LogLocator(subs=NARROW_SUBS if math.log10(top / bottom) < 1 else WIDE_SUBS))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(LogLocator(subs="all"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    # what the panel prices: the stream (synthetic, or which model's trace), its MoE layers, on CLAIM_SHAPE
    shape = f"{sel.moe_layers.iloc[0]} MoE layers, priced on {CLAIM_SHAPE}'s shape"
    ax.set(
        xlabel="cache ratio C/W",
        ylabel="modelled tokens/s (log scale)",
        title=f"{hw}: {_stream(grid, st)}\n({shape})",
    )


def _stream(grid: pd.DataFrame, st: str) -> str:
    """Stream `st` as a figure names it: "<st> (synthetic)", or whose trace it is ("tiny model's ...")."""
    model = str(grid[grid.trace == st].recorded_by.iloc[0])
    who = "tiny model" if model.startswith("tiny") else model
    return f"{st} (synthetic)" if model == "synthetic" else f"{who}'s {st}"


def _plot_diffs(ax, grid: pd.DataFrame, panels: list, streams: list) -> None:
    """The modelled demand-over-last_step difference (fifo) per GPU (grey; the first one's markers filled, the
    others' hollow, each GPU's points shifted along C/W so that equal ones stay apart) and stream (marker and
    line)."""
    d = diffs(grid)
    markers = dict(zip(streams, STREAM_MARKERS))
    for hw, st in panels:
        here = d[(d.hardware == hw) & (d["shape"] == CLAIM_SHAPE) & (d.trace == st)].sort_values(
            "cache_ratio"
        )
        ax.plot(
            here.cache_ratio + 0.03 * (GPUS.index(hw) - (len(GPUS) - 1) / 2),
            here.diff_pct,
            ls="-" if st == streams[0] else "--",
            marker=markers[st],
            ms=5,
            mfc=None if hw == GPUS[0] else "white",
            color=HARDWARE[hw],
            label=f"{hw}, {_stream(grid, st)}",
        )
    mark_paper_04(ax)
    mark_margin(ax, "the modelled equivalence margin")
    ax.axhline(0, color="black", lw=1, ls=":")
    ax.set(
        xlabel="cache ratio C/W",
        ylabel="demand over last_step (% tokens/s)",
        title=f"modelled demand vs last_step ({CLAIM_SHAPE}, fifo)",
    )
