"""03 bandwidth throttling: demand vs last_step at one C/W as the link's bandwidth is scaled (do speculative
transfers compete with demand ones?); the stall claim (criteria/timing.py) is ruled per cell, A/A-gated."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments.bench.grid import CELL_KEYS
from artifact.experiments.bench.order import AA, primary
from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.counting import EXACT, PER_RUN
from artifact.experiments.criteria import thresholds
from artifact.experiments.criteria.claims import ROW_FILES
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.harness import run_grid
from artifact.experiments.outputs.figures import (
    CONTROL_COLOR,
    CONTROL_LABEL,
    INTERVAL_BASIS,
    UNDER,
    figure_legend,
    interval_fields,
    mark_margin,
    mark_zero,
    style,
    title,
)
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.verdicts.judge import claim_compared, judge, timed_claim
from artifact.experiments.verdicts.pairs import STALL_SHARE
from artifact.experiments.verdicts.pooling import Compared, Replicas, gather
from artifact.experiments.verdicts.records import Claim, stated, verdict_of
from artifact.offload.links.link import PCIE4_GBPS

NOTEBOOK = "03_bandwidth_throttling"
(STEM,) = ROW_FILES[NOTEBOOK][1]  # data/results/<profile>/throttle_runs.csv
METRIC = "stall_seconds"
CLAIM = CLAIMS["03-stall"]  # last_step over demand, STALL_SHARE (criteria/timing.py)


def throttle_profile(P: Settings) -> Settings:
    """The 03 grid: the first task, the largest batch size, C/W = throttle_ratio, a cell per throttle_scales;
    demand, last_step, settings.CONTROL; thresholds.MIN_PAIRS repetitions or more (the fewest it rules on)."""
    return dataclasses.replace(
        P,
        tasks=P.tasks[:1],
        batch_sizes=(max(P.batch_sizes),),
        cache_ratios=(P.throttle_ratio,),
        bandwidth_scales=tuple(P.throttle_scales),
        policies=("demand", "last_step", CONTROL),
        repetitions=max(P.repetitions, thresholds.MIN_PAIRS),
    )


def measure(P: Settings, progress: bool = True) -> pd.DataFrame:
    """The 03 grid's rows (resumable; see harness.run_grid)."""
    return run_grid(throttle_profile(P), STEM, progress=progress)


def replicas(P: Settings, rows) -> Replicas:
    """This run's rows with the stored runs' rows of the same grid and settings (verdicts/pooling.py)."""
    return gather(P, rows, NOTEBOOK, bench_fingerprint(throttle_profile(P)), metric=METRIC)


def summary_table(rows) -> pd.DataFrame:
    """Means over repetitions per (bandwidth, policy), arm A only (bench.order.primary); the cuda link's
    unpaced scale 1, which has no link_gbps in the rows, gets it from the others."""
    rows = primary(rows).assign(transfers=lambda r: r.demand_misses + r.speculative_transfers)
    nominal = (rows.link_gbps / rows.bandwidth_scale).dropna()
    if len(nominal):
        rows = rows.assign(link_gbps=rows.link_gbps.fillna(rows.bandwidth_scale * nominal.median()))
    means = ("tokens_per_second", "stall_seconds", "link_busy_seconds", "seconds")
    counts = ("demand_misses", "speculative_transfers", "transfers")  # a run's, the first
    g = rows.groupby(["bandwidth_scale", "link_gbps", "policy"], sort=True, dropna=False).agg(
        runs=("seconds", "size"), **{c: (c, "mean") for c in means}, **{c: (c, "first") for c in counts}
    )
    return g.reset_index()


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    # counts of one run (the first row): no timing enters them, so they never depend on the bandwidth
    fewer_demand: float  # 1 - last_step's demand loads / demand's
    more_speculative: float  # last_step's speculative loads / demand's transfers
    extra_transfers: float  # last_step's transfers / demand's - 1
    # this run's means, highest bandwidth first: (GB/s, demand's and last_step's stall, then their tokens/s)
    by_bandwidth: tuple
    # {cell: Replicated} last_step's stall over demand's (STALL_SHARE), fastest first; the A/A, host shares
    stall: Compared = Compared({})
    gbps: dict = field(default_factory=dict)  # {bandwidth scale: link GB/s}


def _fastest_first(effects: dict) -> dict:
    return dict(sorted(effects.items(), key=lambda kv: (-kv[0][3], kv[0][:3])))


def numbers(reps: Replicas) -> Numbers:
    summary = summary_table(reps.rows)
    d, s = (summary[summary.policy == p].set_index("bandwidth_scale") for p in ("demand", "last_step"))
    scales = sorted(d.index, reverse=True)
    means = (d.link_gbps, d.stall_seconds, s.stall_seconds, d.tokens_per_second, s.tokens_per_second)
    stall = claim_compared(reps, CLAIM)
    return Numbers(
        1 - s.demand_misses.iloc[0] / d.demand_misses.iloc[0],
        s.speculative_transfers.iloc[0] / d.transfers.iloc[0],
        s.transfers.iloc[0] / d.transfers.iloc[0] - 1,
        tuple(zip(*(m[scales] for m in means))),
        dataclasses.replace(stall, effects=_fastest_first(stall.effects), aa=_fastest_first(stall.aa)),
        {float(x): float(d.link_gbps[x]) for x in scales},
    )


def label(key, gbps: dict) -> str:
    """A cell's name: its link bandwidth, batch size and C/W (and task, when not the first one)."""
    task, b, ratio, scale = key
    link = f"{gbps[scale]:.3g} GB/s" if scale in gbps else f"x{scale:g}"
    return f"{link} b={b} C/W {ratio:g}" + (f" {task}" if task != "gsm8k" else "")


def verdicts(n: Numbers) -> list[Claim]:
    counts = (
        f"per run, last_step vs demand: {n.fewer_demand:.0%} fewer demand loads, "
        f"{n.more_speculative:.0%} more speculative ones, {n.extra_transfers:+.0%} link transfers in all"
    )
    means = "this run's means: " + "; ".join(  # per bandwidth (the claim rules on the per-cell intervals)
        f"{gbps:.3g} GB/s: stall {sd:.2f} s (demand) vs {ss:.2f} s (last_step), {td:.1f} vs {ts:.1f} tokens/s"
        for gbps, sd, ss, td, ts in n.by_bandwidth
    )
    transfers = stated(
        "03-transfers",
        counts,
        verdict_of(n.extra_transfers > 0),
        counting=PER_RUN,
        interval=EXACT,
        margin=f"{n.extra_transfers:+.1%} link transfers vs > 0",
    )
    stall = timed_claim(
        CLAIM.key,
        judge(n.stall, CLAIM, lambda k: label(k, n.gbps)),
        f"stall seconds per forward: {STALL_SHARE.text} (last_step over demand), one interval per cell "
        "(bandwidth, batch, C/W)",
        note=means,
    )
    return [transfers, stall]


def stored_claims(P: Settings) -> list[Claim]:
    """The timing claims as `--store` rules them, from committed rows alone (tests/test_stored_runs.py)."""
    return [c for c in verdicts(numbers(replicas(P, None).last_stored())) if c.timing]


def reading(n: Numbers) -> str:
    """What the figure shows, fastest link to slowest, in this run's means (printed by notebook 03)."""
    (g0, sd0, ss0, td0, ts0), (g1, sd1, ss1, td1, ts1) = n.by_bandwidth[0], n.by_bandwidth[-1]
    return (
        f"From {g0:.3g} GB/s to {g1:.3g} GB/s, last_step's stall minus demand's goes from "
        f"{ss0 - sd0:+.2f} s to "
        f"{ss1 - sd1:+.2f} s per run, and its tokens/s relative to demand's from {ts0 / td0 - 1:+.0%} to "
        f"{ts1 / td1 - 1:+.0%} (means over repetitions; the claim below rules on one interval per cell)."
    )


# --- figure ---------------------------------------------------------------------------------------
def plot(summary, n: Numbers, P: Settings):
    """(a) tokens/s and (b) stall seconds vs link bandwidth per policy, this run's means; (c) per cell, the
    stall of last_step over demand and of the A/A, each with the interval it is ruled on."""
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.4), layout="constrained")
    for pol, g in summary.groupby("policy", sort=False):  # demand wide and pale under CONTROL (its loads)
        look = dict(color=style(pol)["color"], **UNDER) if pol == "demand" else dict(style(pol), zorder=3)
        for ax, y in ((ax1, g.tokens_per_second), (ax2, g.stall_seconds)):
            ax.plot(g.link_gbps, y, label=CONTROL_LABEL if pol == CONTROL else pol, **look)
    rows = _stall_intervals(ax3, n)
    any_iv = next(iter(n.stall.effects.values()), None)
    basis = INTERVAL_BASIS[any_iv.ruled.unit] if any_iv else "no intervals"
    why, ticks = _bandwidth_axis(summary, P)
    ax1.set(ylabel="throughput (tokens/s)", title="throughput (means)")
    ax2.set(ylabel="stall per run (seconds)", title="compute waiting on the link (means)")
    ax3.set_ylabel("A - B stall per forward\n(% of B's wall per forward)")
    ax3.set_title(f"stall per cell, 95% intervals ({basis})")
    for ax in (ax1, ax2, ax3):
        ax.title.set_fontsize(10)
        ax.set_xlabel("link bandwidth (GB/s)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(ticks), list(ticks.values()))
        ax.minorticks_off()
    figure_legend(fig, ncol=3, title=why or None, title_fontsize=9)  # why the link is that slow, over it
    title(fig, P, "03 bandwidth throttling (no paper figure: qualitative)")
    intervals = pd.DataFrame(rows).assign(panel="intervals")
    return fig, pd.concat([summary.assign(panel="means"), intervals], ignore_index=True)


def _stall_intervals(ax, n: Numbers) -> list[dict]:
    """Panel (c) against the margin; returns its figure data."""
    rows = []
    for name, src, color, shift in (
        ("last_step over demand", n.stall.effects, style("last_step")["color"], 2**-0.05),
        (n.stall.aa_label or AA, n.stall.aa, CONTROL_COLOR, 2**0.05),
    ):
        for j, group in enumerate(sorted({k[:3] for k in src})):
            keys = [k for k in src if k[:3] == group and k[3] in n.gbps]
            iv = [src[k].ruled for k in keys]
            cell = f"b={group[1]} C/W {group[2]:g}" + (f" {group[0]}" if group[0] != "gsm8k" else "")
            x = [n.gbps[k[3]] * shift for k in keys]
            yerr = [[i.mean - i.low for i in iv], [i.high - i.mean for i in iv]]
            look = dict(fmt="os^D"[j % 4], capsize=3, ms=4, color=color, label=f"{name}, {cell}")
            ax.errorbar(x, [i.mean for i in iv], yerr=yerr, **look)
            rows += [
                dict(series=name, **dict(zip(CELL_KEYS, k)), link_gbps=n.gbps[k[3]], **interval_fields(i))
                for k, i in zip(keys, iv)
            ]
    mark_margin(ax, "the A/A gate (the claim needs every interval above 0)", unit="% of B's wall")
    mark_zero(ax)
    return rows


def _bandwidth_axis(summary, P: Settings) -> tuple[str, dict]:
    """Why the link is that slow (a line under the panels, or "") and the x ticks {GB/s: label}. The emulated
    link's default rate (offload.links.link.emulated_bandwidth_gbps) prices a tiny expert as PCIe 4 prices a
    LLaDA2.0-mini one, so scale s is the PCIe generation s x as fast as PCIe 4."""
    pairs = summary[["link_gbps", "bandwidth_scale"]].drop_duplicates().sort_values("link_gbps")
    if P.link != "emulated" or P.link_gbps is not None:
        return "", {g: f"{g:.3g}" for g in pairs.link_gbps}
    return (
        f"emulated link, scaled to the {P.model} model's experts: "
        "one costs what a LLaDA2.0-mini expert costs on the PCIe x16 link named "
        f"(PCIe 4 = {PCIE4_GBPS:g} GB/s)",
        {g: f"{g:.3g}\n~{_pcie(s)}" for g, s in zip(pairs.link_gbps, pairs.bandwidth_scale)},
    )


def _pcie(scale: float) -> str:
    """The PCIe x16 generation whose bandwidth is `scale` times PCIe 4's (each generation doubles it)."""
    gen = 4 + math.log2(scale)
    return f"PCIe {gen:g}" if gen.is_integer() and 1 <= gen <= 6 else f"{scale:g} x PCIe 4"
