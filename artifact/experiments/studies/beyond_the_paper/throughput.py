"""06 beyond the paper, the timed part: demand against the predictors under each link priority (one bench file
per priority), paired by repetition; the replicas of the stored runs, the table of this run's pairs and the
priority claim (1): does prediction still lose once it can never delay a demand transfer?"""

from __future__ import annotations

import dataclasses

import pandas as pd

from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.criteria.claims import ROW_FILES
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.harness import run_grid
from artifact.experiments.paired_table import CONFIDENCE, cell_label, format_table, paired_table
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.verdicts.judge import claim_parts, judge, merge_others, timed_claim
from artifact.experiments.verdicts.pooling import Replicas, gather
from artifact.experiments.verdicts.records import Claim

BENCH_PREDICTORS = ("last_step", CONTROL, "cross_layer")  # demand against these, under each priority
PRIORITIES = ("fifo", "demand")
NOTEBOOK = "06_beyond_the_paper"
STEM = dict(zip(PRIORITIES, ROW_FILES[NOTEBOOK][1]))  # data/results/<profile>/beyond-<priority>.csv
CLAIM = CLAIMS["06-priority"]  # (1): each predictor over demand under link_priority demand

# The cpu profile's bench, trimmed to keep ./run_all.sh affordable on 2 cores: 96 timed and 48 untimed warm-up
# runs of the tiny model (2 priorities x 3 C/W x 2 batch sizes x 4 policies x (2 repetitions + 1 warm-up,
# which in balanced order (bench/order.py) puts only 2 of the 4 policies first in a cell)), one task, 4
# prompts (the fewest that fill a batch of 4), 8 denoising steps per block: 2 pairs per cell per run. GPU
# profiles run their own grid, with the oracle added.
CPU_TRIM = {
    "tasks": ("gsm8k",),
    "n_prompts": 4,
    "repetitions": 2,
    "warmup": 1,
    "steps": 8,
    "cache_ratios": (0.43, 1.0, 1.73),
}


def bench_profile(P: Settings, priority: str) -> Settings:
    """The profile's bench under one link priority: demand and the predictors (the oracle too off the cpu
    profile), trimmed on cpu (CPU_TRIM)."""
    policies = ("demand",) + BENCH_PREDICTORS + (() if P.name == "cpu" else ("oracle",))
    trim = CPU_TRIM if P.name == "cpu" else {}
    return dataclasses.replace(P, link_priority=priority, policies=policies, **trim)


def measure(P: Settings, progress: bool = True) -> pd.DataFrame:
    """Both priorities' bench rows (column link_priority), each from its own resumable file."""
    runs = [
        run_grid(bench_profile(P, pr), STEM[pr], progress=progress).assign(link_priority=pr)
        for pr in PRIORITIES
    ]
    return pd.concat(runs, ignore_index=True)


def replicas(P: Settings, rows) -> Replicas:
    """This run's rows of both priorities with the stored runs' rows of the same grids (pooling.py)."""
    fingerprints = {STEM[pr]: bench_fingerprint(bench_profile(P, pr)) for pr in PRIORITIES}
    return gather(P, rows, NOTEBOOK, fingerprints)


def throughput_table(rows, by=("task", "batch_size", "cache_ratio")) -> pd.DataFrame:
    """Each predictor over demand (% tokens/s, positive = the predictor is faster) within this run, per link
    priority and cell, with 95% t intervals over its pairs (paired_table.paired_table; shown, the verdicts
    rule on verdicts.pooling's intervals)."""
    out = []
    for pr, g in rows.groupby("link_priority", sort=False):
        for pol in [p for p in g.policy.unique() if p != "demand"]:
            t = paired_table(g, pol, "demand", list(by))
            out.append(t.assign(link_priority=pr, policy=pol))
    table = pd.concat(out, ignore_index=True)
    first = ["link_priority", "policy"] + list(by)
    return table[first + [c for c in table.columns if c not in first]]


def format_tables(table) -> str:
    """paired_table.format_table per (link priority, predictor): the predictor (A) over demand (B)."""
    parts = []
    for (pr, pol), t in table.groupby(["link_priority", "policy"], sort=False):
        t = t.drop(columns=["link_priority", "policy"]).reset_index(drop=True)
        t.attrs.update(a=pol, b="demand", metric="tokens_per_second", confidence=CONFIDENCE)
        parts.append(f"link_priority {pr}: " + format_table(t))
    return "\n\n".join(parts)


def priority_claim(timed: dict, table: pd.DataFrame | None = None) -> Claim:
    """(1): under link_priority demand, no predictor is faster than demand-async (not_faster per predictor and
    cell of `timed`, {predictor: Compared}, gated by the cell's A/A); `table` (throughput_table, this run)
    adds the predictor cells whose bootstrap interval (shown, not ruled on) lies above 0."""
    t = judge(merge_others(timed), CLAIM, lambda pk: f"{pk[0]} {cell_label(pk[1][1:])}")  # [1:]: the priority
    boot = []
    if table is not None:
        up = table[(table.link_priority == "demand") & (table.policy != CONTROL) & (table.boot_low > 0)]
        boot = [f"{r.policy} at C/W {r.cache_ratio:g} b={r.batch_size} (demand)" for r in up.itertuples()]
    return timed_claim(
        CLAIM.key,
        t,
        "tokens/s per run, predictor over demand % per pair, one interval per cell (task, batch, C/W)",
        "this run's bootstrap intervals over pairs (not ruled on) above 0: "
        + (", ".join(boot) if boot else "none"),
    )


def stored_claims(P: Settings) -> list[Claim]:
    """The timing claim as a `--store` run of the stored runs' last one rules it (tests/test_stored_runs.py
    recomputes the committed record with it): from the committed rows alone."""
    r = replicas(P, None).last_stored()
    return [priority_claim(claim_parts(r, CLAIM), throughput_table(r.rows))]
