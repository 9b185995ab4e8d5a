"""The run as the unit of replication: every timing verdict is ruled on an interval that carries the variation
between runs, not only the variation between the pairs of one run.

The pairs of one run share the machine's state (its load, its clock, where the allocator put things), so an
interval over them says how precisely that run measured itself, not what another run on another day will see:
on the cpu profile, estimates of one run fell outside another run's 95% intervals over pairs. So a stored
(headline) result is N >= MIN_RUNS runs of the timing notebooks at one commit, and their raw rows are
committed (data/results/<profile>/runs/run<k>/: stored_runs/, which finds, checks, reads and records them).

Per cell (one task, batch size, C/W, bandwidth; no interval pools cells), with d the per-pair difference of A
over B on the claim's basis (`Basis`: PERCENT, (A - B) / B x 100, or STALL_SHARE, A's stall per forward minus
B's as % of B's wall time per forward), x_i the mean of d over run i's pairs and s the standard deviation of
x_1..x_N:

    pooled     mean(x) +- t_{N-1} * s / sqrt(N)          the t interval over per-run means (METHOD)
    one run    x_i +- max(t_{N-1} * s, t_{n-1} * w)      a run's own interval (ONE_RUN): its mean, with the
    spread of
                                                         a run's mean that the stored runs showed, or its own
                                                         pairs' standard error w when that is larger
    single     hull(one run, pooled)                     what a run that is not a stored one is ruled on
    (SINGLE)

A direction claim (rules.FASTER) asks its question of the effect net of the A/A control: per matched pair
(same cell, run and repetition) d = d(A over B) - d(CONTROL over demand), a difference in differences with the
run as the unit (Compared.net); equivalence and non-superiority claims ask it of d(A over B), with the control
as a precision gate (rules.control_ruling).

A run that is one of the stored runs (its rows are a stored run's rows, `--store`) is ruled on the pooled
interval; any other run (a fresh clone's ./run_all.sh) on the hull of its one-run interval and the pooled one,
and says so. The rules are monotone under widening (rules.py), so a single run's verdict is the pooled one or
inconclusive: it never contradicts the stored result. A run with no stored runs to borrow from has only its
own pairs: its interval is the t interval over them (WITHIN), labelled as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from artifact.errors import RunsError
from artifact.experiments.criteria import thresholds
from artifact.experiments.effects import PERCENT, Basis, RunEffect, run_views
from artifact.experiments.rules import Interval, host_shares, hull
from artifact.experiments.stored_runs import run_meta, runs_root, stored_rows

METHOD = f"{thresholds.CONFIDENCE:.0%} t interval over per-run means (runs are the unit, df = N - 1)"
ONE_RUN = (
    "one run: its mean +- max(t_(N-1) x the sd of the stored runs' means, t_df x its own standard "
    "error, "
    f"the within-run sd pooled over the comparison's cells) ({thresholds.CONFIDENCE:.0%})"
)
SINGLE = (
    "one run: the hull of its mean +- max(t_(N-1) x the sd of the stored runs' means, t_df x its own "
    "pooled "
    f"standard error) and the pooled {thresholds.CONFIDENCE:.0%} interval"
)
WITHIN = (
    f"{thresholds.CONFIDENCE:.0%} t interval over this run's pairs (within one run: no between-run variance)"
)


# ---------------------------------------------------------------------------------------------
# Intervals per cell
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def t_quantile(confidence: float, df: int) -> float:
    """The two-sided `confidence` quantile of t on `df` degrees of freedom (cached: the harness asks
    often)."""
    return float(stats.t.ppf(0.5 + confidence / 2, df))


def t_interval(
    values: Sequence[float], confidence: float = thresholds.CONFIDENCE
) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean of `values` (nan bounds for fewer than 2)."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean()) if len(v) else float("nan")
    if len(v) < 2:
        return mean, float("nan"), float("nan")
    se = float(v.std(ddof=1)) / math.sqrt(len(v))
    half = t_quantile(confidence, len(v) - 1) * se
    return mean, mean - half, mean + half


def pooled_interval(means: Sequence[float], confidence: float = thresholds.CONFIDENCE) -> Interval:
    mean, lo, hi = t_interval(means, confidence)
    return Interval(mean, lo, hi, len(means), "runs")


def one_run_interval(
    run: RunEffect,
    stored_means: Sequence[float],
    confidence: float = thresholds.CONFIDENCE,
    spread: float | None = None,
) -> Interval:
    """A single run's interval (ONE_RUN): its mean +- max(t_(N-1) s, t_df w), s the sd of the stored runs'
    means (`spread`, when the caller has it), w the run's own standard error (RunEffect.se: its within-run sd
    pooled over the comparison's cells when the run carries it, on that pooled df); with fewer than 2 stored
    runs, the t interval over its own pairs."""
    if len(stored_means) < 2:
        if run.pooled_sd is not None and run.df >= 1 and len(run.diffs) >= 1:
            half = t_quantile(confidence, run.df) * run.se
            return Interval(run.mean, run.mean - half, run.mean + half, len(run.diffs), "pairs")
        _, lo, hi = t_interval(run.diffs, confidence)
        return Interval(run.mean, lo, hi, len(run.diffs), "pairs")
    s = float(np.std(stored_means, ddof=1)) if spread is None else spread
    half = t_quantile(confidence, len(stored_means) - 1) * s
    if run.df >= 1:
        se = run.se
        if math.isfinite(se):
            half = max(half, t_quantile(confidence, run.df) * se)
    return Interval(run.mean, run.mean - half, run.mean + half, len(stored_means), "run")


@dataclass(frozen=True)
class Replicated:
    """One cell's effect in every view: this run's, each stored run's, and pooled over the stored runs. Built
    by `replicate` from the runs' RunEffects (`own`, `per`), which it keeps, so `at` can give the same cell at
    another confidence level (the simultaneous level of a claim over several cells) or with a stored run left
    out; built from intervals alone (`own` None), it has only its own level."""

    this: Interval  # this run's own interval (ONE_RUN, or WITHIN without stored runs)
    # each stored run's one-run interval, in run order (None: the run lacks the
    runs: tuple[Interval | None, ...]
    # cell; empty: none stored)
    pooled: Interval | None  # over the stored runs' means (None: fewer than 2 stored runs)
    stored: bool  # this run is one of the stored runs: it is ruled on the pooled interval
    own: RunEffect | None = None  # this run's effect
    per: tuple[RunEffect | None, ...] = ()  # each stored run's effect (None: it lacks the cell)

    def single(self, own: Interval | None = None) -> Interval:
        """What one run (this run, or `own`: a stored run's one-run interval) is ruled on alone: the hull of
        its interval and the pooled one (SINGLE); its own interval when nothing is pooled."""
        own = self.this if own is None else own
        return hull(own, self.pooled) if self.pooled is not None else own

    @property
    def ruled(self) -> Interval:
        if self.pooled is None:
            return self.this
        return self.pooled if self.stored else self.single()

    def at(self, confidence: float = thresholds.CONFIDENCE, drop: int | None = None) -> "Replicated":
        """This cell at another confidence level, or with stored run `drop` (0-based) left out of the pool
        (the leave-one-out view); itself when built from intervals alone."""
        if self.own is None:
            return self
        per = tuple(p for i, p in enumerate(self.per) if i != drop)
        return replicate(self.own, per, self.stored and drop is None, confidence, runs=drop is None)


def replicate(
    own: RunEffect,
    per: Sequence[RunEffect | None],
    stored: bool,
    confidence: float = thresholds.CONFIDENCE,
    runs: bool = True,
) -> Replicated:
    """One cell's Replicated from this run's effect and each stored run's (None where a run lacks the cell: it
    is left out of the pool, and its one-run interval is None, so the runs stay matched by name, never by
    position). `runs` False leaves out each stored run's one-run interval (the leave-one-out view needs only
    the pool)."""
    means = [p.mean for p in per if p is not None]
    spread = float(np.std(means, ddof=1)) if len(means) >= 2 else None
    each = (
        tuple(None if p is None else one_run_interval(p, means, confidence, spread) for p in per)
        if runs
        else ()
    )
    return Replicated(
        one_run_interval(own, means, confidence, spread),
        each,
        pooled_interval(means, confidence) if len(means) >= 2 else None,
        stored,
        own,
        tuple(per),
    )


@dataclass(frozen=True)
class Compared:
    """A over B per cell (`effects`), with the A/A control over demand in the same cells (`control`: {} when
    the rows carry no control runs), A over B net of the control per matched pair (`net`, the difference in
    differences a direction claim rules on, oriented by demand's role: effects.net_difference; {} without a
    control) and each cell's GPU host share of wall time per forward (`host`: {} on the CPU,
    rules.host_shares): what `judge` rules on, and what every timing study's numbers hold."""

    effects: dict
    control: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    net: dict = field(default_factory=dict)
    basis: Basis = PERCENT

    def where(self, keep: Callable[[tuple], bool]) -> "Compared":
        """Only the cells whose key `keep` accepts (their controls, net effects and host shares go with
        them)."""
        return Compared(
            {k: v for k, v in self.effects.items() if keep(k)},
            self.control,
            self.host,
            {k: v for k, v in self.net.items() if keep(k)},
            self.basis,
        )


@dataclass(frozen=True)
class Replicas:
    """This run's rows beside the stored runs' rows of the same grid (same settings): the replicas every
    per-cell interval is computed over (`effects`, `compare`). Each run's views of one comparison are computed
    once (effects.run_views) and kept (`_memo`), so a comparison asked again, or a Replicas made `with_this`
    another run, does not pivot the stored runs again."""

    this: pd.DataFrame
    stored: tuple[tuple[str, pd.DataFrame], ...] = ()
    commit: str = ""  # the stored runs' commit ("" when none, "a, b" when they differ)
    metric: str = "tokens_per_second"
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.stored]

    @property
    def n(self) -> int:
        return len(self.stored)

    def last_stored(self) -> "Replicas":
        """These runs with the last stored run as this run: what a `--store` pass on the stored runs rules
        on."""
        if self.n < thresholds.MIN_RUNS:
            raise RunsError(
                f"{self.n} stored runs hold this grid's rows "
                f"({', '.join(self.names) or 'none'}): a "
                f"pooled verdict needs thresholds.MIN_RUNS = {thresholds.MIN_RUNS}"
            )
        return Replicas(self.stored[-1][1], self.stored, self.commit, self.metric, self._memo)

    def with_this(self, rows: pd.DataFrame) -> "Replicas":
        """The same stored runs (and their computed views) beside another run's rows."""
        return Replicas(rows, self.stored, self.commit, self.metric, self._memo)

    def _views(self, name: str, rows, a, b, by, metric, basis) -> dict:
        key = (name, a, b, tuple(by), metric, basis.name)
        if name is None or key not in self._memo:
            got = run_views(rows, a, b, by, metric, basis)
            if name is None:
                return got
            self._memo[key] = got
        return self._memo[key]

    def _all_views(self, a, b, by, metric, basis) -> tuple[dict, list[dict], bool]:
        mine = self._views(None, self.this, a, b, by, metric, basis)
        theirs = [self._views(n, rows, a, b, by, metric, basis) for n, rows in self.stored]
        return mine, theirs, self.n >= 2 and any(_same_effects(mine["effect"], t["effect"]) for t in theirs)

    def compare(
        self, a: str, b: str, by: Sequence[str], metric: str | None = None, basis: Basis = PERCENT
    ) -> Compared:
        """A over B per cell of `by` on `basis`, with the A/A control (CONTROL over demand) in the same cells
        and A over B net of it (oriented by demand's role) when the rows carry it, and the cells' GPU host
        shares."""
        metric = metric or self.metric
        mine, theirs, me_stored = self._all_views(a, b, by, metric, basis)

        def view(v: str) -> dict:
            if v not in mine:
                return {}
            return {
                key: replicate(eff, [t.get(v, {}).get(key) for t in theirs], me_stored)
                for key, eff in mine[v].items()
            }

        return Compared(view("effect"), view("control"), host_shares(self.this, by), view("net"), basis)

    def effects(
        self,
        a: str,
        b: str,
        by: Sequence[str],
        metric: str | None = None,
        basis: Basis = PERCENT,
        net: bool = False,
    ) -> dict[tuple, Replicated]:
        """{cell key: Replicated} of A over B per cell of `by` (the cells of this run), on `basis`, net of the
        A/A control when `net` (effects.run_views)."""
        c = self.compare(a, b, by, metric, basis)
        return c.net if net else c.effects


def _same_effects(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(
        len(x[k].diffs) == len(y[k].diffs) and np.allclose(x[k].diffs, y[k].diffs, rtol=1e-9, atol=1e-12)
        for k in x
    )


def gather(
    P,
    this: pd.DataFrame,
    stem: str | Sequence[str],
    fingerprint: str | None = None,
    metric: str = "tokens_per_second",
    reference: Path | None = None,
    read=pd.read_csv,
) -> Replicas:
    """This run's rows with the stored runs' rows of the same grid(s) and settings, keeping the cells this run
    has (a stored file may hold other grids' cells)."""
    stems = [stem] if isinstance(stem, str) else list(stem)
    by_run: dict[str, list[pd.DataFrame]] = {}
    for s in stems:
        for name, rows in stored_rows(P, s, fingerprint, reference, read):
            by_run.setdefault(name, []).append(rows)
    stored = tuple((n, pd.concat(fs, ignore_index=True)) for n, fs in by_run.items())
    commits = sorted({run_meta(runs_root(P.name, reference) / n).get("commit", "?") for n, _ in stored})
    return Replicas(this, stored, ", ".join(commits), metric)
