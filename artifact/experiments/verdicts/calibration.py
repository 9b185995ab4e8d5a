"""The verdict rules checked against known truth (`python -m artifact calibrate`).

Noise per cell (`noise`), from the stored runs: each timing claim's comparison (judge.claim_compared) gives
each run's per-pair effects per cell, nothing pooled over cells: sd, the within-run sd of a pair's effect
(root of the mean of the runs' pair variances); n, the median pairs per run; tau, the between-run sd of the
true run means, tau^2 = max(0, var(run means) - sd^2 / n); the same for the cell's A/A. A synthetic study
(`study`): N stored runs (default 9, the cpu profile's) and one fresh run, run means mu + tau e, pairs run
mean + sd e, e standard normal or (heavy tails) t on 3 df scaled to unit variance, the fresh run's pairs
scaled by the scenario's `noise`; the A/A the same with mu = 0 and its own noise. The real code rules it:
pooling.replicate_all builds each comparison, judge.judge rules it (`pooled`: the N runs' verdict; `verdict`:
the fresh run's alone). 06 and 09 (A: every other policy) keep the stored A policies, keyed (policy, cell).
Scenarios: scenarios.py.

The table (data/results/<profile>/calibration.csv), one row per claim and scenario, rates in %: coverage
(cells whose pooled 95% interval holds mu), coverage_single (the fresh run's one-run interval), reproduced,
not_reproduced (the pooled verdict), power (reproduced, power scenarios only), fresh_decides, fresh_wrong (the
fresh verdict is wrong for the planted truth: scenarios.right_verdict), clear_decide (cells >= CLEAR
between-run sds from their boundary that the fresh run decides in their direction), stored_decide ("as
stored" only: the stored runs' own per_run verdicts that decide), each with <name>_se, its Monte-Carlo se
sqrt(p(1 - p) / k) over the k studies, cells or stored runs; decide_flag ("as stored": "disagree" when an
exact binomial test of the stored count against the fresh rate gives p < 0.05); checks."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats
from tqdm.auto import tqdm

from artifact.experiments.criteria.timing import CLAIMS, OTHERS, TimingClaim
from artifact.experiments.outputs.stored_runs import notebook_rows
from artifact.experiments.verdicts import judge
from artifact.experiments.verdicts.next_step import distance
from artifact.experiments.verdicts.pairs import Basis
from artifact.experiments.verdicts.pooling import Compared, Replicas, replicate_all
from artifact.experiments.verdicts.rules import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.experiments.verdicts.scenarios import Scenario, right_verdict, scenarios

RUNS = 9  # stored runs per synthetic study: the cpu profile's count
STUDIES = 300  # per claim and scenario, the default: under 5 minutes on 2 cores
CHUNK = 50  # studies per worker job
CLEAR = 4.0  # a "clear" cell: its true effect >= 4 between-run sds from the claim's boundary


@dataclass(frozen=True)
class Noise:
    """One cell's noise on its claim's basis: sd of a pair's effect within a run, n pairs per run, tau the
    between-run sd of the true run means, mean the stored pooled effect."""

    sd: float
    n: int
    tau: float
    mean: float

    @classmethod
    def of(cls, per: Sequence[np.ndarray | None]) -> "Noise":
        runs = [np.asarray(p, dtype=float) for p in per if p is not None and len(p)]
        if not runs:
            raise ValueError("a cell without stored pairs")
        means = np.array([p.mean() for p in runs])
        spread = [p.var(ddof=1) for p in runs if len(p) >= 2]
        within = float(np.mean(spread)) if spread else 0.0
        n = max(int(round(float(np.median([len(p) for p in runs])))), 1)
        tau2 = max(0.0, float(means.var(ddof=1)) - within / n) if len(means) >= 2 else 0.0
        return cls(math.sqrt(within), n, math.sqrt(tau2), float(means.mean()))


@dataclass(frozen=True)
class ClaimNoise:
    """A claim's cells and their noise ({key: Noise}, the effect's and the A/A's, keyed as judge keys them),
    its basis and A/A label, and how many of its `runs` stored runs decide alone."""

    claim: TimingClaim
    cells: dict
    aa: dict
    basis: Basis
    aa_label: str | None
    stored_decide: int
    runs: int


def noise(P, c: TimingClaim) -> ClaimNoise:
    """Each cell's noise, read from the claim's cells of the profile's stored runs, pooled (what its stored
    verdict rules on)."""
    _, stored = notebook_rows(P, c.notebook)
    if not stored:
        raise ValueError(f"{c.key}: profile {P.name} has no stored runs of notebook {c.notebook}")
    comp = judge.claim_cells(judge.claim_compared(Replicas(None, stored, metric=c.metric), c), c)
    per_run = judge.judge(comp, c, str).per_run
    aa_keys = dict.fromkeys(k[1] if c.a == OTHERS else k for k in comp.effects)  # in order: the seed's draws
    return ClaimNoise(
        c,
        {k: Noise.of(r.per) for k, r in comp.effects.items()},
        {k: Noise.of(comp.aa[k].per) for k in aa_keys if k in comp.aa},
        comp.basis,
        comp.aa_label,
        sum(v != INCONCLUSIVE for v in per_run),
        len(per_run),
    )


def _draw(rng: np.random.Generator, shape, tails: float) -> np.ndarray:
    if not tails:
        return rng.standard_normal(shape)
    return rng.standard_t(tails, shape) * math.sqrt((tails - 2) / tails)  # unit variance


def _runs(rng: np.random.Generator, mu: float, z: Noise, runs: int, tails: float, noise: float) -> list:
    """One cell's pairs of runs + 1 runs (the last the fresh one, its pairs' noise x `noise`)."""
    means = mu + z.tau * _draw(rng, runs + 1, tails)
    pairs = means[:, None] + z.sd * _draw(rng, (runs + 1, z.n), tails)
    pairs[-1] = means[-1] + noise * (pairs[-1] - means[-1])
    return list(pairs)


def _replicated(draws: dict) -> dict:
    """{cell: Replicated} ruled as pooling.replicate_all rules a comparison: each run's within-run noise
    pooled over the cells."""
    keys = list(draws)
    fresh = {k: draws[k][-1] for k in keys}
    stored = [{k: draws[k][i] for k in keys} for i in range(len(draws[keys[0]]) - 1)] if keys else []
    return replicate_all(fresh, stored, keys)


def _holds(iv, mu: float) -> bool:
    return iv is not None and iv.low <= mu <= iv.high


def study(cn: ClaimNoise, s: Scenario, rng: np.random.Generator, runs: int = RUNS) -> np.ndarray:
    """One synthetic study ruled by judge.judge, as counts: 1, pooled reproduced, pooled not reproduced, fresh
    decides, cells whose pooled interval holds mu, cells whose fresh one does, cells, fresh wrong, clear cells
    (>= CLEAR between-run sds from the boundary), clear cells the fresh run decides in their direction."""
    c = cn.claim
    truth = {k: z.mean if s.truth is None else s.truth for k, z in cn.cells.items()}
    effects = _replicated({k: _runs(rng, truth[k], z, runs, s.tails, s.noise) for k, z in cn.cells.items()})
    aa = _replicated({k: _runs(rng, 0.0, z, runs, s.tails, s.noise) for k, z in cn.aa.items()})
    t = judge.judge(Compared(effects, aa, {}, cn.basis, cn.aa_label), c, label=str)
    cover = sum(_holds(r.pooled, truth[k]) for k, r in effects.items())
    single = sum(_holds(r.this, truth[k]) for k, r in effects.items())
    clear = decided = 0
    for (k, z), x in zip(cn.cells.items(), t.cells):
        d = distance(c.question, truth[k])
        if abs(d) >= CLEAR * math.hypot(z.tau, z.sd / math.sqrt(z.n)):
            clear += 1
            decided += x["ruling"] == (REPRODUCED if d > 0 else NOT_REPRODUCED)
    ruled = (t.pooled == REPRODUCED, t.pooled == NOT_REPRODUCED, t.verdict != INCONCLUSIVE)
    wrong = t.verdict not in right_verdict(c, truth)
    return np.array((1, *ruled, cover, single, len(effects), wrong, clear, decided), dtype=np.int64)


def _job(args) -> tuple[int, int, np.ndarray]:
    """(claim index, scenario index, the study counts summed over one chunk of studies)."""
    i, j, cn, s, studies, seed, runs = args
    rng = np.random.default_rng(seed)
    return i, j, sum(study(cn, s, rng, runs) for _ in range(studies))


def _rate(k: float, n: float) -> tuple[float, float]:
    """(rate %, its Monte-Carlo standard error %)."""
    p = k / n if n else math.nan
    return 100 * p, 100 * math.sqrt(p * (1 - p) / n) if n else math.nan


def calibrate(noises, studies=STUDIES, seed=0, processes=2, progress=True, runs=RUNS, plan=None):
    """The table (module docstring) over `noises`' claims and their scenarios (or `plan`'s, for every claim),
    `studies` each, in `processes` worker processes (1: this one). Seeded: the same arguments, any
    `processes`, give the same table."""
    if studies < 1 or processes < 1 or runs < 2:
        raise ValueError(f"studies {studies}, processes {processes}, runs {runs}: expected >= 1, >= 1, >= 2")
    plans = [tuple(plan) if plan else scenarios(cn.claim) for cn in noises]
    jobs = [
        (i, j, cn, s, min(CHUNK, studies - k), [seed, i, j, k], runs)
        for i, (cn, ss) in enumerate(zip(noises, plans))
        for j, s in enumerate(ss)
        for k in range(0, studies, CHUNK)
    ]
    totals: dict[tuple[int, int], np.ndarray] = {}
    bar = tqdm(total=len(jobs), desc=f"calibrate, {studies} studies each", disable=not progress)
    pool = multiprocessing.get_context("fork").Pool(processes) if processes > 1 else None
    try:
        for i, j, counts in pool.imap_unordered(_job, jobs) if pool else map(_job, jobs):
            totals[i, j] = totals.get((i, j), 0) + counts
            bar.update()
    finally:
        if pool:
            pool.terminate()
        bar.close()
    return table(noises, plans, totals)


def table(noises: Sequence[ClaimNoise], plans, totals: dict) -> pd.DataFrame:
    out = []
    for i, (cn, ss) in enumerate(zip(noises, plans)):
        for j, s in enumerate(ss):
            n, r, nr, decides, cover, single, cells, wrong, clear, clear_decided = map(int, totals[i, j])
            row = dict(claim=cn.claim.key, question=cn.claim.question, scenario=s.name, studies=n)
            tails = f"t{s.tails:g}" if s.tails else "normal"
            row.update(truth="stored" if s.truth is None else f"{s.truth:+g}", tails=tails, noise=s.noise)
            stored = (cn.stored_decide, cn.runs) if s.truth is None and s.noise == 1 else (0, 0)
            power = (r, n) if "power" in s.checks else (0, 0)
            rates = dict(coverage=(cover, cells), coverage_single=(single, cells), reproduced=(r, n))
            rates.update(
                not_reproduced=(nr, n), power=power, fresh_decides=(decides, n), stored_decide=stored
            )
            rates.update(fresh_wrong=(wrong, n), clear_decide=(clear_decided, clear))
            for name, (k, m) in rates.items():
                row[name], row[f"{name}_se"] = _rate(k, m)
            flag = ""
            if s.truth is None and s.noise == 1 and cn.runs:
                p = min(max(decides / n, 0.5 / n), 1 - 0.5 / n)  # a rate of 0 or 1 is known to 1/(2 studies)
                flag = "disagree" if stats.binomtest(cn.stored_decide, cn.runs, p).pvalue < 0.05 else "agree"
            out.append(dict(row, decide_flag=flag, checks=s.checks))
    return pd.DataFrame(out)


def noise_table(noises: Sequence[ClaimNoise]) -> pd.DataFrame:
    """Each cell's noise (the claim's unit): sd, n, tau of the effect and of its A/A, and the stored mean."""
    out = []
    for cn in noises:
        for k, z in cn.cells.items():
            aa = cn.aa.get(k[1] if cn.claim.a == OTHERS else k)
            cell = ", ".join(str(v) for v in (k[:1] + tuple(k[1]) if cn.claim.a == OTHERS else k))
            row = dict(claim=cn.claim.key, cell=cell, mean=z.mean, sd=z.sd, n=z.n, tau=z.tau)
            out.append(row | dict(aa_sd=aa.sd if aa else math.nan, aa_tau=aa.tau if aa else math.nan))
    return pd.DataFrame(out)


def claim_keys(claims: Sequence[str] | None) -> list[str]:
    """The claims asked for, each once, in the order given (all when none)."""
    keys = list(dict.fromkeys(claims or CLAIMS))
    bad = [k for k in keys if k not in CLAIMS]
    if bad:
        raise ValueError(f"claim {bad[0]!r}: expected one of {', '.join(CLAIMS)}")
    return keys


def run(P, claims=None, studies=STUDIES, seed=0, processes=2, progress=True, pairs=None) -> tuple:
    """(the table, the noise per cell) of profile P's stored runs; `pairs`: a what-if design with that many
    pairs per cell in every run (each cell's within-run sd and between-run tau as measured)."""
    noises = [noise(P, CLAIMS[k]) for k in claim_keys(claims)]
    for i, cn in enumerate(noises if pairs else ()):
        cells, aa = ({k: dataclasses.replace(z, n=pairs) for k, z in d.items()} for d in (cn.cells, cn.aa))
        noises[i] = dataclasses.replace(cn, cells=cells, aa=aa)
    return calibrate(noises, studies, seed, processes, progress), noise_table(noises)
