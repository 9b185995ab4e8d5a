"""The graphs check: did CUDA graphs between the router syncs make the engine run at the speed of
its link? At most 7 minutes on one H200, no checkpoint, nothing downloaded; `scripts/gpu_check.sh graphs`.

Five steps, in this order, each written to the JSON report (--out, atomically) as soon as it ends:
  1. environment   torch, CUDA, the GPU, Python, the VM's kernel (uname -r), the graph modes
  2. host_costs    host us per call of: a kernel launch (one tiny in-place add), an event record, a bare
                   expert-sized copy_ from pinned memory, a batched copy (one torch._foreach_copy_ of
                   BATCH copies, per copy) and a graph replay (a captured CUDA graph of GRAPH_OPS ops);
                   medians over REPEATS batches of CALLS calls
  3. pinned_peak   pinned H2D GB/s (scripts/gpu_check.py step 3): the bandwidth H2D time is costed at
  4. capped_link   the CUDA link capped at 0.5x and 0.25x of its peak (scripts/gpu_check.py step 4)
  5. engine        the step-7 model (scripts/gpu_check.py: layer 0 dense, the others MoE) with graphs off
                   (today's eager path) and on, at each batch, C/W and policy (demand, last_step); every
                   configuration first runs once in full on the same prompts and shapes (the warm-up: graphs
                   are captured there), then the timed run, then a recorded run whose trace sim.replay
                   replays; per denoising forward the host and wall ms (lists; median and p90), H2D ms
                   from the run's transfers in its denoising forwards over the measured pinned bandwidth,
                   link busy / wall, tokens equal to the resident model's; at C/W 1, demand, a profiled
                   run counts per MoE layer the host-issued launches and the syncs inside the forwards

Then the targets (T1-T6, `judge`) are printed as met / not met / unmeasured and recorded under
"targets" with the figures each was judged on. A configuration that raises is recorded with its error and
the check goes on (GPU time is scarce); a target that lacks a figure is unmeasured, never guessed. After
--budget-s seconds the remaining configurations are skipped (said so in the report).

--device cpu --allow-cpu runs the same steps in miniature (the tiny model, the emulated link, graphs on
running the same segments eagerly): a dry run whose targets are all "unmeasured" (each with the status the
CPU figures would give, `would_be`), so the tests cover the logic without a GPU.
Exit codes as scripts/gpu_check.py: 0 done, 2 bad arguments, 3 no CUDA GPU visible, 4 a step raised."""
from __future__ import annotations

import argparse
import bisect
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as base  # noqa: E402  (scripts/gpu_check.py: the shared steps and shapes)

ROOT = base.ROOT
STEPS = ("environment", "host_costs", "pinned_peak", "capped_link", "engine")
GRAPH_MODES = ("off", "on")
FORWARD_OF = {"off": "eager", "on": "segmented"}  # the forward mode each graphs mode runs
POLICIES = ("demand", "last_step")
CALLS, REPEATS, BATCH, GRAPH_OPS = 200, 5, 8, 8
FORWARD = "gpu_check.forward"         # the profiler range around each denoising forward
MET, NOT_MET, UNMEASURED = "met", "not met", "unmeasured"
# Kernel launches the host issues (a graph replay is one launch, whatever it holds), copies, and syncs:
# CUDA runtime calls as torch.profiler names them on the CPU side.
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch")
COPIES = ("cudaMemcpyAsync", "cudaMemcpyBatchAsync", "cudaMemcpy2DAsync")
EVENT_SYNCS, STREAM_SYNCS, DEVICE_SYNCS = ("cudaEventSynchronize",), ("cudaStreamSynchronize",), (
    "cudaDeviceSynchronize",)
BLOCKING_COPIES = ("cudaMemcpy", "cudaMemcpy2D")
# The targets (docs/host_path.md, "Graphs on"), each judged on the graphs-on rows.
T1_HOST_OVER_H2D, T1_AT_173 = 0.3, 0.5
T2_LAUNCHES = 12
T4_BUSY = 0.85
T5_CAP = 0.1
T6_SHARE = 0.1
RULES = {
    "T1": f"graphs on, demand: host / H2D per forward (medians) <= {T1_HOST_OVER_H2D} at C/W 1, batch 1 and 4; "
          f"<= {T1_AT_173} at batch 1, C/W 1.73",
    "T2": f"graphs on, C/W 1, demand: host-issued kernel launches (graph launches included) per MoE layer <= "
          f"{T2_LAUNCHES}, the copies counted apart (copies_per_moe_layer)",
    "T3": "graphs on, C/W 1, demand, per forward: one event sync per MoE layer, no stream or device sync, no "
          "blocking copy (CPU: SyncCounter's device reads, one per MoE layer)",
    "T4": f"graphs on, batch 1, C/W 1, demand: link busy / wall >= {T4_BUSY}",
    "T5": f"every run (graphs off and on): counts equal sim.replay of its trace and tokens equal resident; the "
          f"capped link at 0.5x and 0.25x within {T5_CAP:.0%} of its cap",
    "T6": f"graphs on, every batch and C/W with C < E: |host(last_step) - host(demand)| <= {T6_SHARE} x demand's "
          "H2D per forward (C = E copies nothing: no link time to compare against)",
}
NO_GPU_TARGETS = "dry run on the CPU: the tiny model on the emulated link, not an H200"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check_graphs.json")
    ap.add_argument("--ratios", default="0.83,1.0,1.73", help="C/W ratios")
    ap.add_argument("--batches", default="1,4", help="batch sizes")
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--layers", type=int, default=6, help="model layers, layer 0 dense (step 7's model: 6)")
    ap.add_argument("--budget-s", type=float, default=380.0,
                    help="seconds after which the remaining configurations are skipped (the check's limit is 7 min)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu with --allow-cpu (dry run)")
    ap.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU: tiny shapes, emulated link")
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
    out.update(kernel=platform.release(), graph_modes=list(GRAPH_MODES),
               foreach_copy=hasattr(torch, "_foreach_copy_"))
    return out


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


# --- step 5: the engine, graphs off and on --------------------------------------------------------
class ForwardRanges:
    """Forward hooks that open a profiler range (FORWARD) around each denoising forward, and point a
    SyncCounter's key at the forward's kind, so both count what happens inside the forwards only."""

    def __init__(self, torch, model, counter=None):
        self.torch, self.model, self.counter = torch, model, counter
        self.hooks, self.open = [], None

    def __enter__(self):
        def pre(mod, args, kwargs):
            kind = self.model.routing.step.kind
            if self.counter is not None:
                self.counter.key = kind
            if kind == "denoise":
                self.open = self.torch.autograd.profiler.record_function(FORWARD)
                self.open.__enter__()

        def post(mod, args, kwargs, out):
            if self.open is not None:
                self.open.__exit__(None, None, None)
                self.open = None
            if self.counter is not None:
                self.counter.key = None

        self.hooks = [self.model.register_forward_pre_hook(pre, with_kwargs=True),
                      self.model.register_forward_hook(post, with_kwargs=True)]
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()


def raw_events(torch, prof) -> list[tuple[str, int, int]]:
    """(name, start ns, end ns) of every host-side event torch.profiler recorded (its raw results: building
    the FunctionEvent tree of a run's ~10^5 events takes seconds). Device-side events (kernels, the GPU's copy
    of a record_function range) are left out: their times are on the GPU's timeline."""
    cpu = torch.autograd.DeviceType.CPU
    return [(e.name(), e.start_ns(), e.start_ns() + e.duration_ns()) for e in prof.profiler.kineto_results.events()
            if e.device_type() == cpu]


def count_in_forwards(events: list[tuple[str, int, int]]) -> dict:
    """Of (name, start, end) events: the CUDA runtime calls that start inside a FORWARD range, by kind, and
    the top-level ATen ops inside one (not inside another ATen op: the ops the forward issues outside any
    graph; on the CPU the stand-in for launches)."""
    ranges = sorted((lo, hi) for name, lo, hi in events if name == FORWARD)
    starts = [lo for lo, _ in ranges]

    def inside(t: int) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t <= ranges[i][1]

    kinds = {**{n: "launches" for n in LAUNCHES}, **{n: "copies" for n in COPIES},
             **{n: "event_syncs" for n in EVENT_SYNCS}, **{n: "stream_syncs" for n in STREAM_SYNCS},
             **{n: "device_syncs" for n in DEVICE_SYNCS}, **{n: "blocking_copies" for n in BLOCKING_COPIES}}
    out = {"forwards": len(ranges), "launches": 0, "copies": 0, "event_syncs": 0, "stream_syncs": 0,
           "device_syncs": 0, "blocking_copies": 0, "aten_ops": 0}
    for name, lo, _ in events:
        if name in kinds and inside(lo):
            out[kinds[name]] += 1
    end = -1
    for lo, hi in sorted((lo, -hi) for name, lo, hi in events if name.startswith("aten::") and inside(lo)):
        if lo >= end:                     # not inside the last top-level op
            out["aten_ops"] += 1
            end = -hi
    return out


def profiled(torch, a, loaded, prompts, batch, dc, spec, forward: str = "eager") -> dict:
    """One run under torch.profiler and SyncCounter: per MoE layer of a denoising forward, the host-issued
    launches, copies and syncs (CUDA runtime calls), ATen ops called by the forward, and device reads."""
    from torch.profiler import ProfilerActivity, profile

    from artifact.model.syncs import SyncCounter
    from artifact.offload.runner import run
    moe = len(loaded.cfg.moe_layers)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    counter = SyncCounter()
    with profile(activities=acts) as prof, ForwardRanges(torch, loaded.model):
        run(loaded, prompts, batch, dc, spec=spec, device=a.device, forward=forward, capture=False)
    c = count_in_forwards(raw_events(torch, prof))
    with counter, ForwardRanges(torch, loaded.model, counter):       # apart: its modes would show in the profile
        res = run(loaded, prompts, batch, dc, spec=spec, device=a.device, forward=forward, capture=False)
    n = max(c["forwards"], 1)
    out = {f"{k}_per_moe_layer": v / n / moe for k, v in c.items() if k != "forwards"}
    out.update(forwards=c["forwards"], moe_layers=moe,
               device_reads_per_moe_layer=counter.reads_by_key["denoise"] / max(res.stats.forwards, 1) / moe,
               host_data_uploads_per_moe_layer=counter.uploads_by_key["denoise"] / max(res.stats.forwards, 1)
               / moe,
               run_device_read_kinds=dict(counter.kinds))      # the whole run's, decode loop included
    return out


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


def engine(a, torch, cfg, dtype, report, bandwidth_gbps: float, deadline: float) -> dict:
    from artifact.model.checkpoint import random_model
    from artifact.model.decode import DecodeConfig
    from artifact.offload.runner import OffloadSpec, run
    from artifact.offload.sim import capacity_for, replay
    from artifact.offload.trace import mean_working_set
    cuda = a.device == "cuda"
    link = "cuda" if cuda else "emulated"
    out = report["engine"] = {"model": cfg.name, "layers": cfg.num_hidden_layers, "moe_layers": len(cfg.moe_layers),
                              "bandwidth_gbps": bandwidth_gbps, "runs": [], "resident": [], "skipped": [],
                              "measures": MEASURES}
    t0 = time.perf_counter()
    loaded = random_model(cfg, seed=0, dtype=dtype, device=a.device, resident=True)
    out["build_seconds"] = time.perf_counter() - t0
    expert_bytes = cfg.expert_params * (2 if cuda else 4)
    steps = cfg.block_length // 4
    dc = DecodeConfig(gen_length=a.gen_length, steps=steps, threshold=1.0, eos_early_stop=False)
    out["decode"] = {"threshold": 1.0, "steps_per_block": steps, "gen_length": a.gen_length,
                     "warm_up": "the whole run once, same prompts and shapes, before the timed run"}
    length = -(-a.prompt_length // cfg.block_length) * cfg.block_length       # block-aligned prompts
    prompts = {b: base.random_prompts(torch, cfg, b, length, seed=b, spread=0) for b in a.batches}
    ref, W = {}, {}
    for b in a.batches:              # the reference tokens and W: graphs off, resident, recorded (untimed)
        res = run(loaded, prompts[b], b, dc, device=a.device, record=True)
        ref[b], W[b] = res.tokens, mean_working_set(res.trace)

    def over_budget(what: dict) -> bool:
        if time.perf_counter() < deadline:
            return False
        out["skipped"].append({**what, "why": f"--budget-s {a.budget_s:g} s spent"})
        return True

    for mode in GRAPH_MODES:
        for b in a.batches:
            if over_budget({"graphs": mode, "batch": b, "resident": True}):
                continue
            row = {"graphs": mode, "batch": b, "working_set": W[b]}
            try:
                run(loaded, prompts[b], b, dc, device=a.device, forward=FORWARD_OF[mode])   # warm-up, in full
                res = run(loaded, prompts[b], b, dc, device=a.device, forward=FORWARD_OF[mode], capture=False)
                row.update(timing(res.stats.as_dict()), tokens_equal_resident=res.tokens == ref[b],
                           forwards=res.stats.forwards)
            except Exception as e:                       # keep the other configurations: GPU time is scarce
                row["error"] = f"{type(e).__name__}: {e}"
            out["resident"].append(row)
            log_row("resident", row)
        for b in a.batches:
            for ratio in a.ratios:
                C = capacity_for(ratio, W[b], cfg.num_experts)
                for policy in POLICIES:
                    what = {"graphs": mode, "batch": b, "cache_ratio": ratio, "policy": policy}
                    if over_budget(what):
                        continue
                    row = {**what, "cache_experts": C, "num_experts": cfg.num_experts}
                    try:
                        row.update(offloaded(torch, a, loaded, prompts[b], b, dc, OffloadSpec(
                            capacity=C, policy=policy, link=link), ref[b], expert_bytes, bandwidth_gbps,
                            replay, profile=ratio == 1.0 and policy == "demand", forward=FORWARD_OF[mode]))
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {e}"
                        row["traceback"] = traceback.format_exc()[-2000:]
                    out["runs"].append(row)
                    log_row("offloaded", row)
    ok = [r for r in out["runs"] if "error" not in r]
    out["all_tokens_equal_resident"] = bool(ok) and all(r["tokens_equal_resident"] for r in ok)
    out["all_counts_equal_replay"] = bool(ok) and all(r["counts_equal_replay"] for r in ok)
    out["errors"] = sum("error" in r for r in out["runs"] + out["resident"])
    return out


def offloaded(torch, a, loaded, prompts, batch, dc, spec, ref_tokens, expert_bytes, gbps, replay,
              profile: bool, forward: str = "eager") -> dict:
    from artifact.offload.runner import run
    run(loaded, prompts, batch, dc, spec=spec, device=a.device, forward=forward)    # warm-up, in full
    w0 = loaded.model.routing.host_counts.wait_seconds
    res = run(loaded, prompts, batch, dc, spec=spec, device=a.device, forward=forward, capture=False)
    wait = loaded.model.routing.host_counts.wait_seconds - w0
    s = res.stats.as_dict()
    denoise = s["forwards"]
    den = [s["by_phase"][ph] for ph in ("first", "later")]
    transfers = sum(p["demand_misses"] + p["speculative_transfers"] for p in den)
    h2d = 1e3 * transfers * expert_bytes / (gbps * 1e9) / max(denoise, 1)
    row = {"forwards": denoise, "prefill_forwards": s["prefill_forwards"], **timing(s),
           "transfers_denoising": transfers, "h2d_ms_per_forward": h2d,
           "link_busy_over_wall": s["link_busy_seconds"] / s["seconds"] if s["seconds"] else None,
           "stall_seconds": s["stall_seconds"], "sync_wait_ms_per_forward": 1e3 * wait / max(
               denoise + s["prefill_forwards"], 1), "tokens_equal_resident": res.tokens == ref_tokens,
           **{k: s[k] for k in COUNT_KEYS}}
    row["host_over_h2d"] = row["host_ms_median"] / h2d if h2d > 0 and row["host_ms_median"] is not None else None
    try:                            # apart, so that a failure here keeps the timed run's figures
        rec = run(loaded, prompts, batch, dc, spec=spec, device=a.device, record=True, forward=forward)
        sim = replay(rec.trace, spec.policy, spec.capacity)
        row["replay"] = {k: sim[k] for k in COUNT_KEYS}
        row["counts_equal_replay"] = (all(getattr(rec.stats, k) == sim[k] == s[k] for k in COUNT_KEYS)
                                      and rec.tokens == res.tokens)
    except Exception as e:
        row["counts_equal_replay"], row["replay_error"] = None, f"{type(e).__name__}: {e}"
    if profile:
        try:
            row["profile"] = profiled(torch, a, loaded, prompts, batch, dc, spec, forward)
        except Exception as e:
            row["profile"] = {"error": f"{type(e).__name__}: {e}"}
    return row


def log_row(kind: str, r: dict) -> None:
    head = f"graphs {r['graphs']:3s} batch {r['batch']} " + (
        f"C/W {r['cache_ratio']} {r['policy']:9s}" if "policy" in r else "resident")
    if "error" in r:
        base.log(f"{head}: {r['error']}")
        return
    h2d = f", H2D {r['h2d_ms_per_forward']:.2f} ms" if "h2d_ms_per_forward" in r else ""
    base.log(f"{head}: host {r['host_ms_median']:.2f} ms (p90 {r['host_ms_p90']:.2f}), wall "
             f"{r['wall_ms_median']:.2f} ms{h2d}, tokens equal: {r['tokens_equal_resident']}")


# --- the targets: pure functions of the report's rows ---------------------------------------------
def _verdict(name: str, figures: dict, ok: bool | None, missing: list[str] | None = None) -> dict:
    if missing:
        return {"status": UNMEASURED, "rule": RULES[name], "figures": figures, "missing": missing}
    return {"status": MET if ok else NOT_MET, "rule": RULES[name], "figures": figures}


def _find(runs: list[dict], **key) -> dict | None:
    """The run (graphs, batch, cache_ratio, policy, ...) matching key, if it ran without error."""
    for r in runs:
        if "error" not in r and all(r.get(k) == v for k, v in key.items()):
            return r
    return None


def _profiled(runs: list[dict]) -> list[dict]:
    """The graphs-on runs whose profiled run measured its counts."""
    return [r for r in runs if "error" not in r and r.get("graphs") == "on"
            and "error" not in r.get("profile", {"error": "not profiled"})]


def t1(runs: list[dict]) -> dict:
    need = [(1, 1.0, T1_HOST_OVER_H2D), (4, 1.0, T1_HOST_OVER_H2D), (1, 1.73, T1_AT_173)]
    figures, missing, ok = {}, [], True
    for b, ratio, limit in need:
        r = _find(runs, graphs="on", batch=b, cache_ratio=ratio, policy="demand")
        label = f"batch {b}, C/W {ratio:g}"
        if r is None or r.get("host_over_h2d") is None:
            missing.append(label)
            continue
        figures[label] = {"host_ms_median": r["host_ms_median"], "h2d_ms_per_forward": r["h2d_ms_per_forward"],
                          "host_over_h2d": r["host_over_h2d"], "limit": limit}
        ok &= r["host_over_h2d"] <= limit
    return _verdict("T1", figures, ok, missing)


def t2(runs: list[dict]) -> dict:
    figures, missing, ok = {}, [], True
    for r in _profiled(runs):
        p = r["profile"]
        figures[f"batch {r['batch']}"] = {k: p[k] for k in ("launches_per_moe_layer", "copies_per_moe_layer",
                                                            "aten_ops_per_moe_layer")}
        ok &= p["launches_per_moe_layer"] <= T2_LAUNCHES
    if not figures:
        missing.append("a profiled graphs-on run (C/W 1, demand)")
    return _verdict("T2", figures, ok, missing)


def t3(runs: list[dict], cuda: bool) -> dict:
    figures, missing, ok = {}, [], True
    for r in _profiled(runs):
        p = r["profile"]
        if cuda:
            keys = ("event_syncs_per_moe_layer", "stream_syncs_per_moe_layer", "device_syncs_per_moe_layer",
                    "blocking_copies_per_moe_layer")
            good = (p["event_syncs_per_moe_layer"] == 1 and p["stream_syncs_per_moe_layer"] == 0
                    and p["device_syncs_per_moe_layer"] == 0 and p["blocking_copies_per_moe_layer"] == 0)
        else:
            keys = ("device_reads_per_moe_layer",)
            good = p["device_reads_per_moe_layer"] == 1
        figures[f"batch {r['batch']}"] = {k: p[k] for k in keys}
        ok &= good
    if not figures:
        missing.append("a profiled graphs-on run (C/W 1, demand)")
    return _verdict("T3", figures, ok, missing)


def t4(runs: list[dict]) -> dict:
    r = _find(runs, graphs="on", batch=1, cache_ratio=1.0, policy="demand")
    if r is None or r.get("link_busy_over_wall") is None:
        return _verdict("T4", {}, None, ["batch 1, C/W 1, demand, graphs on"])
    return _verdict("T4", {"link_busy_over_wall": r["link_busy_over_wall"]}, r["link_busy_over_wall"] >= T4_BUSY)


def t5(runs: list[dict], caps: list[dict]) -> dict:
    ok_runs = [r for r in runs if "error" not in r]
    missing = [] if ok_runs else ["an offloaded run"]
    missing += [f"the replay of graphs {r['graphs']} batch {r['batch']} C/W {r['cache_ratio']:g} {r['policy']}"
                for r in ok_runs if r.get("counts_equal_replay") is None]          # its recorded run raised
    missing += [f"the capped link at {f}x" for f in (0.5, 0.25) if not any(c.get("fraction") == f for c in caps)]
    figures = {"runs": len(ok_runs), "runs_with_errors": len(runs) - len(ok_runs),
               "counts_equal_replay": sum(bool(r.get("counts_equal_replay")) for r in ok_runs),
               "tokens_equal_resident": sum(bool(r.get("tokens_equal_resident")) for r in ok_runs),
               "caps": {f"{c['fraction']}x": c["achieved_over_target"] for c in caps
                        if c.get("fraction") in (0.5, 0.25)}}
    ok = (figures["counts_equal_replay"] == figures["tokens_equal_resident"] == len(ok_runs)
          and figures["runs_with_errors"] == 0
          and all(abs(v - 1) <= T5_CAP for v in figures["caps"].values()))
    return _verdict("T5", figures, ok, missing)


def t6(runs: list[dict]) -> dict:
    figures, ok = {}, True
    cells = sorted({(r["batch"], r["cache_ratio"]) for r in runs if r.get("graphs") == "on" and "batch" in r})
    for b, ratio in cells:
        d = _find(runs, graphs="on", batch=b, cache_ratio=ratio, policy="demand")
        s = _find(runs, graphs="on", batch=b, cache_ratio=ratio, policy="last_step")
        label = f"batch {b}, C/W {ratio:g}"
        if d is None or s is None:
            continue
        if d["cache_experts"] >= d["num_experts"]:
            figures[label] = "excluded: C = E, no copies"
            continue
        diff = abs(s["host_ms_median"] - d["host_ms_median"])
        figures[label] = {"host_diff_ms": diff, "h2d_ms_per_forward": d["h2d_ms_per_forward"],
                          "limit_ms": T6_SHARE * d["h2d_ms_per_forward"]}
        ok &= diff <= T6_SHARE * d["h2d_ms_per_forward"]
    judged = [v for v in figures.values() if isinstance(v, dict)]
    return _verdict("T6", figures, ok, [] if judged else ["a graphs-on cell with C < E run under both policies"])


def judge(report: dict) -> dict:
    """T1-T6 from a report's engine and capped_link steps; on a CPU dry run every target is unmeasured
    and says what the CPU figures would give (would_be)."""
    runs = (report.get("engine") or {}).get("runs", [])
    caps = (report.get("capped_link") or {}).get("caps", [])
    cuda = not report.get("dry_run_on_cpu")
    out = {"T1": t1(runs), "T2": t2(runs), "T3": t3(runs, cuda), "T4": t4(runs), "T5": t5(runs, caps),
           "T6": t6(runs)}
    if not cuda:
        for t in out.values():
            t["would_be"], t["status"], t["why"] = t["status"], UNMEASURED, NO_GPU_TARGETS
    return out


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
        print(f"gpu_check_graphs: cannot import the artifact package ({e}); run scripts/gpu_check.sh graphs from "
              "the checkout", file=sys.stderr)
        return base.EXIT_USAGE
    cuda = a.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    cfg = base.model_config(a, a.layers)
    dtype = "bfloat16" if cuda else "float32"
    expert_bytes = cfg.expert_params * (2 if cuda else 4)
    report = {"note": base.NOTE, "issue": 30, "dry_run_on_cpu": not cuda,
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
        from artifact.offload.link import emulated_bandwidth_gbps
        return emulated_bandwidth_gbps(expert_bytes)

    deadline = t_start + a.budget_s
    steps = {"environment": lambda: environment(a, torch),
             "host_costs": lambda: host_costs(a, torch, expert_bytes),
             "pinned_peak": lambda: base.pinned_peak(a, torch, expert_bytes),
             "capped_link": lambda: base.capped_link(a, torch, expert_bytes),
             "engine": lambda: torch.no_grad()(engine)(a, torch, cfg, dtype, report, bandwidth(), deadline)}
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
        extra = f" (would be {t['would_be']}: {t['why']})" if "would_be" in t else (
            f" (missing: {'; '.join(t['missing'])})" if t.get("missing") else "")
        print(f"{name}: {t['status']}{extra} -- {t['rule']}; figures: {json.dumps(t['figures'], default=str)}",
              flush=True)
    write()
    base.log(f"wrote {a.out} in {report['seconds_total']:.0f} s. NOTE: {base.NOTE}")
    return code


if __name__ == "__main__":
    sys.exit(main())
