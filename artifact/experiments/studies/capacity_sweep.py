"""04 capacity sweep: demand-async vs async last-step prefetch end to end over the profile's grid (tasks x
batch sizes x C/W), paired by repetition, with 95% intervals; the grid's A/A control (settings.CONTROL against
demand, identical work) gates every C/W's verdict."""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments.bench.results import bench_fingerprint, same_tokens
from artifact.experiments.claims import EXACT, PER_RUN, Claim, judged
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.harness import run_grid
from artifact.experiments.outputs.figures import AA_LABEL, COLORS, CONTROL_COLOR, INTERVAL_BASIS, PAPER_STYLE, title
from artifact.experiments.replication import Compared, Replicas, gather, judge, timed_claim
from artifact.experiments.rules import faster, no_difference
from artifact.experiments.settings import Settings
from artifact.experiments.stats import CELL_KEYS, paired_table

STEM = "bench"      # data/results/<profile>/bench.csv, the same file `python -m artifact bench` writes
CELL = list(CELL_KEYS)      # one interval per cell (stats.CellKey): nothing pooled


def measure(P: Settings, progress: bool = True) -> pd.DataFrame:
    return run_grid(P, STEM, progress=progress)


def replicas(P: Settings, rows) -> Replicas:
    """This run's rows with the stored runs' rows of the same grid (replication.py)."""
    return gather(P, rows, STEM, bench_fingerprint(P))


def tables(rows) -> pd.DataFrame:
    """demand vs last_step within this run, one row per cell (task, batch size, C/W), with the paper's figure."""
    t = paired_table(rows, "demand", "last_step", CELL)
    t.attrs.update(a="demand", b="last_step")
    return t


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    same_cells: int              # cells where every policy and repetition decoded the same tokens ...
    cells: int                   # ... of all cells
    timed: Compared              # {cell: Replicated} demand over last_step, tokens/s, with the A/A control and host


def numbers(reps: Replicas) -> Numbers:
    rows = reps.this
    n_same, n_cells = same_tokens(rows)
    return Numbers(n_same, n_cells, reps.compare("demand", "last_step", CELL))


def label(key) -> str:
    task, b, ratio, scale = key
    return f"C/W {ratio:g} b={b}" + (f" {task}" if task != "gsm8k" else "") + (f" x{scale:g}" if scale != 1 else "")


def verdicts(n: Numbers) -> list[Claim]:
    lo, hi = paper.FASTER_RANGE
    counting = "tokens/s per run, demand over last_step % per pair, one interval per cell (task, batch, C/W)"
    claims = [Claim("offloading changes time, never results: every policy decoded the same tokens in every cell",
                    "the engine is exact (design invariant)", f"{n.same_cells} of {n.cells} cells identical",
                    judged(n.same_cells == n.cells), counting=PER_RUN, interval=EXACT,
                    margin=f"{n.cells - n.same_cells} cells differ")]
    in_range = n.timed.where(lambda k: lo <= k.cache_ratio <= hi)
    if in_range.effects:
        q = faster(paper=paper.FASTER_PCT)
        t = judge(in_range, q, label)
        claims.append(timed_claim(
            f"demand-async is faster than async last-step prefetch at C/W {lo:g}-{hi:g}: {q.text()} net of the "
            "A/A control, in every cell",
            f"+{paper.FASTER_PCT[0]} to +{paper.FASTER_PCT[1]}%, CIs exclude zero", t, counting))
    at_low = n.timed.where(lambda k: k.cache_ratio == paper.AT_LOW.cache_ratio)
    if at_low.effects:
        q = no_difference()
        t = judge(at_low, q, label)
        claims.append(timed_claim(
            f"at C/W {paper.AT_LOW.cache_ratio:g} demand-async and async last-step prefetch do not differ: "
            f"{q.text()} (equivalence)", paper.paired_text(paper.AT_LOW, "%"), t, counting))
    return claims


def stored_claims(P: Settings) -> list[Claim]:
    """The timing claims as a `--store` run of the stored runs' last one rules them, from the committed rows
    alone (tests/test_stored_runs.py recomputes the committed record with it)."""
    return [c for c in verdicts(numbers(replicas(P, None).last_stored())) if c.timing]


# --- figure ---------------------------------------------------------------------------------------
NET = "demand over last_step, net of the A/A control"


def plot(n: Numbers, P: Settings):
    """demand over last_step (% tokens/s) vs C/W, one point per cell (batch sizes side by side) with its interval,
    the A/A control in its own colour with its interval, and, at the C/W the direction claim rules (the paper's
    range), the effect net of the control (hollow: the difference in differences that claim is ruled on; the
    C/W 0.43 equivalence claim rules on the filled point, gated by the control); the paper's figures marked."""
    fig, ax = plt.subplots(figsize=(9, 4))
    batches = sorted({k.batch_size for k in n.timed.effects})
    width = 0.025
    rows = []
    lo, hi = paper.FASTER_RANGE
    net = {k: v for k, v in n.timed.net.items() if lo <= k.cache_ratio <= hi}
    for j, b in enumerate(batches):
        off = (j - (len(batches) - 1) / 2) * width
        for name, src, color, dx, hollow in (("demand over last_step", n.timed.effects, COLORS["demand"], 0.0, False),
                                             (NET, net, COLORS["demand"], -width / 2, True),
                                             (AA_LABEL, n.timed.control, CONTROL_COLOR, width / 2, False)):
            keys = sorted(k for k in src if k.batch_size == b)
            if not keys:
                continue
            iv = [src[k].ruled for k in keys]
            x = [k.cache_ratio + off + dx for k in keys]
            ax.errorbar(x, [i.mean for i in iv], yerr=[[i.mean - i.low for i in iv], [i.high - i.mean for i in iv]],
                        fmt="o" if j == 0 else "s", capsize=3, color=color, ms=4,
                        mfc="none" if hollow else color,
                        label=f"{name}, b={b}")
            rows += [dict(series=name, task=k.task, batch_size=k.batch_size, cache_ratio=k.cache_ratio,
                          diff_pct=i.mean, low=i.low, high=i.high, interval=i.unit, n=i.n) for k, i in zip(keys, iv)]
    ax.fill_between([lo, hi], *paper.FASTER_PCT, color=PAPER_STYLE["color"], alpha=0.15,
                    label=f"paper: +{paper.FASTER_PCT[0]}..+{paper.FASTER_PCT[1]}% at C/W {lo}-{hi}")
    low = paper.AT_LOW
    ax.errorbar([low.cache_ratio], [low.diff_pct], yerr=[[low.diff_pct - low.ci_low], [low.ci_high - low.diff_pct]],
                fmt="D", color=PAPER_STYLE["color"], capsize=4, label=f"paper: {paper.paired_text(low, '%')}")
    ax.axhspan(-thresholds.MARGIN, thresholds.MARGIN, color="gray", alpha=0.12,
               label=f"+-{thresholds.MARGIN:g}% (equivalence margin)")
    ax.axhline(0, color="black", lw=1, ls=":")
    any_iv = next(iter(n.timed.effects.values()), None)
    basis = INTERVAL_BASIS[any_iv.ruled.unit] if any_iv else ""
    ax.set(xlabel="cache capacity C/W", ylabel="A over B (% tokens/s)",
           title=f"demand vs last_step per cell, 95% intervals ({basis})")
    ax.title.set_fontsize(10)
    fig.legend(fontsize=7, loc="outside right upper")
    title(fig, P, "04 capacity sweep")
    return fig, pd.DataFrame(rows)
