"""The performance model: the engine on a virtual clock (offload/trace_engine.run_virtual) priced by a
hardware profile (hardware.py), and its validation against measured runs.

model_grid replays routing traces (recorded or synthetic) through the real engine, cache, policies and
link timeline for every policy x C/W x link priority and returns, per cell, the modelled seconds per step,
tokens/s, stall, link busy / wall, host time per step and the per-phase split, with the physical limit
beside them: max(compute, misses x expert bytes / bandwidth), once with the policy's own link transfers and
once with `min`'s misses (the floor of any C-slot demand paging). Every number is a pure function of the
inputs: two runs give identical bits.

validate_cpu runs the tiny model offloaded on the emulated link (real compute, wall clock), records each
run's routing, and models the same run on its own trace with the cpu-emulated profile (its compute costs
calibrated on the model in the same session): the error of seconds per step per cell, and whether every
measured policy difference whose interval excludes 0 has the modelled difference's sign.
validate_gpu does the same for the runs of a gpu_check report, whose routing traces are committed beside
it (data/gpu_check/), with the h200 profile.

The model-error claim (model_error.py) follows the protocol of docs/perf_model.md ("Validation"): `validation`
keeps a run's rows, `model_errors` sets its figure (the median absolute error over its cells) beside every
stored run's (data/results/<profile>/runs/run<k>/validation.csv), and the claim is ruled on the median of the
stored runs' figures when this run is one of them, else on this run's own figure; each validation cell's
measured demand-over-last_step difference is printed beside the virtual clock's, with their sign agreement.
"""

from __future__ import annotations

import pandas as pd
from tqdm.auto import tqdm

from artifact.experiments.counting import MODELED
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.hardware import HARDWARE
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.studies.performance_model.engines import (
    EAGER,
    ENGINES,
    REPLAY_US,
    SEGMENTED,
    Metered,
    SegmentedCosts,
    costs_for,
    host_work,
)
from artifact.experiments.studies.performance_model.estimate import paper_point_stats
from artifact.experiments.studies.performance_model.explain import (
    PAIR,
    Decomposition,
    Sensitivity,
    decomposition,
    decomposition_text,
    engine_predictions,
    engine_predictions_text,
    explain_paper_point,
    sensitivity,
    sensitivity_text,
)
from artifact.experiments.studies.performance_model.model_error import (
    VALIDATION_CELL,
    CellSign,
    ModelErrors,
    cell_signs,
    errors_of,
    errors_table,
    model_error_claim,
    model_errors,
    same_rows,
    steps_per_second,
    stored_claims,
    summary_text,
)
from artifact.experiments.studies.performance_model.plots import plot
from artifact.experiments.studies.performance_model.validation import (
    FAST_LINK,
    VALIDATION,
    VALIDATION_POLICIES,
    VALIDATION_RATIOS,
    cpu_emulated,
    validate_cpu,
    validate_gpu,
    validation,
    validation_summary,
)
from artifact.experiments.studies.performance_model.virtual import (
    CLAIM_SHAPE,
    GPUS,
    OUTPUTS,
    SHAPES,
    TABLE_COLUMNS,
    WALL_STORE_LIMIT,
    check_clock,
    check_grid,
    diffs,
    limits,
    model_grid,
    model_run,
    priced_spec,
    shape,
    to_json,
    tokens_decoded,
    wall_run,
)
from artifact.experiments.verdicts import rules
from artifact.experiments.verdicts.records import Claim, verdict_of
from artifact.experiments.verdicts.rules import Interval
from artifact.offload.links.timeline import PRIORITIES
from artifact.offload.policy.policies import check_policy
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.replay.trace import Trace
from artifact.offload.spec import RunSpec


def measure(P: Settings, progress: bool = True) -> tuple[pd.DataFrame, str]:
    """What a stored run keeps of notebook 08: the validation cells' rows (stored_runs.TIMED_STUDIES)."""
    return validation(P, progress=progress)


# --- notebook 08: the modelled grid, the figure and the claims ----------------------------------------
GRID_RATIOS = (0.43, 0.83, 1.0, 1.73)
GRID_POLICIES = ("demand", "last_step", CONTROL, "cross_layer", "oracle")  # CONTROL: the A/A control
GPU_SHAPES = ("llada2-mini", "llada2-flash")
# the engine the grid and its claims price: the one whose launch costs are measured (engines.py)
ENGINE = EAGER


def paper_point(P: Settings) -> Trace:
    """A synthetic stream at the routing point this artifact infers from the abstract's oracle cut (an
    illustration; notebook 07's 'paper point': its novelty and W spread, from the profile's committed 07
    record, else the cpu profile's), 4 MoE layers, one block of 16 steps, no prefill (short: the grid replays
    it 128 times)."""
    novelty, w_spread = paper_point_stats(P)  # inputs from the checkout, whatever ARTIFACT_DATA says
    return synth(SynthParams(layers=4, blocks=1, steps=16, novelty=novelty, w_spread=w_spread, prefill=0.0))


def gpu_grid(
    streams: dict[str, Trace], spec: RunSpec, full: str = "paper point", progress: bool = True
) -> pd.DataFrame:
    """Every GPU x C/W x policy on every stream (cross_layer only where the trace carries its predictions),
    each cell `spec` (the profile's run: its lookahead and tau; model_grid sets capacity, policy and link
    priority), priced as ENGINE: on `full` for both shapes and both link priorities, on the others (recorded
    traces, longer) for llada2-mini under fifo (what the claims read), to keep the notebook's run time."""
    frames, floors = [], {}
    jobs = [
        (hw, s, name)
        for hw in GPUS
        for s in GPU_SHAPES
        for name in streams
        if name == full or s == "llada2-mini"
    ]
    for hw, s, name in tqdm(jobs, desc="model grid", disable=not progress):
        t = streams[name]
        pols = [p for p in GRID_POLICIES if t.has_predictions or not check_policy(p).needs_prediction]
        prios = PRIORITIES if name == full else ("fifo",)
        grid = model_grid(
            [t], HARDWARE[hw], s, spec, pols, GRID_RATIOS, prios, names=[name], floors=floors, engine=ENGINE
        )
        frames.append(grid)
    df = pd.concat(frames, ignore_index=True)
    df["floor_tokens_per_second"] = df.tokens / (df.floor_per_step * df.steps)
    return df


def explanation(trace: Trace, spec: RunSpec) -> str:
    """Why the model puts demand and last_step level on `trace` (the paper point), what the paper's smallest
    gain (paper.FASTER_PCT[0]) would need, and which reading that supports (explain.py), on every GPU at the
    claim's C/W range."""
    lo, hi = paper.FASTER_RANGE
    ratios = [r for r in GRID_RATIOS if lo <= r <= hi]
    return explain_paper_point(trace, spec, {g: HARDWARE[g] for g in GPUS}, ratios)


def engines_table(trace: Trace, spec: RunSpec) -> pd.DataFrame:
    """Notebook 08's engines table (explain.engine_predictions): demand against last_step on `trace` (the
    paper point) on every GPU, at every C/W of the grid, on the eager engine and the segmented one."""
    return engine_predictions(trace, spec, {g: HARDWARE[g] for g in GPUS}, GRID_RATIOS)


def cell_host_shares(grid: pd.DataFrame, priority: str = "fifo") -> pd.DataFrame:
    """Per hardware x shape x stream x C/W, the cell's host share: the larger of demand's and last_step's
    (engines.host_work; the largest over the policies, as rules.host_shares takes it of measured cells)."""
    g = grid[(grid.link_priority == priority) & grid.policy.isin(PAIR)]
    keys = ["hardware", "shape", "trace", "cache_ratio"]
    return g.groupby(keys, sort=False).host_share.max().reset_index()


def modelled_cells(grid: pd.DataFrame) -> pd.DataFrame:
    """The modelled timing claims' cells: demand over last_step (diffs) beside each cell's host share and
    why the host-share rule gates it (rules.host_bound: host share over thresholds.HOST_SHARE_LIMIT), else
    None."""
    d = diffs(grid).merge(cell_host_shares(grid), on=["hardware", "shape", "trace", "cache_ratio"])
    return d.assign(gate=pd.Series([rules.host_bound(x) for x in d.host_share], index=d.index, dtype=object))


def rule_modelled(kind: str, cells: pd.DataFrame) -> tuple[str, str]:
    """(verdict, reason) of a modelled claim over its cells by the measured claims' rule
    (rules.rule_claim_cells): each cell's modelled difference is a point, an interval of zero width, and a
    cell whose host share is over the limit is inconclusive with rules.host_bound's reason."""
    ivs = [
        (f"{r.hardware} {r.trace} C/W {r.cache_ratio:g}", Interval(r.diff_pct, r.diff_pct, r.diff_pct))
        for r in cells.itertuples()
    ]
    gates = [g if isinstance(g, str) else None for g in cells.gate]
    return rules.rule_claim_cells(kind, ivs, gates)


def _model_claim(d: pd.DataFrame, lo: float, hi: float, text: str, paper_text: str, kind: str) -> Claim:
    sel = d[(d.cache_ratio >= lo - 1e-9) & (d.cache_ratio <= hi + 1e-9) & (d["shape"] == CLAIM_SHAPE)]
    parts = [
        f"{r.hardware} {r.trace} C/W {r.cache_ratio:g}: {r.diff_pct:+.1f}% (host {100 * r.host_share:.0f}%)"
        for r in sel.itertuples()
    ]
    verdict, reason = rule_modelled(kind, sel)
    judged = "> 0" if kind == rules.FASTER else f"+-{thresholds.MARGIN:g}%"
    gated = int(sel.gate.notna().sum())
    return Claim(
        f"[modeled: {', '.join(GPUS)}, {CLAIM_SHAPE}, {ENGINE} engine] {text}",
        paper_text,
        f"demand over last_step, modelled tokens/s, fifo, {ENGINE} engine (the measured launch costs); per "
        "cell the host share of the modelled step (host term + launches above the rooflines, "
        "engines.host_work): " + "; ".join(parts),
        verdict,
        reason,
        counting=f"modelled tokens/s (virtual clock, {ENGINE} engine)",
        interval=MODELED,
        margin=f"range {sel.diff_pct.min():+.1f}..{sel.diff_pct.max():+.1f}% vs {judged}; {gated} of "
        f"{len(sel)} cells host-bound (host share > {100 * thresholds.HOST_SHARE_LIMIT:.0f}%)",
    )


def verdicts(grid: pd.DataFrame, errors: ModelErrors, gpu_summary: dict, source: str) -> list[Claim]:
    """Notebook 08's claims. The two timing claims compare demand with last_step on the grid's cells (the
    eager engine: the engine whose launch costs are measured) and follow the measured timing claims' rule,
    the host-share gate included (rule_modelled)."""
    d = modelled_cells(grid)
    lo, hi = paper.FASTER_RANGE
    claims = [
        _model_claim(
            d,
            lo,
            hi,
            "demand-async is faster than async last-step prefetch at C/W 0.83-1.73",
            f"{paper.FASTER_PCT[0]:+.1f} to {paper.FASTER_PCT[1]:+.1f}%, CIs exclude zero; "
            "judged on the model: demand faster at every C/W 0.83-1.73 on both streams and both GPUs, "
            f"a cell whose host share is over {100 * thresholds.HOST_SHARE_LIMIT:.0f}% inconclusive",
            rules.FASTER,
        ),
        _model_claim(
            d,
            paper.AT_LOW.cache_ratio,
            paper.AT_LOW.cache_ratio,
            "at C/W 0.43 demand-async and async last-step prefetch do not differ (within +-3%)",
            f"{paper.paired_text(paper.AT_LOW)}; judged on the model: |difference| <= "
            f"{thresholds.MARGIN:g}% on both streams and both GPUs, a cell whose host share is over "
            f"{100 * thresholds.HOST_SHARE_LIMIT:.0f}% inconclusive",
            rules.NO_DIFFERENCE,
        ),
    ]
    h = grid[
        (grid.hardware == "h200")
        & (grid["shape"] == CLAIM_SHAPE)
        & (grid.cache_ratio == 1.0)
        & (grid.link_priority == "fifo")
    ].set_index(["trace", "policy"])
    parts, shares = [], []
    for tr in h.index.get_level_values(0).unique():
        dem, ora, floor = (
            h.loc[(tr, "demand"), "seconds_per_step"],
            h.loc[(tr, "oracle"), "seconds_per_step"],
            h.loc[(tr, "demand"), "floor_per_step"],
        )
        share = (dem - ora) / (dem - floor) if dem > floor else 1.0
        shares.append(share)
        far = "; ".join(
            f"{p} {100 * (h.loc[(tr, p), 'seconds_per_step'] / floor - 1):+.0f}%" for p in h.loc[tr].index
        )
        parts.append(f"{tr}: over the floor {far}; the oracle closes {100 * share:.0f}% of demand's gap")
    claims.append(
        Claim(
            "[own result, modeled: h200, llada2-mini] most of demand's distance to the physical "
            "floor is beyond prediction: the oracle closes less than half of it at C/W 1",
            "not a claim of the paper: this artifact's own result; floor = max(compute, "
            "min's misses x expert bytes / bandwidth) per step",
            "; ".join(parts),
            verdict_of(max(shares) < thresholds.GAP_LEFT),
            counting="modelled seconds per step (virtual clock)",
            interval=MODELED,
            margin=f"largest share closed {100 * max(shares):.0f}% vs < {100 * thresholds.GAP_LEFT:.0f}%",
        )
    )
    claims.append(model_error_claim(errors, gpu_summary, source))
    return claims


__all__ = [
    "SHAPES",
    "OUTPUTS",
    "shape",
    "tokens_decoded",
    "priced_spec",
    "TABLE_COLUMNS",
    "model_run",
    "limits",
    "WALL_STORE_LIMIT",
    "wall_run",
    "check_clock",
    "check_grid",
    "model_grid",
    "to_json",
    "VALIDATION_RATIOS",
    "VALIDATION_POLICIES",
    "FAST_LINK",
    "cpu_emulated",
    "validate_cpu",
    "VALIDATION",
    "validation",
    "validate_gpu",
    "validation_summary",
    "VALIDATION_CELL",
    "same_rows",
    "CellSign",
    "ModelErrors",
    "steps_per_second",
    "cell_signs",
    "errors_of",
    "model_errors",
    "stored_claims",
    "summary_text",
    "errors_table",
    "model_error_claim",
    "GRID_RATIOS",
    "GRID_POLICIES",
    "GPUS",
    "GPU_SHAPES",
    "paper_point",
    "gpu_grid",
    "diffs",
    "CLAIM_SHAPE",
    "plot",
    "verdicts",
    "Decomposition",
    "Sensitivity",
    "decomposition",
    "decomposition_text",
    "sensitivity",
    "sensitivity_text",
    "explanation",
    "EAGER",
    "SEGMENTED",
    "ENGINES",
    "ENGINE",
    "REPLAY_US",
    "SegmentedCosts",
    "Metered",
    "costs_for",
    "host_work",
    "engine_predictions",
    "engine_predictions_text",
    "engines_table",
    "cell_host_shares",
    "modelled_cells",
    "rule_modelled",
]
