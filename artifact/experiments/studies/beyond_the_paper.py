"""06 beyond the paper (this artifact's own results, not the paper's): the prefetcher design space and a
demand-priority link. Two questions:
  (1) does prediction still lose once it can never delay a demand transfer (link_priority: demand)?
  (2) is last-step the right predictor to judge prediction by?
Miss accounting replays the profile's traces exactly for every predictor, against the miss floors belady
(this cache's rules) and min (relaxed MIN, any demand-paging schedule), with every count per phase: the count
claims rule on the denoising steps (prefill excluded), as notebook 02 and the paper's oracle figure count, and
print all demands beside them where that basis would give another verdict (claims.on_bases). Paired
throughput runs demand against the predictors under each link priority, one bench file per priority."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments.bench.results import bench_fingerprint, same_tokens
from artifact.experiments.claims import BASIS, BASIS_SHORT, EXACT, PER_RUN, Claim, on_bases, on_basis, verdict_of
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.harness import run_grid
from artifact.experiments.outputs.figures import COLORS, CONTROL_COLOR, title
from artifact.experiments.replication import Replicas
from artifact.experiments.rules import margin_below
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.stats import CELL_KEYS, CONFIDENCE, format_table, paired_table
from artifact.experiments.stored_runs import stored_rows
from artifact.experiments.timed import claim_parts, merge_others, question, rule_claim, timed_claim
from artifact.offload.replay.sim import by_basis, phase_columns, ruling_basis, sweep

OWN = "not a claim of the paper: this artifact's own result"

# Miss accounting: every predictor, then the floors. "min" is bounds.relaxed_min, a bound the simulator replays.
PREDICTORS = ("last_step", "last_step:lookahead=2", "last_step_conservative", "last_step_conservative:lookahead=2",
              "cross_layer", "oracle")
MISS_POLICIES = ("demand",) + PREDICTORS + ("belady",)
MIN = "min"
BOUNDS = ("belady", MIN)
SUMMED = ("demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches", "accesses")

# Throughput: demand against these, under each link priority (one bench file per priority); CONTROL among them.
BENCH_PREDICTORS = ("last_step", CONTROL, "cross_layer")
PRIORITIES = ("fifo", "demand")
STEM = "beyond"          # data/results/<profile>/beyond-fifo.csv and beyond-demand.csv

# The cpu profile's bench, trimmed to keep ./run_all.sh affordable on 2 cores: 96 timed and 48 untimed warm-up
# runs of the tiny model (2 priorities x 3 C/W spanning 0.43-1.73 x 2 batch sizes x 4 policies x (2 repetitions
# + 1 warm-up)), one task, 4 prompts (the fewest that fill a batch of 4), 8 denoising steps per block: 2 pairs
# per cell (priority, batch size, C/W) per run. The warm-up: 2 repetitions of 4 policies in balanced order
# (bench/order.py) put only 2 of them first in a cell of one run. GPU profiles run their own grid unchanged, with
# the oracle added.
CPU_TRIM = {"tasks": ("gsm8k",), "n_prompts": 4, "repetitions": 2, "warmup": 1, "steps": 8,
            "cache_ratios": (0.43, 1.0, 1.73)}


# --- miss accounting --------------------------------------------------------------------------------
def miss_sweep(ts, P: Settings, progress: bool = True) -> pd.DataFrame:
    """Every trace x C/W x policy and the relaxed-MIN floor 'min' replayed (sim.sweep, exact counts), each count
    also per phase (<count>_<phase> columns, sim.phase_columns), so that both counting bases can be pooled."""
    df = sweep(ts, P.cache_ratios, MISS_POLICIES + (MIN,), progress=progress, by_phase=True, lookahead=P.lookahead,
               tau=P.tau)
    df = phase_columns(df)
    df["trace"] = [Path(p).name for p in df.trace]          # no machine paths in saved data
    return df.drop(columns=["replay_seconds", "misses_vs_lru"], errors="ignore")


def miss_summary(sweep_df) -> pd.DataFrame:
    """Counts pooled over traces per (counting basis, C/W, policy), relative to LRU ('demand') at the same C/W
    and basis (sim.by_basis: column `prefill`, 'excluded' = denoising steps only, 'included' = all demands;
    without per-phase columns only 'included'), and each predictor's share of the misses the oracle removes
    (`of_oracle`) on the same basis."""
    g = by_basis(sweep_df, ["cache_ratio"], SUMMED)
    oracle = g[g.policy == "oracle"].set_index(["prefill", "cache_ratio"]).misses_removed
    oracle_removed = pd.Series([oracle.get(k, float("nan")) for k in zip(g.prefill, g.cache_ratio)], index=g.index)
    g["of_oracle"] = g.misses_removed / oracle_removed.where(oracle_removed > 0)
    return g


# --- paired throughput --------------------------------------------------------------------------------
def bench_profile(P: Settings, priority: str) -> Settings:
    """The profile's bench under one link priority: demand and the predictors (the oracle too off the cpu
    profile), trimmed on cpu (CPU_TRIM)."""
    policies = ("demand",) + BENCH_PREDICTORS + (() if P.name == "cpu" else ("oracle",))
    trim = CPU_TRIM if P.name == "cpu" else {}
    return dataclasses.replace(P, link_priority=priority, policies=policies, **trim)


def measure(P: Settings, progress: bool = True) -> pd.DataFrame:
    """Both priorities' bench rows (column link_priority), each from its own resumable file."""
    frames = []
    for pr in PRIORITIES:
        Q = bench_profile(P, pr)
        frames.append(run_grid(Q, f"{STEM}-{pr}", progress=progress).assign(link_priority=pr))
    return pd.concat(frames, ignore_index=True)


CELL = ["link_priority", *CELL_KEYS]   # one interval per cell
CLAIM = CLAIMS["06-priority"]  # (1) (criteria/timing.py): each predictor over demand under link_priority demand


def replicas(P: Settings, rows) -> Replicas:
    """This run's rows of both priorities with the stored runs' rows of the same grids (replication.py)."""
    stored: dict[str, list] = {}
    for pr in PRIORITIES:
        for name, df in stored_rows(P, f"{STEM}-{pr}", bench_fingerprint(bench_profile(P, pr))):
            stored.setdefault(name, []).append(df.assign(link_priority=pr))
    return Replicas(rows, tuple((n, pd.concat(f, ignore_index=True)) for n, f in stored.items()))


def throughput_table(rows, by=("task", "batch_size", "cache_ratio")) -> pd.DataFrame:
    """Each predictor over demand (% tokens/s, positive = the predictor is faster) within this run, per link
    priority and cell, with 95% t intervals over its pairs (stats.paired_table; shown, the verdicts rule on
    replication's intervals)."""
    out = []
    for pr, g in rows.groupby("link_priority", sort=False):
        for pol in [p for p in g.policy.unique() if p != "demand"]:
            t = paired_table(g, pol, "demand", list(by))
            out.append(t.assign(link_priority=pr, policy=pol))
    table = pd.concat(out, ignore_index=True)
    first = ["link_priority", "policy"] + list(by)
    return table[first + [c for c in table.columns if c not in first]]


def format_tables(table) -> str:
    """stats.format_table per (link priority, predictor): the predictor (A) over demand (B)."""
    parts = []
    for (pr, pol), t in table.groupby(["link_priority", "policy"], sort=False):
        t = t.drop(columns=["link_priority", "policy"]).reset_index(drop=True)
        t.attrs.update(a=pol, b="demand", metric="tokens_per_second", confidence=CONFIDENCE)
        parts.append(f"link_priority {pr}: " + format_table(t))
    return "\n\n".join(parts)


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Counts:
    """The exact counts of one counting basis (sim.BASES)."""
    conservative_is_lru: bool        # last_step_conservative: no transfer, demand's misses, at every C/W
    removed: dict                    # policy -> {C/W: misses removed beyond LRU / LRU's misses}
    of_oracle: dict                  # policy -> {C/W: share of the oracle's removed misses}


def counts(summary) -> Counts:
    cons = summary[summary.policy.str.startswith("last_step_conservative")]
    is_lru = bool(len(cons)) and bool((cons.speculative_transfers == 0).all() and (cons.misses_vs_lru == 1).all())
    removed = {p: dict(zip(g.cache_ratio, g.misses_removed / g.lru_misses)) for p, g in summary.groupby("policy")}
    of_or = {p: dict(zip(g.cache_ratio, g.of_oracle)) for p, g in summary.groupby("policy")}
    return Counts(is_lru, removed, of_or)


@dataclass(frozen=True)
class Numbers:
    same_cells: int                  # cells where every policy and repetition decoded the same tokens ...
    cells: int                       # ... of all cells (both priorities)
    faster: pd.DataFrame             # throughput rows where a predictor beats demand (CI excludes zero)
    table: pd.DataFrame              # every predictor over demand, per link priority and C/W
    basis: str                       # the counting basis the count claims rule on (sim.ruling_basis)
    by_prefill: dict                 # counting basis -> Counts
    timed: dict = dataclasses.field(default_factory=dict)    # {policy: Compared} predictor over demand per cell,
                                                             # with the A/A control and host shares

    # the counts on the basis the count claims rule on
    conservative_is_lru, removed, of_oracle = (on_basis(f) for f in ("conservative_is_lru", "removed", "of_oracle"))


def numbers(summary, table, reps: Replicas) -> Numbers:
    rows = reps.this
    n_same, n_cells = same_tokens(rows.assign(task=rows.task + "/" + rows.link_priority))
    fast = table[(table.verdict == paper.FASTER)]
    by_prefill = {p: counts(g) for p, g in summary.groupby("prefill", sort=False)}
    return Numbers(n_same, n_cells, fast, table, ruling_basis(summary), by_prefill,
                   claim_parts(reps, CLAIM))


def label(key) -> str:
    pr, task, b, ratio, scale = key
    return f"C/W {ratio:g} b={b}" + (f" {task}" if task != "gsm8k" else "") + (f" x{scale:g}" if scale != 1 else "")


def _by_ratio(d: dict, fmt: str = "{:+.0%}") -> str:
    return ", ".join(f"{r:g}: {fmt.format(v)}" for r, v in sorted(d.items()))


def bootstrap_above_zero(table) -> list[str]:
    """Predictor cells whose bootstrap interval (shown, not ruled on) lies above zero."""
    t = table[(table.policy != CONTROL) & (table.boot_low > 0)]
    return [f"{r.policy} at C/W {r.cache_ratio:g} b={r.batch_size} ({r.link_priority})" for r in t.itertuples()]


def priority_claim(timed: dict, table: pd.DataFrame | None = None) -> Claim:
    """(1): under link_priority demand, no predictor is faster than demand-async (not_faster per predictor and
    cell of `timed`, {predictor: Compared}, gated by the cell's A/A control); `table` (throughput_table, this run)
    adds its bootstrap note."""
    q = question(CLAIM)
    t = rule_claim(merge_others(timed), CLAIM, lambda pk: f"{pk[0]} {label(pk[1])}")
    boot = [] if table is None else [c for c in bootstrap_above_zero(table) if c.endswith("(demand)")]
    return timed_claim(
        "[own result] (1) prediction still does not pay once it can never delay a demand transfer: under "
        f"link_priority demand no predictor is faster than demand-async at any measured C/W ({q.text()}: "
        "non-superiority)",
        f"{OWN}; judged per cell (docs/verdicts.md), {CONTROL} vs demand as the A/A control", t,
        "tokens/s per run, predictor over demand % per pair, one interval per cell (task, batch, C/W)",
        "this run's bootstrap intervals over pairs (not ruled on) above 0: " + (", ".join(boot) if boot else "none"))


def stored_claims(P: Settings) -> list[Claim]:
    """The timing claim as a `--store` run of the stored runs' last one rules it (tests/test_stored_runs.py
    recomputes the committed record with it): from the committed rows alone."""
    r = replicas(P, None).last_stored()
    rows = r.this
    return [priority_claim(claim_parts(r, CLAIM), throughput_table(rows))]


def verdicts(n: Numbers) -> list[Claim]:
    claims = [Claim("[own result] offloading changes time, never results: every policy under both link priorities "
                    "decoded the same tokens in every cell", f"{OWN}; the engine is exact (design invariant)",
                    f"{n.same_cells} of {n.cells} cells identical", verdict_of(n.same_cells == n.cells),
                    counting=PER_RUN, interval=EXACT, margin=f"{n.cells - n.same_cells} cells differ")]
    # (1) does prediction still lose once it can never delay a demand transfer?
    if any(k[0] == "demand" for c in n.timed.values() for k in c.effects):
        claims.append(priority_claim(n.timed, n.table))
    # (2) is last-step the right predictor to judge prediction by? Exact counts, ruled on n.basis (docs/verdicts.md)
    on = BASIS_SHORT[n.basis]
    bases = n.by_prefill
    if all({"last_step", "oracle"} <= set(c.removed) for c in bases.values()):
        share = {p: _of_oracle(c.removed["last_step"], c.removed["oracle"]) for p, c in bases.items()}
        worst = {p: max(sh, key=sh.get) if sh else None for p, sh in share.items()}
        holds = {p: all(v < thresholds.HEADROOM for v in sh.values()) for p, sh in share.items()}
        verdict, note = on_bases(holds, {p: f"{share[p][worst[p]]:.1%} at C/W {worst[p]:g}" if worst[p] is not None
                                         else "-" for p in bases}, n.basis)
        ls, orc, w = n.removed["last_step"], n.removed["oracle"], worst[n.basis]
        claims.append(Claim(
            "[own result] (2a) last-step understates what prediction can do: it removes less than "
            f"{thresholds.HEADROOM:.0%} of the misses the oracle removes beyond LRU at every C/W",
            f"{OWN}; judged on exact replay (the oracle is the ceiling of any predictor), over the {on}",
            f"misses removed beyond LRU ({on}): last_step {_by_ratio(ls)}; oracle {_by_ratio(orc)}; last_step's "
            f"share of the oracle's: {_by_ratio(share[n.basis], '{:.1%}')}",
            verdict, note, counting=BASIS[n.basis], interval=EXACT,
            margin="" if w is None else f"largest share of the oracle's (C/W {w:g}): "
            + margin_below(share[n.basis][w], thresholds.HEADROOM)))
    if all({"last_step", "cross_layer", "oracle"} <= set(c.removed) for c in bases.values()):
        gap = {p: {r: (c.removed["cross_layer"][r] - v) * 100 for r, v in c.removed["last_step"].items()}
               for p, c in bases.items()}
        least = {p: min(g, key=g.get) for p, g in gap.items()}
        holds = {p: all(v > 0 for v in g.values()) for p, g in gap.items()}
        verdict, note = on_bases(holds, {p: f"smallest lead {gap[p][least[p]]:+.1f} points at C/W {least[p]:g}"
                                         for p in bases}, n.basis)
        r = least[n.basis]
        claims.append(Claim(
            "[own result] (2b) a better predictor exists: the cross-layer predictor (layer l+1's router on layer "
            "l's hidden states) removes more of LRU's misses than last_step at every C/W",
            f"{OWN}; judged on exact replay: cross_layer's misses removed > last_step's at every C/W, over the {on}",
            f"misses removed beyond LRU ({on}): cross_layer {_by_ratio(n.removed['cross_layer'])}; its share of the "
            f"oracle's: {_by_ratio(n.of_oracle['cross_layer'], '{:.0%}')}",
            verdict, note, counting=BASIS[n.basis], interval=EXACT,
            margin=f"smallest lead over last_step (C/W {r:g}): {gap[n.basis][r]:+.1f} points of LRU's misses vs > 0"))
    if "last_step_conservative" in n.removed:
        verdict, note = on_bases({p: c.conservative_is_lru for p, c in bases.items()},
                                 {p: "equal" if c.conservative_is_lru else "not equal" for p, c in bases.items()},
                                 n.basis)
        claims.append(Claim(
            "[own result] last_step_conservative never issues a transfer under this cache's rules: its counts "
            "equal demand's (LRU already holds or fills the slots with the previous demand)",
            f"{OWN}; judged: zero speculative transfers and LRU's demand misses at every C/W, lookahead 1 and 2, "
            f"over the {on}",
            "conservative lookahead 1: " + _by_ratio(n.removed["last_step_conservative"])
            + "; lookahead 2: " + _by_ratio(n.removed.get("last_step_conservative:lookahead=2", {}))
            + " misses removed", verdict, note, counting=BASIS[n.basis], interval=EXACT,
            margin="exact: equal counts or not"))
    return claims


def _of_oracle(ls: dict, orc: dict) -> dict:
    """{C/W: last_step's misses removed / the oracle's} where the oracle removes any."""
    return {r: ls[r] / orc[r] for r in ls if orc[r] > 0}


def lookahead_text(summary) -> str:
    """What lookahead 2 changes in exact replay, per predictor: the C/W where its counts equal lookahead 1's,
    and its speculative transfers against lookahead 1's elsewhere, on the basis the claims rule on (printed by
    notebook 06)."""
    basis = ruling_basis(summary)
    summary = summary[summary.prefill == basis]
    parts = []
    for pol in ("last_step", CONTROL):
        a = summary[summary.policy == pol].set_index("cache_ratio")
        b = summary[summary.policy == f"{pol}:lookahead=2"].set_index("cache_ratio")
        if a.empty or b.empty:
            continue
        cols = ["demand_misses", "speculative_transfers"]
        same = [r for r in a.index if r in b.index and (a.loc[r, cols] == b.loc[r, cols]).all()]
        diff = [r for r in a.index if r in b.index and r not in same]
        text = (f"{pol}: lookahead 2 gives lookahead 1's counts at "
                + (f"C/W {', '.join(f'{r:g}' for r in same)}" if same else "no C/W"))
        if diff:
            text += "; elsewhere its speculative transfers are " + ", ".join(
                f"{int(b.loc[r, 'speculative_transfers'])} vs {int(a.loc[r, 'speculative_transfers'])} "
                f"(C/W {r:g})" for r in diff) + " and its demand misses " + ", ".join(
                f"{int(b.loc[r, 'demand_misses'])} vs {int(a.loc[r, 'demand_misses'])}" for r in diff)
        parts.append(text)
    return (f"Lookahead in exact replay ({BASIS_SHORT[basis]}): " + "; ".join(parts) + "." if parts
            else "No lookahead variants replayed.")


# --- figure ---------------------------------------------------------------------------------------
STYLE = {"demand": ("tab:blue", "o", "-"), "last_step": ("tab:orange", "o", "-"),
         "last_step:lookahead=2": ("tab:orange", "^", "--"), "last_step_conservative": ("tab:brown", "s", "-"),
         "last_step_conservative:lookahead=2": ("tab:brown", "v", "--"), "cross_layer": ("tab:red", "D", "-"),
         "oracle": (COLORS["oracle"], "o", "-"), "belady": ("black", "", ":"), MIN: ("black", "", "--")}


def plot(summary, n: "Numbers", P: Settings):
    """(a) demand misses relative to LRU per policy vs C/W; (b) all transfers (demand + speculative) relative
    to LRU's misses, with the floors belady and min (they bound every policy's transfers: a prefetch can be
    postponed to its first use); (c, d) each predictor's throughput over demand (% tokens/s, 95% CIs) vs C/W
    under FIFO and under demand priority. The counts are drawn on the basis the claims rule on (sim.ruling_basis);
    the saved data holds both."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    basis = ruling_basis(summary)
    counted = summary[summary.prefill == basis]
    have = [p for p in STYLE if p in set(counted.policy)]
    for ax, col, what in ((axes[0, 0], "misses_vs_lru", "demand misses"),
                          (axes[0, 1], "transfers_vs_lru", "transfers (demand + speculative)")):
        for pol in have:
            if pol in BOUNDS and col == "misses_vs_lru":
                continue                           # a floor on loads, not on a prefetcher's demand misses
            g = counted[counted.policy == pol]
            color, marker, ls = STYLE[pol]
            label = pol + (" (LRU)" if pol == "demand" else " (floor)" if pol in BOUNDS else "")
            ax.plot(g.cache_ratio, 100 * g[col], marker=marker, ms=4, ls=ls, color=color, label=label)
        ax.axhline(100, color="gray", lw=0.8, ls=":")
        ax.set(xlabel="cache capacity C/W", ylabel="% of LRU's demand misses",
               title=f"{what}, exact replay, {BASIS_SHORT[basis]}")
        ax.set_ylim(bottom=0)
    control = next(iter(n.timed.values())).control if n.timed else {}
    series = {**{p: c.effects for p, c in n.timed.items()}, CONTROL: control}
    pols = list(series)
    batches = sorted({k[2] for eff in series.values() for k in eff})
    width = 0.02
    rows = []
    for ax, pr in zip(axes[1], PRIORITIES):
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
                ax.errorbar(x, [i.mean for i in iv], yerr=[[i.mean - i.low for i in iv], [i.high - i.mean for i in iv]],
                            fmt=marker if j == 0 else "x", color=color, capsize=3, ms=4,
                            label=f"{pol}{' (A/A control)' if pol == CONTROL else ''}, b={b}")
                rows += [dict(panel="throughput", link_priority=pr, policy=pol, batch_size=b, cache_ratio=c[3],
                              diff_pct=i.mean, low=i.low, high=i.high, interval=i.unit, n=i.n)
                         for c, i in zip(keys, iv)]
        ax.axhspan(-thresholds.MARGIN, thresholds.MARGIN, color="gray", alpha=0.12,
                   label=f"+-{thresholds.MARGIN:g}% (margin)")
        ax.axhline(0, color="black", lw=1, ls=":")
        ax.set(xlabel="cache capacity C/W", ylabel="predictor over demand (% tokens/s,\n95% intervals as ruled)",
               title=f"tokens/s vs demand-async, link_priority {pr}")
    lo = min(a.get_ylim()[0] for a in axes[1])
    hi = max(a.get_ylim()[1] for a in axes[1])
    for a in axes[1]:
        a.set_ylim(lo, hi)                         # one scale, so the two priorities compare by eye
    for ax in axes[:, 1]:                          # beside each row, over no curve
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    for ax in axes.flat:
        ax.title.set_fontsize(10)
    title(fig, P, "06 beyond the paper (this artifact's own results)")
    df = pd.concat([summary.assign(panel="misses"), pd.DataFrame(rows)], ignore_index=True)
    return fig, df
