"""The run as the unit of replication: every timing verdict is ruled on an interval that carries the variation
between runs, not only the variation between the pairs of one run.

The pairs of one run share the machine's state (its load, its clock, where the allocator put things), so an
interval over them says how precisely that run measured itself, not what another run on another day will see:
on the cpu profile, estimates of one run fell outside another run's 95% intervals over pairs. So a stored
(headline) result is N >= MIN_RUNS runs of the timing notebooks at one commit, and their raw rows are committed:

    data/results/<profile>/runs/run<k>/<stem>.csv    run k's raw rows of grid <stem>, as the bench wrote them
    data/results/<profile>/runs/run<k>/run.json      its commit, date, load average and command
    data/results/<profile>/runs/run<k>/manifest.json each row file's row count and sha256 (outputs/manifest.py):
                                                     every reader checks the runs first (check_stored_runs)

Per cell (one task, batch size, C/W, bandwidth; no interval pools cells), with d the per-pair difference of A over
B on the claim's basis (`Basis`: PERCENT, (A - B) / B x 100, or STALL_SHARE, A's stall per forward minus B's as
% of B's wall time per forward), x_i the mean of d over run i's pairs and s the standard deviation of x_1..x_N:

    pooled     mean(x) +- t_{N-1} * s / sqrt(N)          the t interval over per-run means (METHOD)
    one run    x_i +- max(t_{N-1} * s, t_{n-1} * w)      a run's own interval (ONE_RUN): its mean, with the spread of
                                                         a run's mean that the stored runs showed, or its own
                                                         pairs' standard error w when that is larger
    single     hull(one run, pooled)                     what a run that is not a stored one is ruled on (SINGLE)

A direction claim (rules.FASTER) asks its question of the effect net of the A/A control: per matched pair (same
cell, run and repetition) d = d(A over B) - d(CONTROL over demand), a difference in differences with the run as
the unit (Compared.net); equivalence and non-superiority claims ask it of d(A over B), with the control as a
precision gate (rules.control_ruling).

A run that is one of the stored runs (its rows are a stored run's rows, `--store`) is ruled on the pooled
interval; any other run (a fresh clone's ./run_all.sh) on the hull of its one-run interval and the pooled one, and
says so. The rules are monotone under widening (rules.py), so a single run's verdict is the pooled one or
inconclusive: it never contradicts the stored result. A run with no stored runs to borrow from has only its own
pairs: its interval is the t interval over them (WITHIN), labelled as such.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from artifact.errors import RunsError
from artifact.experiments.claims import run_info
from artifact.experiments.criteria import thresholds
from artifact.experiments.effects import PERCENT, Basis, RunEffect, run_views
from artifact.experiments.outputs.manifest import check_runs, write_manifest
from artifact.experiments.outputs.paths import reference_data_dir, results_dir, short_path
from artifact.experiments.rules import Interval, host_shares, hull
from artifact.paths import atomic_write_text

RUNS = "runs"
METHOD = f"{thresholds.CONFIDENCE:.0%} t interval over per-run means (runs are the unit, df = N - 1)"
ONE_RUN = (f"one run: its mean +- max(t_(N-1) x the sd of the stored runs' means, t_df x its own standard error, "
           f"the within-run sd pooled over the comparison's cells) ({thresholds.CONFIDENCE:.0%})")
SINGLE = (f"one run: the hull of its mean +- max(t_(N-1) x the sd of the stored runs' means, t_df x its own pooled "
          f"standard error) and the pooled {thresholds.CONFIDENCE:.0%} interval")
WITHIN = f"{thresholds.CONFIDENCE:.0%} t interval over this run's pairs (within one run: no between-run variance)"


@dataclass(frozen=True)
class TimedStudy:
    """A timing notebook: its study (artifact/experiments/studies/<module>, whose `measure(P, progress)` writes the
    rows a stored run keeps and whose `stored_claims(P)` rules on the stored ones) and its raw row files
    (data/results/<profile>/<stem>.csv)."""
    notebook: str
    module: str
    stems: tuple[str, ...]


# The timing notebooks, once: scripts/record_runs.py measures them, tests/test_stored_runs.py recomputes them.
TIMED_STUDIES = (
    TimedStudy("03_bandwidth_throttling", "bandwidth_throttling", ("throttle_runs",)),
    TimedStudy("04_capacity_sweep", "capacity_sweep", ("bench",)),
    TimedStudy("05_tide_head_to_head", "tide_head_to_head", ("tide_style_runs",)),
    TimedStudy("06_beyond_the_paper", "beyond_the_paper", ("beyond-fifo", "beyond-demand")),
    TimedStudy("07_routing_map", "routing_map", ("streams",)),
    TimedStudy("08_performance_model", "performance_model", ("validation",)),
    TimedStudy("09_cache_design_space", "cache_design_space", ("cache_design_runs",)),
)
TIMED_STEMS = tuple(s for t in TIMED_STUDIES for s in t.stems)     # what a stored run keeps


# ---------------------------------------------------------------------------------------------
# Stored runs
# ---------------------------------------------------------------------------------------------
def runs_root(profile_name: str, reference: Path | None = None) -> Path:
    base = Path(reference) / "data" / "results" / profile_name if reference else reference_data_dir(profile_name)
    return base / RUNS


def stored_runs(profile_name: str, reference: Path | None = None) -> list[Path]:
    """The stored runs of a profile, run1, run2, ... in number order, checked (check_stored_runs)."""
    return check_stored_runs(profile_name, reference)


def check_stored_runs(profile_name: str, reference: Path | None = None, ruled_on: int = 0) -> list[Path]:
    """The stored runs of a profile, each matching its manifest, numbered without a gap, at one commit, and at
    least the `ruled_on` runs the claim records were ruled on (outputs/manifest.check_runs); else RunsError, one
    line naming the run and the fault. Every reader of the stored runs goes through it before it rules."""
    root = runs_root(profile_name, reference)
    found = check_runs(root)
    if len(found) < ruled_on:
        raise RunsError(f"{short_path(root)}: {len(found)} stored runs ({', '.join(p.name for p in found) or 'none'})"
                        f", but the claim records were ruled on {ruled_on}: a run is missing")
    return found


def run_meta(run: Path) -> dict:
    try:
        return json.loads((Path(run) / "run.json").read_text())
    except (OSError, ValueError) as e:
        raise RunsError(f"{run}/run.json: unreadable ({e}); a stored run needs its run.json") from e


def row_files(P, stem: str, directory: Path | None = None) -> list[Path]:
    """The files of grid `stem` in a folder (default: this profile's working folder, results_dir): <stem>.csv
    and the <stem>-<fingerprint>.csv files harness.bench_file writes when settings changed."""
    d = Path(directory) if directory is not None else results_dir(P)
    return sorted(p for p in d.glob(f"{stem}*.csv") if p.stem == stem or p.stem.startswith(f"{stem}-"))


def stored_rows(P, stem: str, fingerprint: str | None = None, reference: Path | None = None,
                read=pd.read_csv) -> list[tuple[str, pd.DataFrame]]:
    """[(run name, its rows of grid `stem`)] over the stored runs that hold rows made under `fingerprint`
    (every row when None or when the file has no fingerprint column)."""
    out = []
    for run in stored_runs(P.name, reference):
        frames = []
        for f in row_files(P, stem, run):
            df = read(f)
            if fingerprint is not None and "fingerprint" in df.columns:
                df = df[df.fingerprint.astype(str) == fingerprint]
            if len(df):
                frames.append(df)
        if frames:
            out.append((run.name, pd.concat(frames, ignore_index=True)))
    return out


def next_run(profile_name: str, reference: Path | None = None) -> tuple[Path, dict]:
    """(the folder the next stored run goes to, this checkout's run_info), or RunsError when the stored runs are
    damaged (check_stored_runs) or of another commit than this checkout."""
    have = stored_runs(profile_name, reference)
    dest = runs_root(profile_name, reference) / f"run{int(have[-1].name[3:]) + 1 if have else 1}"
    info = run_info()
    at = run_meta(have[-1]).get("commit") if have else info["commit"]
    if dest.exists() or at != info["commit"]:
        raise RunsError(f"{short_path(dest)}: exists already" if dest.exists() else
                        f"{short_path(dest.parent)}: the stored runs are at commit {at}, this checkout at "
                        f"{info['commit']}; a stored result is runs at one commit (move them away to record anew)")
    return dest, info


def record_run(P, stems: Sequence[str] = TIMED_STEMS, reference: Path | None = None, seconds: float | None = None,
               command: str | None = None, log=print, rotation: int | None = None) -> Path:
    """Copy this profile's working row files (results_dir) of `stems` into a new stored run, runs/run<k>/ with k
    one more than the last, with its run.json and manifest.json: written into a temporary folder and renamed, so a
    run is either whole or absent; never over an existing run, nor beside damaged runs or runs of another commit.
    `rotation`: the Settings.rotation the run was measured with, kept in run.json when given."""
    files = [f for s in stems for f in row_files(P, s)]
    if not files:
        only = ",".join(t.notebook[:2] for t in TIMED_STUDIES)
        raise RunsError(f"{results_dir(P)}: no row files of the timing notebooks ({', '.join(stems)}); run them "
                        f"first (python -m artifact notebooks --only {only})")
    dest, info = next_run(P.name, reference)
    root, k = dest.parent, int(dest.name[3:])
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".run{k}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in files:
        shutil.copyfile(f, tmp / f.name)
    meta = {"run": k, **info, **({"command": command} if command else {}),
            **({"rotation": rotation} if rotation is not None else {}), "host": socket.gethostname(),
            "load_average": list(os.getloadavg()), "cpus": os.cpu_count(), "seconds": seconds,
            "files": sorted(f.name for f in files)}
    atomic_write_text(tmp / "run.json", json.dumps(meta, indent=1) + "\n")
    write_manifest(tmp)
    tmp.rename(dest)
    log(f"recorded {len(files)} row files as {dest}")
    return dest


def clear_working(P, stems: Sequence[str] = TIMED_STEMS, log=print) -> int:
    """Remove this profile's working row files of `stems` (and their lock sidecars), so the next run of the timing
    notebooks measures afresh. Stored runs and the committed reference are untouched."""
    n = 0
    for s in stems:
        for f in row_files(P, s):
            for g in (f, f.with_name(f.name + ".lock")):
                if g.exists():
                    g.unlink()
            n += 1
    log(f"cleared {n} working row files in {results_dir(P)}")
    return n


def cached_rows(P, stem: str, fingerprint: str, measure: Callable[[], pd.DataFrame], log=print) -> pd.DataFrame:
    """A timing notebook's rows that are not a bench grid (07's streams, 08's validation cells), kept like a grid:
    data/results/<profile>/<stem>.csv is reused when it holds rows made under `fingerprint`, else `measure()` runs
    and its rows are written there atomically (column `fingerprint` added). Read back from the file either way, so
    a run compares equal to its stored copy."""
    path = results_dir(P) / f"{stem}.csv"
    if path.is_file():
        have = pd.read_csv(path)
        if "fingerprint" in have.columns and set(have.fingerprint.astype(str)) == {fingerprint}:
            log(f"{stem}: reusing {len(have)} rows of {path.name} (remove it to measure again)")
            return have
    rows = measure().assign(fingerprint=fingerprint)
    atomic_write_text(path, rows.to_csv(index=False))
    return pd.read_csv(path)


# ---------------------------------------------------------------------------------------------
# Intervals per cell
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def t_quantile(confidence: float, df: int) -> float:
    """The two-sided `confidence` quantile of t on `df` degrees of freedom (cached: the harness asks often)."""
    return float(stats.t.ppf(0.5 + confidence / 2, df))


def t_interval(values: Sequence[float], confidence: float = thresholds.CONFIDENCE) -> tuple[float, float, float]:
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


def one_run_interval(run: RunEffect, stored_means: Sequence[float],
                     confidence: float = thresholds.CONFIDENCE, spread: float | None = None) -> Interval:
    """A single run's interval (ONE_RUN): its mean +- max(t_(N-1) s, t_df w), s the sd of the stored runs' means
    (`spread`, when the caller has it), w the run's own standard error (RunEffect.se: its within-run sd pooled over
    the comparison's cells when the run carries it, on that pooled df); with fewer than 2 stored runs, the t
    interval over its own pairs."""
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
    """One cell's effect in every view: this run's, each stored run's, and pooled over the stored runs. Built by
    `replicate` from the runs' RunEffects (`own`, `per`), which it keeps, so `at` can give the same cell at another
    confidence level (the simultaneous level of a claim over several cells) or with a stored run left out; built
    from intervals alone (`own` None), it has only its own level."""
    this: Interval                   # this run's own interval (ONE_RUN, or WITHIN without stored runs)
    runs: tuple[Interval | None, ...]  # each stored run's one-run interval, in run order (None: the run lacks the
                                       # cell; empty: none stored)
    pooled: Interval | None          # over the stored runs' means (None: fewer than 2 stored runs)
    stored: bool                     # this run is one of the stored runs: it is ruled on the pooled interval
    own: RunEffect | None = None     # this run's effect
    per: tuple[RunEffect | None, ...] = ()   # each stored run's effect (None: it lacks the cell)

    def single(self, own: Interval | None = None) -> Interval:
        """What one run (this run, or `own`: a stored run's one-run interval) is ruled on alone: the hull of its
        interval and the pooled one (SINGLE); its own interval when nothing is pooled."""
        own = self.this if own is None else own
        return hull(own, self.pooled) if self.pooled is not None else own

    @property
    def ruled(self) -> Interval:
        if self.pooled is None:
            return self.this
        return self.pooled if self.stored else self.single()

    def at(self, confidence: float = thresholds.CONFIDENCE, drop: int | None = None) -> "Replicated":
        """This cell at another confidence level, or with stored run `drop` (0-based) left out of the pool (the
        leave-one-out view); itself when built from intervals alone."""
        if self.own is None:
            return self
        per = tuple(p for i, p in enumerate(self.per) if i != drop)
        return replicate(self.own, per, self.stored and drop is None, confidence, runs=drop is None)


def replicate(own: RunEffect, per: Sequence[RunEffect | None], stored: bool,
              confidence: float = thresholds.CONFIDENCE, runs: bool = True) -> Replicated:
    """One cell's Replicated from this run's effect and each stored run's (None where a run lacks the cell: it is
    left out of the pool, and its one-run interval is None, so the runs stay matched by name, never by position).
    `runs` False leaves out each stored run's one-run interval (the leave-one-out view needs only the pool)."""
    means = [p.mean for p in per if p is not None]
    spread = float(np.std(means, ddof=1)) if len(means) >= 2 else None
    each = tuple(None if p is None else one_run_interval(p, means, confidence, spread) for p in per) if runs else ()
    return Replicated(one_run_interval(own, means, confidence, spread), each,
                      pooled_interval(means, confidence) if len(means) >= 2 else None, stored, own, tuple(per))


@dataclass(frozen=True)
class Compared:
    """A over B per cell (`effects`), with the A/A control over demand in the same cells (`control`: {} when the
    rows carry no control runs), A over B net of the control per matched pair (`net`, the difference in
    differences a direction claim rules on, oriented by demand's role: effects.net_difference; {} without a control)
    and each cell's GPU host share of wall time per forward (`host`: {} on the CPU, rules.host_shares): what
    `judge` rules on, and what every timing study's numbers hold."""
    effects: dict
    control: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    net: dict = field(default_factory=dict)
    basis: Basis = PERCENT

    def where(self, keep: Callable[[tuple], bool]) -> "Compared":
        """Only the cells whose key `keep` accepts (their controls, net effects and host shares go with them)."""
        return Compared({k: v for k, v in self.effects.items() if keep(k)}, self.control, self.host,
                        {k: v for k, v in self.net.items() if keep(k)}, self.basis)


@dataclass(frozen=True)
class Replicas:
    """This run's rows beside the stored runs' rows of the same grid (same settings): the replicas every per-cell
    interval is computed over (`effects`, `compare`). Each run's views of one comparison are computed once
    (effects.run_views) and kept (`_memo`), so a comparison asked again, or a Replicas made `with_this` another run,
    does not pivot the stored runs again."""
    this: pd.DataFrame
    stored: tuple[tuple[str, pd.DataFrame], ...] = ()
    commit: str = ""                 # the stored runs' commit ("" when none, "a, b" when they differ)
    metric: str = "tokens_per_second"
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.stored]

    @property
    def n(self) -> int:
        return len(self.stored)

    def last_stored(self) -> "Replicas":
        """These runs with the last stored run as this run: what a `--store` pass on the stored runs rules on."""
        if self.n < thresholds.MIN_RUNS:
            raise RunsError(f"{self.n} stored runs hold this grid's rows ({', '.join(self.names) or 'none'}): a "
                            f"pooled verdict needs thresholds.MIN_RUNS = {thresholds.MIN_RUNS}")
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

    def compare(self, a: str, b: str, by: Sequence[str], metric: str | None = None,
                basis: Basis = PERCENT) -> Compared:
        """A over B per cell of `by` on `basis`, with the A/A control (CONTROL over demand) in the same cells and A
        over B net of it (oriented by demand's role) when the rows carry it, and the cells' GPU host shares."""
        metric = metric or self.metric
        mine, theirs, me_stored = self._all_views(a, b, by, metric, basis)

        def view(v: str) -> dict:
            if v not in mine:
                return {}
            return {key: replicate(eff, [t.get(v, {}).get(key) for t in theirs], me_stored)
                    for key, eff in mine[v].items()}
        return Compared(view("effect"), view("control"), host_shares(self.this, by), view("net"), basis)

    def effects(self, a: str, b: str, by: Sequence[str], metric: str | None = None, basis: Basis = PERCENT,
                net: bool = False) -> dict[tuple, Replicated]:
        """{cell key: Replicated} of A over B per cell of `by` (the cells of this run), on `basis`, net of the A/A
        control when `net` (effects.run_views)."""
        c = self.compare(a, b, by, metric, basis)
        return c.net if net else c.effects


def _same_effects(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(
        len(x[k].diffs) == len(y[k].diffs) and np.allclose(x[k].diffs, y[k].diffs, rtol=1e-9, atol=1e-12) for k in x)


def gather(P, this: pd.DataFrame, stem: str | Sequence[str], fingerprint: str | None = None,
           metric: str = "tokens_per_second", reference: Path | None = None, read=pd.read_csv) -> Replicas:
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
