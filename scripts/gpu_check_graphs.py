"""The graphs check: does the segmented forward (the forward cut into segments between the router syncs,
each captured once as a CUDA graph and replayed) make the engine run at the speed of its link? No
checkpoint, nothing downloaded; step 2 of scripts/gpu_run.sh (its budget there: docs/benchmarks.md).

Six steps, in this order, each written to the JSON report (--out, atomically) as soon as it ends, and
every engine row as soon as it is measured (a kill at the time limit keeps the rows measured so far):
  1. environment   torch, CUDA, the GPU, Python, the VM's kernel (uname -r), the forward modes
  2. host_costs    host us per call of: a kernel launch (one tiny in-place add), an event record, a bare
                   expert-sized copy_ from pinned memory, a batched copy (one torch._foreach_copy_ of
                   BATCH copies, per copy) and a graph replay (a captured CUDA graph of GRAPH_OPS ops);
                   medians over REPEATS batches of CALLS calls
  3. pinned_peak   pinned H2D GB/s (gpu_check_steps.pinned_peak): the bandwidth H2D time is costed at
  4. capped_link   the CUDA link capped at 0.5x and 0.25x of its peak (gpu_check_steps.capped_link)
  5. fp32_tokens   CUDA: the tiny model in float32, batch 1, C/W 1, each policy and forward mode: tokens equal
                   the resident eager run's (T5 judges tokens in float32 only: bf16 may diverge after the
                   first step); on the CPU the engine rows are float32 already
  6. engine        scripts/gpu_check.py's engine model (layer 0 dense, the others MoE), forward "eager" and
                   "segmented", at each batch, C/W and policy (demand, last_step); every configuration first
                   runs once in full on the same prompts and shapes (the warm-up: the segments are captured
                   there), then the timed run, then a recorded run whose trace sim.replay replays; per
                   denoising forward the host and wall ms (lists; median and p90), H2D ms from the run's
                   transfers in its denoising forwards over the measured pinned bandwidth, link busy / wall,
                   tokens equal to the resident model's, the segments' captures and replays
                   (RunResult.segments); at C/W 1, demand, a profiled run counts per MoE layer the
                   host-issued launches and the syncs inside the forwards (gpu_profile.py)

Steps 5 and 6 are gpu_graphs_engine.py. Then the targets (T1-T7, gpu_targets.judge) are printed as met / not
met / unmeasured / not judged and recorded under "targets" with the figures each was judged on; a segmented
row whose segments did not replay is marked so (`replayed` false, `not_judged`) and judged by no target. A
configuration that raises is recorded with its error and the check goes on (GPU time is scarce); a target
that lacks a figure is unmeasured, never guessed. After --budget-s seconds the remaining configurations are
skipped (said so in the report).

--device cpu --allow-cpu runs the same steps in miniature (the tiny model, the emulated link, the segmented
forward running its segments eagerly): a dry run whose targets are all "unmeasured" (each with the status
the CPU figures would give, `would_be`), so the tests cover the logic without a GPU.
Exit codes as scripts/gpu_check.py: 0 done, 2 bad arguments, 3 no CUDA GPU visible, 4 a step raised."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as base  # noqa: E402  (scripts/gpu_check.py: the shared steps and shapes)
import gpu_graphs_engine as rows  # noqa: E402  (steps 5 and 6: the engine's rows, eager and segmented)
from gpu_targets import judge, line  # noqa: E402

ROOT = base.ROOT
STEPS = ("environment", "host_costs", "pinned_peak", "capped_link", "fp32_tokens", "engine")
CALLS, REPEATS, BATCH, GRAPH_OPS = 200, 5, 8, 8


def parse_args(argv=None) -> argparse.Namespace:
    ap = base.engine_parser(__doc__, "gpu_check_graphs.json", "1.0,1.73,0.83", ", in the order they run")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=380.0,
        help="seconds after which the remaining configurations are skipped (the check's limit is 7 min)",
    )
    a = ap.parse_args(argv)
    base.check_engine_args(ap, a)
    if a.forward is not None:
        ap.error("--forward: this check runs every configuration in both forward modes; leave it out")
    if not a.budget_s > 0:
        ap.error(f"--budget-s must be > 0, got {a.budget_s}")
    a.store_gb, a.skip_tests = 0.0, True  # the shared steps read these; nothing here pins a store
    return a


# --- step 1 and 2 ---------------------------------------------------------------------------------
def environment(a, torch) -> dict:
    out = base.environment(a, torch)
    out.update(
        kernel=platform.release(),
        forward_modes=list(rows.FORWARD_MODES),
        foreach_copy=hasattr(torch, "_foreach_copy_"),
    )
    return out


def _per_call_us(fn, calls: int = CALLS, repeats: int = REPEATS, sync=None) -> float:
    """Median over `repeats` batches of the host us per call of fn() (the device catches up between
    batches)."""
    fn()
    if sync:
        sync()
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
        if sync:
            sync()
    return statistics.median(per)


def host_costs(a, torch, expert_bytes: int) -> dict:
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    x = torch.zeros(16, device=a.device)
    out = {
        "calls": CALLS,
        "repeats": REPEATS,
        "statistic": f"median of {REPEATS} batches of {CALLS} calls",
        "measures": "host us per call: launch_us one in-place add on a 16-element tensor; "
        "event_record_us torch.cuda.Event.record; "
        "copy_us one expert-sized copy_ from pinned host memory (non_blocking); "
        f"batched_copy_us one torch._foreach_copy_ of {BATCH} such copies, per copy; "
        f"graph_replay_us one replay of a captured CUDA graph of {GRAPH_OPS} in-place adds",
    }
    out["launch_us"] = _per_call_us(lambda: x.add_(1), sync=sync)
    if cuda:
        ev = torch.cuda.Event()
        out["event_record_us"] = _per_call_us(ev.record, sync=sync)
    else:
        out["event_record_us"] = None
        out["event_record_skipped"] = "needs CUDA"
    src = [torch.empty(expert_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(BATCH)]
    dst = [torch.empty(expert_bytes, dtype=torch.uint8, device=a.device) for _ in range(BATCH)]
    calls = 32 if cuda else CALLS  # a copy takes ~120 us of link time: keep the queue short
    out["copy_us"] = _per_call_us(lambda: dst[0].copy_(src[0], non_blocking=True), calls=calls, sync=sync)
    # per batch of the median
    out["copy_calls"] = {"copy_us": calls, "batched_copy_us": max(1, calls // BATCH)}
    if hasattr(torch, "_foreach_copy_"):
        out["batched_copy_us"] = (
            _per_call_us(
                lambda: torch._foreach_copy_(dst, src, non_blocking=True),
                calls=max(1, calls // BATCH),
                sync=sync,
            )
            / BATCH
        )
    else:
        out["batched_copy_us"] = None
        out["batched_copy_skipped"] = "this torch has no _foreach_copy_"
    if cuda:
        g = torch.cuda.CUDAGraph()
        y = torch.zeros(16, device=a.device)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up on a side stream, as capture requires
            for _ in range(GRAPH_OPS):
                y.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(GRAPH_OPS):
                y.add_(1)
        out["graph_replay_us"] = _per_call_us(g.replay, sync=sync)
    else:
        out["graph_replay_us"] = None
        out["graph_replay_skipped"] = "CUDA graphs need CUDA"
    return out


class Writer:
    """write(): the report to --out, atomically, with the seconds since the start and the exit code so far
    (`code`, which a failing step sets)."""

    def __init__(self, report: dict, out: Path, t_start: float, atomic_write_text):
        self.report, self.out, self.t_start, self.atomic_write_text = report, out, t_start, atomic_write_text
        self.code = base.EXIT_OK

    def __call__(self) -> None:
        self.report["seconds_total"] = time.perf_counter() - self.t_start
        self.report["exit_code"] = self.code
        self.atomic_write_text(self.out, json.dumps(self.report, indent=2, default=str))


def bandwidth(report: dict, cuda: bool, expert_bytes: int) -> float:
    """GB/s H2D time is costed at: the registered store's expert-sized copies (CUDA), the emulated
    link's."""
    peak = report.get("pinned_peak") or {}
    if isinstance(peak.get("store_expert_copy_gbps"), (int, float)):
        return float(peak["store_expert_copy_gbps"])
    if cuda:
        raise RuntimeError("pinned_peak measured no bandwidth: H2D time cannot be costed")
    from artifact.offload.links.link import emulated_bandwidth_gbps

    return emulated_bandwidth_gbps(expert_bytes)


def step_table(a, torch, cfg, dtype: str, report: dict, deadline: float, write: Writer) -> dict:
    """Each step's name -> the call that measures it (the engine's bandwidth read when it starts, after
    pinned_peak)."""
    cuda = a.device == "cuda"
    expert_bytes = cfg.expert_params * (2 if cuda else 4)
    return {
        "environment": lambda: environment(a, torch),
        "host_costs": lambda: host_costs(a, torch, expert_bytes),
        "pinned_peak": lambda: base.pinned_peak(a, torch, expert_bytes),
        "capped_link": lambda: base.capped_link(a, torch, expert_bytes),
        "fp32_tokens": lambda: torch.no_grad()(rows.fp32_tokens)(a, torch),
        "engine": lambda: torch.no_grad()(rows.engine)(
            a, torch, cfg, dtype, report, bandwidth(report, cuda, expert_bytes), deadline, write
        ),
    }


def run_step(i: int, name: str, step, report: dict, write: Writer) -> None:
    """Step i: its result under report[name], or what it had recorded with the error (the exit code set
    to EXIT_ERROR; the other steps go on), and its seconds."""
    base.log(f"step {i}/{len(STEPS)}: {name}")
    t0 = time.perf_counter()
    try:
        report[name] = step()
    except Exception as e:  # keep the other steps
        report[name] = {
            **(report.get(name) or {}),
            "error": {
                "type": type(e).__name__,
                "message": str(e),
                "traceback": traceback.format_exc()[-4000:],
            },
        }
        base.log(f"{name} failed: {type(e).__name__}: {e}")
        write.code = base.EXIT_ERROR
    report[name]["seconds"] = time.perf_counter() - t0
    report["steps"].append(name)


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print(base.NO_GPU, file=sys.stderr, flush=True)
        return base.EXIT_NO_GPU
    try:
        from artifact.paths import atomic_write_text
    except ImportError as e:
        print(
            f"gpu_check_graphs: cannot import the artifact package ({e}); "
            "run scripts/gpu_run.sh from the checkout",
            file=sys.stderr,
        )
        return base.EXIT_USAGE
    cuda = a.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    cfg = base.model_config(a, a.layers)
    dtype = "bfloat16" if cuda else "float32"
    report = {
        "note": base.NOTE,
        "dry_run_on_cpu": not cuda,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "steps": [],
    }
    write = Writer(report, a.out, t_start, atomic_write_text)
    steps = step_table(a, torch, cfg, dtype, report, t_start + a.budget_s, write)
    for i, name in enumerate(STEPS, 1):
        run_step(i, name, steps[name], report, write)
        if cuda:
            torch.cuda.empty_cache()
        write()
        base.log(f"{name}: done in {report[name]['seconds']:.1f} s")
    report["targets"] = judge(report)
    for name, t in report["targets"].items():
        print(line(name, t), flush=True)
    write()
    base.log(f"wrote {a.out} in {report['seconds_total']:.0f} s. NOTE: {base.NOTE}")
    return write.code


if __name__ == "__main__":
    sys.exit(main())
