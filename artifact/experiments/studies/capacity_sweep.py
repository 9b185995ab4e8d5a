"""04 capacity sweep: demand-async vs async last-step prefetch end to end over the profile's grid (tasks x
batch sizes x C/W), paired by repetition. Both claims (criteria/timing.py) rule on demand over last_step per
cell, gated by the A/A (verdicts/): direction at C/W 0.83-1.73 (every interval above 0), equivalence at 0.43
(inside +-3%). last_step_conservative over demand (host time, no transfers) is a decomposition beside
demand's own A/A pair, else the stand-in A/A."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments.bench.order import AA
from artifact.experiments.bench.results import bench_fingerprint, same_tokens
from artifact.experiments.counting import EXACT, PER_RUN
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.criteria.claims import ROW_FILES
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.harness import run_grid
from artifact.experiments.outputs.figures import (
    CONTROL_COLOR,
    INTERVAL_BASIS,
    figure_legend,
    interval_fields,
    interval_limits,
    mark_clipped,
    mark_margin,
    mark_paper_04,
    mark_zero,
    style,
    title,
)
from artifact.experiments.paired_table import CELL_KEYS, cell_label, paired_table
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.verdicts.judge import claim_cells, claim_compared, judge, timed_claim
from artifact.experiments.verdicts.pooling import Compared, Replicas, gather
from artifact.experiments.verdicts.records import Claim, stated, verdict_of

NOTEBOOK = "04_capacity_sweep"
(STEM,) = ROW_FILES[NOTEBOOK][1]  # data/results/<profile>/bench.csv, also `python -m artifact bench`'s
FASTER_CLAIM, EQUAL_CLAIM = CLAIMS["04-faster"], CLAIMS["04-equal"]  # criteria/timing.py
CELL = list(CELL_KEYS)  # one interval per cell (bench.grid.CellKey): nothing pooled


def measure(P: Settings, progress: bool = True) -> pd.DataFrame:
    return run_grid(P, STEM, progress=progress)


def replicas(P: Settings, rows) -> Replicas:
    """This run's rows with the stored runs' rows of the same grid (verdicts/pooling.py)."""
    return gather(P, rows, NOTEBOOK, bench_fingerprint(P))


def tables(rows) -> pd.DataFrame:
    """demand vs last_step within this run, one row per cell (task, batch size, C/W), with the paper's figure
    where criteria/paper.py gives one (paper.demand_vs_last_step)."""
    t = paired_table(rows, "demand", "last_step", CELL)
    t.attrs.update(a="demand", b="last_step")
    return t


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    same_cells: int  # cells where every policy and repetition decoded the same tokens ...
    cells: int  # ... of all cells
    timed: Compared  # {cell: Replicated} demand over last_step, tokens/s, with the A/A and host shares
    decomposition: Compared | None = None  # last_step_conservative over demand, when the A/A is demand's own


def numbers(reps: Replicas) -> Numbers:
    n_same, n_cells = same_tokens(reps.rows)
    timed = claim_compared(reps, FASTER_CLAIM)
    own = timed.aa_label == AA and CONTROL in set(reps.rows.policy)  # the A/A is demand's own pair
    return Numbers(n_same, n_cells, timed, reps.compare(CONTROL, "demand", CELL) if own else None)


def cells_table(n: Numbers) -> pd.DataFrame:
    """Per cell: demand over last_step as ruled (% tokens/s, 95% interval), runs pooled, the A/A interval."""
    aa = n.timed.aa
    out = [
        dict(
            zip(CELL, k),
            effect=r.ruled.mean,
            low=r.ruled.low,
            high=r.ruled.high,
            over=r.ruled.unit,
            runs=r.n_runs,
            aa_low=aa[k].ruled.low if aa.get(k) else None,
            aa_high=aa[k].ruled.high if aa.get(k) else None,
        )
        for k, r in n.timed.effects.items()
    ]
    return pd.DataFrame(out).round(2)


def verdicts(n: Numbers) -> list[Claim]:
    counting = "tokens/s per run, demand over last_step % per pair, one interval per cell (task, batch, C/W)"
    claims = [
        stated(
            "04-exact",
            f"{n.same_cells} of {n.cells} cells identical",
            verdict_of(n.same_cells == n.cells),
            counting=PER_RUN,
            interval=EXACT,
            margin=f"{n.cells - n.same_cells} cells differ",
        )
    ]
    for c in (FASTER_CLAIM, EQUAL_CLAIM):
        if claim_cells(n.timed, c).effects:
            claims.append(timed_claim(c.key, judge(n.timed, c, cell_label), counting))
    return claims


def stored_claims(P: Settings) -> list[Claim]:
    """The timing claims as `--store` rules them, from committed rows alone (tests/test_stored_runs.py)."""
    return [c for c in verdicts(numbers(replicas(P, None).last_stored())) if c.timing]


# --- figure ---------------------------------------------------------------------------------------
EFFECT = "demand over last_step"
SPLIT = f"{CONTROL} over demand (host time only)"  # its prediction runs; it never transfers


def plot(n: Numbers, P: Settings):
    """A column per batch size (x: C/W), a row per series, each point a cell with the 95% interval it is ruled
    on: demand over last_step (% tokens/s) with the abstract's figures (outputs/figures.mark_paper_04) and the
    +-3% margin; the A/A, inside +-3% (the gate); the decomposition. Beside a fresh run's interval, hollow,
    the stored runs' pooled one; an interval past the y axis ends in an arrow, its end printed."""
    series = (
        (EFFECT, n.timed.effects, style("last_step")["color"]),
        (n.timed.aa_label or "A/A", n.timed.aa, CONTROL_COLOR),
        (SPLIT, n.decomposition.effects if n.decomposition else {}, style(CONTROL)["color"]),
    )
    series = [s for s in series if s[1]]
    batches = sorted({k.batch_size for k in n.timed.effects})
    fig, axes = plt.subplots(
        max(len(series), 1),
        max(len(batches), 1),
        figsize=(4.2 * len(batches) + 1, 7.6),
        sharex=True,
        sharey="row",
        squeeze=False,
        layout="constrained",
    )
    one = next(iter(n.timed.effects.values()), None)  # what every panel's intervals are over
    rows, drawn = [], []
    for r, (name, src, color) in enumerate(series):
        keep, ends = [0.0, -thresholds.MARGIN, thresholds.MARGIN], []
        for c, b in enumerate(batches):
            ax = axes[r, c]
            keys = sorted(k for k in src if k.batch_size == b)
            x, ruled, data = _draw_intervals(ax, name, keys, src, color, one, keep, ends)
            drawn.append((ax, x, ruled, color))
            rows += data
            if name == EFFECT:
                keep += mark_paper_04(ax)
            if name != SPLIT:
                margin = f"the equivalence margin (C/W {paper.AT_LOW.cache_ratio:g}; the A/A gate)"
                mark_margin(ax, margin)
            mark_zero(ax)
            ax.set_title(f"{name}, b={b}", fontsize=9)
            if c == 0:
                ax.set_ylabel("% tokens/s")
            if r == len(series) - 1:
                ax.set_xlabel("cache capacity C/W")
        axes[r, 0].set_ylim(*interval_limits(keep, ends))
    for ax, x, ruled, color in drawn:  # once every limit is set
        mark_clipped(ax, x, [i.low for i in ruled], [i.high for i in ruled], color)
    figure_legend(fig, ncol=2)
    title(fig, P, "04 capacity sweep: demand vs last_step per cell")
    return fig, pd.DataFrame(rows)


def _errorbar(ax, x: list, iv: list, color, label: str, **kw) -> None:
    """Intervals (mean, low, high) at x: a dot at the mean, a bar over the interval."""
    yerr = [[i.mean - i.low for i in iv], [i.high - i.mean for i in iv]]
    ax.errorbar(x, [i.mean for i in iv], yerr=yerr, fmt="o", capsize=3, ms=4, color=color, label=label, **kw)


def _draw_intervals(ax, name: str, keys: list, src: dict, color, one, keep: list, ends: list):
    """One panel's ruled intervals and, for a fresh run (as `one`, the first cell's effect, says), the stored
    runs' pooled ones beside them; adds to `keep` the values the y axis is scaled to, to `ends` those it may
    clip. Returns the ruled ones' x, the ruled ones and the figure data."""
    unit = one.ruled.unit if one else "runs"
    beside = one is not None and one.pooled is not None and one.this is not None  # a fresh run beside stored
    if unit == "runs":
        ruled_label = f"95% interval {INTERVAL_BASIS['runs']} ({one.ruled.n} stored runs)"
    else:
        ruled_label = f"the fresh run, 95% interval as ruled ({INTERVAL_BASIS[unit]})"
    dx = 0.025 if beside else 0.0  # the ruled intervals' shift left of the C/W, the pooled ones' right
    ruled, pooled = [src[k].ruled for k in keys], [src[k].pooled for k in keys]
    x = [k.cache_ratio - dx for k in keys]
    _errorbar(ax, x, ruled, color, ruled_label)
    keep += [i.mean for i in ruled]
    bounds = [v for i in ruled for v in (i.low, i.high)]
    if beside:
        have = [(k.cache_ratio + dx, p) for k, p in zip(keys, pooled) if p is not None]
        pooled_label = f"the {one.pooled.n} stored runs, 95% interval {INTERVAL_BASIS['runs']}"
        _errorbar(ax, [xp for xp, _ in have], [p for _, p in have], color, pooled_label, mfc="white")
        keep += [v for _, p in have for v in (p.low, p.high)]
        ends += bounds
    else:
        (keep if unit == "runs" else ends).extend(bounds)
    data = [
        dict(
            series=name,
            task=k.task,
            batch_size=k.batch_size,
            cache_ratio=k.cache_ratio,
            **interval_fields(i),
            pooled_diff_pct=p.mean if p else None,
            pooled_low=p.low if p else None,
            pooled_high=p.high if p else None,
            pooled_n=p.n if p else None,
        )
        for k, i, p in zip(keys, ruled, pooled)
    ]
    return x, ruled, data
