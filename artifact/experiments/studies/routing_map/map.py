"""07 routing map, the map (built as routing_map/__init__.py says): the replayed grid, the cpu traces placed
on it, the abstract's oracle cut as a contour; its numbers, verdicts and figure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from scipy.interpolate import RegularGridInterpolator
from tqdm.auto import tqdm

from artifact.experiments.counting import EXACT
from artifact.experiments.criteria import paper
from artifact.experiments.outputs.figures import PAPER_STYLE, title
from artifact.experiments.settings import Settings
from artifact.experiments.verdicts.records import NOT_MEASURABLE, Claim, stated, verdict_of
from artifact.offload.replay.bounds import relaxed_min
from artifact.offload.replay.fit import measure as routing_statistics
from artifact.offload.replay.sim import capacity_for, denoising_only, phase_columns, replay, sweep
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.replay.trace import Trace, mean_working_set

POLICIES = ("last_step", "oracle", "min")  # each against LRU ('demand') at the same C


@dataclass(frozen=True)
class MapGrid:
    """How much of the map a profile computes (the grid, the streams' length, the timed repetitions)."""

    novelty: tuple[float, ...]  # nu: share of D(t, l) not in D(t-1, l)
    spread: tuple[float, ...]  # relative sd of W around its profile
    ratios: tuple[float, ...]  # C/W; the first is the W-scale cache (C/W 1: this artifact's choice)
    layers: int  # MoE layers of a map stream (fewer than LLaDA2.0-mini's 19: run time)
    blocks: int
    steps: int
    seed: int = 0
    stream_layers: int = 4  # MoE layers of the timed streams (the tiny model's, whose compute is calibrated)
    stream_steps: int = 16  # steps of a block in the timed streams (through the engine, in real time)
    repetitions: int = 4  # timed pairs per stream (at least thresholds.MIN_PAIRS: the interval rule)


# Grids by profile name (others get DEFAULT_GRID). cpu: 50 streams of ~13k accesses replayed eight times each;
# it times 2 streams x 3 policies (demand, last_step, the stand-in CONTROL) x (1 warm-up + 4 timed rounds).
GRIDS = {
    "cpu": MapGrid(
        novelty=(0.02, 0.06, 0.12, 0.2, 0.3),
        spread=(0.0, 0.05, 0.1, 0.25, 0.5),
        ratios=(1.0, 1.73),
        layers=6,
        blocks=1,
        steps=32,
    )
}
DEFAULT_GRID = MapGrid(
    novelty=(0.02, 0.04, 0.08, 0.12, 0.16, 0.2, 0.3),
    spread=(0.0, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5),
    ratios=(1.0, 1.73),
    layers=19,
    blocks=2,
    steps=32,
    stream_layers=19,
    stream_steps=32,
    repetitions=5,
)


def grid_for(P: Settings) -> MapGrid:
    return GRIDS.get(P.name, DEFAULT_GRID)


def trace_fits(ts: list[Trace], ratio: float = 1.0) -> pd.DataFrame:
    """One row per trace: its fitted statistics (fit.measure) and its own replayed LRU / oracle cut over its
    denoising steps (sim.denoising_only: the basis of the map's no-prefill rows, which the claims rule on)."""
    rows = []
    for t in ts:
        m = routing_statistics(t)
        swept = phase_columns(sweep([t], [ratio], ["demand", "oracle"], by_phase=True))
        misses = denoising_only(swept, ["demand_misses"]).set_index("policy").demand_misses
        lru, oracle = int(misses["demand"]), int(misses["oracle"])
        rows.append(
            {
                "task": t.meta.get("task"),
                "batch_size": int(t.meta.get("batch_size")),
                "w": m["w"],
                "novelty": m["novelty"],
                "w_spread": m["w_spread"],
                "w_cv_total": m["measured"]["w_cv_total"],
                "w_persistence": m["w_persistence"],
                "prefill": m["prefill"],
                "cache_ratio": ratio,
                "trace_oracle_cut": lru / oracle if oracle else float("inf"),
            }
        )
    return pd.DataFrame(rows)


def base_params(fits: pd.DataFrame, g: MapGrid) -> SynthParams:
    """The map's base stream (module docstring); its novelty, spread and prefill are set per cell."""
    persistence = float(np.clip(fits.w_persistence.median(), 0.0, 0.95))
    return SynthParams(
        layers=g.layers, blocks=g.blocks, steps=g.steps, seed=g.seed, w_persistence=persistence, prefill=0.0
    )


def prefill_multiple(fits: pd.DataFrame) -> float:
    return float(fits.prefill.median())


def routing_map(base: SynthParams, g: MapGrid, prefill: float, progress: bool = True) -> pd.DataFrame:
    """Every (prefill or not) x nu x spread stream, replayed at each C/W: one row per policy with its
    demand misses, speculative transfers, LRU's misses and cut = LRU misses / the policy's."""
    jobs = [(pf, nu, s) for pf in (0.0, prefill) for nu in g.novelty for s in g.spread]
    rows = []
    for pf, nu, s in tqdm(jobs, desc="routing map", disable=not progress):
        t = synth(dataclasses.replace(base, novelty=nu, w_spread=s, prefill=pf))
        W, E = mean_working_set(t), base.experts
        for r in g.ratios:
            C = capacity_for(r, W, E)
            lru = replay(t, "demand", C)["demand_misses"]
            for p in POLICIES:
                got = relaxed_min(t, C) if p == "min" else replay(t, p, C, lookahead=1)
                m = got["demand_misses"]
                rows.append(
                    {
                        "prefill": pf > 0,
                        "prefill_multiple": pf,
                        "novelty": nu,
                        "w_spread": s,
                        "cache_ratio": r,
                        "policy": p,
                        "working_set": W,
                        "cache_experts": C,
                        "accesses": t.accesses,
                        "lru_misses": lru,
                        "demand_misses": m,
                        "speculative_transfers": got["speculative_transfers"],
                        "cut": lru / m if m else float("inf"),
                    }
                )
    return pd.DataFrame(rows)


def cuts(map_df: pd.DataFrame, policy: str, ratio: float, prefill: bool) -> np.ndarray:
    """(len(novelty), len(spread)) LRU/policy cut, rows by novelty, columns by spread (both ascending)."""
    sel = map_df[(map_df.policy == policy) & (map_df.cache_ratio == ratio) & (map_df.prefill == prefill)]
    table = sel.pivot(index="novelty", columns="w_spread", values="cut")
    return table.sort_index().sort_index(axis=1).to_numpy()


def at_point(map_df, policy: str, ratio: float, prefill: bool, novelty: float, spread: float) -> float:
    """The map's cut at (novelty, spread), interpolated linearly in log(cut), clamped to the grid."""
    nus, ss = np.sort(map_df.novelty.unique()), np.sort(map_df.w_spread.unique())
    f = RegularGridInterpolator((nus, ss), np.log(cuts(map_df, policy, ratio, prefill)))
    return float(np.exp(f([[np.clip(novelty, nus[0], nus[-1]), np.clip(spread, ss[0], ss[-1])]])[0]))


# --- what the abstract's 6.7x implies on the map (this artifact's inference) --------------------------
@dataclass(frozen=True)
class Numbers:
    ratio: float
    target: float  # the oracle cut (abstract: "cuts misses by 6.7x")
    limit: dict  # (prefill, novelty) -> largest grid spread with cut >= target, or None
    # (novelty, spread): at the grid novelty nearest the cpu traces', the spread where the cut falls to the
    # target (no prefill); None if that row never reaches it
    implied: tuple[float, float] | None
    best: tuple[float, float, float]  # (novelty, spread, cut) of the largest no-prefill cut
    cpu_point: tuple[float, float]  # median fitted (novelty, spread) of the cpu traces
    cpu_inside: int  # cpu traces whose map cut (no prefill) reaches the target
    cpu_traces: int
    cpu_map_cut: tuple[float, float]  # (min, max) map cut at the traces' points, no prefill
    cpu_trace_cut: tuple[float, float]  # (min, max) of the traces' own replayed cut
    cpu_ranges: tuple[float, float, float, float]  # novelty min, max, spread min, max


def numbers(map_df: pd.DataFrame, fits: pd.DataFrame) -> Numbers:
    r = float(min(map_df.cache_ratio))
    target = paper.ORACLE_CUT
    nus, ss = np.sort(map_df.novelty.unique()), np.sort(map_df.w_spread.unique())
    limit = {
        (pf, float(nu)): crossing(ss, row, target)
        for pf in (False, True)
        for nu, row in zip(nus, cuts(map_df, "oracle", r, pf))
    }
    c = cuts(map_df, "oracle", r, False)
    cpu = (round(float(fits.novelty.median()), 3), round(float(fits.w_spread.median()), 3))
    # what the cpu routing would need: its novelty (the nearest grid row), the spread that reaches the cut
    row = float(nus[np.argmin(np.abs(nus - cpu[0]))])
    bi, bj = np.unravel_index(np.argmax(c), c.shape)
    at = [
        at_point(map_df, "oracle", r, False, a, b) for a, b in zip(fits.novelty, fits.w_spread, strict=True)
    ]
    return Numbers(
        r,
        target,
        limit,
        (row, limit[(False, row)]) if limit[(False, row)] is not None else None,
        (float(nus[bi]), float(ss[bj]), float(c[bi, bj])),
        cpu,
        int(sum(v >= target for v in at)),
        len(fits),
        (min(at), max(at)),
        (float(fits.trace_oracle_cut.min()), float(fits.trace_oracle_cut.max())),
        tuple(float(f(fits[col])) for col in ("novelty", "w_spread") for f in (np.min, np.max)),
    )


def crossing(spreads: np.ndarray, cut: np.ndarray, target: float) -> float | None:
    """The largest spread whose cut still reaches `target` (linear in log cut between grid cells); None if
    even the smallest spread falls short, the last spread if all reach it."""
    if cut[0] < target:
        return None
    below = np.flatnonzero(cut < target)
    if not len(below):
        return float(spreads[-1])
    j = below[0]
    a, b = np.log(cut[j - 1]), np.log(cut[j])
    return float(spreads[j - 1] + (spreads[j] - spreads[j - 1]) * (a - np.log(target)) / (a - b))


def region_text(n: Numbers, prefill: bool) -> str:
    return "; ".join(
        f"nu {nu:g}: spread <= {lim:.3f}" if lim is not None else f"nu {nu:g}: none"
        for (pf, nu), lim in n.limit.items()
        if pf == prefill
    )


def reading(map_df: pd.DataFrame, n: Numbers) -> str:
    """What the map shows, in this run's numbers (printed by notebook 07)."""
    span = {p: cuts(map_df, p, n.ratio, False) for p in POLICIES}
    orc = span["oracle"]
    where = (
        f"the {n.target}x contour at the cpu traces' novelty lies at spread {n.implied[1]:.3f}, "
        f"the traces at {n.cpu_ranges[2]:.2f}-{n.cpu_ranges[3]:.2f}"
        if n.implied
        else f"no cell at the cpu traces' novelty reaches {n.target}x"
    )
    return (
        f"At C/W {n.ratio:g} without prefill, LRU's misses over each policy's span: "
        + ", ".join(f"{p} {c.min():.2f}-{c.max():.2f}x" for p, c in span.items())
        + f"; the oracle's cut at the smallest spread is {orc[:, 0].min():.1f}-{orc[:, 0].max():.1f}x and at "
        f"the largest {orc[:, -1].min():.1f}-{orc[:, -1].max():.1f}x over novelty; {where}."
    )


def verdicts(n: Numbers) -> list[Claim]:
    """Both claims rule on the map's rows without prefill forwards, where every demand is a denoising step
    (the with-prefill rows are printed beside them, not ruled on). The contour is judged at the cpu traces'
    novelty (the grid row nearest it): does some W spread there reach the paper's cut? It fails when that
    row never does, whatever other rows do."""
    fill = {"target": n.target, "ratio": n.ratio}
    any_region = any(v is not None for (pf, _), v in n.limit.items() if not pf)
    ruled = "synthetic streams without prefill forwards (every demand a denoising step)"
    lo_nu, hi_nu, lo_s, hi_s = n.cpu_ranges
    return [
        stated(
            "07-contour",
            f"by the interpolated contour (linear in log cut between grid cells): cut >= {n.target}x without "
            f"prefill at {region_text(n, False)}; with prefill at {region_text(n, True)}; "
            + (
                f"at the cpu traces' novelty (nu {n.implied[0]:g}) "
                f"it needs a W spread <= {n.implied[1]:.3f} (the cpu traces fit {lo_s:.2f}-{hi_s:.2f})"
                if n.implied
                else "no spread reaches it at the cpu traces' novelty; "
                f"largest cut {n.best[2]:.1f}x at nu {n.best[0]:g}, spread {n.best[1]:g}"
            ),
            verdict_of(n.implied is not None) if any_region else NOT_MEASURABLE,
            fill,
            reason="" if any_region else "no grid cell reaches the paper's cut; widen the grid",
            counting=f"{ruled}; the with-prefill rows printed, not ruled on",
            interval=EXACT,
            margin=(
                f"contour spread limit {n.implied[1]:.3f} at nu {n.implied[0]:g} vs the traces' fitted "
                f"spread {lo_s:.2f}-{hi_s:.2f}"
                if n.implied
                else f"no spread reaches {n.target}x at the traces' novelty; "
                f"largest grid cut {n.best[2]:.2f}x (nu {n.best[0]:g}, spread {n.best[1]:g})"
            ),
        ),
        stated(
            "07-traces",
            f"{n.cpu_inside} of {n.cpu_traces} traces inside; fitted nu {lo_nu:.2f}-{hi_nu:.2f}, spread "
            f"{lo_s:.2f}-{hi_s:.2f}; the map there (interpolated): "
            f"{n.cpu_map_cut[0]:.1f}-{n.cpu_map_cut[1]:.1f}x; "
            f"the traces' own replay (denoising steps): {n.cpu_trace_cut[0]:.1f}-{n.cpu_trace_cut[1]:.1f}x",
            verdict_of(n.cpu_inside == n.cpu_traces),
            fill,
            counting=f"{ruled}, at each cpu trace's fitted point",
            interval=EXACT,
            margin=f"largest map cut at a trace {n.cpu_map_cut[1]:.2f}x vs {n.target}x: "
            f"{n.cpu_map_cut[1] / n.target:.2f} of it",
        ),
    ]


# --- figures --------------------------------------------------------------------------------------
def plot_map(map_df: pd.DataFrame, fits: pd.DataFrame, n: Numbers, P: Settings):
    """Rows: (C/W, prefill or not); columns: LRU misses / policy misses for last_step, oracle, min. The
    paper's oracle cut is the dashed contour, passing under the printed values; the cpu traces are the white
    dots (nu, spread from the fit)."""
    ratios = sorted(map_df.cache_ratio.unique())
    panels = [(r, pf) for r in ratios for pf in (False, True)]
    nus, ss = np.sort(map_df.novelty.unique()), np.sort(map_df.w_spread.unique())
    finite = map_df.cut[np.isfinite(map_df.cut)]
    norm = LogNorm(vmin=max(0.8, float(finite.min())), vmax=float(finite.max()))
    fig, axes = plt.subplots(
        len(panels), len(POLICIES), figsize=(4 * len(POLICIES), 3.2 * len(panels)), layout="constrained"
    )
    xi = np.interp(fits.w_spread, ss, np.arange(len(ss)))
    yi = np.interp(fits.novelty, nus, np.arange(len(nus)))
    for row, (r, pf) in enumerate(panels):
        for col, p in enumerate(POLICIES):
            ax = axes[row, col]
            c = cuts(map_df, p, r, pf)
            im = ax.imshow(c, origin="lower", cmap="viridis", norm=norm, aspect="auto")
            for (i, j), v in np.ndenumerate(c):
                ax.text(
                    j,
                    i,
                    f"{v:.2f}" if v < 2 else f"{v:.1f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if v < np.sqrt(norm.vmin * norm.vmax) else "black",
                    zorder=4,  # over the contour, on a box of the cell's own colour: the value stays readable
                    bbox=dict(boxstyle="square,pad=0.05", fc=im.cmap(norm(v)), ec="none"),
                )
            if p == "oracle" and c.min() < n.target < c.max():  # on the cells' indices, as imshow
                ax.contour(
                    c,
                    levels=[n.target],
                    colors=PAPER_STYLE["color"],
                    linestyles="dashed",
                    linewidths=PAPER_STYLE["lw"],
                )
            ax.scatter(
                xi,
                yi,
                s=14,
                c="white",
                edgecolors="black",
                linewidths=0.5,
                zorder=3,
                label="the cpu traces (their fitted nu and W spread)",
            )
            ax.set_xticks(range(len(ss)), [f"{v:g}" for v in ss], fontsize=8)
            ax.set_yticks(range(len(nus)), [f"{v:g}" for v in nus], fontsize=8)
            ax.set_title(f"LRU / {p}: C/W {r:g}, {'with' if pf else 'no'} prefill", fontsize=9)
            if row == len(panels) - 1:
                ax.set_xlabel("W spread (relative sd)")
            if col == 0:
                ax.set_ylabel("step novelty nu")
    fig.colorbar(im, ax=axes, shrink=0.4, label="LRU's demand misses / the policy's (x)")
    title(
        fig,
        P,
        f"07 routing map: where prediction wins (synthetic streams; dashed: the paper's oracle {n.target}x)",
        legend_columns=1,
    )
    return fig, map_df.copy()
