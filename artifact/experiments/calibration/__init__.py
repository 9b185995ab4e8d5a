"""The verdict pipeline checked against known truth (`python -m artifact calibrate`, docs/verdicts.md
"Calibration").

A simulated study is N synthetic stored runs of one timing claim's grid: the stored runs' own rows (same
schema, cells, policies, repetitions, slot order and N), their metric replaced by values drawn from a model
whose truth is known. Per row (run r, cell c, repetition j, policy p in slot s), on the claim's additive scale
(100 x log of the metric for a ratio basis, points of wall time for the stall basis):

    y = truth(p) + role(p) + slot(s) + u[r, c, p] + e[r, c, j, p] + h[r, c, j]

- truth: the claim's true effect T of A over B (each of OTHERS' policies as A), at the claim's boundary (+m)
  or clearly on the claim's side of it (`Scenario.truth`); demand and the A/A control (demand's double) carry
  none;
- role: a bias of the non-demand role (the prefetch path's hooks), shared by the control and every non-demand
  policy: the bias the control exists to cancel, in either orientation (demand as A or as B);
- slot: a bias of the first slot of a repetition (the first run after a capacity change);
- u: the between-run spread of one policy, e: the within-run noise of one measurement, both sized from the
  stored runs' own variance of the claim's effect (`Noise.of`); h: the pair's shared machine state (cancels);
- optionally one outlier run (its A side shifted by `outlier` between-run sds) and heavy tails (t on 3 df).

The real pipeline then rules the runs: Replicas (every run's views, effects.run_views), criteria.timing's
claim (timed.claim_compared, claim_cells), the rules, the combination of cells (timed.judge). The harness
counts, over the studies: how often the pooled 95% intervals of the effect and of the net effect contain their
true values; the claim's verdicts (family-wise over its cells) and the per-cell ones; and, for fresh runs
drawn from the same model beside the stored ones (Replicas.with_this), how often one gives the verdict
opposite to the pooled one, and how often it decides alone. 08's model error (a figure, not an interval) has
its own simulation (`model_error`)."""

from __future__ import annotations

import importlib
import math
import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from artifact.experiments.calibration.generator import SCENARIOS, Generator, Noise, Scenario
from artifact.experiments.claims import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.experiments.criteria import thresholds
from artifact.experiments.criteria.timing import CLAIMS, DEMAND, TimingClaim
from artifact.experiments.replication import Replicas
from artifact.experiments.rules import at_most, figure_range, median_at_most, rule_cell
from artifact.experiments.settings import CONTROL
from artifact.experiments.stored_runs import TIMED_STUDIES, stored_rows
from artifact.experiments.timed import claim_cells, claim_compared, question, rule_claim


def _opposite(a: str, b: str) -> bool:
    return {a, b} == {REPRODUCED, NOT_REPRODUCED}


@dataclass
class Tally:
    studies: int = 0
    verdicts: dict | None = None
    cells: int = 0
    cell_r: int = 0
    cell_nr: int = 0
    cover_effect: int = 0
    cover_net: int = 0
    covered_cells: int = 0
    cover_single: int = 0
    single_cells: int = 0
    fresh: int = 0
    fresh_decides: int = 0
    fresh_opposite: int = 0
    aligned: int = 0

    def rate(self, verdict: str) -> float:
        return (self.verdicts or {}).get(verdict, 0) / max(self.studies, 1)


def study_once(gen: Generator, fresh: int, family: str, label=str) -> tuple:
    """Rule one simulated study (and `fresh` fresh runs beside it) through the real pipeline; what Tally
    counts."""
    runs = gen.study()
    reps = Replicas(runs[-1][1], tuple(runs), metric=gen.c.metric).last_stored()
    compared = claim_compared(reps, gen.c)
    t = rule_claim(compared, gen.c, label, family)
    cells = claim_cells(compared, gen.c)
    net = cells.net if cells.net else cells.effects
    targets = {k: gen.targets(k) for k in cells.effects}
    cover = [(r.pooled.low <= targets[k][0] <= r.pooled.high) for k, r in cells.effects.items() if r.pooled]
    cover_net = [(r.pooled.low <= targets[k][1] <= r.pooled.high) for k, r in net.items() if r.pooled]
    q = question(gen.c)
    ruled = net if q.net_of_control else cells.effects
    gate = {} if q.net_of_control else cells.control
    per_cell = [
        rule_cell(q, r.pooled, gate[k].pooled if k in gate else None).verdict
        for k, r in ruled.items()
        if r.pooled
    ]
    outs = []
    for _ in range(fresh):
        mine = reps.with_this(gen.run(int(gen.rng.integers(len(gen.runs)))))
        fc = claim_cells(claim_compared(mine, gen.c), gen.c)
        ft = rule_claim(fc, gen.c, label, family)
        fnet = fc.net if fc.net else fc.effects
        outs.append(
            (
                ft.verdict,
                [
                    (r.this.low <= targets[k][1] <= r.this.high)
                    for k, r in fnet.items()
                    if math.isfinite(r.this.low) and k in targets
                ],
            )
        )
    return t, cover, cover_net, per_cell, outs, len(t.per_run) == len(runs)


def calibrate_claim(
    c: TimingClaim,
    template,
    noise: Noise,
    s: Scenario,
    studies: int,
    fresh: int,
    family: str = thresholds.FAMILY,
    seed: int = 0,
    progress: bool = True,
    stored: dict | None = None,
) -> Tally:
    gen = Generator(c, template, noise, s, np.random.default_rng(seed), stored)
    tally = Tally(verdicts={})
    for _ in tqdm(range(studies), desc=f"{c.key}: {s.name}", disable=not progress, leave=False):
        t, cover, cover_net, per_cell, outs, aligned = study_once(gen, fresh, family)
        tally.studies += 1
        tally.verdicts[t.verdict] = tally.verdicts.get(t.verdict, 0) + 1
        tally.cells += len(per_cell)
        tally.cell_r += per_cell.count(REPRODUCED)
        tally.cell_nr += per_cell.count(NOT_REPRODUCED)
        tally.cover_effect += sum(cover)
        tally.cover_net += sum(cover_net)
        tally.covered_cells += len(cover)
        tally.aligned += aligned
        for verdict, single in outs:
            tally.fresh += 1
            tally.fresh_decides += verdict != INCONCLUSIVE
            tally.fresh_opposite += _opposite(verdict, t.verdict)
            tally.cover_single += sum(single)
            tally.single_cells += len(single)
    return tally


# ---------------------------------------------------------------------------------------------
# The stored runs each claim's synthetic studies are shaped on
# ---------------------------------------------------------------------------------------------
def stored_template(P, c: TimingClaim) -> Replicas:
    """The stored runs of the claim's grid (checked: stored_runs.check_stored_runs), as its study gathers
    them."""
    module = next(t.module for t in TIMED_STUDIES if t.notebook == c.notebook)
    study = importlib.import_module(f"artifact.experiments.studies.{module}")
    if hasattr(study, "replicas"):
        return study.replicas(P, None).last_stored()
    names = {p for _, rows in stored_rows(P, study.STEM) for p in set(rows.policy)} - {DEMAND, CONTROL}
    return study.bench_replicas(P, names.pop(), None).last_stored()


@dataclass(frozen=True)
class Row:
    claim: str
    question: str
    demand: str
    scenario: str
    tally: Tally
    noise: Noise


def _job(args) -> Tally:
    c, template, noise, s, studies, fresh, family, seed, stored = args
    return calibrate_claim(c, template, noise, s, studies, fresh, family, seed, progress=False, stored=stored)


def stored_truth(compared) -> dict:
    """{claim key: (pooled net %, pooled A/A control %)} of the stored runs: the truth of the "as stored"
    scenario."""
    return {
        k: (r.pooled.mean, compared.control[k].pooled.mean)
        for k, r in compared.net.items()
        if r.pooled is not None and k in compared.control and compared.control[k].pooled is not None
    }


def run(
    P,
    claims: Sequence[str] | None = None,
    scenarios: Sequence[Scenario] = SCENARIOS,
    studies: int = 1000,
    fresh: int = 10,
    family: str = thresholds.FAMILY,
    seed: int = 0,
    progress: bool = True,
    processes: int | None = None,
) -> list[Row]:
    """Every (claim, scenario): `studies` simulated studies, each with `fresh` fresh runs, in `processes`
    worker processes (default: one per core; 1: in this process). Seeded: the same arguments give the same
    table."""
    keys = list(claims or CLAIMS)
    unknown = [k for k in keys if k not in CLAIMS]
    if unknown:
        raise ValueError(f"unknown timing claims {unknown}; expected some of {list(CLAIMS)}")
    if studies < 1 or fresh < 0:
        raise ValueError(f"studies {studies} and fresh {fresh}: expected studies >= 1 and fresh >= 0")
    jobs, meta = [], []
    for i, key in enumerate(keys):
        c = CLAIMS[key]
        reps = stored_template(P, c)
        every = claim_compared(reps, c)
        compared = claim_cells(every, c)
        noise = Noise.of(compared)
        cells = len(compared.effects)
        truth = stored_truth(every)
        for j, s in enumerate(scenarios):
            if s.missing_cell and cells < 2:
                continue  # a claim of one cell: a run without it has no rows
            jobs.append((c, reps.stored, noise, s, studies, fresh, family, seed + 1000 * i + j, truth))
            meta.append((key, c, s, noise))
    processes = processes or min(os.cpu_count() or 1, len(jobs))
    bar = tqdm(
        total=len(jobs), desc=f"calibrate ({studies} studies per claim and scenario)", disable=not progress
    )
    tallies = []
    if processes == 1:
        for job in jobs:
            tallies.append(_job(job))
            bar.update()
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            for t in pool.imap(_job, jobs):
                tallies.append(t)
                bar.update()
    bar.close()
    return [
        Row(key, c.question, c.demand_role, s.name, t, noise) for (key, c, s, noise), t in zip(meta, tallies)
    ]


def _pct(k: float, n: float) -> float:
    return 100.0 * k / n if n else float("nan")


def table(rows: Sequence[Row]) -> pd.DataFrame:
    """One row per claim and scenario: coverage (%), the claim's verdict rates (%), the per-cell rates (%),
    the fresh runs' opposite verdicts (count) and how often one decides alone (%)."""
    out = []
    for r in rows:
        t = r.tally
        out.append(
            dict(
                claim=r.claim,
                question=r.question,
                demand=r.demand,
                scenario=r.scenario,
                studies=t.studies,
                cover_effect=_pct(t.cover_effect, t.covered_cells),
                cover_net=_pct(t.cover_net, t.covered_cells),
                cover_single=_pct(t.cover_single, t.single_cells),
                reproduced=100 * t.rate(REPRODUCED),
                not_reproduced=100 * t.rate(NOT_REPRODUCED),
                cell_reproduced=_pct(t.cell_r, t.cells),
                cell_not_reproduced=_pct(t.cell_nr, t.cells),
                fresh=t.fresh,
                fresh_opposite=t.fresh_opposite,
                fresh_decides=_pct(t.fresh_decides, t.fresh),
                runs_aligned=_pct(t.aligned, t.studies),
                noise_pair=r.noise.pair,
                noise_run=r.noise.run,
            )
        )
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------
# 08: a figure per run (the model's median absolute error), ruled with rules.at_most
# ---------------------------------------------------------------------------------------------
def model_error(
    runs: int = 9,
    studies: int = 1000,
    fresh: int = 10,
    limit: float = thresholds.MODEL_ERROR,
    spread: float = 0.02,
    truth: float | None = None,
    seed: int = 0,
) -> dict:
    """08's rule on synthetic run figures (each run's figure ~ truth + spread x N(0, 1), truth at the limit
    unless given), through the rule 08 rules with: the stored verdict on the interval of the N runs' median
    (rules.median_at_most), a single run on the range holding its figure and that interval (rules.at_most on
    rules.figure_range). Counts the stored
    verdicts, fresh runs' opposite verdicts and how often a fresh run decides."""
    rng = np.random.default_rng(seed)
    truth = limit if truth is None else truth
    verdicts: dict = {}
    opposite = decides = 0
    for _ in range(studies):
        figs = truth + spread * rng.standard_normal(runs)
        v, _, interval = median_at_most(list(figs), limit)
        verdicts[v] = verdicts.get(v, 0) + 1
        for f in truth + spread * rng.standard_normal(fresh):
            own = at_most(*figure_range(float(f), interval), limit)
            decides += own != INCONCLUSIVE
            opposite += _opposite(own, v)
    return dict(
        studies=studies,
        truth=truth,
        reproduced=100.0 * verdicts.get(REPRODUCED, 0) / studies,
        not_reproduced=100.0 * verdicts.get(NOT_REPRODUCED, 0) / studies,
        fresh=studies * fresh,
        fresh_opposite=opposite,
        fresh_decides=_pct(decides, studies * fresh),
    )
