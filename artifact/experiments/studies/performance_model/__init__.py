"""The performance model (notebook 08): the engine on a virtual clock priced by a hardware profile, and its
validation against measured runs. virtual.py runs the model (model_grid, a pure function of its inputs);
engines.py prices the eager or the segmented engine and splits a step by who paces it; validation.py measures
runs and models each on its own routing; model_error.py rules the model-error claim over the stored runs;
explain.py and search.py say why demand and last_step come out level and what the paper's gain would need;
plots.py draws the figure; estimate.py prices a GPU grid for doctor. This module holds notebook 08's grid and
claims, and re-exports the names the notebook, the CLI and the benchmarks use.
"""

from __future__ import annotations

import pandas as pd
from tqdm.auto import tqdm

from artifact.experiments.counting import MODELED
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.hardware import HARDWARE
from artifact.experiments.settings import CONTROL, Settings
from artifact.experiments.studies.performance_model.engines import (  # noqa: F401
    EAGER,
    ENGINES,
    REPLAY_US,
    SEGMENTED,
    costs_for,
    host_work,
)
from artifact.experiments.studies.performance_model.estimate import paper_point_stats
from artifact.experiments.studies.performance_model.explain import (  # noqa: F401
    engine_predictions_text,
    engines_table,
    explanation,
)
from artifact.experiments.studies.performance_model.model_error import (  # noqa: F401
    CellSign,
    ModelErrors,
    errors_of,
    errors_table,
    model_error_claim,
    model_errors,
    stored_claims,
)
from artifact.experiments.studies.performance_model.plots import plot  # noqa: F401
from artifact.experiments.studies.performance_model.search import PAIR
from artifact.experiments.studies.performance_model.validation import (  # noqa: F401
    VALIDATION,
    cpu_emulated,
    validate_cpu,
    validate_gpu,
    validation,
    validation_summary,
)
from artifact.experiments.studies.performance_model.virtual import (  # noqa: F401
    CLAIM_SHAPE,
    GPUS,
    GRID_RATIOS,
    SHAPES,
    TABLE_COLUMNS,
    check_clock,
    check_grid,
    diffs,
    model_grid,
    model_run,
    priced_spec,
    shape,
    to_json,
)
from artifact.experiments.verdicts import rules
from artifact.experiments.verdicts.records import Claim, stated, verdict_of
from artifact.experiments.verdicts.rules import Interval
from artifact.offload.links.timeline import PRIORITIES
from artifact.offload.policy.policies import check_policy
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.replay.trace import Trace
from artifact.offload.spec import RunSpec

# the grid's policies (CONTROL: last_step's prediction on the host, no transfers: demand's work)
GRID_POLICIES = ("demand", "last_step", CONTROL, "cross_layer", "oracle")
GPU_SHAPES = ("llada2-mini", "llada2-flash")
# the engine the grid and its claims price: the one whose launch costs are measured (engines.py)
ENGINE = EAGER
CELL = ["hardware", "shape", "trace", "cache_ratio"]  # a modelled cell of the grid
# what a stored run keeps of notebook 08: the validation rows (stored_runs.TIMED_STUDIES)
measure = validation


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
    each cell `spec` (its lookahead and tau), priced as ENGINE: on `full` for both shapes and both link
    priorities, on the others (recorded traces, longer) for llada2-mini under fifo (what the claims read).
    Each row names its stream's model (`recorded_by`: the trace's, "synthetic" for a generated stream) and
    its MoE layers."""
    frames, floors = [], {}
    jobs = [(hw, s, n) for hw in GPUS for s in GPU_SHAPES for n in streams if n == full or s == "llada2-mini"]
    for hw, s, name in tqdm(jobs, desc="model grid", disable=not progress):
        t = streams[name]
        pols = [p for p in GRID_POLICIES if t.has_predictions or not check_policy(p).needs_prediction]
        prios = PRIORITIES if name == full else ("fifo",)
        grid = model_grid(
            [t], HARDWARE[hw], s, spec, pols, GRID_RATIOS, prios, names=[name], floors=floors, engine=ENGINE
        )
        frames.append(grid.assign(recorded_by=t.meta.get("model"), moe_layers=len(t.meta["moe_layers"])))
    df = pd.concat(frames, ignore_index=True)
    df["floor_tokens_per_second"] = df.tokens / (df.floor_per_step * df.steps)
    return df


def cell_host_shares(grid: pd.DataFrame, priority: str = "fifo") -> pd.DataFrame:
    """Per cell (CELL), the larger of demand's and last_step's host share (engines.host_work; the largest
    over the policies, as pairs.host_shares takes it of measured cells)."""
    g = grid[(grid.link_priority == priority) & grid.policy.isin(PAIR)]
    return g.groupby(CELL, sort=False).host_share.max().reset_index()


def modelled_cells(grid: pd.DataFrame) -> pd.DataFrame:
    """The modelled timing claims' cells: demand over last_step (diffs) beside each cell's host share and
    why the host-share rule gates it (rules.host_bound), else None."""
    d = diffs(grid).merge(cell_host_shares(grid), on=CELL)
    return d.assign(gate=pd.Series([rules.host_bound(x) for x in d.host_share], index=d.index, dtype=object))


def rule_modelled(kind: str, cells: pd.DataFrame) -> tuple[str, str]:
    """(verdict, reason) of a modelled claim over its cells by the measured claims' rule
    (rules.rule_claim_cells): each cell's difference a point, an interval of zero width, and a host-bound
    cell inconclusive with rules.host_bound's reason."""
    ivs = [
        (f"{r.hardware} {r.trace} C/W {r.cache_ratio:g}", Interval(r.diff_pct, r.diff_pct, r.diff_pct))
        for r in cells.itertuples()
    ]
    return rules.rule_claim_cells(kind, ivs, [g if isinstance(g, str) else None for g in cells.gate])


def _model_claim(d: pd.DataFrame, lo: float, hi: float, key: str, kind: str) -> Claim:
    sel = d[(d.cache_ratio >= lo - 1e-9) & (d.cache_ratio <= hi + 1e-9) & (d["shape"] == CLAIM_SHAPE)]
    parts = [
        f"{r.hardware} {r.trace} C/W {r.cache_ratio:g}: {r.diff_pct:+.1f}% (host {100 * r.host_share:.0f}%)"
        for r in sel.itertuples()
    ]
    judged = "> 0" if kind == rules.FASTER else f"+-{thresholds.MARGIN:g}%"
    verdict, reason = rule_modelled(kind, sel)
    return stated(
        key,
        f"demand over last_step, modelled tokens/s, fifo, {ENGINE} engine (the measured launch costs); per "
        "cell the host share of the modelled step (host term + launches above the rooflines, "
        "engines.host_work): " + "; ".join(parts),
        verdict,
        {"modelled": f"{', '.join(GPUS)}, {CLAIM_SHAPE}, {ENGINE} engine"},
        reason=reason,
        counting=f"modelled tokens/s (virtual clock, {ENGINE} engine)",
        interval=MODELED,
        margin=f"range {sel.diff_pct.min():+.1f}..{sel.diff_pct.max():+.1f}% vs {judged}; "
        f"{int(sel.gate.notna().sum())} of {len(sel)} cells host-bound (host share > "
        f"{100 * thresholds.HOST_SHARE_LIMIT:.0f}%)",
    )


def _floor_claim(grid: pd.DataFrame) -> Claim:
    """The own result on the h200 at C/W 1: how much of demand's distance to the physical floor the oracle
    closes, per stream."""
    h = grid[
        (grid.hardware == "h200")
        & (grid["shape"] == CLAIM_SHAPE)
        & (grid.cache_ratio == 1.0)
        & (grid.link_priority == "fifo")
    ]
    parts, shares = [], []
    for tr, g in h.groupby("trace", sort=False):
        sec = g.set_index("policy").seconds_per_step
        dem, ora, floor = sec["demand"], sec["oracle"], g[g.policy == "demand"].floor_per_step.iloc[0]
        shares.append((dem - ora) / (dem - floor) if dem > floor else 1.0)
        far = "; ".join(f"{p} {100 * (s / floor - 1):+.0f}%" for p, s in sec.items())
        parts.append(f"{tr}: over the floor {far}; the oracle closes {100 * shares[-1]:.0f}% of demand's gap")
    return stated(
        "08-floor",
        "; ".join(parts),
        verdict_of(max(shares) < thresholds.GAP_LEFT),
        counting="modelled seconds per step (virtual clock)",
        interval=MODELED,
        margin=f"largest share closed {100 * max(shares):.0f}% vs < {100 * thresholds.GAP_LEFT:.0f}%",
    )


def verdicts(grid: pd.DataFrame, errors: ModelErrors, gpu_summary: dict, source: str) -> list[Claim]:
    """Notebook 08's claims. The two timing claims compare demand with last_step on the grid's cells (the
    eager engine, whose launch costs are measured) by the measured timing claims' rule, the host-share gate
    included (rule_modelled); then the floor claim and the model-error claim."""
    d = modelled_cells(grid)
    low = paper.AT_LOW.cache_ratio
    return [
        _model_claim(d, *paper.FASTER_RANGE, "08-faster", rules.FASTER),
        _model_claim(d, low, low, "08-equal", rules.NO_DIFFERENCE),
        _floor_claim(grid),
        model_error_claim(errors, gpu_summary, source),
    ]
