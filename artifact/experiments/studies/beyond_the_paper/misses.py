"""06 beyond the paper, the exact part: every predictor's traces replayed exactly against the miss floors
belady (this cache's rules) and min (relaxed MIN, any demand-paging schedule), each count per phase; their
summary, the counts of each counting basis, and the count claims (2a, 2b and the conservative predictor's),
ruled on the denoising steps (prefill excluded) with all demands printed beside where that basis would give
another verdict (counting.on_bases)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from artifact.experiments.counting import BASIS_SHORT, stated_on_bases
from artifact.experiments.criteria import thresholds
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.verdicts.counts import margin_below
from artifact.experiments.verdicts.records import Claim
from artifact.offload.replay.sim import by_basis, phase_columns, ruling_basis, sweep

# Miss accounting: every predictor, then the floors ("min": bounds.relaxed_min, which the simulator replays)
PREDICTORS = (
    "last_step",
    "last_step:lookahead=2",
    "last_step_conservative",
    "last_step_conservative:lookahead=2",
    "cross_layer",
    "oracle",
)
MISS_POLICIES = ("demand",) + PREDICTORS + ("belady",)
MIN = "min"
BOUNDS = ("belady", MIN)
SUMMED = ("demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches", "accesses")


def miss_sweep(ts, P: Settings, progress: bool = True) -> pd.DataFrame:
    """Every trace x C/W x policy and the floor 'min' replayed (sim.sweep, exact counts), each count also per
    phase (<count>_<phase> columns, sim.phase_columns) for both counting bases."""
    df = sweep(
        ts,
        P.cache_ratios,
        MISS_POLICIES + (MIN,),
        progress=progress,
        by_phase=True,
        lookahead=P.lookahead,
        tau=P.tau,
    )
    df = phase_columns(df)
    df["trace"] = [Path(p).name for p in df.trace]  # no machine paths in saved data
    return df.drop(columns=["replay_seconds", "misses_vs_lru"], errors="ignore")


def miss_summary(sweep_df) -> pd.DataFrame:
    """Counts pooled over traces per (counting basis, C/W, policy), relative to LRU's at the same C/W and
    basis (sim.by_basis: `prefill` 'excluded' = denoising steps only, 'included' = all demands, the only one
    without per-phase columns), and each predictor's share of the oracle's removed misses (`of_oracle`)."""
    g = by_basis(sweep_df, ["cache_ratio"], SUMMED)
    oracle = g[g.policy == "oracle"].set_index(["prefill", "cache_ratio"]).misses_removed.rename("oracle")
    removed = g.join(oracle, on=["prefill", "cache_ratio"]).oracle  # NaN where no oracle was replayed
    g["of_oracle"] = g.misses_removed / removed.where(removed > 0)
    return g


@dataclass(frozen=True)
class Counts:
    """The exact counts of one counting basis (sim.BASES)."""

    conservative_is_lru: bool  # last_step_conservative: no transfer, demand's misses, at every C/W
    removed: dict  # policy -> {C/W: misses removed beyond LRU / LRU's misses}
    of_oracle: dict  # policy -> {C/W: share of the oracle's removed misses}


def counts(summary) -> Counts:
    cons = summary[summary.policy.str.startswith("last_step_conservative")]
    is_lru = bool(len(cons) and (cons.speculative_transfers == 0).all() and (cons.misses_vs_lru == 1).all())
    by = summary.groupby("policy")
    removed = {p: dict(zip(g.cache_ratio, g.misses_removed / g.lru_misses)) for p, g in by}
    return Counts(is_lru, removed, {p: dict(zip(g.cache_ratio, g.of_oracle)) for p, g in by})


def _by_ratio(d: dict, fmt: str = "{:+.0%}") -> str:
    return ", ".join(f"{r:g}: {fmt.format(v)}" for r, v in sorted(d.items()))


# --- the count claims: (2) is last-step the right predictor to judge prediction by? ----------------------
def count_claims(bases: dict[str, Counts], basis: str) -> list[Claim]:
    """The count claims on `bases` (counting basis -> Counts), ruled on `basis` (docs/verdicts.md), each where
    the counts hold the policies it reads."""
    claims = []
    if all({"last_step", "oracle"} <= set(c.removed) for c in bases.values()):
        claims.append(headroom_claim(bases, basis))
    if all({"last_step", "cross_layer", "oracle"} <= set(c.removed) for c in bases.values()):
        claims.append(cross_layer_claim(bases, basis))
    if "last_step_conservative" in bases[basis].removed:
        claims.append(conservative_claim(bases, basis))
    return claims


def _share(ls: dict, orc: dict) -> dict:
    """{C/W: last_step's misses removed / the oracle's} where the oracle removes any."""
    return {r: ls[r] / orc[r] for r in ls if orc[r] > 0}


def headroom_claim(bases: dict[str, Counts], basis: str) -> Claim:
    """(2a) last_step removes less than HEADROOM of the misses the oracle removes beyond LRU, at every C/W."""
    share = {p: _share(c.removed["last_step"], c.removed["oracle"]) for p, c in bases.items()}
    ls, orc, sh = bases[basis].removed["last_step"], bases[basis].removed["oracle"], share[basis]
    w = max(sh, key=sh.get) if sh else None
    return stated_on_bases(
        "06-headroom",
        f"misses removed beyond LRU ({BASIS_SHORT[basis]}): last_step {_by_ratio(ls)}; oracle "
        f"{_by_ratio(orc)}; last_step's share of the oracle's: {_by_ratio(sh, '{:.1%}')}",
        share,
        basis,
        lambda sh: all(v < thresholds.HEADROOM for v in sh.values()),
        lambda sh: f"{max(sh.values()):.1%} at C/W {max(sh, key=sh.get):g}" if sh else "-",
        margin=""
        if w is None
        else f"largest share of the oracle's (C/W {w:g}): " + margin_below(sh[w], thresholds.HEADROOM),
    )


def cross_layer_claim(bases: dict[str, Counts], basis: str) -> Claim:
    """(2b) the cross-layer predictor removes more of LRU's misses than last_step at every C/W."""
    gap = {
        p: {r: (c.removed["cross_layer"][r] - v) * 100 for r, v in c.removed["last_step"].items()}
        for p, c in bases.items()
    }
    r = min(gap[basis], key=gap[basis].get)
    return stated_on_bases(
        "06-cross-layer",
        f"misses removed beyond LRU ({BASIS_SHORT[basis]}): cross_layer "
        f"{_by_ratio(bases[basis].removed['cross_layer'])}; its share of the oracle's: "
        f"{_by_ratio(bases[basis].of_oracle['cross_layer'], '{:.0%}')}",
        gap,
        basis,
        lambda g: all(v > 0 for v in g.values()),
        lambda g: f"smallest lead {min(g.values()):+.1f} points at C/W {min(g, key=g.get):g}",
        margin=f"smallest lead over last_step (C/W {r:g}): {gap[basis][r]:+.1f} points of LRU's misses "
        "vs > 0",
    )


def conservative_claim(bases: dict[str, Counts], basis: str) -> Claim:
    """last_step_conservative issues no transfer: its counts equal demand's at every C/W, both lookaheads."""
    removed = bases[basis].removed
    return stated_on_bases(
        "06-conservative",
        f"conservative lookahead 1: {_by_ratio(removed['last_step_conservative'])}; lookahead 2: "
        f"{_by_ratio(removed.get('last_step_conservative:lookahead=2', {}))} misses removed",
        bases,
        basis,
        lambda c: c.conservative_is_lru,
        lambda c: "equal" if c.conservative_is_lru else "not equal",
        margin="exact: equal counts or not",
    )


def lookahead_text(summary) -> str:
    """What lookahead 2 changes in exact replay, per predictor: the C/W where its counts equal lookahead 1's,
    and its speculative transfers against lookahead 1's elsewhere, on the basis the claims rule on (printed by
    notebook 06)."""
    basis = ruling_basis(summary)
    summary = summary[summary.prefill == basis]
    parts = []
    for pol in ("last_step", CONTROL):
        a, b = (summary[summary.policy == p].set_index("cache_ratio") for p in (pol, f"{pol}:lookahead=2"))
        if a.empty or b.empty:
            continue
        both = [r for r in a.index if r in b.index]
        cols = ["demand_misses", "speculative_transfers"]
        same = [r for r in both if (a.loc[r, cols] == b.loc[r, cols]).all()]
        diff = [r for r in both if r not in same]
        vs = {c: [f"{int(b.loc[r, c])} vs {int(a.loc[r, c])}" for r in diff] for c in cols}
        text = f"{pol}: lookahead 2 gives lookahead 1's counts at " + (
            f"C/W {', '.join(f'{r:g}' for r in same)}" if same else "no C/W"
        )
        if diff:
            spec = ", ".join(f"{x} (C/W {r:g})" for x, r in zip(vs["speculative_transfers"], diff))
            text += f"; elsewhere its speculative transfers are {spec} and its demand misses "
            text += ", ".join(vs["demand_misses"])
        parts.append(text)
    if not parts:
        return "No lookahead variants replayed."
    return f"Lookahead in exact replay ({BASIS_SHORT[basis]}): " + "; ".join(parts) + "."
