"""The performance model against measured runs: validate_cpu (the tiny model offloaded on the emulated link,
each run modelled on its own routing with cpu-emulated costs calibrated in the same session), validate_gpu (a
gpu_check report's runs with the h200 profile), `validation` (a run's rows, kept as a stored run's) and
validation_summary (a run's figure). The model-error claim over the stored runs: model_error.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from artifact.experiments.bench.order import slot_order
from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.hardware import HARDWARE, committed_gpu_check, hardware, load_gpu_check
from artifact.experiments.harness import load_model
from artifact.experiments.paired_table import paired_table
from artifact.experiments.recording import cached_rows
from artifact.experiments.settings import Settings
from artifact.experiments.studies.performance_model.virtual import model_run, shape
from artifact.model.config import PRESETS
from artifact.model.tasks import prompts
from artifact.offload.links.costs import Costs, Hardware, Shape
from artifact.offload.replay.sim import capacity_for
from artifact.offload.replay.trace import Trace, mean_working_set
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec
from artifact.offload.trace_engine import calibrate

VALIDATION_RATIOS = (0.43, 1.0, 1.73)
VALIDATION_POLICIES = ("demand", "last_step")
VALIDATION = "validation"  # data/results/<profile>/validation.csv: the timed validation rows (pooling)
FAST_LINK = dict(link="emulated", link_gbps=1e6, latency_us=0.0)  # a link no compute ever waits on


def cpu_emulated(
    P: Settings, loaded, ps: list[list[int]], batch_size: int = 1, reps: int = 1, trace: Trace | None = None
) -> tuple[Hardware, str]:
    """The cpu-emulated profile with its costs measured now, on this machine, on the offloaded engine:
    runs on a link too fast to wait on at two C (demand) give the host time per copy (the slope of time on
    copies) and the compute; trace_engine.calibrate's resident run splits that compute between the experts and
    the rest (its share of expert time)."""
    resident = P.run_spec()
    cal = calibrate(loaded, ps, resident, batch_size)
    if trace is None:
        trace = decode_prompts(loaded, ps, batch_size, resident, record=True).trace
    W = mean_working_set(trace)
    points = []
    for ratio in (0.43, 3.0):
        C = capacity_for(ratio, W, loaded.cfg.num_experts)
        spec = P.run_spec(C, "demand", **FAST_LINK)
        res = [decode_prompts(loaded, ps, batch_size, spec) for _ in range(reps + 1)][1:]
        best = min(res, key=lambda r: r.stats.seconds).stats
        points.append((best.transfers, best.seconds, best.demand_hits + best.demand_misses))
    (x1, t1, accesses), (x2, t2, _) = points
    copy_s = max(0.0, (t1 - t2) / (x1 - x2)) if x1 != x2 else 0.0
    compute = t2 - x2 * copy_s
    demands = len(trace)
    share = cal.compute_us_per_expert * 1e-6 * accesses / compute if compute > 0 else 0.0
    share = min(max(share, 0.0), 1.0)
    hw = dataclasses.replace(
        HARDWARE["cpu-emulated"],
        expert_us=1e6 * compute * share / accesses,
        other_us_per_demand=1e6 * compute * (1 - share) / demands,
        plan_us=0.0,
        copy_host_us=1e6 * copy_s,
    )
    source = (
        f"{hw.expert_us:.1f} us per expert, {hw.other_us_per_demand:.0f} us other per demand, "
        f"{hw.copy_host_us:.1f} us host per copy"
    )
    return hw, source


def validate_cpu(
    P: Settings,
    ratios=VALIDATION_RATIOS,
    policies=VALIDATION_POLICIES,
    batch_sizes=(1, 4),
    repetitions: int = 2,
    n_prompts: int = 2,
    progress: bool = True,
) -> tuple[pd.DataFrame, str]:
    """Measured (wall clock, real compute, emulated link) against modelled seconds per step, one row per run;
    repetition rep runs the policies in the order slot_order(policies, P.rotation * repetitions + rep)
    (bench/order.py). Returns the rows and the calibration's description."""
    loaded = load_model(P)
    task = P.tasks[0]
    _, ps = prompts(loaded.tokenizer, task, n_prompts, P.seed, P.max_prompt_tokens)
    shp = shape("tiny") if loaded.cfg.name == "tiny" else Shape.of(loaded.cfg, 4)
    costs, sources, traces = {}, [], {}
    for b in batch_sizes:  # compute per demand grows with the batch: calibrated per batch size
        # The routing of every run of this batch size (offloading changes time, never results); measured runs
        # do not record, since recording also computes each layer's cross-layer prediction.
        traces[b] = decode_prompts(loaded, ps, b, P.run_spec(), record=True, task=task).trace
        hw, source = cpu_emulated(P, loaded, ps, b, trace=traces[b])
        costs[b] = Costs(hw, shp)
        sources.append(f"batch {b}: {source}")
    source = "; ".join(sources)
    rows = []
    jobs = [(b, r, rep) for b in batch_sizes for r in ratios for rep in range(repetitions)]
    for b, ratio, rep in tqdm(jobs, desc="validate", disable=not progress):
        t = traces[b]
        C = capacity_for(ratio, mean_working_set(t), loaded.cfg.num_experts)
        order = slot_order(policies, P.rotation * repetitions + rep)
        for policy in order:
            spec = P.run_spec(C, policy)
            res = decode_prompts(loaded, ps, b, spec, task=task)
            # The run modelled: its policy, priority, lookahead and tau. Its forward mode and kernel are in
            # the costs, calibrated on this run's own forwards (cpu_emulated); a virtual run has no forward.
            modelled = spec.replace(link_gbps=None, forward="eager", expert_kernel="grouped")
            m = model_run(t, costs[b], modelled)
            s = res.stats
            rows.append(
                {
                    "task": task,
                    "batch_size": b,
                    "cache_ratio": ratio,
                    "bandwidth_scale": 1.0,
                    "cache_experts": C,
                    "rep": rep,
                    "policy": policy,
                    "measured_seconds_per_step": s.seconds / s.forwards,
                    "modeled_seconds_per_step": m["seconds_per_step"],
                    "measured_stall": s.stall_seconds,
                    "modeled_stall": m["stall_per_step"] * m["steps"],
                    "demand_misses": s.demand_misses,
                    "modeled_demand_misses": m["demand_misses"],
                    "forwards": s.forwards,
                }
            )
    df = pd.DataFrame(rows)
    df["error"] = df.modeled_seconds_per_step / df.measured_seconds_per_step - 1
    return df, source


def validation(P: Settings, progress: bool = True) -> tuple[pd.DataFrame, str]:
    """The validation protocol of docs/perf_model.md: validate_cpu at batch sizes 1 and 4 and every C/W of the
    profile's grid, 2 repetitions, reused from data/results/<profile>/validation.csv when made under these
    settings (recording.cached_rows). Returns the rows and the calibration's description."""

    def measure():
        df, source = validate_cpu(
            P, ratios=tuple(P.cache_ratios), batch_sizes=(1, 4), repetitions=2, progress=progress
        )
        return df.assign(calibration=source)

    rows = cached_rows(P, VALIDATION, bench_fingerprint(P), measure)
    return rows, str(rows.calibration.iloc[0]) if len(rows) else ""


def validate_gpu(report: str | Path | None = None, hw: Hardware | None = None) -> pd.DataFrame:
    """A gpu_check report's runs against the model on their routing (the h200_trace_b1 and _b4 beside the
    report; `hw`, by default the h200 profile with the report's measurements). One row per run: measured and
    modelled seconds per forward (prefill included, as gpu_check's ms_per_forward) and per denoising one."""
    report = Path(report) if report else committed_gpu_check()
    eng = load_gpu_check(report)["engine"]
    hw = hw or hardware("h200", report)
    traces = {b: Trace.load(report.parent / f"h200_trace_b{b}.safetensors") for b in (1, 4)}
    cfg = dataclasses.replace(PRESETS["llada2-mini"], num_hidden_layers=eng["layers"], vocab_size=32768)
    costs = Costs(hw, Shape.of(cfg, 2))
    rows = []
    for run_ in (r for r in eng["runs"] if r["batch"] in traces):
        # the GPU check's engine runs: fifo, the default lookahead and tau (scripts/gpu_check.py)
        m = model_run(
            traces[run_["batch"]], costs, RunSpec(capacity=run_["cache_experts"], policy=run_["policy"])
        )
        rows.append(
            {
                "batch_size": run_["batch"],
                "cache_ratio": run_["cache_ratio"],
                "cache_experts": run_["cache_experts"],
                "policy": run_["policy"],
                "measured_seconds_per_step": run_["ms_per_forward"] / 1e3,
                "modeled_seconds_per_step": m["seconds"] / m["steps"],
                "measured_seconds_per_denoise": run_["denoise_ms_per_forward"] / 1e3,
                "modeled_seconds_per_denoise": (m["seconds"] - m["seconds_prefill"]) / m["steps"],
                "measured_demand_misses": run_["demand_misses"],
                "modeled_demand_misses": m["demand_misses"],
                "forwards": m["steps"] + m["prefill_forwards"],
            }
        )
    df = pd.DataFrame(rows)
    df["error"] = df.modeled_seconds_per_step / df.measured_seconds_per_step - 1
    return df


def validation_summary(rows: pd.DataFrame, a: str = "demand", b: str = "last_step") -> dict:
    """Median and worst absolute error of seconds per step over cells (a cell: batch x C/W x policy, its
    repetitions' mean), and sign agreement: each cell pair whose measured a-vs-b difference has an interval
    excluding 0 (paired t, paired_table.paired_table; needs repetitions) against the modelled sign."""
    keys = ["batch_size", "cache_ratio", "policy"]
    cells = rows.groupby(keys, as_index=False)[
        ["measured_seconds_per_step", "modeled_seconds_per_step"]
    ].mean()
    err = (cells.modeled_seconds_per_step / cells.measured_seconds_per_step - 1).abs()
    out = {
        "cells": len(cells),
        "median_abs_error": float(err.median()),
        "worst_abs_error": float(err.max()),
        "signs": [],
    }
    if "rep" in rows and rows.rep.nunique() >= 2:
        mod = cells.set_index(keys).modeled_seconds_per_step
        tab = paired_table(rows, a, b, ["batch_size", "cache_ratio"], metric="measured_seconds_per_step")
        for r in tab[tab.excludes_zero.astype(bool)].itertuples():
            d_mod = mod[(r.batch_size, r.cache_ratio, a)] - mod[(r.batch_size, r.cache_ratio, b)]
            out["signs"].append(
                {
                    "batch_size": r.batch_size,
                    "cache_ratio": r.cache_ratio,
                    "measured_diff_pct": r.diff_pct,
                    "modeled_sign_agrees": bool(np.sign(d_mod) == np.sign(r.diff_pct)),
                }
            )
    out["all_signs_agree"] = all(s["modeled_sign_agrees"] for s in out["signs"])
    return out
