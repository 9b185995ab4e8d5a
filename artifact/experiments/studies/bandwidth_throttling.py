"""03 bandwidth throttling: demand and last_step end to end at one C/W while the link's bandwidth is scaled;
do speculative transfers compete with demand transfers?"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments import paper
from artifact.experiments import verdicts as verdict_rules
from artifact.experiments.claims import COLORS, EXACT, PER_RUN, Claim, judged, title
from artifact.experiments.runs import run_grid
from artifact.experiments.settings import Settings
from artifact.experiments.stats import paired_table
from artifact.experiments.verdicts import CONTROL, METHOD, Interval, combine, controls, controls_text, faster, gated
from artifact.offload.link import PCIE4_GBPS

STEM = "throttle_runs"      # data/results/<profile>/throttle_runs.csv


def throttle_profile(P: Settings) -> Settings:
    """The 03 grid: the first task, the largest batch size, C/W = throttle_ratio, demand and last_step with
    the A/A control (verdicts.CONTROL), one cell per bandwidth in throttle_scales, with at least
    paper.MIN_PAIRS repetitions (the fewest pairs the interval rule rules on)."""
    return dataclasses.replace(P, tasks=P.tasks[:1], batch_sizes=(max(P.batch_sizes),),
                               cache_ratios=(P.throttle_ratio,), bandwidth_scales=tuple(P.throttle_scales),
                               policies=("demand", "last_step", CONTROL),
                               repetitions=max(P.repetitions, paper.MIN_PAIRS))


def runs(P: Settings, progress: bool = True) -> pd.DataFrame:
    """The 03 grid's rows (resumable; see runs.run_grid)."""
    return run_grid(throttle_profile(P), STEM, progress=progress)


def summary_table(rows) -> pd.DataFrame:
    """Mean over repetitions per (bandwidth, policy): tokens/s, stall and link-busy seconds, transfers.
    On the cuda link the unpaced scale 1 has no link_gbps in the rows: it is filled in from the others."""
    rows = rows.assign(transfers=rows.demand_misses + rows.speculative_transfers)
    nominal = (rows.link_gbps / rows.bandwidth_scale).dropna()
    if len(nominal):
        rows = rows.assign(link_gbps=rows.link_gbps.fillna(rows.bandwidth_scale * nominal.median()))
    g = rows.groupby(["bandwidth_scale", "link_gbps", "policy"], sort=True, dropna=False).agg(
        runs=("seconds", "size"), tokens_per_second=("tokens_per_second", "mean"),
        stall_seconds=("stall_seconds", "mean"), link_busy_seconds=("link_busy_seconds", "mean"),
        seconds=("seconds", "mean"), demand_misses=("demand_misses", "first"),
        speculative_transfers=("speculative_transfers", "first"), transfers=("transfers", "first"))
    return g.reset_index()


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    # counts of one run (the first row; counts never depend on the bandwidth: no timing enters them)
    fewer_demand: float          # 1 - last_step's demand loads / demand's
    more_speculative: float      # last_step's speculative loads / demand's transfers
    extra_transfers: float       # last_step's transfers / demand's - 1
    by_bandwidth: tuple          # (link GB/s, stall demand, stall last_step, tokens/s demand, tokens/s last_step),
                                 # highest bandwidth first
    stall: tuple = ()            # (link GB/s, Interval of last_step's stall over demand's, % per pair), highest
                                 # bandwidth first; empty without the runs
    control: tuple = ()          # (link GB/s, Interval of the A/A control's stall over demand's), the same order
    host: tuple = ()             # (link GB/s, GPU host share of wall per forward: verdicts.host_shares)


def stall_table(rows) -> pd.DataFrame:
    """last_step (A) over demand (B) in stall seconds, paired by repetition, per bandwidth."""
    return paired_table(rows, "last_step", "demand", ["bandwidth_scale"], metric="stall_seconds")


def numbers(summary, rows=None) -> Numbers:
    d = summary[summary.policy == "demand"].set_index("bandwidth_scale")
    s = summary[summary.policy == "last_step"].set_index("bandwidth_scale")
    scales = sorted(d.index, reverse=True)
    stall, control, host = (), (), ()
    if rows is not None:
        t = stall_table(rows).set_index("bandwidth_scale")
        stall = tuple((d.link_gbps[x], Interval.of(t.loc[x])) for x in scales)
        aa = controls(rows, ["bandwidth_scale"], metric="stall_seconds")
        control = tuple((d.link_gbps[x], aa[(x,)]) for x in scales if (x,) in aa)
        hs = verdict_rules.host_shares(rows, ["bandwidth_scale"])
        host = tuple((d.link_gbps[x], hs[(x,)]) for x in scales if (x,) in hs)
    return Numbers(1 - s.demand_misses.iloc[0] / d.demand_misses.iloc[0],
                   s.speculative_transfers.iloc[0] / d.transfers.iloc[0],
                   s.transfers.iloc[0] / d.transfers.iloc[0] - 1,
                   tuple((d.link_gbps[x], d.stall_seconds[x], s.stall_seconds[x], d.tokens_per_second[x],
                          s.tokens_per_second[x]) for x in scales), stall, control, host)


def counts_text(n: Numbers) -> str:
    return (f"per run, last_step vs demand: {n.fewer_demand:.0%} fewer demand loads, "
            f"{n.more_speculative:.0%} more speculative ones, {n.extra_transfers:+.0%} link transfers in all")


def stall_text(n: Numbers) -> str:
    ivs = dict(n.stall)
    return "; ".join(f"{gbps:.3g} GB/s: stall {sd:.2f} s (demand) vs {ss:.2f} s (last_step)"
                     + (f", last_step over demand {ivs[gbps].text()}" if gbps in ivs else "")
                     + f", {td:.1f} vs {ts:.1f} tokens/s" for gbps, sd, ss, td, ts in n.by_bandwidth)


def verdicts(n: Numbers) -> list[Claim]:
    counts = Claim(
        "last-step prefetch puts more transfers on the link than demand loading serves misses",
        "speculative transfers compete with demand transfers for host-to-device bandwidth",
        counts_text(n), judged(n.extra_transfers > 0), counting=PER_RUN, interval=EXACT,
        margin=f"{n.extra_transfers:+.1%} link transfers vs > 0")
    aa, hs = dict(n.control), dict(n.host)
    verdict, reason, margin = combine((f"{gbps:.3g} GB/s", gated(faster(iv), aa.get(gbps), hs.get(gbps)))
                                      for gbps, iv in n.stall)
    stall = Claim(
        "speculative transfers delay demand transfers: last_step stalls longer than demand at every bandwidth",
        "speculative loads queue ahead of demand loads on the copy engine (qualitative)",
        stall_text(n) + "; stall " + controls_text({(g,): iv for g, iv in n.control}, lambda k: f"{k[0]:.3g} GB/s"),
        verdict, reason, timing=True, counting="stall seconds per run, % per pair",
        interval=METHOD, pairs=min((iv.n for _, iv in n.stall), default=0), margin=margin)
    return [counts, stall]


def reading(n: Numbers) -> str:
    """What the figure shows, from the fastest link to the slowest, in this run's means (printed by notebook 03)."""
    (g0, sd0, ss0, td0, ts0), (g1, sd1, ss1, td1, ts1) = n.by_bandwidth[0], n.by_bandwidth[-1]
    return (f"From {g0:.3g} GB/s to {g1:.3g} GB/s, last_step's stall minus demand's goes from {ss0 - sd0:+.2f} s to "
            f"{ss1 - sd1:+.2f} s per run, and its tokens/s relative to demand's from {ts0 / td0 - 1:+.0%} to "
            f"{ts1 / td1 - 1:+.0%} (means over repetitions; the claim below rules on the paired intervals).")


# --- figure ---------------------------------------------------------------------------------------
def plot(summary, P: Settings):
    """(a) tokens/s and (b) stall seconds vs link bandwidth, demand and last_step."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for pol, g in summary.groupby("policy", sort=False):
        kw = dict(marker="o", color=COLORS.get(pol), label=pol)
        ax1.plot(g.link_gbps, g.tokens_per_second, **kw)
        ax2.plot(g.link_gbps, g.stall_seconds, **kw)
    why, ticks = _bandwidth_axis(summary, P)
    ax1.set(xlabel="link bandwidth (GB/s)", ylabel="throughput (tokens/s)", title="throughput")
    ax2.set(xlabel="link bandwidth (GB/s)", ylabel="stall per run (seconds)", title="compute waiting on the link")
    if why:
        fig.supxlabel(why, fontsize=9)
    for ax in (ax1, ax2):
        ax.title.set_fontsize(10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(ticks), list(ticks.values()))
        ax.minorticks_off()
        ax.legend(fontsize=8)
    title(fig, P, "03 bandwidth throttling (no paper figure: qualitative)")
    return fig, summary.copy()


def _bandwidth_axis(summary, P: Settings) -> tuple[str, dict]:
    """Why the link is that slow (a line under the panels, or "") and the x ticks {GB/s: label}. The emulated
    link's default bandwidth is PCIe 4 scaled
    to this model's expert size (offload.link.emulated_bandwidth_gbps): a tiny expert then costs what a
    LLaDA2.0-mini expert costs on PCIe 4, so scale s is the PCIe generation whose rate is s x PCIe 4's."""
    pairs = summary[["link_gbps", "bandwidth_scale"]].drop_duplicates().sort_values("link_gbps")
    scaled = P.link == "emulated" and P.link_gbps is None
    if not scaled:
        return "", {g: f"{g:.3g}" for g in pairs.link_gbps}
    return (f"emulated link, scaled to the {P.model} model's experts: one costs what a LLaDA2.0-mini expert costs "
            f"on the PCIe x16 link named (PCIe 4 = {PCIE4_GBPS:g} GB/s)",
            {g: f"{g:.3g}\n~{_pcie(s)}" for g, s in zip(pairs.link_gbps, pairs.bandwidth_scale)})


def _pcie(scale: float) -> str:
    """The PCIe x16 generation whose bandwidth is `scale` times PCIe 4's (each generation doubles it)."""
    gen = 4 + math.log2(scale)
    return f"PCIe {gen:g}" if gen.is_integer() and 1 <= gen <= 6 else f"{scale:g} x PCIe 4"
