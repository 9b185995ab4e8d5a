"""The model's error, run by run (docs/perf_model.md, "Validation"): a run's figure (validation_summary of
its validation rows) beside every stored run's (data/results/<profile>/runs/run<k>/validation.csv), each
validation cell's measured demand-over-last_step difference beside the virtual clock's (CellSign), and the
model-error claim ruled on them (model_error_claim)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.criteria import thresholds
from artifact.experiments.outputs.stored_runs import stored_rows
from artifact.experiments.settings import Settings
from artifact.experiments.studies.performance_model.validation import (
    VALIDATION,
    validate_gpu,
    validation_summary,
)
from artifact.experiments.verdicts.counts import at_most, median_interval
from artifact.experiments.verdicts.pooling import Replicas
from artifact.experiments.verdicts.records import Claim, stated

VALIDATION_CELL = ["batch_size", "cache_ratio"]  # a measured demand-vs-last_step comparison: one per cell
LIMIT = thresholds.MODEL_ERROR


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Two runs' validation rows are the same rows (a run compared with its stored copy): same cells,
    repetitions and policies, same measured and modelled seconds per step."""
    keys = ["batch_size", "cache_ratio", "policy", "rep"]
    vals = ["measured_seconds_per_step", "modeled_seconds_per_step"]
    if len(a) != len(b) or not set(keys + vals) <= set(a.columns) & set(b.columns):
        return False
    a, b = (x.sort_values(keys)[keys + vals].reset_index(drop=True) for x in (a, b))
    return bool(
        (a[keys].astype(str).to_numpy() == b[keys].astype(str).to_numpy()).all()
        and np.allclose(a[vals].to_numpy(float), b[vals].to_numpy(float), rtol=1e-9, atol=0)
    )


@dataclass(frozen=True)
class CellSign:
    """One validation cell's demand over last_step (% steps per second): the measured interval it is ruled on
    (verdicts/pooling.py) beside the virtual clock's modelled value, and whether their signs agree."""

    batch_size: int
    cache_ratio: float
    measured: object  # rules.Interval: the ruled interval (pooled, one run widened, or within)
    modeled: float  # this run's modelled difference, %

    @property
    def agrees(self) -> bool | None:
        """None when the measured interval has no sign (it crosses 0, or is unusable)."""
        if not self.measured.excludes_zero:
            return None
        return bool(np.sign(self.measured.mean) == np.sign(self.modeled))

    def text(self) -> str:
        why = {True: "signs agree", False: "signs DISAGREE", None: "crosses 0: no sign to agree with"}
        why = why[self.agrees] if self.measured.usable else "too few pairs for a sign"
        return (
            f"b={self.batch_size} C/W {self.cache_ratio:g}: measured {self.measured.text()}, modelled "
            f"{self.modeled:+.1f}% ({why})"
        )


@dataclass(frozen=True)
class ModelErrors:
    """The model-error figure (validation_summary's median absolute error over cells) of this run and of
    each stored run. The claim is ruled on the median of the stored runs' figures when this run is one of
    them, else on this run's own figure: a run is evidence of its own, never bounded by the stored verdict."""

    this: dict  # validation_summary of this run's rows
    runs: tuple[tuple[str, dict], ...] = ()  # (stored run, its validation_summary), in run order
    stored: str = ""  # the stored run whose rows this run's rows are ("" when none)
    cells: tuple[CellSign, ...] = ()  # measured vs modelled demand over last_step per cell

    @property
    def figures(self) -> list[float]:
        return [s["median_abs_error"] for _, s in self.runs]

    @property
    def pooled(self) -> float | None:
        """The median over the stored runs' figures (None with fewer than 2 stored runs)."""
        return float(np.median(self.figures)) if len(self.runs) >= 2 else None

    @property
    def pooled_range(self) -> tuple[float, float] | None:
        """The 95% distribution-free interval of the stored runs' median (counts.median_interval)."""
        return median_interval(self.figures) if len(self.runs) >= 2 else None

    @property
    def pooled_verdict(self) -> str:
        """The verdict on pooled_range ("" with fewer than 2 stored runs)."""
        return at_most(*self.pooled_range, LIMIT) if self.pooled_range is not None else ""

    @property
    def is_pooled(self) -> bool:
        return bool(self.stored) and self.pooled is not None

    @property
    def ruled(self) -> tuple[float, float]:
        """The range the claim is ruled on: pooled_range when this run is a stored one, else its figure."""
        if self.is_pooled:
            return self.pooled_range
        return self.this["median_abs_error"], self.this["median_abs_error"]

    def leave_one_out(self) -> tuple[str, ...]:
        """The pooled verdict over the other stored runs, each run left out in turn (run order)."""
        f = self.figures
        return tuple(at_most(*median_interval(f[:i] + f[i + 1 :]), LIMIT) for i in range(len(f)))

    def own(self, figure: float) -> str:
        """One run's own verdict: its figure against MODEL_ERROR (counts.at_most)."""
        return at_most(figure, figure, LIMIT)


def cell_signs(
    rows: pd.DataFrame, stored: list[tuple[str, pd.DataFrame]], a: str = "demand", b: str = "last_step"
) -> tuple[CellSign, ...]:
    """Per validation cell, a over b in measured steps per second (higher is faster, as tokens/s) on the
    interval pooling.py rules on (the stored runs' rows give the between-run spread), beside the modelled
    difference of this run."""
    if not {a, b} <= set(rows.policy):
        return ()

    def per_second(r: pd.DataFrame) -> pd.DataFrame:
        return r.assign(measured_steps_per_second=1.0 / r.measured_seconds_per_step)

    reps = Replicas(
        per_second(rows), tuple((n, per_second(r)) for n, r in stored), metric="measured_steps_per_second"
    )
    mod = rows.groupby([*VALIDATION_CELL, "policy"]).modeled_seconds_per_step.mean()
    return tuple(
        CellSign(
            int(bs), float(ratio), r.ruled, float(100.0 * (mod[(bs, ratio, b)] / mod[(bs, ratio, a)] - 1))
        )
        for (bs, ratio), r in reps.effects(a, b, VALIDATION_CELL).items()
    )


def errors_of(rows: pd.DataFrame, stored: list[tuple[str, pd.DataFrame]]) -> ModelErrors:
    """ModelErrors of this run's validation rows beside the stored runs' rows (each [(run name, rows)])."""
    same = next((name for name, r in stored if same_rows(rows, r)), "")
    summaries = tuple((name, validation_summary(r)) for name, r in stored)
    return ModelErrors(validation_summary(rows), summaries, same, cell_signs(rows, stored))


def model_errors(P: Settings, rows: pd.DataFrame) -> ModelErrors:
    """errors_of this run's rows and the stored runs' rows of the same settings (stored_runs.stored_rows)."""
    return errors_of(rows, stored_rows(P, VALIDATION, bench_fingerprint(P)))


def stored_claims(P: Settings) -> list[Claim]:
    """The model-error claim as a `--store` run of the stored runs' last one rules it, from the committed rows
    alone (tests/test_stored_runs.py recomputes the committed record with it)."""
    stored = stored_rows(P, VALIDATION, bench_fingerprint(P))
    if not stored:
        raise ValueError(f"profile {P.name}: no stored validation rows (data/results/{P.name}/runs/run<k>/)")
    rows = stored[-1][1]
    gpu = validation_summary(validate_gpu())
    return [model_error_claim(errors_of(rows, stored), gpu, str(rows.calibration.iloc[0]))]


def signs_text(s: dict) -> str:
    """A validation_summary's sign agreement: "k of n"."""
    return f"{sum(x['modeled_sign_agrees'] for x in s['signs'])} of {len(s['signs'])}"


def summary_text(s: dict) -> str:
    """A run's figure: its median absolute error, the worst cell, and its sign agreement."""
    return (
        f"{100 * s['median_abs_error']:.1f}% (worst {100 * s['worst_abs_error']:.1f}%, "
        f"{s['cells']} cells, signs {signs_text(s)})"
    )


def errors_table(e: ModelErrors) -> pd.DataFrame:
    """One row per run (every stored run, then this run): its median and worst absolute error, its cells, its
    sign agreement and its own verdict (ModelErrors.own)."""
    rows = [*e.runs, (f"this run{f' (= {e.stored})' if e.stored else ''}", e.this)]
    return pd.DataFrame(
        [
            {
                "run": name,
                **{k: s[k] for k in ("median_abs_error", "worst_abs_error", "cells")},
                "signs_agree": signs_text(s),
                "verdict": e.own(s["median_abs_error"]),
            }
            for name, s in rows
        ]
    )


def model_error_claim(e: ModelErrors, gpu_summary: dict, source: str) -> Claim:
    """The model-error claim (docs/perf_model.md, "Validation"): every run's figure printed, ruled as
    ModelErrors says; each stored run's own verdict beside it, and every validation cell's measured
    demand-over-last_step difference beside the virtual clock's, with their sign agreement."""
    n = len(e.runs)
    if e.is_pooled:
        verdict, ruled = e.pooled_verdict, "pooled"
        on = (
            "the 95% distribution-free interval (order statistics) "
            f"of the median over N = {n} stored runs of each run's median absolute error (runs are the unit)"
        )
        reason = f"the interval of the median of the {n} runs' figures"
    else:
        verdict, ruled = at_most(*e.ruled, LIMIT), "this run"
        beside = f"{n} stored runs beside it, not bounding it" if n else "no stored runs to compare"
        on = f"one run: its own median absolute error ({beside})"
        reason = "one run: " + (
            "this run is not one of the stored runs, so its own figure rules" if n else "no stored runs"
        )
    return stated(
        "08-model-error",
        _measured_text(e, gpu_summary, source),
        verdict,
        reason=reason,
        timing=True,
        counting="seconds per denoising step, modelled against measured (a cell: "
        "the mean of its 2 repetitions)",
        interval=on,
        margin=_margin_text(e),
        per_run=tuple(e.own(f) for f in e.figures),
        pooled=e.pooled_verdict,
        ruled=ruled,
        leave_one_out=e.leave_one_out() if e.is_pooled else (),
    )


def _measured_text(e: ModelErrors, gpu_summary: dict, source: str) -> str:
    """What was measured: every stored run's figure, their median, this run's, the cells' measured and
    modelled differences, the h200 check and this run's calibration."""
    n = len(e.runs)
    runs_text = "".join(f"{name} {summary_text(s)}; " for name, s in e.runs)
    if n >= 2:
        lo, hi = e.pooled_range
        runs_text += f"median of the {n} runs {100 * e.pooled:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]; "
    signed = [c for c in e.cells if c.agrees is not None]
    cell_text = (
        "; ".join(c.text() for c in e.cells) + f"; the modelled sign agrees in "
        f"{sum(c.agrees for c in signed)} of {len(signed)} cells whose measured interval excludes 0"
        if e.cells
        else "no paired cells"
    )
    return (
        "cpu, each run's median absolute error of seconds per step (signs: "
        "the modelled sign agrees with k of the n measured demand-vs-last_step differences whose interval "
        f"over the run's pairs excludes 0): {runs_text}"
        f"this run{f' (it is {e.stored})' if e.stored else ''}: {summary_text(e.this)}; "
        "demand over last_step per cell (steps/s), measured on the ruled interval vs modelled (virtual "
        f"clock): {cell_text}; "
        "h200 (gpu_check runs, host costs fitted on them): "
        f"median {100 * gpu_summary['median_abs_error']:.1f}%, "
        f"worst {100 * gpu_summary['worst_abs_error']:.1f}%; calibration (this run): {source}"
    )


def _margin_text(e: ModelErrors) -> str:
    """How far the ruled figure (or range) is from the limit."""
    low, high = e.ruled
    if low == high:
        side = f"{abs(LIMIT - low) * 100:.1f} points {'under' if low <= LIMIT else 'over'}"
        who = "median over runs" if e.is_pooled else "this run"
        return f"{who} {100 * low:.1f}% vs <= {100 * LIMIT:.0f}%: {side}"
    side = "all under" if high <= LIMIT else "all over" if low > LIMIT else "straddles it"
    head = (
        f"median over runs {100 * e.pooled:.1f}%, its interval"
        if e.is_pooled
        else f"this run {100 * e.this['median_abs_error']:.1f}% and the interval of the median over runs"
    )
    return f"{head}: range [{100 * low:.1f}%, {100 * high:.1f}%] vs <= {100 * LIMIT:.0f}%: {side}"
