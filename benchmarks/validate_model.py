"""The performance model against measured runs (printed, not asserted).

cpu (default): the tiny model offloaded on the emulated link, wall clock, real compute (the cpu profile's
first task, batch 1 and 4, C/W 0.43 / 1 / 1.73, demand and last_step, --reps pairs with alternating order);
each run's own routing is replayed on the virtual clock with the cpu-emulated profile, whose compute costs
are calibrated on the model in the same process (stream.calibrate). Prints one row per cell (measured and
modelled seconds per step, the error) and the summary: median and worst absolute error over cells, and for
every cell whose measured demand-vs-last_step interval excludes 0 whether the modelled difference has its sign.

gpu: the runs of the committed gpu_check report (data/gpu_check/h200.json, one H200) against the model on
their recorded routing with the h200 profile. The profile's host costs were fitted on these same runs, so
this is a check of the model's structure, not an independent validation.

--measure-host: the offloaded engine's host time per demand (plan_us) and per copy (copy_host_us) on this
CPU, the cpu-emulated profile's two host numbers: the tiny model offloaded on a link too fast to wait on, at
several C, minus its resident run's time; least squares on (demands, copies).

    .venv/bin/python benchmarks/validate_model.py [--which cpu|gpu|both] [--reps 2] [--json]
    .venv/bin/python benchmarks/validate_model.py --measure-host
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from artifact.experiments.perf_model import validate_cpu, validate_gpu, validation_summary
from artifact.experiments.runs import load_model
from artifact.experiments.settings import load_profile
from artifact.model.tasks import prompts
from artifact.offload.runner import OffloadSpec, run
from artifact.offload.sim import capacity_for
from artifact.offload.trace import mean_working_set

COLS = ["batch_size", "cache_ratio", "policy", "measured_seconds_per_step", "modeled_seconds_per_step", "error"]


def measure_host(reps: int = 3) -> dict:
    """The engine's host time beyond the model's own: offloaded runs of the tiny model on a link too fast to
    wait on (so no stall) at several C, minus the resident run's time, fitted on (demands, copies)."""
    P = load_profile("cpu")
    loaded = load_model(P)
    _, ps = prompts(loaded.tokenizer, P.tasks[0], 2, P.seed, P.max_prompt_tokens)
    dc = P.decode_config()

    def best(spec) -> tuple[float, dict]:
        run(loaded, ps, 1, dc, spec=spec, device=P.device)                       # warm-up
        res = [run(loaded, ps, 1, dc, spec=spec, device=P.device) for _ in range(reps)]
        return min(r.stats["seconds"] for r in res), res[0].stats

    resident, st0 = best(None)
    W = mean_working_set(run(loaded, ps, 1, dc, device=P.device, record=True).trace)
    xs, ys = [], []
    for ratio in (0.43, 0.83, 1.0, 1.73, 3.0):
        C = capacity_for(ratio, W, loaded.cfg.num_experts)
        seconds, st = best(OffloadSpec(C, "last_step", "emulated", bandwidth_gbps=1e6, latency_us=0.0))
        xs.append((st["demands"] if "demands" in st else st["forwards"] * len(loaded.cfg.moe_layers), st["transfers"]))
        ys.append(seconds - resident)
    coef = np.linalg.lstsq(np.array(xs, dtype=float), np.array(ys), rcond=None)[0]
    return {"plan_us": 1e6 * coef[0], "copy_host_us": 1e6 * coef[1], "demands_transfers": xs,
            "seconds_over_resident": ys, "resident_seconds": resident, "statistic": f"best of {reps}"}


def table(df) -> str:
    return df[COLS].to_string(index=False, float_format=lambda v: f"{v:.4g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--which", choices=("cpu", "gpu", "both"), default="both")
    ap.add_argument("--reps", type=int, default=2, help="measured pairs per cell (cpu)")
    ap.add_argument("--measure-host", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.measure_host:
        print(json.dumps(measure_host(), indent=1))
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
        df, source = validate_cpu(P, repetitions=a.reps, n_prompts=max(P.batch_sizes), progress=not a.json)
        out["cpu"] = {"summary": validation_summary(df), "calibration": source, "rows": df.to_dict("records")}
        if not a.json:
            print(f"cpu (tiny model, emulated link, wall clock; calibration: {source}):")
            print(table(df))
            print(json.dumps(out["cpu"]["summary"]))
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
