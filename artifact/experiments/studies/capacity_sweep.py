"""04 capacity sweep: demand-async vs async last-step prefetch end to end over the profile's grid (tasks x
batch sizes x C/W), paired by repetition, with 95% intervals; the grid's A/A control (verdicts.CONTROL against
demand, identical work) gates every C/W's verdict."""
from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments import paper
from artifact.experiments import verdicts as verdict_rules
from artifact.experiments.bench.results import same_tokens
from artifact.experiments.claims import EXACT, NOT_REPRODUCED, PER_RUN, REPRODUCED, Claim, judged, title
from artifact.experiments.runs import run_grid
from artifact.experiments.settings import Settings
from artifact.experiments.stats import paired_table, with_paper
from artifact.experiments.verdicts import METHOD, Interval, combine, controls, controls_text, faster, gated

STEM = "bench"      # data/results/<profile>/bench.csv, the same file `python -m artifact bench` writes


def runs(P: Settings, progress: bool = True) -> pd.DataFrame:
    return run_grid(P, STEM, progress=progress)


def tables(rows) -> tuple[pd.DataFrame, pd.DataFrame]:
    """demand vs last_step, paired per C/W (with the paper's figures), and per (task, batch size)."""
    return (with_paper(paired_table(rows, "demand", "last_step", ["cache_ratio"])),
            paired_table(rows, "demand", "last_step", ["task", "batch_size"]))


# --- verdicts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Numbers:
    same_cells: int              # cells where every policy and repetition decoded the same tokens ...
    cells: int                   # ... of all cells
    in_range: pd.DataFrame       # by_ratio rows at C/W in the paper's faster range
    at_low: pd.Series | None     # the by_ratio row at the paper's low C/W, if measured
    control: dict                # {(C/W,): Interval of the A/A control over demand} (verdicts.controls)
    host: dict = field(default_factory=dict)   # {(C/W,): host share of wall time per forward} (host_shares)


def numbers(by_ratio, rows) -> Numbers:
    n_same, n_cells = same_tokens(rows)
    lo, hi = paper.FASTER_RANGE
    low = by_ratio[by_ratio.cache_ratio == paper.AT_LOW.cache_ratio]
    return Numbers(n_same, n_cells, by_ratio[(by_ratio.cache_ratio >= lo) & (by_ratio.cache_ratio <= hi)],
                   low.iloc[0] if len(low) else None, controls(rows, ["cache_ratio"]),
                   verdict_rules.host_shares(rows, ["cache_ratio"]))


def control_text(n: Numbers, ratios=None) -> str:
    """The A/A control at these C/W (all when None), in one phrase."""
    aa = {k: v for k, v in n.control.items() if ratios is None or k[0] in ratios}
    return controls_text(aa, lambda key: f"C/W {key[0]:g}")


def paired_text(r) -> str:
    return f"C/W {r.cache_ratio:g}: {r.diff_pct:+.1f}% [{r.ci_low:+.1f}, {r.ci_high:+.1f}]"


def verdicts(n: Numbers) -> list[Claim]:
    lo, hi = paper.FASTER_RANGE
    timed = dict(timing=True, counting="tokens/s per run, demand over last_step % per pair", interval=METHOD)
    claims = [Claim("offloading changes time, never results: every policy decoded the same tokens in every cell",
                    "the engine is exact (design invariant)", f"{n.same_cells} of {n.cells} cells identical",
                    judged(n.same_cells == n.cells), counting=PER_RUN, interval=EXACT,
                    margin=f"{n.cells - n.same_cells} cells differ")]
    if len(n.in_range):
        verdict, reason, margin = combine((f"C/W {r.cache_ratio:g}", gated(faster(Interval.of(r), paper.FASTER_PCT),
                                                                            n.control.get((r.cache_ratio,)),
                                                                            n.host.get((r.cache_ratio,))))
                                          for r in n.in_range.itertuples())
        claims.append(Claim(
            f"demand-async is faster than async last-step prefetch at C/W {lo:g}-{hi:g} (95% CIs exclude zero)",
            f"+{paper.FASTER_PCT[0]} to +{paper.FASTER_PCT[1]}%, CIs exclude zero",
            "; ".join(paired_text(r) for r in n.in_range.itertuples())
            + f" ({int(n.in_range.n_pairs.min())} pairs each); "
            + control_text(n, set(n.in_range.cache_ratio)),
            verdict, reason, pairs=int(n.in_range.n_pairs.min()), margin=margin, **timed))
    if n.at_low is not None:
        r = n.at_low
        ruling = gated(verdict_rules.no_difference(Interval.of(r)), n.control.get((r.cache_ratio,)),
                       n.host.get((r.cache_ratio,)))
        claims.append(Claim(
            f"at C/W {paper.AT_LOW.cache_ratio:g} demand-async and async last-step prefetch do not differ "
            f"(equivalence within +-{paper.EQUIV_MARGIN:g}%)",
            paper.paired_text(paper.AT_LOW, "%"),
            paired_text(r) + f" ({int(r.n_pairs)} pairs); " + control_text(n, {r.cache_ratio}), ruling.verdict,
            "" if ruling.verdict == REPRODUCED else ruling.why
            + (f": {'demand' if r.diff_pct > 0 else 'last_step'} faster" if ruling.verdict == NOT_REPRODUCED else ""),
            pairs=int(r.n_pairs), margin=ruling.margin,
            **timed))
    return claims


# --- figure ---------------------------------------------------------------------------------------
def plot(by_ratio, by_cell, P: Settings):
    """(a) demand over last_step (% tokens/s) vs C/W with 95% CIs, the paper's figures marked;
    (b) the same per task and batch size."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    err = [by_ratio.diff_pct - by_ratio.ci_low, by_ratio.ci_high - by_ratio.diff_pct]
    ax1.errorbar(by_ratio.cache_ratio, by_ratio.diff_pct, yerr=err, fmt="o", capsize=4, color="tab:blue",
                 label="measured (95% CI over pairs)")
    lo, hi = paper.FASTER_RANGE
    ax1.fill_between([lo, hi], *paper.FASTER_PCT, color="crimson", alpha=0.15,
                     label=f"paper: +{paper.FASTER_PCT[0]}..+{paper.FASTER_PCT[1]}% at C/W {lo}-{hi}")
    low = paper.AT_LOW
    ax1.errorbar([low.cache_ratio], [low.diff_pct], yerr=[[low.diff_pct - low.ci_low], [low.ci_high - low.diff_pct]],
                 fmt="s", color="crimson", capsize=4,
                 label=f"paper: {paper.paired_text(low, '%')} at {low.cache_ratio:g}")
    ax1.axhline(0, color="black", lw=1, ls=":")
    ax1.set(xlabel="cache capacity C/W", ylabel="demand over last_step (% tokens/s)",
            title="demand vs last_step, by C/W")
    ax1.legend(fontsize=8)
    labels = [f"{t}\nb={b}" for t, b in zip(by_cell.task, by_cell.batch_size)]
    e2 = [by_cell.diff_pct - by_cell.ci_low, by_cell.ci_high - by_cell.diff_pct]
    ax2.errorbar(range(len(by_cell)), by_cell.diff_pct, yerr=[x.fillna(0) for x in e2], fmt="o", capsize=4)
    ax2.axhline(0, color="black", lw=1, ls=":")
    ax2.set_xticks(range(len(by_cell)), labels, fontsize=8)
    ax2.set(xlabel="task, batch size b", ylabel="demand over last_step (% tokens/s)",
            title="by task and batch size (C/W pooled)")
    for ax in (ax1, ax2):
        ax.title.set_fontsize(10)
    title(fig, P, "04 capacity sweep")
    df = pd.concat([by_ratio.assign(panel="by C/W"), by_cell.assign(panel="by task and batch size")],
                   ignore_index=True)
    return fig, df
