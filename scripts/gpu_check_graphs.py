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
                   the resident eager run's (T5 judges tokens in float32 only: bf16 may diverge after the first
                   step); on the CPU the engine rows are float32 already
  6. engine        scripts/gpu_check.py's engine model (layer 0 dense, the others MoE), forward "eager" and
                   "segmented", at each batch, C/W and policy (demand, last_step); every configuration first
                   runs once in full on the same prompts and shapes (the warm-up: the segments are captured
                   there), then the timed run, then a recorded run whose trace sim.replay replays; per
                   denoising forward the host and wall ms (lists; median and p90), H2D ms from the run's
                   transfers in its denoising forwards over the measured pinned bandwidth, link busy / wall,
                   tokens equal to the resident model's, the segments' captures and replays
                   (RunResult.segments); at C/W 1, demand, a profiled run counts per MoE layer the
                   host-issued launches and the syncs inside the forwards (gpu_profile.py)

Then the targets (T1-T7, gpu_targets.judge) are printed as met / not met / unmeasured / not judged and
recorded under "targets" with the figures each was judged on; a segmented row whose segments did not
replay is marked so (`replayed` false, `not_judged`) and judged by no target. A configuration that raises
is recorded with its error and the check goes on (GPU time is scarce); a target that lacks a figure is
unmeasured, never guessed. After --budget-s seconds the remaining configurations are skipped (said so in
the report).

--device cpu --allow-cpu runs the same steps in miniature (the tiny model, the emulated link, the segmented
forward running its segments eagerly): a dry run whose targets are all "unmeasured" (each with the status
the CPU figures would give, `would_be`), so the tests cover the logic without a GPU.
Exit codes as scripts/gpu_check.py: 0 done, 2 bad arguments, 3 no CUDA GPU visible, 4 a step raised."""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as base  # noqa: E402  (scripts/gpu_check.py: the shared steps and shapes)
from gpu_profile import profiled  # noqa: E402
from gpu_targets import judge, line  # noqa: E402

ROOT = base.ROOT
STEPS = ("environment", "host_costs", "pinned_peak", "capped_link", "fp32_tokens", "engine")
FORWARD_MODES = ("eager", "segmented")     # artifact.model's forward modes: the eager path, and the forward cut
                                           # into segments between the router syncs (CUDA graphs on a GPU)
POLICIES = ("demand", "last_step")
CALLS, REPEATS, BATCH, GRAPH_OPS = 200, 5, 8, 8
def parse_args(argv=None) -> argparse.Namespace:
    ap = base.engine_parser(__doc__, "gpu_check_graphs.json", "1.0,1.73,0.83", ", in the order they run")
    ap.add_argument("--budget-s", type=float, default=380.0,
                    help="seconds after which the remaining configurations are skipped (the check's limit is 7 min)")
    a = ap.parse_args(argv)
    base.check_engine_args(ap, a)
    if not a.budget_s > 0:
        ap.error(f"--budget-s must be > 0, got {a.budget_s}")
    a.store_gb, a.skip_tests = 0.0, True           # the shared steps read these; nothing here pins a store
    return a


# --- small statistics -----------------------------------------------------------------------------
def p90(xs: list[float]) -> float | None:
    """The 90th percentile (nearest rank) of xs; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# --- step 1 and 2 ---------------------------------------------------------------------------------
def environment(a, torch) -> dict:
    out = base.environment(a, torch)
    out.update(kernel=platform.release(), forward_modes=list(FORWARD_MODES),
               foreach_copy=hasattr(torch, "_foreach_copy_"))
    return out


def run_options(dc, device: str, forward: str, timed: bool = False):
    """The RunOptions of a run in forward mode `forward` (FORWARD_MODES); a timed or profiled run never captures
    (capture=False: its shapes were captured by the warm-up run before it)."""
    from artifact.offload.runner import RunOptions
    return RunOptions(dc, device, forward, capture=not timed)


def warm_up(run_once, forward: str):
    """The untimed warm-up of a configuration: the whole run once, and for forward "segmented" twice. A program
    captures on its second forward, and a shape the decoder feeds once per run (the first step of a later block,
    which also commits the previous block) is seen twice only over two runs: after them the timed run replays
    every piece (none eager). Returns the last warm-up run's result."""
    res = run_once()
    return run_once() if forward == "segmented" else res


def segment_counters(forward: str, *results) -> dict:
    """A row's forward mode and its segments' counters over its runs (warm-up and timed): captures summed,
    the timed run's replays, the first capture error; `replayed` (hardware.replayed). A segmented row whose
    runs report no counters (RunResult.segments missing or None) did not show a replay: replayed False."""
    from artifact.experiments.hardware import replayed
    row = {"forward": forward, "captures": None, "replays": None, "eager": None, "capture_error": None}
    if forward == "eager":
        return row
    segs = [getattr(r, "segments", None) for r in results]
    if all(s is not None for s in segs):
        row.update(captures=sum(s.captures for s in segs), replays=segs[-1].replays, eager=segs[-1].eager,
                   capture_error=next((s.capture_error for s in segs if s.capture_error), None))
    row["replayed"] = replayed(row)
    if not row["replayed"]:
        why = row["capture_error"] or (f"{row['eager']} pieces ran eagerly" if row["eager"] else "no replays")
        row["not_judged"] = ("segments did not replay: " + why if segs[-1]
                             is not None else "segments did not replay: the run reports no segment counters")
    return row


def _per_call_us(fn, calls: int = CALLS, repeats: int = REPEATS, sync=None) -> float:
    """Median over `repeats` batches of the host us per call of fn() (the device catches up between batches)."""
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
    out = {"calls": CALLS, "repeats": REPEATS, "statistic": f"median of {REPEATS} batches of {CALLS} calls",
           "measures": "host us per call: launch_us one in-place add on a 16-element tensor; event_record_us "
                       "torch.cuda.Event.record; copy_us one expert-sized copy_ from pinned host memory "
                       f"(non_blocking); batched_copy_us one torch._foreach_copy_ of {BATCH} such copies, per copy; "
                       f"graph_replay_us one replay of a captured CUDA graph of {GRAPH_OPS} in-place adds"}
    out["launch_us"] = _per_call_us(lambda: x.add_(1), sync=sync)
    if cuda:
        ev = torch.cuda.Event()
        out["event_record_us"] = _per_call_us(ev.record, sync=sync)
    else:
        out["event_record_us"] = None
        out["event_record_skipped"] = "needs CUDA"
    src = [torch.empty(expert_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(BATCH)]
    dst = [torch.empty(expert_bytes, dtype=torch.uint8, device=a.device) for _ in range(BATCH)]
    calls = 32 if cuda else CALLS          # a copy takes ~120 us of link time: keep the queue short
    out["copy_us"] = _per_call_us(lambda: dst[0].copy_(src[0], non_blocking=True), calls=calls, sync=sync)
    out["copy_calls"] = {"copy_us": calls, "batched_copy_us": max(1, calls // BATCH)}     # per batch of the median
    if hasattr(torch, "_foreach_copy_"):
        out["batched_copy_us"] = _per_call_us(lambda: torch._foreach_copy_(dst, src, non_blocking=True),
                                              calls=max(1, calls // BATCH), sync=sync) / BATCH
    else:
        out["batched_copy_us"] = None
        out["batched_copy_skipped"] = "this torch has no _foreach_copy_"
    if cuda:
        g = torch.cuda.CUDAGraph()
        y = torch.zeros(16, device=a.device)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):                  # warm-up on a side stream, as capture requires
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


# --- step 5: the engine, forward eager and segmented (the profiled run: gpu_profile.py) -------------
def timing(stats: dict) -> dict:
    host, wall = list(stats.get("forward_host_ms", [])), list(stats.get("forward_wall_ms", []))
    out = {"host_ms": host, "wall_ms": wall, "host_ms_median": median(host), "host_ms_p90": p90(host),
           "wall_ms_median": median(wall), "wall_ms_p90": p90(wall)}
    out["host_over_wall"] = (out["host_ms_median"] / out["wall_ms_median"]
                             if host and wall and out["wall_ms_median"] > 0 else None)
    return out


COUNT_KEYS = ("demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches")
MEASURES = {
    "host_ms": "per denoising forward: CPU ms of the forward less the time blocked in the router syncs "
               "(decode's forward_host_ms)",
    "wall_ms": "per denoising forward: CUDA: event pair on the compute stream around it; CPU: elapsed ms",
    "h2d_ms_per_forward": "transfers (demand misses + speculative) in the run's denoising forwards x expert "
                          "bytes / the measured pinned H2D bandwidth, per denoising forward",
    "host_over_h2d": "host_ms_median / h2d_ms_per_forward",
    "link_busy_over_wall": "link busy seconds / the run's wall seconds (prefill included)",
    "sync_wait_ms_per_forward": "ms blocked in the router syncs (routing.host_counts.wait_seconds) per forward "
                                "of the run (prefill included)",
    "counts_equal_replay": "a recorded run of the same configuration: its engine counts equal sim.replay of its "
                           "own trace, and equal the timed run's counts",
    "profile": "C/W 1, demand: per MoE layer of a denoising forward (torch.profiler, the CUDA runtime calls "
               "inside the forward): launches (kernels and graph launches), copies, event / stream / device "
               "syncs, blocking copies; aten_ops: ATen ops the forward called directly (outside graphs); "
               "device_reads: SyncCounter's device-to-host reads",
}


def engine(a, torch, cfg, dtype, report, bandwidth_gbps: float, deadline: float, write=lambda: None) -> dict:
    """Step 5; `write` is called after every row, so each row is on disk as soon as it is measured."""
    from artifact.model.decode import DecodeConfig
    from artifact.model.tiny import random_model
    from artifact.offload.replay.sim import capacity_for, replay
    from artifact.offload.replay.trace import mean_working_set
    from artifact.offload.runner import OffloadSpec, decode_prompts
    cuda = a.device == "cuda"
    link = "cuda" if cuda else "emulated"
    expert_bytes = cfg.expert_params * (2 if cuda else 4)
    out = report["engine"] = {"model": cfg.name, "layers": cfg.num_hidden_layers, "moe_layers": len(cfg.moe_layers),
                              "dtype": dtype, "expert_bytes": expert_bytes, "bandwidth_gbps": bandwidth_gbps,
                              "runs": [], "resident": [], "skipped": [], "measures": MEASURES}
    t0 = time.perf_counter()
    loaded = random_model(cfg, seed=0, dtype=dtype, device=a.device, resident=True)
    out["build_seconds"] = time.perf_counter() - t0
    steps = cfg.block_length // 4
    dc = DecodeConfig(gen_length=a.gen_length, steps=steps, threshold=1.0, eos_early_stop=False)
    out["decode"] = {"threshold": 1.0, "steps_per_block": steps, "gen_length": a.gen_length,
                     "warm_up": "the whole run, same prompts and shapes, before the timed run: once for forward eager, "
                               "twice for segmented (a shape fed once per run is captured in the second)"}
    length = -(-a.prompt_length // cfg.block_length) * cfg.block_length       # block-aligned prompts
    prompts = {b: base.random_prompts(torch, cfg, b, length, seed=b, spread=0) for b in a.batches}
    ref, W = {}, {}
    for b in a.batches:              # the reference tokens and W: eager, resident, recorded (untimed)
        res = decode_prompts(loaded, prompts[b], b, run_options(dc, a.device, "eager"), record=True)
        ref[b], W[b] = res.tokens, mean_working_set(res.trace)

    def over_budget(what: dict) -> bool:
        if time.perf_counter() < deadline:
            return False
        out["skipped"].append({**what, "why": f"--budget-s {a.budget_s:g} s spent"})
        return True

    # In order of what the targets need first, so that a budget running out leaves the rest: each batch's
    # resident rows, then per batch the C/W ratios in the order given, each policy, each forward mode.
    for b in a.batches:
        for forward in FORWARD_MODES:
            if over_budget({"forward": forward, "batch": b, "resident": True}):
                continue
            row = {"forward": forward, "batch": b, "working_set": W[b], "dtype": dtype}
            try:
                options = run_options(dc, a.device, forward)
                warm = warm_up(partial(decode_prompts, loaded, prompts[b], b, options), forward)
                res = decode_prompts(loaded, prompts[b], b, run_options(dc, a.device, forward, timed=True))
                row.update(timing(res.stats.as_dict()), tokens_equal_resident=res.tokens == ref[b],
                           forwards=res.stats.forwards, **segment_counters(forward, warm, res))
            except Exception as e:                       # keep the other configurations: GPU time is scarce
                row["error"] = f"{type(e).__name__}: {e}"
            out["resident"].append(row)
            write()
            log_row("resident", row)
    for b in a.batches:
        for ratio in a.ratios:
            C = capacity_for(ratio, W[b], cfg.num_experts)
            for policy in POLICIES:
                for forward in FORWARD_MODES:
                    what = {"forward": forward, "batch": b, "cache_ratio": ratio, "policy": policy}
                    if over_budget(what):
                        continue
                    row = {**what, "cache_experts": C, "num_experts": cfg.num_experts, "dtype": dtype}
                    try:
                        row.update(offloaded(torch, a, loaded, prompts[b], b, dc, OffloadSpec(
                            capacity=C, policy=policy, link=link), ref[b], expert_bytes, bandwidth_gbps,
                            replay, profile=ratio == 1.0 and policy == "demand", forward=forward))
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {e}"
                        row["traceback"] = traceback.format_exc()[-2000:]
                    out["runs"].append(row)
                    write()
                    log_row("offloaded", row)
    ok = [r for r in out["runs"] if "error" not in r]
    out["all_tokens_equal_resident"] = bool(ok) and all(r["tokens_equal_resident"] for r in ok)
    out["all_counts_equal_replay"] = bool(ok) and all(r["counts_equal_replay"] for r in ok)
    out["errors"] = sum("error" in r for r in out["runs"] + out["resident"])
    return out


def offloaded(torch, a, loaded, prompts, batch, dc, spec, ref_tokens, expert_bytes, gbps, replay,
              profile: bool, forward: str) -> dict:
    from artifact.offload.runner import decode_prompts
    options, timed = run_options(dc, a.device, forward), run_options(dc, a.device, forward, timed=True)
    warm = warm_up(partial(decode_prompts, loaded, prompts, batch, options, spec=spec), forward)
    w0 = loaded.model.routing.host_counts.wait_seconds
    res = decode_prompts(loaded, prompts, batch, timed, spec=spec)
    wait = loaded.model.routing.host_counts.wait_seconds - w0
    s = res.stats.as_dict()
    denoise = s["forwards"]
    den = [s["by_phase"][ph] for ph in ("first", "later")]
    transfers = sum(p["demand_misses"] + p["speculative_transfers"] for p in den)
    h2d = 1e3 * transfers * expert_bytes / (gbps * 1e9) / max(denoise, 1)
    row = {"forwards": denoise, "prefill_forwards": s["prefill_forwards"], **timing(s),
           "transfers_denoising": transfers, "demand_misses_denoising": sum(p["demand_misses"] for p in den),
           "h2d_ms_per_forward": h2d,
           "link_busy_over_wall": s["link_busy_seconds"] / s["seconds"] if s["seconds"] else None,
           "stall_seconds": s["stall_seconds"], "sync_wait_ms_per_forward": 1e3 * wait / max(
               denoise + s["prefill_forwards"], 1), "tokens_equal_resident": res.tokens == ref_tokens,
           **{k: s[k] for k in COUNT_KEYS}, **segment_counters(forward, warm, res)}
    row["host_over_h2d"] = row["host_ms_median"] / h2d if h2d > 0 and row["host_ms_median"] is not None else None
    try:                            # apart, so that a failure here keeps the timed run's figures
        rec = decode_prompts(loaded, prompts, batch, options, spec=spec, record=True)
        sim = replay(rec.trace, spec.policy, spec.capacity)
        row["replay"] = {k: sim[k] for k in COUNT_KEYS}
        row["counts_equal_replay"] = (all(getattr(rec.stats, k) == sim[k] == s[k] for k in COUNT_KEYS)
                                      and rec.tokens == res.tokens)
    except Exception as e:
        row["counts_equal_replay"], row["replay_error"] = None, f"{type(e).__name__}: {e}"
    if profile:
        try:
            row["profile"] = profiled(torch, a, loaded, prompts, batch, timed, spec)
        except Exception as e:
            row["profile"] = {"error": f"{type(e).__name__}: {e}"}
    return row


def fp32_tokens(a, torch) -> dict:
    """Step 5 (CUDA): the tiny model in float32 on the GPU, batch 1, C/W 1, each policy and forward mode (the
    segmented one warmed up as in the engine step): tokens equal the resident eager run's. T5 judges tokens here:
    the engine's bf16 rows may diverge from the eager run after the first step, as tests/test_cuda.py allows."""
    if a.device != "cuda":
        return {"skipped": "on the CPU the engine rows run in float32: T5 judges their tokens"}
    import dataclasses

    from artifact.model.config import get_preset
    from artifact.model.decode import DecodeConfig
    from artifact.model.tiny import random_model
    from artifact.offload.replay.sim import capacity_for
    from artifact.offload.replay.trace import mean_working_set
    from artifact.offload.runner import OffloadSpec, decode_prompts
    cfg = dataclasses.replace(get_preset("tiny"), num_hidden_layers=3, name="tiny-3L-random")
    loaded = random_model(cfg, seed=0, dtype="float32", device=a.device, resident=True)
    dc = DecodeConfig(gen_length=2 * cfg.block_length, steps=cfg.block_length // 4, threshold=1.0,
                      eos_early_stop=False)
    prompts = base.random_prompts(torch, cfg, 1, 2 * cfg.block_length, seed=1, spread=0)
    ref = decode_prompts(loaded, prompts, 1, run_options(dc, a.device, "eager"), record=True)
    C = capacity_for(1.0, mean_working_set(ref.trace), cfg.num_experts)
    out = {"model": cfg.name, "dtype": "float32", "batch": 1, "cache_ratio": 1.0, "cache_experts": C, "runs": []}
    for policy in POLICIES:
        for forward in FORWARD_MODES:
            row = {"forward": forward, "batch": 1, "cache_ratio": 1.0, "policy": policy, "dtype": "float32"}
            try:
                spec = OffloadSpec(capacity=C, policy=policy, link="cuda")
                options = run_options(dc, a.device, forward)
                warm = warm_up(partial(decode_prompts, loaded, prompts, 1, options, spec=spec), forward)
                res = decode_prompts(loaded, prompts, 1, run_options(dc, a.device, forward, timed=True), spec=spec)
                row.update(tokens_equal_resident=res.tokens == ref.tokens, **segment_counters(forward, warm, res))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
            out["runs"].append(row)
    return out


def log_row(kind: str, r: dict) -> None:
    replay = "" if r.get("forward") == "eager" or r.get("replayed") else " (did not replay)"
    head = f"forward {r['forward']}{replay} batch {r['batch']} " + (
        f"C/W {r['cache_ratio']} {r['policy']:9s}" if "policy" in r else "resident")
    if "error" in r:
        base.log(f"{head}: {r['error']}")
        return
    h2d = f", H2D {r['h2d_ms_per_forward']:.2f} ms" if "h2d_ms_per_forward" in r else ""
    base.log(f"{head}: host {r['host_ms_median']:.2f} ms (p90 {r['host_ms_p90']:.2f}), wall "
             f"{r['wall_ms_median']:.2f} ms{h2d}, tokens equal: {r['tokens_equal_resident']}")


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
        print(f"gpu_check_graphs: cannot import the artifact package ({e}); run scripts/gpu_run.sh from "
              "the checkout", file=sys.stderr)
        return base.EXIT_USAGE
    cuda = a.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    cfg = base.model_config(a, a.layers)
    dtype = "bfloat16" if cuda else "float32"
    expert_bytes = cfg.expert_params * (2 if cuda else 4)
    report = {"note": base.NOTE, "dry_run_on_cpu": not cuda,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}, "steps": []}
    code = base.EXIT_OK

    def write():
        report["seconds_total"] = time.perf_counter() - t_start
        report["exit_code"] = code
        atomic_write_text(a.out, json.dumps(report, indent=2, default=str))

    def bandwidth() -> float:
        """GB/s H2D time is costed at: the registered store's expert-sized copies (CUDA), the emulated link's."""
        peak = report.get("pinned_peak") or {}
        if isinstance(peak.get("store_expert_copy_gbps"), (int, float)):
            return float(peak["store_expert_copy_gbps"])
        if cuda:
            raise RuntimeError("pinned_peak measured no bandwidth: H2D time cannot be costed")
        from artifact.offload.links.link import emulated_bandwidth_gbps
        return emulated_bandwidth_gbps(expert_bytes)

    deadline = t_start + a.budget_s
    steps = {"environment": lambda: environment(a, torch),
             "host_costs": lambda: host_costs(a, torch, expert_bytes),
             "pinned_peak": lambda: base.pinned_peak(a, torch, expert_bytes),
             "capped_link": lambda: base.capped_link(a, torch, expert_bytes),
             "fp32_tokens": lambda: torch.no_grad()(fp32_tokens)(a, torch),
             "engine": lambda: torch.no_grad()(engine)(a, torch, cfg, dtype, report, bandwidth(), deadline, write)}
    for i, name in enumerate(STEPS, 1):
        base.log(f"step {i}/{len(STEPS)}: {name}")
        t0 = time.perf_counter()
        try:
            report[name] = steps[name]()
        except Exception as e:                   # keep the other steps
            report[name] = {**(report.get(name) or {}),
                            "error": {"type": type(e).__name__, "message": str(e),
                                      "traceback": traceback.format_exc()[-4000:]}}
            base.log(f"{name} failed: {type(e).__name__}: {e}")
            code = base.EXIT_ERROR
        report[name]["seconds"] = time.perf_counter() - t0
        report["steps"].append(name)
        if cuda:
            torch.cuda.empty_cache()
        write()
        base.log(f"{name}: done in {report[name]['seconds']:.1f} s")
    report["targets"] = judge(report)
    for name, t in report["targets"].items():
        print(line(name, t), flush=True)
    write()
    base.log(f"wrote {a.out} in {report['seconds_total']:.0f} s. NOTE: {base.NOTE}")
    return code


if __name__ == "__main__":
    sys.exit(main())
