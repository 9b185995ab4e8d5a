"""Runs are the unit: the pairs of one run share the machine's state (load, clock, allocation), and the stored
cpu runs differ from each other by more than the pairs inside a run do. Per cell, with x_k the mean of run k's
per-pair effects (pairs.run_effects):

    pooled    a t interval over the per-run means of the runs that hold the cell (df = N - 1)     unit "runs"
    one run   x +- t_df se, se^2 = s^2 + max(0, w_run^2 - w_stored^2) / n: s the sd of the stored   unit "run"
              runs' means (the run-to-run spread, holding their within-run noise too); w_run^2 the run's
              within-run variance of a pair's effect pooled over the comparison's cells (one-way ANOVA:
              sum (n_c - 1) var_c / sum (n_c - 1), resting on every cell's pairs, not a cell's two);
              w_stored^2 the same over the stored runs; n the cell's pairs. A run as quiet as the stored
              ones is sized by their spread alone, a noisier one widened by its excess. df:
              Welch-Satterthwaite over s^2 (N - 1 df) and the excess (the run's pooled df).
    alone     fewer than 2 stored runs: no run-to-run spread to size it; the t interval    unit "pairs"
              over its pairs, which a timing verdict does not rule on (judge.py)

A fresh run is ruled alone, never bounded by the stored verdict. A claim's cells are the union over the runs
(a cell is pooled over the runs that hold it). Leave-one-out drops a run from the effect and the A/A alike."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy import stats

from artifact.errors import RunsError
from artifact.experiments.criteria import thresholds
from artifact.experiments.outputs.stored_runs import notebook_rows, run_meta, runs_root
from artifact.experiments.verdicts.pairs import PERCENT, Basis, aa_label, host_shares, run_effects
from artifact.experiments.verdicts.rules import Interval


def pooled(means: Sequence[float]) -> Interval | None:
    """The t interval over per-run means (scipy.stats.ttest_1samp's), None with fewer than 2."""
    x = np.asarray(means, dtype=float)
    if len(x) < 2:
        return None
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    se = float(x.std(ddof=1) / math.sqrt(len(x)))
    return Interval(float(x.mean()), float(ci.low), float(ci.high), len(x), "runs", se, len(x) - 1)


@dataclass(frozen=True)
class Within:
    """A run's within-run noise of one comparison: the variance of a pair's effect pooled over its cells
    (`var`) and its degrees of freedom (`df`: sum over cells of pairs - 1)."""

    var: float
    df: int

    @classmethod
    def of(cls, cells: Iterable[np.ndarray | None]) -> "Within":
        held = [np.asarray(d, dtype=float) for d in cells if d is not None and len(d) >= 2]
        df = sum(len(d) - 1 for d in held)
        ss = sum(float(((d - d.mean()) ** 2).sum()) for d in held)
        return cls(ss / df if df else math.nan, df)

    @classmethod
    def pooled(cls, runs: Iterable["Within"]) -> "Within":
        held = [w for w in runs if w.df]
        df = sum(w.df for w in held)
        return cls(sum(w.var * w.df for w in held) / df if df else math.nan, df)


def one_run(
    d: np.ndarray, others: Sequence[float], own: Within | None = None, stored: Within | None = None
) -> Interval:
    """A single run's interval (module docstring): sized by the spread of `others` (the stored runs' means in
    the cell), widened by its within-run variance `own` beyond the stored runs' `stored` (by default the
    cell's own pairs, no excess); over its own pairs ("pairs") when fewer than 2 others hold the cell."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    mean = float(d.mean()) if n else float("nan")
    own = own if own is not None and own.df else Within.of([d])
    if len(others) < 2:
        if not own.df or not math.isfinite(own.var):
            return Interval(mean, float("nan"), float("nan"), n, "pairs")
        return Interval.t(mean, math.sqrt(own.var / n), own.df, n, "pairs")
    s2 = float(np.var(others, ddof=1))
    k = len(others) - 1
    excess = 0.0
    if stored is not None and stored.df and own.df and math.isfinite(own.var) and math.isfinite(stored.var):
        excess = max(0.0, own.var - stored.var) / n
    total = s2 + excess
    if total <= 0:
        return Interval.t(mean, 0.0, k, len(others), "run")
    df = total**2 / (s2**2 / k + (excess**2 / own.df if excess else 0.0))
    return Interval.t(mean, math.sqrt(total), df, len(others), "run")


@dataclass(frozen=True)
class Replicated:
    """One cell in every view: `ruled` (`pooled` over the stored runs when ruling them, else `this`, this
    run's one-run interval), `runs` (each stored run's one-run interval against the others, None where it
    lacks the cell); `per` and `own`: the per-pair effects behind them."""

    ruled: Interval
    pooled: Interval | None
    this: Interval | None
    runs: tuple[Interval | None, ...]
    per: tuple[np.ndarray | None, ...] = field(repr=False, default=())
    own: np.ndarray | None = field(repr=False, default=None)

    @property
    def n_runs(self) -> int:
        return sum(p is not None for p in self.per)


def replicate(
    own: np.ndarray | None,
    per: Sequence[np.ndarray | None],
    own_within: Within | None = None,
    per_within: Sequence[Within | None] = (),
) -> Replicated:
    """A cell's Replicated from this run's effects (None: ruling the stored runs) and each stored run's; each
    run's Within (over the comparison's cells: replicate_all) sizes the one-run intervals (a stored run's
    against the others)."""
    means = [float(p.mean()) for p in per if p is not None and len(p)]
    per_within = list(per_within) or [None] * len(per)
    runs = []
    for i, p in enumerate(per):
        others = [float(q.mean()) for j, q in enumerate(per) if j != i and q is not None and len(q)]
        rest = Within.pooled(w for j, w in enumerate(per_within) if j != i and w is not None)
        runs.append(None if p is None or not len(p) else one_run(p, others, per_within[i], rest))
    pool = pooled(means)
    stored = Within.pooled(w for w in per_within if w is not None)
    this = one_run(own, means, own_within, stored) if own is not None and len(own) else None
    if own is not None:
        ruled = this or Interval(math.nan, math.nan, math.nan, 0, "pairs")
    else:
        ruled = pool or Interval(
            float(np.mean(means)) if means else math.nan, math.nan, math.nan, len(means), "runs"
        )
    return Replicated(ruled, pool, this, tuple(runs), tuple(per), own)


def replicate_all(mine: dict | None, theirs: Sequence[dict], keys: Sequence | None = None) -> dict:
    """{cell: Replicated} of one comparison: this run's per-cell effects (`mine`; None: ruling the stored
    runs) and each stored run's, each run's within-run noise pooled over its cells (Within.of)."""
    if keys is None:
        keys = sorted(set(mine or {}).union(*theirs), key=lambda k: tuple(str(v) for v in k))
        if mine is not None:
            keys = [k for k in keys if k in mine]
    own = Within.of(mine.values()) if mine is not None else None
    per = [Within.of(t.values()) for t in theirs]
    return {
        k: replicate(mine.get(k) if mine is not None else None, [t.get(k) for t in theirs], own, per)
        for k in keys
    }


@dataclass(frozen=True)
class Compared:
    """A over B per cell (`effects`), the A/A in the same cells (`aa`, labelled `aa_label`: pairs.AA or the
    stand-in) and each GPU cell's host share of wall time (`host`): what judge.py rules on."""

    effects: dict
    aa: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    basis: Basis = PERCENT
    aa_label: str | None = None

    def where(self, keep: Callable[[tuple], bool]) -> "Compared":
        return replace(self, effects={k: v for k, v in self.effects.items() if keep(k)})

    def without(self, i: int) -> "Compared":
        """The stored runs' pooled view with stored run `i` left out of every input (effect and A/A)."""

        def drop(cells: dict) -> dict:
            return {k: replicate(None, [p for j, p in enumerate(r.per) if j != i]) for k, r in cells.items()}

        return replace(self, effects=drop(self.effects), aa=drop(self.aa))


@dataclass(frozen=True)
class Replicas:
    """This run's rows (None: the stored runs are ruled, pooled) beside the stored runs' rows of the same
    grid and settings."""

    this: pd.DataFrame | None
    stored: tuple[tuple[str, pd.DataFrame], ...] = ()
    commit: str = ""  # the stored runs' commit(s)
    metric: str = "tokens_per_second"

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.stored]

    def last_stored(self) -> "Replicas":
        """The stored runs alone, pooled (their stored verdict); RunsError with fewer than MIN_RUNS."""
        if len(self.stored) < thresholds.MIN_RUNS:
            have = f"{len(self.stored)} stored runs hold this grid's rows ({', '.join(self.names) or 'none'})"
            raise RunsError(f"{have}: a pooled verdict needs thresholds.MIN_RUNS = {thresholds.MIN_RUNS}")
        return Replicas(None, self.stored, self.commit, self.metric)

    @property
    def rows(self) -> pd.DataFrame:
        """This run's rows, or the last stored run's when ruling the stored runs (for tables and figures)."""
        return self.this if self.this is not None else self.stored[-1][1]

    def compare(
        self, a: str, b: str, by: Sequence[str], metric: str | None = None, basis: Basis = PERCENT
    ) -> Compared:
        """A over B per cell of `by` (the union over the runs), with the A/A and the GPU host shares."""
        metric = metric or self.metric
        runs = [rows for _, rows in self.stored]
        mine = run_effects(self.this, a, b, by, metric, basis) if self.this is not None else None
        stored = mine is None or any(_same(mine, run_effects(r, a, b, by, metric, basis)) for r in runs)
        this = None if stored else self.this

        def view(x: str, y: str) -> dict:
            mine = run_effects(this, x, y, by, metric, basis) if this is not None else None
            return replicate_all(mine, [run_effects(r, x, y, by, metric, basis) for r in runs])

        labels = {aa_label(r) for r in ([this] if this is not None else []) + runs}
        label = None if None in labels or not labels else " and ".join(sorted(labels))  # mixed: both named
        return Compared(
            view(a, b), view("A/A", "demand") if label else {}, host_shares(self.rows, by), basis, label
        )

    def effects(
        self, a: str, b: str, by: Sequence[str], metric: str | None = None, basis: Basis = PERCENT
    ) -> dict:
        return self.compare(a, b, by, metric, basis).effects


def _same(x: dict, y: dict) -> bool:
    """Whether this run's effects are a stored run's (a notebook run under `--store` of the stored runs)."""
    return x.keys() == y.keys() and all(len(x[k]) == len(y[k]) and np.allclose(x[k], y[k]) for k in x)


def gather(P, this, notebook: str, fingerprint=None, metric="tokens_per_second") -> Replicas:
    """This run's rows with the stored runs' rows of the notebook's grids made under the same settings
    (stored_runs.notebook_rows)."""
    stored = notebook_rows(P, notebook, None, fingerprint)[1]
    commits = sorted({run_meta(runs_root(P.name) / n).get("commit", "?") for n, _ in stored})
    return Replicas(this, stored, ", ".join(commits), metric)
