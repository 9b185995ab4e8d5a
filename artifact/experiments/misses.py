"""02 miss accounting: every trace replayed through the engine's own cache and policies (exact counts), and
what each prefetcher removes beyond LRU."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments import paper
from artifact.experiments.claims import COLORS, NOT_MEASURABLE, PAPER_STYLE, Claim, judged, title
from artifact.experiments.settings import Profile
from artifact.offload.sim import sweep

FEW = 0.10       # "few or no misses removed" (our reading): under 10% of LRU's misses
FACTOR = 1.5     # a paper ratio is reproduced within a factor of 1.5


# --- replay and table -----------------------------------------------------------------------------
def miss_sweep(ts, P: Profile, progress: bool = True) -> pd.DataFrame:
    """Every trace x C/W x simulator policy, replayed (exact counts; sim.sweep)."""
    df = sweep(ts, P.cache_ratios, P.sim_policies, progress=progress, lookahead=P.lookahead, tau=P.tau)
    df["trace"] = [Path(p).name for p in df.trace]          # no machine paths in saved data
    return df.drop(columns=["replay_seconds"])


def miss_summary(sweep_df) -> pd.DataFrame:
    """Counts pooled over traces per (C/W, policy), relative to LRU ('demand') at the same C/W."""
    g = sweep_df.groupby(["cache_ratio", "policy"], sort=True)[
        ["demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches", "accesses"]].sum()
    g = g.reset_index()
    lru = g[g.policy == "demand"].set_index("cache_ratio").demand_misses
    g["lru_misses"] = g.cache_ratio.map(lru)
    g["misses_vs_lru"] = g.demand_misses / g.lru_misses
    g["transfers"] = g.demand_misses + g.speculative_transfers
    g["transfers_vs_lru"] = g.transfers / g.lru_misses
    g["misses_removed"] = g.lru_misses - g.demand_misses
    return g


# --- verdicts -------------------------------------------------------------------------------------
def _at(summary, policy: str, ratio: float):
    return summary[(summary.policy == policy) & (summary.cache_ratio == ratio)].iloc[0]


def _nearest(ratios, target: float) -> float:
    return float(min(ratios, key=lambda r: (abs(r - target), r)))


@dataclass(frozen=True)
class Numbers:
    ratios: tuple[float, ...]
    # at each C/W in the paper's W-scale range: (misses removed / LRU's, speculative transfers / LRU's misses,
    # speculative transfers > misses removed); empty without last_step
    last_step: dict
    oracle_cut: dict             # C/W -> LRU misses / oracle misses; empty without oracle
    refresh_removed: dict        # C/W -> misses removed by interval_refresh / LRU's; empty without it


def numbers(summary) -> Numbers:
    ratios = tuple(sorted(float(r) for r in summary.cache_ratio.unique()))
    policies = set(summary.policy)
    last = {}
    if "last_step" in policies:
        for r in ratios:
            if paper.FASTER_RANGE[0] <= r <= paper.FASTER_RANGE[1]:
                s = _at(summary, "last_step", r)
                last[r] = (s.misses_removed / s.lru_misses, s.speculative_transfers / s.lru_misses,
                           bool(s.speculative_transfers > s.misses_removed))
    cut = {r: 1 / _at(summary, "oracle", r).misses_vs_lru for r in ratios} if "oracle" in policies else {}
    refresh = {}
    if "interval_refresh" in policies:
        for r in ratios:
            s = _at(summary, "interval_refresh", r)
            refresh[r] = s.misses_removed / s.lru_misses
    return Numbers(ratios, last, cut, refresh)


def last_step_text(n: Numbers) -> str:
    return "; ".join(f"C/W {r:g}: {removed:.0%} removed, speculative transfers +{spec:.0%} of LRU's misses"
                     for r, (removed, spec, _) in n.last_step.items())


def oracle_text(n: Numbers, r1: float) -> str:
    return (f"LRU/oracle misses at C/W = {r1:g}: {n.oracle_cut[r1]:.1f}x (by C/W: "
            + ", ".join(f"{r:g}: {v:.1f}x" for r, v in n.oracle_cut.items()) + ")")


def refresh_text(n: Numbers) -> str:
    return "misses removed beyond LRU by C/W: " + ", ".join(f"{r:g}: {v:+.0%}" for r, v in n.refresh_removed.items())


def verdicts(n: Numbers) -> list[Claim]:
    claims = []
    lo, hi = paper.FASTER_RANGE
    if n.last_step:
        ok = all(removed < FEW and more for removed, _, more in n.last_step.values())
        claims.append(Claim(
            "W-scale caches make last-step prefetch nearly useless: few or no misses removed beyond LRU, "
            "extra speculative transfers",
            f"few or no misses removed; judged: < {FEW:.0%} of LRU's misses removed and more speculative "
            f"transfers than misses removed, at every C/W in {lo:g}-{hi:g}",
            last_step_text(n), judged(ok)))
    else:
        claims.append(Claim("W-scale caches make last-step prefetch nearly useless", "few or no misses removed",
                            "-", NOT_MEASURABLE,
                            f"no last_step policy or no C/W in {lo:g}-{hi:g} in sim_policies/cache_ratios"))
    if n.oracle_cut:
        r1 = _nearest(n.ratios, 1.0)
        cut = paper.ORACLE_CUT
        claims.append(Claim(
            f"an oracle prefetcher cuts demand misses {cut}x versus LRU",
            f"{cut}x; judged at the W-scale cache C/W = {r1:g}, within a factor {FACTOR}",
            oracle_text(n, r1), judged(cut / FACTOR <= n.oracle_cut[r1] <= cut * FACTOR)))
    if n.refresh_removed:
        claims.append(Claim(
            "interval refresh (TIDE-style) does not beat LRU",
            f"does not beat LRU; judged: removes < {FEW:.0%} of LRU's misses at every C/W",
            refresh_text(n), judged(all(v < FEW for v in n.refresh_removed.values()))))
    return claims


# --- figure ---------------------------------------------------------------------------------------
def plot(summary, P: Profile):
    """(a) demand misses relative to LRU per policy vs C/W, the paper's oracle cut marked;
    (b) all transfers (demand + speculative) relative to LRU's."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for pol in [p for p in COLORS if p in set(summary.policy)]:
        g = summary[summary.policy == pol]
        kw = dict(marker="o", ms=4, color=COLORS.get(pol), label=pol + (" (LRU)" if pol == "demand" else ""))
        ax1.plot(g.cache_ratio, 100 * g.misses_vs_lru, **kw)
        ax2.plot(g.cache_ratio, 100 * g.transfers_vs_lru, **kw)
    ax1.axhline(100 / paper.ORACLE_CUT, **PAPER_STYLE, label=f"paper: oracle = LRU / {paper.ORACLE_CUT}")
    ax1.set(xlabel="cache capacity C/W", ylabel="demand misses (% of LRU's)", ylim=(0, 110),
            title="demand misses vs LRU")
    ax2.axhline(100, color="black", lw=1, ls=":")
    ax2.set(xlabel="cache capacity C/W", ylabel="host-to-device transfers (% of LRU's)",
            title="transfers (demand + speculative) vs LRU")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
    title(fig, P, "02 miss accounting (exact replay, all traces pooled)")
    return fig, summary.copy()
