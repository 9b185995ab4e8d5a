"""The notebooks' figures. Each function takes the tables of analysis.py and returns (figure, the data
frame it plotted, one row per plotted value); `save` writes both, atomically, as
figures/<profile>/<name>.png and data/results/<profile>/<name>.csv."""
from __future__ import annotations

import io

from artifact.experiments.analysis import (
    PAPER_AT_043,
    PAPER_FASTER_PCT,
    PAPER_FASTER_RANGE,
    PAPER_ORACLE_CUT,
    figures_dir,
    results_dir,
)
from artifact.paths import atomic_write_bytes, atomic_write_text

DPI = 100
COLORS = {"demand": "tab:blue", "last_step": "tab:orange", "oracle": "tab:green", "interval_refresh": "tab:purple",
          "belady": "tab:gray", "resident": "tab:gray"}
PAPER = dict(color="crimson", lw=1.5, ls="--")


def _plt():
    import matplotlib.pyplot as plt
    return plt


def save(fig, df, P, name: str, log=print):
    """Write figures/<profile>/<name>.png (dpi 100) and data/results/<profile>/<name>.csv; returns both paths."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    png = atomic_write_bytes(figures_dir(P) / f"{name}.png", buf.getvalue())
    csv = atomic_write_text(results_dir(P) / f"{name}.csv", df.to_csv(index=False))
    log(f"saved {_short(png)} and {_short(csv)}")
    return png, csv


def _short(path):
    """Relative to the checkout when inside it (the usual case: no machine paths in notebook outputs)."""
    from artifact.paths import repo_root
    try:
        return str(path.resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path.resolve())


def _title(fig, P, text: str):
    fig.suptitle(f"{text}  [profile {P.name}: {P.model if P.model == 'tiny' else 'checkpoint'}, {P.device}]",
                 fontsize=11)


# --- 00 -----------------------------------------------------------------------------------------
def quickstart_time(q: dict, P):
    import pandas as pd
    r, o = q["resident"], q["offloaded"]
    df = pd.DataFrame([
        {"run": "resident", "part": "compute", "seconds": r["seconds"]},
        {"run": f"offloaded C={q['cache_experts']}", "part": "compute", "seconds": o["seconds"] - o["stall_seconds"]},
        {"run": f"offloaded C={q['cache_experts']}", "part": "stall (waiting on the link)", "seconds": o["stall_seconds"]}])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    left = {}
    for row in df.itertuples():
        label = "compute (offloaded: with the engine's work)" if row.part == "compute" else row.part
        ax.barh(row.run, row.seconds, left=left.get(row.run, 0.0), color="tab:red" if "stall" in row.part else
                "tab:blue", label=label if label not in ax.get_legend_handles_labels()[1] else None)
        left[row.run] = left.get(row.run, 0.0) + row.seconds
    ax.set_xlabel("wall-clock time for one prompt (seconds)")
    ax.legend(loc="lower right", fontsize=8)
    _title(fig, P, "00 quickstart: resident vs offloaded (demand, LRU)")
    return fig, df


# --- 01 -----------------------------------------------------------------------------------------
def working_set(ws, P):
    """(a) W per denoising step of a block, per MoE layer (all tasks, the smallest batch size);
    (b) mean W per task and batch size."""
    import pandas as pd
    b0 = ws.batch_size.min()
    a = ws[ws.batch_size == b0].groupby(["layer", "block_step"]).working_set.mean().reset_index()
    b = ws.groupby(["task", "batch_size"]).working_set.mean().reset_index()
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for layer, g in a.groupby("layer"):
        ax1.plot(g.block_step, g.working_set, marker=".", label=f"layer {layer}")
    ax1.set(xlabel="denoising step within a block", ylabel="working set W (experts)",
            title=f"W per layer and step (batch size {b0}, all tasks)")
    ax1.legend(fontsize=8)
    tasks, sizes = list(dict.fromkeys(b.task)), sorted(b.batch_size.unique())
    width = 0.8 / len(sizes)
    for k, s in enumerate(sizes):
        g = b[b.batch_size == s].set_index("task").reindex(tasks)
        ax2.bar([i + k * width for i in range(len(tasks))], g.working_set, width, label=f"batch size {s}")
    ax2.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(tasks))], tasks)
    ax2.set(ylabel="mean working set W (experts)", title="mean W per task", ylim=(0, 1.25 * b.working_set.max()))
    ax2.legend(fontsize=8, loc="upper left", ncol=len(sizes))
    _title(fig, P, "01 working set")
    df = pd.concat([a.assign(panel="W per layer and step", batch_size=b0),
                    b.assign(panel="mean W per task and batch size")], ignore_index=True)
    return fig, df


def stability(sim, share, P, threshold: float):
    """(a) share of D(t, l) already in D(t-1, l) per task and batch size; (b) share of each step's experts
    already resident under LRU vs C/W, per task and batch size."""
    import pandas as pd
    a = sim.groupby(["task", "batch_size"]).agg(reuse=("reuse", "mean"), jaccard=("jaccard", "mean")).reset_index()
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    tasks, sizes = list(dict.fromkeys(a.task)), sorted(a.batch_size.unique())
    width = 0.8 / len(sizes)
    for k, s in enumerate(sizes):
        g = a[a.batch_size == s].set_index("task").reindex(tasks)
        ax1.bar([i + k * width for i in range(len(tasks))], 100 * g.reuse, width, label=f"batch size {s}")
    ax1.axhline(100 * threshold, color="black", lw=1, ls=":", label=f"'very stable' threshold {threshold:.0%}")
    ax1.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(tasks))], tasks)
    ax1.set(ylabel="D(t, l) already in D(t-1, l) (%)", ylim=(0, 118), title="step-to-step reuse")
    ax1.legend(fontsize=7, loc="upper left", ncol=3)
    styles = ["-", "--", ":", "-."]
    for (task, s), g in share.groupby(["task", "batch_size"], sort=False):
        ax2.plot(g.cache_ratio, 100 * g.resident_share, ls=styles[sizes.index(s) % 4], marker="o", ms=3,
                 color=f"C{tasks.index(task) % 10}", label=f"{task} b={s}")
    ax2.set(xlabel="cache capacity C/W (C slots per layer / mean W)",
            ylabel="demanded experts already resident (%)", ylim=(0, 100), title="LRU: resident share")
    ax2.legend(fontsize=7, ncol=2)
    _title(fig, P, "01 step-to-step stability")
    df = pd.concat([a.assign(panel="reuse"), share.assign(panel="LRU resident share")], ignore_index=True)
    return fig, df


# --- 02 -----------------------------------------------------------------------------------------
def misses(summary, P):
    """(a) demand misses relative to LRU per policy vs C/W, the paper's oracle cut marked;
    (b) all transfers (demand + speculative) relative to LRU's."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    order = [p for p in COLORS if p in set(summary.policy)]
    for pol in order:
        g = summary[summary.policy == pol]
        kw = dict(marker="o", ms=4, color=COLORS.get(pol), label=pol + (" (LRU)" if pol == "demand" else ""))
        ax1.plot(g.cache_ratio, 100 * g.misses_vs_lru, **kw)
        ax2.plot(g.cache_ratio, 100 * g.transfers_vs_lru, **kw)
    ax1.axhline(100 / PAPER_ORACLE_CUT, **PAPER, label=f"paper: oracle = LRU / {PAPER_ORACLE_CUT}")
    ax1.set(xlabel="cache capacity C/W", ylabel="demand misses (% of LRU's)", ylim=(0, 110),
            title="demand misses vs LRU")
    ax2.axhline(100, color="black", lw=1, ls=":")
    ax2.set(xlabel="cache capacity C/W", ylabel="host-to-device transfers (% of LRU's)",
            title="transfers (demand + speculative) vs LRU")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
    _title(fig, P, "02 miss accounting (exact replay, all traces pooled)")
    return fig, summary.copy()


# --- 03 -----------------------------------------------------------------------------------------
def throttle(summary, P):
    """(a) tokens/s and (b) stall seconds vs link bandwidth, demand and last_step."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for pol, g in summary.groupby("policy", sort=False):
        kw = dict(marker="o", color=COLORS.get(pol), label=pol)
        ax1.plot(g.link_gbps, g.tokens_per_second, **kw)
        ax2.plot(g.link_gbps, g.stall_seconds, **kw)
    ax1.set(xlabel="link bandwidth (GB/s)", ylabel="throughput (tokens/s)", title="throughput")
    ax2.set(xlabel="link bandwidth (GB/s)", ylabel="stall per run (seconds)", title="compute waiting on the link")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(summary.link_gbps.unique()), [f"{x:.3g}" for x in sorted(summary.link_gbps.unique())])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    _title(fig, P, "03 bandwidth throttling (no paper figure: qualitative)")
    return fig, summary.copy()


# --- 04 -----------------------------------------------------------------------------------------
def capacity(by_ratio, by_cell, P):
    """(a) demand over last_step (% tokens/s) vs C/W with 95% CIs, the paper's figures marked;
    (b) the same per task and batch size."""
    import pandas as pd
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    err = [by_ratio.diff_pct - by_ratio.ci_low, by_ratio.ci_high - by_ratio.diff_pct]
    ax1.errorbar(by_ratio.cache_ratio, by_ratio.diff_pct, yerr=err, fmt="o", capsize=4, color="tab:blue",
                 label="measured (95% CI over pairs)")
    lo, hi = PAPER_FASTER_RANGE
    ax1.fill_between([lo, hi], *PAPER_FASTER_PCT, color="crimson", alpha=0.15,
                     label=f"paper: +{PAPER_FASTER_PCT[0]}..+{PAPER_FASTER_PCT[1]}% at C/W {lo}-{hi}")
    ax1.errorbar([0.43], [PAPER_AT_043[0]], yerr=[[PAPER_AT_043[0] - PAPER_AT_043[1]], [PAPER_AT_043[2] - PAPER_AT_043[0]]],
                 fmt="s", color="crimson", capsize=4, label="paper: +0.73% [-1.16, +2.63] at 0.43")
    ax1.axhline(0, color="black", lw=1, ls=":")
    ax1.set(xlabel="cache capacity C/W", ylabel="demand over last_step (% tokens/s)",
            title="demand-async vs async last-step prefetch")
    ax1.legend(fontsize=8)
    labels = [f"{t}\nb={b}" for t, b in zip(by_cell.task, by_cell.batch_size)]
    e2 = [by_cell.diff_pct - by_cell.ci_low, by_cell.ci_high - by_cell.diff_pct]
    ax2.errorbar(range(len(by_cell)), by_cell.diff_pct, yerr=[x.fillna(0) for x in e2], fmt="o", capsize=4)
    ax2.axhline(0, color="black", lw=1, ls=":")
    ax2.set_xticks(range(len(by_cell)), labels, fontsize=8)
    ax2.set(xlabel="task, batch size b", ylabel="demand over last_step (% tokens/s)",
            title="per task and batch size (all C/W pooled)")
    _title(fig, P, "04 capacity sweep")
    df = pd.concat([by_ratio.assign(panel="by C/W"), by_cell.assign(panel="by task and batch size")],
                   ignore_index=True)
    return fig, df


# --- 05 -----------------------------------------------------------------------------------------
def tide(rows, P, released=None):
    """Tokens/s of our engine, demand vs TIDE-style interval_refresh, at the budget and half of it;
    TIDE's released code beside them when it was measured."""
    import pandas as pd
    def per_budget(r):
        g = r.groupby(["cache_ratio", "policy"], sort=False).agg(
            tokens_per_second=("tokens_per_second", "mean"), sd=("tokens_per_second", "std"),
            runs=("tokens_per_second", "size"),
            cache_experts=("cache_experts", lambda c: "/".join(str(int(x)) for x in dict.fromkeys(c))))
        return g.reset_index()
    df = per_budget(rows).assign(system="engine")
    if released:
        r = pd.DataFrame(released)
        r = r[r.system == "tide_released"].assign(policy="TIDE released")
        df = pd.concat([df, per_budget(r).assign(system="tide_released")], ignore_index=True)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    budgets = sorted(df.cache_ratio.unique(), reverse=True)
    pols = list(dict.fromkeys(df.policy))
    width = 0.8 / len(pols)
    for k, pol in enumerate(pols):
        g = df[df.policy == pol].set_index("cache_ratio").reindex(budgets)
        ax.bar([i + k * width for i in range(len(budgets))], g.tokens_per_second, width, yerr=g.sd.fillna(0),
               capsize=3, color=COLORS.get(pol, "tab:red"), label=pol)
    ticks = [f"C/W {b:g} (C = {df[df.cache_ratio == b].cache_experts.iloc[0]})" for b in budgets]
    ax.set_xticks([i + width * (len(pols) - 1) / 2 for i in range(len(budgets))], ticks)
    ax.set(xlabel="expert budget per MoE layer (C per task: " + ", ".join(dict.fromkeys(rows.task)) + ")",
           ylabel="throughput (tokens/s)\nmean, bars: sd over tasks x reps")
    note = "" if released else "TIDE released: not run on this profile (paper: engine 14.4x faster, 6.1x at half)"
    ax.set_title(note, fontsize=8, color="crimson")
    ax.legend(fontsize=8)
    _title(fig, P, "05 head to head at the same expert budget")
    return fig, df
