"""01 the per-step expert working set W and its step-to-step stability, from routing traces, over the
denoising steps only (sim.denoising_only): W, the reuse of D(t-1, l), the share already resident under LRU."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from artifact.experiments.counting import DENOISING, EXACT
from artifact.experiments.criteria import thresholds
from artifact.experiments.harness import trace_label
from artifact.experiments.outputs.figures import batch_color, title
from artifact.experiments.verdicts.counts import margin_at_least
from artifact.experiments.verdicts.records import Claim, stated, verdict_of
from artifact.offload.replay.sim import denoising_only, phase_columns, sweep
from artifact.offload.replay.trace import step_similarity, working_sets


# --- tables ---------------------------------------------------------------------------------------
def working_set_table(ts) -> pd.DataFrame:
    """W = distinct experts one MoE layer needs in one denoising step: one row per (trace, forward, layer)."""
    return pd.concat([working_sets(t).assign(**trace_label(t)) for t in ts], ignore_index=True)


def stability_table(ts) -> pd.DataFrame:
    """Step-to-step similarity of D(t, l) and D(t-1, l): one row per (trace, forward, layer)."""
    return pd.concat([step_similarity(t).assign(**trace_label(t)) for t in ts], ignore_index=True)


def lru_share(ts, ratios) -> pd.DataFrame:
    """Per trace and C/W, the share of the denoising steps' demanded experts already resident under LRU: the
    'demand' policy's hit rate at C = ratio * W over those steps (the prefill still fills the cache)."""
    hits = ("demand_hits", "demand_misses")
    df = denoising_only(phase_columns(sweep(ts, ratios, ["demand"], by_phase=True)), hits)
    df["batch_size"] = df.batch_size.astype(int)
    df["resident_share"] = df.demand_hits / (df.demand_hits + df.demand_misses)
    return df[["task", "batch_size", "cache_ratio", "working_set", "cache_experts", *hits, "resident_share"]]


# --- verdict --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    mean_working_set: float
    reuse: float  # mean share of D(t, l) already in D(t-1, l)
    reuse_by_task: dict  # task -> mean reuse
    jaccard: float
    lru_ratio: float  # the C/W closest to 1 ...
    lru_resident: float  # ... and the share of the denoising steps' demands already resident under LRU there


def numbers(ws, sim, share) -> Numbers:
    at1 = share.loc[(share.cache_ratio - 1.0).abs().idxmin()].cache_ratio
    s1 = share[share.cache_ratio == at1]
    return Numbers(
        float(ws.working_set.mean()),
        float(sim.reuse.mean()),
        sim.groupby("task").reuse.mean().to_dict(),
        float(sim.jaccard.mean()),
        float(at1),
        float(s1.demand_hits.sum() / (s1.demand_hits.sum() + s1.demand_misses.sum())),
    )


def verdicts(n: Numbers) -> list[Claim]:
    worst = min(n.reuse_by_task, key=n.reuse_by_task.get)
    measured = (
        f"mean W {n.mean_working_set:.0f} experts/layer/step; share of D(t, l) in D(t-1, l) "
        f"{n.reuse:.2f} (lowest task {worst}: {n.reuse_by_task[worst]:.2f}), Jaccard {n.jaccard:.2f}; "
        f"share of the denoising steps' demands already resident under LRU at C/W = {n.lru_ratio:g}: "
        f"{n.lru_resident:.2f}"
    )
    return [
        stated(
            "01-stable",
            measured,
            verdict_of(all(v >= thresholds.STABLE for v in n.reuse_by_task.values())),
            counting=f"{DENOISING}: W, the reuse of D(t-1, l) and the share resident under LRU",
            interval=EXACT,
            margin=f"lowest task {worst}: " + margin_at_least(n.reuse_by_task[worst], thresholds.STABLE),
        )
    ]


def reading(ws) -> str:
    """What the working-set figure shows, in this run's numbers (printed by notebook 01)."""
    b0 = ws.batch_size.min()
    by_step = ws[ws.batch_size == b0].groupby("block_step").working_set.mean()
    by_size = ws.groupby("batch_size").working_set.mean()
    sizes = ", ".join(f"{w:.0f} at batch size {b}" for b, w in by_size.items())
    return (
        f"At batch size {b0}, mean W over layers goes from {by_step.iloc[0]:.0f} experts at the first "
        f"denoising step of a block to {by_step.iloc[-1]:.0f} at the last (range "
        f"{by_step.min():.0f}-{by_step.max():.0f}); mean W by batch size: {sizes}."
    )


# --- figures --------------------------------------------------------------------------------------
def _grouped_bars(ax, df, value, scale=1.0):
    """One bar per (task, batch size), tasks along x; returns the tasks and batch sizes drawn."""
    tasks, sizes = list(dict.fromkeys(df.task)), sorted(df.batch_size.unique())
    width = 0.8 / len(sizes)
    for k, s in enumerate(sizes):
        g = df[df.batch_size == s].set_index("task").reindex(tasks)
        x = [i + k * width for i in range(len(tasks))]
        ax.bar(x, scale * g[value], width, color=batch_color(s), label=f"batch size {s}")
    ax.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(tasks))], tasks)
    return tasks, sizes


def plot_working_set(ws, P):
    """(a) W per denoising step of a block, per MoE layer (all tasks, the smallest batch size), as a heatmap
    (seaborn: layer x step, each cell's W printed where it fits); (b) mean W per task and batch size."""
    b0 = ws.batch_size.min()
    a = ws[ws.batch_size == b0].groupby(["layer", "block_step"]).working_set.mean().reset_index()
    b = ws.groupby(["task", "batch_size"]).working_set.mean().reset_index()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.8), width_ratios=(1.6, 1), layout="constrained")
    grid = a.pivot(index="layer", columns="block_step", values="working_set")
    sns.heatmap(
        grid,
        ax=ax1,
        cmap="viridis",
        annot=grid.shape[0] <= 8 and grid.shape[1] <= 32,  # where a cell holds its number at 8 pt
        fmt=".0f",
        annot_kws={"fontsize": 8},
        linewidths=0.3,
        cbar_kws={"label": "working set W (experts)", "pad": 0.02},
    )
    ax1.set(xlabel="denoising step within a block", ylabel="MoE layer")
    ax1.set_title(f"W per layer and step (batch size {b0}, all tasks; experts)")
    ax1.tick_params(axis="y", rotation=0)
    _, sizes = _grouped_bars(ax2, b, "working_set")
    ax2.set(ylabel="mean working set W (experts)", title="mean W per task")
    ax2.set_ylim(0, 1.25 * b.working_set.max())
    ax2.legend(fontsize=8, loc="upper left", ncol=len(sizes))
    title(fig, P, "01 working set")
    a = a.assign(panel="W per layer and step", batch_size=b0)
    return fig, pd.concat([a, b.assign(panel="mean W per task and batch size")], ignore_index=True)


def plot_stability(sim, share, P):
    """(a) share of D(t, l) already in D(t-1, l) per task and batch size, the STABLE threshold marked;
    (b) share of each step's experts already resident under LRU vs C/W, per task and batch size."""
    a = sim.groupby(["task", "batch_size"])[["reuse", "jaccard"]].mean().reset_index()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    tasks, sizes = _grouped_bars(ax1, a, "reuse", 100)
    stable = f'threshold {thresholds.STABLE:.0%} (this artifact\'s reading of "highly stable")'
    ax1.axhline(100 * thresholds.STABLE, color="black", lw=1, ls=":", label=stable)
    ax1.set(ylabel="D(t, l) already in D(t-1, l) (%)", ylim=(0, 118), title="step-to-step reuse")
    ax1.legend(fontsize=8, loc="upper left", ncol=3)
    styles = ["-", "--", ":", "-."]
    for (task, s), g in share.groupby(["task", "batch_size"], sort=False):
        look = dict(ls=styles[sizes.index(s) % 4], marker="hp<>8H"[tasks.index(task) % 6], ms=4)
        ax2.plot(g.cache_ratio, 100 * g.resident_share, color=batch_color(s), label=f"{task} b={s}", **look)
    ax2.set_xlabel("cache capacity C/W (C slots per layer / mean W)")
    ax2.set_ylabel("demanded experts already resident (%)")
    ax2.set(ylim=(0, 100), title="LRU: resident share, denoising steps")
    ax2.legend(fontsize=8, ncol=2)
    title(fig, P, "01 step-to-step stability")
    df = pd.concat([a.assign(panel="reuse"), share.assign(panel="LRU resident share")], ignore_index=True)
    return fig, df
