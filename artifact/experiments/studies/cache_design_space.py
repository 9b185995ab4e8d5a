"""09 the cache's own design space (this artifact's own results, not the paper's): is LRU the right cache for
diffusion MoE? Every eviction policy (offload/policy/eviction.py) replays the profile's traces exactly against
LRU and the floors belady (this cache's rules) and min (any demand paging), per C/W, batch size and phase; the
best one is combined with prefetching; libCacheSim's LRU is checked against `demand` request by request; and a
small paired bench times the best eviction against lru (tokens/s, ruled per cell and gated by the A/A, as the
other direction claims: criteria/timing.py). The count claims rule on the denoising steps, as 02 and 06 count
(the abstract does not say which forwards its counts cover), and print all demands beside them where that
basis would give another verdict (counting.on_bases)."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from artifact.errors import RunsError
from artifact.experiments.bench.order import primary
from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.counting import BASIS_SHORT, EXACT, on_basis, stated_on_bases
from artifact.experiments.criteria import thresholds
from artifact.experiments.criteria.claims import ROW_FILES
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.harness import run_grid, trace_label, traces
from artifact.experiments.outputs.figures import style, title
from artifact.experiments.outputs.stored_runs import stored_rows
from artifact.experiments.paired_table import cell_label
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.verdicts.counts import margin_below
from artifact.experiments.verdicts.judge import claim_parts, judge, merge_others, timed_claim
from artifact.experiments.verdicts.pooling import Replicas, gather
from artifact.experiments.verdicts.records import Claim, stated, verdict_of
from artifact.offload.replay import sim
from artifact.offload.replay.trace import mean_working_set

RATIOS = (0.43, 0.83, 1.0, 1.3, 1.73)
EVICTIONS = (
    "demand",
    "demand+token_lru",
    "demand+token_lru:reverse=true",
    "demand+lfu",
    "demand+lfu:perfect=true",
    "demand+lfu_window:steps=8",
    "demand+lrfu:lam=0.5",
    "demand+lrfu:lam=2",
    "demand+block_tokens",
    "demand+arc",
    "demand+s3fifo",
)
FLOORS = ("belady", "min")
TOKEN = (
    "demand",
    "demand+token_lru",
    "demand+token_lru:reverse=true",
)  # the token claim's order, low to high
PREFETCH = ("last_step", "cross_layer", "oracle")
SUMMED = ("demand_misses", "speculative_transfers", "accesses")
BENCH_RATIO = 1.0  # the timed cell's C/W: the cache holds one mean working set
BENCH_PROMPTS = 2  # prompts per timed run: 3 policies x 5 runs stay well under a minute on cpu
NOTEBOOK = "09_cache_design_space"
(STEM,) = ROW_FILES[NOTEBOOK][1]  # data/results/<profile>/cache_design_runs.csv
CLAIM = CLAIMS["09-eviction"]  # the bench claim (criteria/timing.py): the best eviction over lru, faster


def label(spec: str) -> str:
    """'demand+token_lru' -> 'token_lru'; 'demand' -> 'lru'."""
    return "lru" if spec == "demand" else spec.removeprefix("demand+")


def eviction_sweep(ts, P: Settings) -> pd.DataFrame:
    """Every eviction (with no prefetch), belady and the bound min per trace x C/W, by phase; exact counts."""
    df = sim.phase_columns(
        sim.sweep(ts, RATIOS, EVICTIONS + FLOORS, by_phase=True, lookahead=P.lookahead, tau=P.tau)
    )
    return df.drop(columns=["trace", "replay_seconds", "misses_vs_lru"], errors="ignore")


def summary(df: pd.DataFrame, by=("batch_size", "cache_ratio")) -> pd.DataFrame:
    """Misses pooled over traces per counting basis (column `prefill`, sim.by_basis: 'excluded' = denoising
    steps only, 'included' = all demands) x `by` x policy: against LRU, min's misses at the same keys
    (min_misses) and the share of LRU's gap to them each policy closes (gap_closed)."""
    g, keys = sim.by_basis(df, by, SUMMED), ["prefill", *by]
    floor = g[g.policy == "min"].set_index(keys).demand_misses
    g["min_misses"] = [floor.get(tuple(k), np.nan) for k in g[keys].itertuples(index=False)]
    g["gap_closed"] = (g.lru_misses - g.demand_misses) / (g.lru_misses - g.min_misses)
    g["eviction"] = g.policy.map(label)
    return g


def phase_table(df: pd.DataFrame) -> pd.DataFrame:
    """Misses relative to LRU per phase (prefill, first, later), pooled over traces and C/W."""
    d = df[df.policy.isin(EVICTIONS)].groupby("policy")[[f"demand_misses_{ph}" for ph in sim.PHASES]].sum()
    out = (d / d.loc["demand"]).set_axis(sim.PHASES, axis=1)
    return out.set_axis([label(p) for p in out.index]).round(3)


def best_eviction(s: pd.DataFrame) -> str:
    """The eviction spec with the fewest misses pooled over every batch size and C/W, on the basis the claims
    rule on (sim.ruling_basis)."""
    s = s[s.prefill == sim.ruling_basis(s)]
    return str(s[s.policy.isin(EVICTIONS[1:])].groupby("policy").demand_misses.sum().idxmin())


def combined(ts, P: Settings, best: str) -> pd.DataFrame:
    """Each prefetcher with LRU and with the best eviction: misses and transfers per C/W, pooled over all
    demands (a figure panel, no claim)."""
    ev, cross = best.partition("+")[2], all(t.has_predictions for t in ts)  # cross_layer needs predictions
    specs = ["demand", best] + [p for q in PREFETCH if cross or q != "cross_layer" for p in (q, f"{q}+{ev}")]
    df = sim.sweep(ts, RATIOS, specs, lookahead=P.lookahead, tau=P.tau)
    g = df.groupby(["cache_ratio", "policy"])[["demand_misses", "speculative_transfers"]].sum().reset_index()
    return sim.relative_to_lru(g, ["cache_ratio"])


def libcachesim_check(ts, ratios=(0.43, 1.0, 1.73)) -> pd.DataFrame:
    """libCacheSim's LRU on the hits-first feed vs `demand`, per trace and C/W: requests and disagreements.
    Empty when libcachesim is not installed (it is a dev dependency)."""
    try:
        import libcachesim as lcs
    except ImportError:
        return pd.DataFrame()
    from artifact.offload.replay.export import request_streams

    rows = []
    req = lcs.Request()
    req.obj_size = 1
    for t in ts:
        W = mean_working_set(t)
        for r in ratios:
            C = sim.capacity_for(r, W, t.meta["num_experts"])
            ours, theirs = [], []  # hit or not per request: `demand`'s replay, libCacheSim's LRU
            for s in request_streams(t, "demand", C).values():
                cache = lcs.LRU(C)
                for o in s["obj_id"].tolist():
                    req.obj_id = o
                    theirs.append(cache.get(req))
                ours += s["hit"].tolist()
            ours, theirs = np.array(ours, bool), np.array(theirs, bool)
            rows.append(
                {
                    **trace_label(t),
                    "cache_ratio": r,
                    "cache_experts": C,
                    "requests": len(ours),
                    "demand_misses": int((~ours).sum()),
                    "libcachesim_lru_misses": int((~theirs).sum()),
                    "requests_that_differ": int((ours != theirs).sum()),
                }
            )
    return pd.DataFrame(rows)


# --- throughput ---------------------------------------------------------------------------------
def bench_profile(P: Settings, best: str) -> Settings:
    """The 09 bench: lru (`demand`) vs the best eviction with last_step_conservative (settings.CONTROL), one
    cell (the first task, batch size 1, C/W BENCH_RATIO, at most BENCH_PROMPTS prompts), one warm-up run of
    each policy and enough repetitions for thresholds.MIN_PAIRS pairs."""
    return dataclasses.replace(
        P,
        tasks=P.tasks[:1],
        batch_sizes=(1,),
        cache_ratios=(BENCH_RATIO,),
        bandwidth_scales=(1.0,),
        policies=("demand", best, CONTROL),
        n_prompts=min(P.n_prompts, BENCH_PROMPTS),
        repetitions=max(P.repetitions, thresholds.MIN_PAIRS),
        warmup=1,
    )


def measure_bench(P: Settings, best: str, progress: bool = True) -> pd.DataFrame:
    return run_grid(bench_profile(P, best), STEM, progress=progress)


def measure(P: Settings, progress: bool = True) -> pd.DataFrame:
    """What a stored run keeps of notebook 09 (stored_runs.TIMED_STUDIES): the bench of the best eviction."""
    return measure_bench(P, best_eviction(summary(eviction_sweep(traces(P, progress=progress), P))), progress)


def bench_replicas(P: Settings, best: str, rows: pd.DataFrame) -> Replicas:
    """The bench's rows with the stored runs' rows of the same grid and settings (verdicts/pooling.py)."""
    return gather(P, rows, NOTEBOOK, bench_fingerprint(bench_profile(P, best)))


def bench_verdict(reps: Replicas, best: str) -> Claim:
    """The best eviction (`best`) over lru, tokens/s per cell with the A/A; beside it, the demand misses of
    this run's timed runs (arm A: one demand run per repetition)."""
    m = primary(reps.rows).groupby("policy").demand_misses.sum().astype(int)
    t = judge(merge_others({best: claim_parts(reps, CLAIM)[best]}), CLAIM, lambda k: cell_label(k[1]))
    return timed_claim(
        CLAIM.key,
        t,
        f"tokens/s per run, {label(best)} over lru % per pair, one interval per cell",
        note=f"demand misses over this run's timed runs: lru {m['demand']}, {label(best)} {m[best]}",
        best=label(best),
        ratio=BENCH_RATIO,
    )


def stored_claims(P: Settings) -> list[Claim]:
    """The bench's timing claim as a `--store` run rules it on the stored runs, from the committed rows alone
    (tests/test_stored_runs.py); the best eviction: the one policy timed beside lru and CONTROL."""
    names = {p for _, rows in stored_rows(P, STEM) for p in set(rows.policy)} - {"demand", CONTROL}
    if len(names) != 1:
        raise RunsError(f"the stored {STEM} rows time {sorted(names)} beside lru: expected one best eviction")
    best = names.pop()
    return [bench_verdict(bench_replicas(P, best, None).last_stored(), best)]


# --- verdicts -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Counts:
    """The exact counts of one counting basis (sim.BASES)."""

    removed: dict  # eviction label -> max over (batch, C/W) of misses removed beyond LRU / LRU's; most first
    best: str  # best eviction spec (fewest pooled misses)
    gap_closed: dict  # C/W (and "pooled") -> share of LRU's gap to min the best eviction closes
    token: dict  # label of each TOKEN spec -> pooled exact demand misses


def counts(s: pd.DataFrame) -> Counts:
    """Counts of one basis: `s` is a summary's rows of that basis."""
    ev = s[s.policy.isin(EVICTIONS)]
    removed = {label(p): float((1 - g.misses_vs_lru).max()) for p, g in ev.groupby("policy")}
    removed = dict(sorted(removed.items(), key=lambda kv: -kv[1]))  # the most removed first
    best = best_eviction(s)
    b = s[s.policy == best].groupby("cache_ratio").sum(numeric_only=True, min_count=1)  # over batch sizes
    closed, gap = b.lru_misses - b.demand_misses, b.lru_misses - b.min_misses
    gap_closed = {**(closed / gap).to_dict(), "pooled": float(closed.sum() / gap.sum())}
    tot = ev.groupby("policy").demand_misses.sum()
    return Counts(removed, best, gap_closed, {label(p): int(tot[p]) for p in TOKEN})


@dataclasses.dataclass(frozen=True)
class Numbers:
    basis: str  # the counting basis the count claims rule on (sim.ruling_basis)
    by_prefill: dict  # counting basis -> Counts
    check: pd.DataFrame  # the libCacheSim table

    # the counts on the basis the count claims rule on
    removed, best, gap_closed, token = (on_basis(f) for f in ("removed", "best", "gap_closed", "token"))


def numbers(s: pd.DataFrame, check: pd.DataFrame) -> Numbers:
    return Numbers(sim.ruling_basis(s), {p: counts(g) for p, g in s.groupby("prefill", sort=False)}, check)


def verdicts(n: Numbers) -> list[Claim]:
    claims = [eviction_claim(n), gap_claim(n), token_claim(n)]
    if len(n.check):
        claims.append(libcachesim_claim(n.check))
    return claims


def eviction_claim(n: Numbers) -> Claim:
    """Some eviction removes more than EVICTION_GAIN of LRU's demand misses."""
    (top, most), gain = next(iter(n.removed.items())), thresholds.EVICTION_GAIN
    return stated_on_bases(
        "09-evictions",
        "largest share removed per eviction: " + ", ".join(f"{k} {v:+.1%}" for k, v in n.removed.items()),
        n.by_prefill,
        n.basis,
        lambda c: max(c.removed.values()) > gain,
        lambda c: "the best, {}, removes {:.1%}".format(*next(iter(c.removed.items()))),
        reason="" if most > gain else f"the best, {top}, removes {most:.1%}",
        margin=f"best ({top}): " + margin_below(most, gain),
    )


def gap_claim(n: Numbers) -> Claim:
    """The best eviction closes less than GAP_LEFT of LRU's gap to min."""
    per = {r: v for r, v in n.gap_closed.items() if r != "pooled"}
    return stated_on_bases(
        "09-gap",
        f"share of the gap closed: pooled {n.gap_closed['pooled']:.0%}; "
        + ", ".join(f"C/W {r:g}: {v:.0%}" for r, v in sorted(per.items())),
        n.by_prefill,
        n.basis,
        lambda c: c.gap_closed["pooled"] < thresholds.GAP_LEFT,
        lambda c: f"{label(c.best)} closes {c.gap_closed['pooled']:.0%}",
        fill={"best": label(n.best)},
        margin="pooled: " + margin_below(n.gap_closed["pooled"], thresholds.GAP_LEFT),
    )


def token_claim(n: Numbers) -> Claim:
    """token_lru has fewer demand misses than lru, and its reverse more."""
    lru, tok, rev = (n.token[label(p)] for p in TOKEN)
    return stated_on_bases(
        "09-tokens",
        f"demand misses: lru {lru}, token_lru {tok} ({tok / lru - 1:+.1%}), token_lru reversed {rev} "
        f"({rev / lru - 1:+.1%})" + ("" if tok < lru else "; token_lru is NOT lower than lru"),
        n.by_prefill,
        n.basis,
        lambda c: c.token["token_lru"] < c.token["lru"] < c.token["token_lru:reverse=true"],
        lambda c: "lru {}, token_lru {}, reversed {}".format(*(c.token[label(p)] for p in TOKEN)),
        margin="exact: the order holds or not",
    )


def libcachesim_claim(check: pd.DataFrame) -> Claim:
    """libCacheSim's LRU equals the demand policy on every request (the libcachesim_check table)."""
    differ = int(check.requests_that_differ.sum())
    return stated(
        "09-libcachesim",
        f"{differ} of {int(check.requests.sum())} requests differ over {len(check)} trace x C/W pairs",
        verdict_of(differ == 0),
        margin="exact: equal or not",
        counting="every request of every layer",
        interval=EXACT,
    )


# --- figure ---------------------------------------------------------------------------------------
def plot(s: pd.DataFrame, comb: pd.DataFrame, P: Settings):
    """(a, b) one heatmap per batch size: demand misses (% of LRU's) per eviction (rows, the floors belady and
    min last) and C/W (columns), values printed; blue = fewer than LRU, red = more, one colour scale spanned
    by the evictions; drawn on the ruling basis (sim.ruling_basis), the saved data holds both. (c) each
    prefetcher's demand misses + transfers (% of LRU's misses), with lru and with the best eviction."""
    basis = sim.ruling_basis(s)
    drawn = s[s.prefill == basis]
    batches = sorted(drawn.batch_size.dropna().unique())
    fig, axes = plt.subplots(
        1,
        len(batches) + 1,
        figsize=(4.6 * (len(batches) + 1) + 1, 5.2),
        layout="constrained",
        width_ratios=[1] * len(batches) + [1.25],
    )
    grids = [_eviction_grid(drawn[drawn.batch_size == b]) for b in batches]
    # one colour scale for both, spanned by the evictions (the floors, far below, saturate; values printed)
    span = max([float(np.nanmax(np.abs(g.to_numpy()[: len(EVICTIONS)] - 100))) for g in grids] + [5.0])
    for k, (ax, b, grid) in enumerate(zip(axes, batches, grids)):
        last = k == len(batches) - 1
        sns.heatmap(
            grid,
            ax=ax,
            cmap="vlag",
            center=100,
            vmin=100 - span,
            vmax=100 + span,
            annot=True,
            fmt=".0f",
            annot_kws={"fontsize": 8},
            linewidths=0.4,
            cbar=last,
            cbar_kws={"label": "demand misses (% of LRU's; blue: fewer)"} if last else None,
        )
        ax.axhline(len(EVICTIONS), color="black", lw=2)  # the floors below it
        ax.set(
            xlabel="cache capacity C/W",
            ylabel="eviction policy (floors below the line)" if k == 0 else "",
            title=f"batch {int(b)}, exact replay, {BASIS_SHORT[basis]}",
        )
        ax.tick_params(axis="y", rotation=0, labelsize=8)
        if k:
            ax.set_yticklabels([])
    ax = axes[-1]  # (c)
    for pol, h in comb.groupby("policy", sort=False):  # with the best eviction: its prefetcher's look, paler
        ax.plot(h.cache_ratio, 100 * h.transfers_vs_lru, ms=4, label=pol, **style(pol))
    ax.axhline(100, color="gray", lw=0.8, ls=":")
    ax.set(
        xlabel="cache capacity C/W",
        ylabel="transfers: demand misses + prefetches\n(% of LRU's demand misses)",
        title="prefetching with lru vs the best eviction, all demands",
    )
    ax.legend(fontsize=8, loc="upper left", title="prefetch (+ eviction)", title_fontsize=8)
    for ax in axes:
        ax.title.set_fontsize(10)
    title(fig, P, "09 the cache's own design space (this artifact's own results)")
    df = pd.concat([s.assign(panel="evictions"), comb.assign(panel="prefetch")], ignore_index=True)
    return fig, df


def _eviction_grid(g: pd.DataFrame) -> pd.DataFrame:
    """One batch size's demand misses (% of LRU's): a row per eviction then per floor, a column per C/W."""
    rows = [*EVICTIONS, *FLOORS]
    grid = (100 * g.pivot_table(index="policy", columns="cache_ratio", values="misses_vs_lru")).reindex(rows)
    grid.index = [label(p) + (" (floor)" if p in FLOORS else "") for p in rows]
    grid.columns = [f"{c:g}" for c in grid.columns]
    return grid
