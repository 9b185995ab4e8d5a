"""The graphs check's engine steps (scripts/gpu_check_graphs.py, steps 5 and 6): the tiny model run resident
and offloaded, forward "eager" and "segmented", each configuration warmed up, timed and replayed; a row per
configuration, with its segments' counters (`replayed`). The profiled run is gpu_profile.py."""

from __future__ import annotations

import math
import statistics
import time
import traceback
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import gpu_check as base  # scripts/gpu_check.py: the shared shapes and the log
from gpu_profile import profiled

FORWARD_MODES = ("eager", "segmented")  # artifact.model's forward modes: the eager path, and the forward cut
# into segments between the router syncs (CUDA graphs on a GPU)
POLICIES = ("demand", "last_step")


# --- small statistics -----------------------------------------------------------------------------
def p90(xs: list[float]) -> float | None:
    """The 90th percentile (nearest rank) of xs; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# --- a row's forward mode: its keywords, its warm-up, its segments' counters ---------------------------
def run_spec(a, dc, forward: str, timed: bool = False, **fields):
    """The RunSpec of a row in forward mode `forward` (the check sweeps FORWARD_MODES), with the run flags
    (gpu_check.base_spec: kernel, link priority, lookahead, tau) and `fields` (capacity, policy, link); a
    timed or profiled run never captures (capture=False: its warm-up run captured its shapes)."""
    return base.base_spec(a, device=a.device, decode=dc, forward=forward, capture=not timed, **fields)


def warm_up(run_once, forward: str):
    """The untimed warm-up of a configuration: the whole run once, and for forward "segmented" twice. A
    program captures on its second forward, and a shape the decoder feeds once per run (the first step of a
    later block, which also commits the previous block) is seen twice only over two runs: after them the timed
    run replays every piece (none eager). Returns the last warm-up run's result."""
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
        row.update(
            captures=sum(s.captures for s in segs),
            replays=segs[-1].replays,
            eager=segs[-1].eager,
            capture_error=next((s.capture_error for s in segs if s.capture_error), None),
        )
    row["replayed"] = replayed(row)
    if not row["replayed"]:
        why = row["capture_error"] or (f"{row['eager']} pieces ran eagerly" if row["eager"] else "no replays")
        row["not_judged"] = (
            "segments did not replay: " + why
            if segs[-1] is not None
            else "segments did not replay: the run reports no segment counters"
        )
    return row


# --- step 6: the engine, forward eager and segmented (the profiled run: gpu_profile.py) -------------
def timing(stats: dict) -> dict:
    host, wall = list(stats.get("forward_host_ms", [])), list(stats.get("forward_wall_ms", []))
    out = {
        "host_ms": host,
        "wall_ms": wall,
        "host_ms_median": median(host),
        "host_ms_p90": p90(host),
        "wall_ms_median": median(wall),
        "wall_ms_p90": p90(wall),
    }
    out["host_over_wall"] = (
        out["host_ms_median"] / out["wall_ms_median"] if host and wall and out["wall_ms_median"] > 0 else None
    )
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
    "sync_wait_ms_per_forward": "ms blocked in the router syncs (routing.host_counts.wait_seconds) "
    "per forward of the run (prefill included)",
    "counts_equal_replay": "a recorded run of the same configuration: "
    "its engine counts equal sim.replay of its own trace, and equal the timed run's counts",
    "profile": "C/W 1, demand: per MoE layer of a denoising forward (torch.profiler, the CUDA runtime calls "
    "inside the forward): launches (kernels and graph launches), copies, event / stream / device "
    "syncs, blocking copies; aten_ops: ATen ops the forward called directly (outside graphs); "
    "device_reads: SyncCounter's device-to-host reads",
}


def engine(a, torch, cfg, dtype, report, bandwidth_gbps: float, deadline: float, write=lambda: None) -> dict:
    """Step 6; `write` is called after every row, so each row is on disk as soon as it is measured."""
    from artifact.model.tiny import random_model

    cuda = a.device == "cuda"
    link = "cuda" if cuda else "emulated"
    expert_bytes = cfg.expert_params * (2 if cuda else 4)
    out = report["engine"] = {
        "model": cfg.name,
        "layers": cfg.num_hidden_layers,
        "moe_layers": len(cfg.moe_layers),
        "dtype": dtype,
        "expert_bytes": expert_bytes,
        "bandwidth_gbps": bandwidth_gbps,
        "runs": [],
        "resident": [],
        "skipped": [],
        "measures": MEASURES,
    }
    t0 = time.perf_counter()
    loaded = random_model(cfg, seed=0, dtype=dtype, device=a.device, resident=True)
    out["build_seconds"] = time.perf_counter() - t0
    dc = decoding(a, cfg, out)
    length = -(-a.prompt_length // cfg.block_length) * cfg.block_length  # block-aligned prompts
    prompts = {b: base.random_prompts(torch, cfg, b, length, seed=b, spread=0) for b in a.batches}
    ref, W = references(a, loaded, prompts, dc)
    bench = Bench(a, cfg, loaded, dc, dtype, prompts, ref, W, out, deadline, write)
    # In order of what the targets need first, so that a budget running out leaves the rest: each batch's
    # resident rows, then per batch the C/W ratios in the order given, each policy, each forward mode.
    resident_rows(bench)
    offloaded_rows(bench, torch, link, expert_bytes, bandwidth_gbps)
    ok = [r for r in out["runs"] if "error" not in r]
    out["all_tokens_equal_resident"] = bool(ok) and all(r["tokens_equal_resident"] for r in ok)
    out["all_counts_equal_replay"] = bool(ok) and all(r["counts_equal_replay"] for r in ok)
    out["errors"] = sum("error" in r for r in out["runs"] + out["resident"])
    return out


def decoding(a, cfg, out: dict):
    """The rows' DecodeConfig (threshold 1.0: a fixed count of steps per block, no early stop), described
    under out["decode"]."""
    from artifact.model.decode import DecodeConfig

    steps = cfg.block_length // 4
    dc = DecodeConfig(gen_length=a.gen_length, steps=steps, threshold=1.0, eos_early_stop=False)
    out["decode"] = {
        "threshold": 1.0,
        "steps_per_block": steps,
        "gen_length": a.gen_length,
        "warm_up": "the whole run, same prompts and shapes, before the timed run: "
        "once for forward eager, twice for segmented (a shape fed once per run is captured in the second)",
    }
    return dc


def references(a, loaded, prompts: dict, dc) -> tuple[dict, dict]:
    """Per batch, the reference tokens and the mean working set W: eager, resident, recorded (untimed)."""
    from artifact.offload.replay.trace import mean_working_set
    from artifact.offload.runner import decode_prompts

    ref, W = {}, {}
    for b in a.batches:
        res = decode_prompts(loaded, prompts[b], b, run_spec(a, dc, "eager"), record=True)
        ref[b], W[b] = res.tokens, mean_working_set(res.trace)
    return ref, W


@dataclass(frozen=True)
class Bench:
    """What step 6's rows share: the flags, the model (resident) and its config, the decoding, the rows'
    dtype; per batch the prompts, the reference tokens and W; the report's section (`out`), written to
    disk by `write` after each row, and the deadline past which a configuration is skipped."""

    a: Any
    cfg: Any
    loaded: Any
    dc: Any
    dtype: str
    prompts: dict
    ref: dict
    W: dict
    out: dict
    deadline: float
    write: Callable[[], None]

    def over_budget(self, what: dict) -> bool:
        """Past the deadline (--budget-s): configuration `what` is recorded as skipped, and True."""
        if time.perf_counter() < self.deadline:
            return False
        self.out["skipped"].append({**what, "why": f"--budget-s {self.a.budget_s:g} s spent"})
        return True

    def record(self, rows: str, kind: str, row: dict) -> None:
        """The row under out[rows], on disk at once, and logged."""
        self.out[rows].append(row)
        self.write()
        log_row(kind, row)


def resident_rows(bench: Bench) -> None:
    """Each batch's resident rows, one per forward mode: warmed up, timed, tokens against the reference."""
    from artifact.offload.runner import decode_prompts

    a, loaded, prompts, dc = bench.a, bench.loaded, bench.prompts, bench.dc
    for b in a.batches:
        for forward in FORWARD_MODES:
            if bench.over_budget({"forward": forward, "batch": b, "resident": True}):
                continue
            row = {"forward": forward, "batch": b, "working_set": bench.W[b], "dtype": bench.dtype}
            try:
                options = run_spec(a, dc, forward)
                warm = warm_up(partial(decode_prompts, loaded, prompts[b], b, options), forward)
                res = decode_prompts(loaded, prompts[b], b, run_spec(a, dc, forward, timed=True))
                row.update(
                    timing(res.stats.as_dict()),
                    tokens_equal_resident=res.tokens == bench.ref[b],
                    forwards=res.stats.forwards,
                    **segment_counters(forward, warm, res),
                )
            except Exception as e:  # keep the other configurations: GPU time is scarce
                row["error"] = f"{type(e).__name__}: {e}"
            bench.record("resident", "resident", row)


def offloaded_rows(bench: Bench, torch, link: str, expert_bytes: int, bandwidth_gbps: float) -> None:
    """Per batch, C/W ratio (in the order given), policy and forward mode, the offloaded row (offloaded());
    a configuration that raises is recorded with its error and traceback."""
    from artifact.offload.replay.sim import capacity_for, replay

    a, cfg = bench.a, bench.cfg
    for b in a.batches:
        for ratio in a.ratios:
            C = capacity_for(ratio, bench.W[b], cfg.num_experts)
            for policy in POLICIES:
                for forward in FORWARD_MODES:
                    what = {"forward": forward, "batch": b, "cache_ratio": ratio, "policy": policy}
                    if bench.over_budget(what):
                        continue
                    row = {**what, "cache_experts": C, "num_experts": cfg.num_experts, "dtype": bench.dtype}
                    try:
                        row.update(
                            offloaded(
                                torch,
                                a,
                                bench.loaded,
                                bench.prompts[b],
                                b,
                                bench.dc,
                                dict(capacity=C, policy=policy, link=link),
                                bench.ref[b],
                                expert_bytes,
                                bandwidth_gbps,
                                replay,
                                profile=ratio == 1.0 and policy == "demand",
                                forward=forward,
                            )
                        )
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {e}"
                        row["traceback"] = traceback.format_exc()[-2000:]
                    bench.record("runs", "offloaded", row)


def offloaded(
    torch,
    a,
    loaded,
    prompts,
    batch,
    dc,
    offload: dict,
    ref_tokens,
    expert_bytes,
    gbps,
    replay,
    profile: bool,
    forward: str,
) -> dict:
    from artifact.offload.runner import decode_prompts

    spec, timed = run_spec(a, dc, forward, **offload), run_spec(a, dc, forward, timed=True, **offload)
    warm = warm_up(partial(decode_prompts, loaded, prompts, batch, spec), forward)
    w0 = loaded.model.routing.host_counts.wait_seconds
    res = decode_prompts(loaded, prompts, batch, timed)
    wait = loaded.model.routing.host_counts.wait_seconds - w0
    s = res.stats.as_dict()
    denoise = s["forwards"]
    den = [s["by_phase"][ph] for ph in ("first", "later")]
    transfers = sum(p["demand_misses"] + p["speculative_transfers"] for p in den)
    h2d = 1e3 * transfers * expert_bytes / (gbps * 1e9) / max(denoise, 1)
    row = {
        "forwards": denoise,
        "prefill_forwards": s["prefill_forwards"],
        **timing(s),
        "transfers_denoising": transfers,
        "demand_misses_denoising": sum(p["demand_misses"] for p in den),
        "h2d_ms_per_forward": h2d,
        "link_busy_over_wall": s["link_busy_seconds"] / s["seconds"] if s["seconds"] else None,
        "stall_seconds": s["stall_seconds"],
        "sync_wait_ms_per_forward": 1e3 * wait / max(denoise + s["prefill_forwards"], 1),
        "tokens_equal_resident": res.tokens == ref_tokens,
        **{k: s[k] for k in COUNT_KEYS},
        **segment_counters(forward, warm, res),
    }
    row["host_over_h2d"] = (
        row["host_ms_median"] / h2d if h2d > 0 and row["host_ms_median"] is not None else None
    )
    try:  # apart, so that a failure here keeps the timed run's figures
        rec = decode_prompts(loaded, prompts, batch, spec, record=True)
        sim = replay(rec.trace, spec.policy, spec.capacity, lookahead=spec.lookahead, tau=spec.tau)
        row["replay"] = {k: sim[k] for k in COUNT_KEYS}
        row["counts_equal_replay"] = (
            all(getattr(rec.stats, k) == sim[k] == s[k] for k in COUNT_KEYS) and rec.tokens == res.tokens
        )
    except Exception as e:
        row["counts_equal_replay"], row["replay_error"] = None, f"{type(e).__name__}: {e}"
    if profile:
        try:
            row["profile"] = profiled(torch, a, loaded, prompts, batch, timed)
        except Exception as e:
            row["profile"] = {"error": f"{type(e).__name__}: {e}"}
    return row


def fp32_tokens(a, torch) -> dict:
    """Step 5 (CUDA): the tiny model in float32 on the GPU, batch 1, C/W 1, each policy and forward mode (the
    segmented one warmed up as in the engine step): tokens equal the resident eager run's. T5 judges tokens
    here: the engine's bf16 rows may diverge from the eager run after the first step, as tests/test_cuda.py
    allows."""
    if a.device != "cuda":
        return {"skipped": "on the CPU the engine rows run in float32: T5 judges their tokens"}
    import dataclasses

    from artifact.model.config import get_preset
    from artifact.model.decode import DecodeConfig
    from artifact.model.tiny import random_model
    from artifact.offload.replay.sim import capacity_for
    from artifact.offload.replay.trace import mean_working_set
    from artifact.offload.runner import decode_prompts

    cfg = dataclasses.replace(get_preset("tiny"), num_hidden_layers=3, name="tiny-3L-random")
    loaded = random_model(cfg, seed=0, dtype="float32", device=a.device, resident=True)
    dc = DecodeConfig(
        gen_length=2 * cfg.block_length, steps=cfg.block_length // 4, threshold=1.0, eos_early_stop=False
    )
    prompts = base.random_prompts(torch, cfg, 1, 2 * cfg.block_length, seed=1, spread=0)
    ref = decode_prompts(loaded, prompts, 1, run_spec(a, dc, "eager"), record=True)
    C = capacity_for(1.0, mean_working_set(ref.trace), cfg.num_experts)
    out = {
        "model": cfg.name,
        "dtype": "float32",
        "batch": 1,
        "cache_ratio": 1.0,
        "cache_experts": C,
        "runs": [],
    }
    for policy in POLICIES:
        for forward in FORWARD_MODES:
            row = {"forward": forward, "batch": 1, "cache_ratio": 1.0, "policy": policy, "dtype": "float32"}
            try:
                offload = dict(capacity=C, policy=policy, link="cuda")
                spec = run_spec(a, dc, forward, **offload)
                warm = warm_up(partial(decode_prompts, loaded, prompts, 1, spec), forward)
                res = decode_prompts(loaded, prompts, 1, run_spec(a, dc, forward, timed=True, **offload))
                row.update(
                    tokens_equal_resident=res.tokens == ref.tokens, **segment_counters(forward, warm, res)
                )
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
            out["runs"].append(row)
    return out


def log_row(kind: str, r: dict) -> None:
    replay = "" if r.get("forward") == "eager" or r.get("replayed") else " (did not replay)"
    head = f"forward {r['forward']}{replay} batch {r['batch']} " + (
        f"C/W {r['cache_ratio']} {r['policy']:9s}" if "policy" in r else "resident"
    )
    if "error" in r:
        base.log(f"{head}: {r['error']}")
        return
    h2d = f", H2D {r['h2d_ms_per_forward']:.2f} ms" if "h2d_ms_per_forward" in r else ""
    base.log(
        f"{head}: host {r['host_ms_median']:.2f} ms (p90 {r['host_ms_p90']:.2f}), wall "
        f"{r['wall_ms_median']:.2f} ms{h2d}, tokens equal: {r['tokens_equal_resident']}"
    )
