"""The performance model against measured runs (printed, not asserted).

cpu (default): the validation protocol of docs/perf_model.md ("Validation", performance_model.validation): the
tiny model offloaded on the emulated link, wall clock, real compute (the cpu profile's first task, batch 1 and
4, every C/W of the profile's grid, demand and last_step, 2 repetitions in alternating order); each run's own
routing is replayed on the virtual clock with the cpu-emulated profile, whose compute costs are calibrated on
the model in the same process (trace_engine.calibrate). The rows are reused from the working file
data/results/<profile>/validation.csv under the same settings (remove it to measure again). Prints one row
per timed run (measured and modelled seconds per step, the error), the summary (median and worst absolute
error over cells, and for every cell whose measured demand-vs-last_step interval excludes 0 whether the
modelled difference has its sign), and every stored run's figure (data/results/cpu/runs/run<k>/validation.csv)
beside this run's, with the median over the stored runs.

gpu: the runs of the committed gpu_check report (data/gpu_check/h200.json, one H200) against the model on
their recorded routing with the h200 profile. The profile's host costs were fitted on these same runs, so
this is a check of the model's structure, not an independent validation.

--calibrate: the cpu-emulated profile's measured numbers on this machine (performance_model.cpu_emulated,
batch 1): per-expert compute, other time per demand, host time per copy.

    .venv/bin/python benchmarks/validate_model.py [--which cpu|gpu|both] [--json]
    .venv/bin/python benchmarks/validate_model.py --calibrate
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import torch

from artifact.experiments.harness import load_model
from artifact.experiments.settings import load_profile
from artifact.experiments.studies.performance_model import (
    cpu_emulated,
    errors_table,
    model_errors,
    validate_gpu,
    validation,
    validation_summary,
)
from artifact.model.tasks import prompts

COLS = [
    "batch_size",
    "cache_ratio",
    "policy",
    "measured_seconds_per_step",
    "modeled_seconds_per_step",
    "error",
]


def calibrate_now(batch_size: int = 1) -> dict:
    """performance_model.cpu_emulated on this machine: the numbers of the cpu-emulated profile."""
    P = load_profile("cpu")
    loaded = load_model(P)
    _, ps = prompts(loaded.tokenizer, P.tasks[0], max(P.batch_sizes), P.seed, P.max_prompt_tokens)
    hw, source = cpu_emulated(P, loaded, ps, batch_size)
    return {
        "batch_size": batch_size,
        "expert_us": hw.expert_us,
        "other_us_per_demand": hw.other_us_per_demand,
        "copy_host_us": hw.copy_host_us,
        "source": source,
    }


def table(df) -> str:
    return df[COLS].to_string(index=False, float_format=lambda v: f"{v:.4g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--which", choices=("cpu", "gpu", "both"), default="both")
    ap.add_argument(
        "--calibrate", action="store_true", help="print the cpu-emulated profile's numbers, measured now"
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.calibrate:
        print(json.dumps(calibrate_now(), indent=1))
        return
    out = {}
    if a.which in ("gpu", "both"):
        df = validate_gpu()
        out["gpu"] = {"summary": validation_summary(df), "rows": df.to_dict("records")}
        if not a.json:
            print("h200 (gpu_check runs, data/gpu_check/h200.json; host costs fitted on these runs):")
            print(table(df))
            print(json.dumps(out["gpu"]["summary"]))
    if a.which in ("cpu", "both"):
        P = load_profile("cpu")
        # stdout: JSON only
        with contextlib.redirect_stdout(sys.stderr) if a.json else contextlib.nullcontext():
            df, source = validation(P, progress=not a.json)
        e = model_errors(P, df)
        runs = errors_table(e)
        out["cpu"] = {
            "summary": validation_summary(df),
            "calibration": source,
            "runs": runs.to_dict("records"),
            "median_over_stored_runs": e.pooled,
            "rows": df.to_dict("records"),
        }
        if not a.json:
            print(f"cpu (tiny model, emulated link, wall clock; calibration: {source}):")
            print(table(df))
            print(json.dumps(out["cpu"]["summary"]))
            print("every run's figure (median absolute error over its cells):")
            print(runs.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
            if e.pooled is not None:
                print(f"median over the {len(e.runs)} stored runs: {100 * e.pooled:.1f}%")
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
