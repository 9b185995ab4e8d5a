"""GPU check: one command, a few minutes on one GPU, nothing downloaded or built.

  1. the GPU test subset (pytest -m cuda tests), with a time limit;
  2. the pinned-copy peak: host-to-device GB/s of a 1 GiB pinned copy, and of back-to-back copies of
     one expert's size (the engine's unit of transfer);
  3. an LLaDA2.0-mini-shaped model with random weights and fewer layers (default 4: 1 dense + 3 MoE,
     vocabulary cut to 32768): W from a resident traced run, then demand vs last_step, paired and
     interleaved (the order alternates each repetition), at each C/W ratio, with the CUDA link;
     the engine's achieved H2D GB/s is set against the pinned-copy peak;
  4. a JSON summary (--out), written atomically.

Random weights route differently from the trained model (W, step-to-step reuse and tokens per
forward all differ): the figures check the machinery and the link, not the paper's claims.

Exit codes: 0 done; 1 the GPU tests failed or timed out (the summary is still written);
2 bad arguments; 3 no CUDA GPU visible (nothing was run); 4 a measurement raised (the summary holds
what was measured before, and the error).
--device cpu --allow-cpu runs the same pipeline on the tiny shapes with the emulated link: a dry run
for machines without a GPU (the tests use it)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_TESTS_FAILED, EXIT_USAGE, EXIT_NO_GPU, EXIT_ERROR = 0, 1, 2, 3, 4
ROOT = Path(__file__).resolve().parent.parent
NOTE = ("Random weights route differently from the trained LLaDA2.0-mini: the working set W, its "
        "step-to-step reuse and the tokens accepted per forward differ, so these tokens/s compare the "
        "policies and the link on this machine; they do not reproduce the paper's figures.")
NO_GPU = "gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); nothing was run."


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check.json")
    ap.add_argument("--ratios", default="0.43,1.0,1.73",
                    help="C/W ratios (the engine issue's 0.5,1.0,1.5 also work: --ratios 0.43,0.5,1.0,1.5,1.73)")
    ap.add_argument("--reps", type=int, default=None, help="paired repetitions (default 3; --quick 2)")
    ap.add_argument("--prompts", type=int, default=None, help="random prompts per run (default 2; --quick 1)")
    ap.add_argument("--prompt-length", type=int, default=100)
    ap.add_argument("--gen-length", type=int, default=None, help="default 128; --quick 64")
    ap.add_argument("--layers", type=int, default=None, help="model layers, layer 0 dense (default 4; --quick 3)")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="fewer reps, prompts, tokens and layers (~1-2 minutes)")
    ap.add_argument("--skip-tests", action="store_true", help="skip the pytest GPU subset")
    ap.add_argument("--test-timeout", type=int, default=240, help="seconds for the GPU test subset")
    ap.add_argument("--time-budget", type=float, default=420.0,
                    help="seconds after which no new paired repetition starts (the summary says so)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu with --allow-cpu (dry run)")
    ap.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU: tiny shapes, emulated link")
    a = ap.parse_args(argv)
    a.reps = a.reps or (2 if a.quick else 3)
    a.prompts = a.prompts or (1 if a.quick else 2)
    a.gen_length = a.gen_length or (64 if a.quick else 128)
    a.layers = a.layers or (3 if a.quick else 4)
    try:
        a.ratios = [float(r) for r in a.ratios.split(",") if r.strip()]
    except ValueError:
        ap.error(f"--ratios must be comma-separated numbers, got {a.ratios!r}")
    if not a.ratios or min(a.ratios) <= 0:
        ap.error(f"--ratios must be positive, got {a.ratios}")
    for name in ("reps", "prompts", "prompt_length", "gen_length"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 1 <= a.batch_size <= min(8, a.prompts):
        ap.error(f"--batch-size must be in [1, min(8, --prompts={a.prompts})], got {a.batch_size}")
    if a.layers < 2:
        ap.error("--layers must be >= 2 (layer 0 is dense)")
    if a.device not in ("cuda", "cpu"):
        ap.error(f"--device must be cuda or cpu, got {a.device!r}")
    if a.device == "cpu" and not a.allow_cpu:
        ap.error("--device cpu is a dry run of the pipeline: add --allow-cpu")
    return a


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_gpu_tests(timeout: int) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "tests", "-q", "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"command": " ".join(cmd[1:]), "returncode": None, "timed_out": True, "ok": False,
                "seconds": time.perf_counter() - t0, "tail": tail[-2000:]}
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    summary = next((ln for ln in reversed(lines) if re.search(r"passed|failed|error|skipped|deselected", ln)), "")
    return {"command": " ".join(cmd[1:]), "returncode": p.returncode, "timed_out": False,
            "ok": p.returncode == 0, "summary": summary.strip("= "), "seconds": time.perf_counter() - t0,
            "tail": (p.stdout + p.stderr)[-2000:]}


def pinned_peak(torch, expert_bytes: int, total_bytes: int = 1 << 30, reps: int = 5) -> dict:
    """H2D GB/s of one big pinned copy (the DMA peak) and of expert-sized copies back to back."""
    src = torch.empty(total_bytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(total_bytes, dtype=torch.uint8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(fn) -> float:
        fn()                                                           # warm-up
        torch.cuda.synchronize()
        best = math.inf
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return best

    big = timed(lambda: dst.copy_(src, non_blocking=True))
    n = total_bytes // expert_bytes

    def experts():
        for i in range(n):
            dst[i * expert_bytes:(i + 1) * expert_bytes].copy_(src[i * expert_bytes:(i + 1) * expert_bytes],
                                                                non_blocking=True)
    small = timed(experts)
    return {"peak_gbps": total_bytes / big / 1e9, "expert_copy_gbps": n * expert_bytes / small / 1e9,
            "copy_bytes": total_bytes, "expert_bytes": expert_bytes, "reps": reps, "statistic": "best of reps"}


def model_config(a):
    from artifact.model.config import get_preset
    if a.device == "cpu":
        return dataclasses.replace(get_preset("tiny"), num_hidden_layers=a.layers, name=f"tiny-{a.layers}L-random")
    vocab = 32768                # a smaller embedding and LM head: faster to build, same expert shapes
    return dataclasses.replace(get_preset("llada2-mini"), num_hidden_layers=a.layers, vocab_size=vocab,
                               mask_token_id=vocab - 1, eos_token_id=vocab - 4,
                               name=f"llada2-mini-shaped-{a.layers}L-random")


def random_prompts(torch, cfg, n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lo, hi = 8, cfg.vocab_size - 8          # clear of the special ids at either end (tiny: 0-5; here: V-4, V-1)
    assert not lo <= cfg.mask_token_id < hi and not lo <= cfg.eos_token_id < hi
    return [torch.randint(lo, hi, (length + 7 * i,), generator=g).tolist() for i in range(n)]


def paired_summary(rows: list[dict], ratios: list[float]) -> list[dict]:
    """Per ratio: mean tokens/s of each policy and the paired per-rep difference of demand over last_step
    in percent, with a t-based 95% CI when there are at least two pairs."""
    from scipy import stats
    out = []
    for r in ratios:
        by = {(x["rep"], x["policy"]): x for x in rows if x["cache_ratio"] == r}
        reps = sorted({rep for rep, p in by if (rep, "demand") in by and (rep, "last_step") in by})
        diffs = [100 * (by[k, "demand"]["tokens_per_second"] / by[k, "last_step"]["tokens_per_second"] - 1)
                 for k in reps]
        row = {"cache_ratio": r, "pairs": len(diffs),
               "cache_experts": next((x["cache_experts"] for x in by.values()), None)}
        for p in ("demand", "last_step"):
            v = [by[k, p]["tokens_per_second"] for k in reps]
            row[f"{p}_tokens_per_second"] = statistics.fmean(v) if v else None
            row[f"{p}_demand_misses"] = statistics.fmean(by[k, p]["demand_misses"] for k in reps) if v else None
        row["demand_vs_last_step_pct"] = statistics.fmean(diffs) if diffs else None
        if len(diffs) >= 2:
            half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
            row["ci95_pct"] = [row["demand_vs_last_step_pct"] - half, row["demand_vs_last_step_pct"] + half]
        else:
            row["ci95_pct"] = None
        out.append(row)
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr, flush=True)
        return EXIT_NO_GPU
    try:
        from artifact.paths import atomic_write_text
    except ImportError as e:
        print(f"gpu_check: cannot import the artifact package ({e}); run scripts/gpu_check.sh from the "
              "checkout, or pip install -e . first", file=sys.stderr)
        return EXIT_USAGE

    cuda = a.device == "cuda"
    if not cuda:     # tiny shapes gain nothing from threads, and on a shared CPU idle-spinning threads make
        torch.set_num_threads(1)                      # timings erratic (a dry run checks plumbing, not speed)
    link = "cuda" if cuda else "emulated"
    summary = {"note": NOTE, "dry_run_on_cpu": not cuda, "device": torch.cuda.get_device_name() if cuda else "cpu",
               "torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
               "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "link": link,
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}}
    code = EXIT_OK

    if a.skip_tests:
        summary["tests"] = {"skipped": "--skip-tests"}
    else:
        log(f"GPU test subset (pytest -m cuda, limit {a.test_timeout} s)")
        summary["tests"] = run_gpu_tests(a.test_timeout)
        log(f"tests: {summary['tests'].get('summary') or 'timed out'}")
        code = EXIT_OK if summary["tests"]["ok"] else EXIT_TESTS_FAILED

    try:
        measure(a, torch, summary, t_start)
    except Exception as e:                       # keep what was measured: GPU time is scarce
        import traceback
        summary["error"] = {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()[-4000:]}
        log(f"measurement failed: {type(e).__name__}: {e}")
        code = EXIT_ERROR
    summary["seconds_total"] = time.perf_counter() - t_start
    summary["exit_code"] = code
    atomic_write_text(a.out, json.dumps(summary, indent=2, default=str))
    for p in summary.get("paired", []):
        if not p["pairs"]:
            log(f"C/W {p['cache_ratio']}: no pairs (time budget)")
            continue
        ci = p["ci95_pct"]
        ci_text = f" (95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}])" if ci else ""
        log(f"C/W {p['cache_ratio']}: demand vs last_step {p['demand_vs_last_step_pct']:+.2f}%{ci_text}")
    h = summary.get("h2d", {})
    if h.get("engine_vs_peak") is not None:
        log(f"engine H2D {h['engine_achieved_gbps_median']:.2f} GB/s = {100 * h['engine_vs_peak']:.0f}% of "
            f"peak {h['peak_gbps']:.2f} GB/s")
    log(f"wrote {a.out} in {summary['seconds_total']:.0f} s. NOTE: {NOTE}")
    return code


def measure(a, torch, summary: dict, t_start: float) -> None:
    """Peak copy, model, W, warm-ups and the paired runs; fills `summary` as it goes."""
    from artifact.model.checkpoint import random_model
    from artifact.model.decode import DecodeConfig
    from artifact.offload.runner import OffloadSpec, run
    from artifact.offload.sim import capacity_for
    from artifact.offload.trace import mean_working_set

    cuda = a.device == "cuda"
    link = summary["link"]
    rows = summary["runs"] = []                                         # filled as runs finish
    cfg = model_config(a)
    dtype = "bfloat16" if cuda else "float32"
    expert_bytes = cfg.expert_params * (2 if cuda else 4)
    if cuda:
        log("pinned-copy peak (1 GiB, and expert-sized copies)")
        summary["pinned_copy"] = pinned_peak(torch, expert_bytes)
        log(f"peak {summary['pinned_copy']['peak_gbps']:.1f} GB/s, expert-sized "
            f"{summary['pinned_copy']['expert_copy_gbps']:.1f} GB/s")
    else:
        summary["pinned_copy"] = {"skipped": "dry run on the CPU: the emulated link's bandwidth is the peak"}

    log(f"building {cfg.name} ({len(cfg.moe_layers)} MoE layers x {cfg.num_experts} experts, {dtype})")
    t0 = time.perf_counter()
    loaded = random_model(cfg, seed=0, dtype=dtype, device=a.device, resident=True)
    if cuda and not loaded.experts.is_pinned():   # once, not in every run's HostStore (as bench.py does)
        loaded.experts = loaded.experts.pin_memory()
    summary["model"] = {"name": cfg.name, "layers": cfg.num_hidden_layers, "moe_layers": len(cfg.moe_layers),
                        "experts": cfg.num_experts, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
                        "expert_bytes": expert_bytes, "dtype": dtype, "build_seconds": time.perf_counter() - t0}
    prompts = random_prompts(torch, cfg, a.prompts, a.prompt_length)
    dc = DecodeConfig(gen_length=a.gen_length, eos_early_stop=False)    # fixed work: never stop at a random eos

    log("warm-up (untimed): kernels, allocator, copy stream")
    warm = DecodeConfig(gen_length=cfg.block_length, eos_early_stop=False)
    run(loaded, prompts[:1], 1, warm, device=a.device)
    log("resident traced run: working set W")
    ref = run(loaded, prompts, a.batch_size, dc, device=a.device, record=True)
    W = mean_working_set(ref.trace)
    summary["resident"] = {k: ref.stats[k] for k in ("tokens_per_second", "seconds", "tokens_generated",
                                                     "forwards", "tokens_per_forward")}
    summary["working_set"] = W
    log(f"W = {W:.1f} experts/layer/step, {ref.stats['tokens_per_forward']:.2f} tokens/forward, resident "
        f"{ref.stats['tokens_per_second']:.1f} tokens/s")
    loaded.model.backend = None                  # free the resident experts: the runs below offload
    if cuda:
        torch.cuda.empty_cache()

    for policy in ("demand", "last_step"):
        run(loaded, prompts[:1], 1, warm, spec=OffloadSpec(capacity=capacity_for(min(a.ratios), W, cfg.num_experts),
                                                           policy=policy, link=link), device=a.device)
    truncated = False
    policies = ("demand", "last_step")
    for rep in range(a.reps):
        for i, ratio in enumerate(a.ratios):
            # rep 0 always runs (a summary without pairs says nothing); later ones only within the budget
            if rep > 0 and time.perf_counter() - t_start > a.time_budget:
                truncated = True
                break
            C = capacity_for(ratio, W, cfg.num_experts)
            order = policies if (rep + i) % 2 == 0 else policies[::-1]  # alternate who goes first
            for policy in order:
                res = run(loaded, prompts, a.batch_size, dc, spec=OffloadSpec(capacity=C, policy=policy, link=link),
                          device=a.device)
                s = res.stats
                rows.append({"cache_ratio": ratio, "cache_experts": C, "policy": policy, "rep": rep,
                             "tokens_per_second": s["tokens_per_second"], "seconds": s["seconds"],
                             "tokens": s["tokens_generated"], "forwards": s["forwards"],
                             "stall_seconds": s["stall_seconds"], "link_busy_seconds": s["link_busy_seconds"],
                             "achieved_gbps": s["achieved_gbps"], "demand_misses": s["demand_misses"],
                             "speculative_transfers": s["speculative_transfers"], "link_bytes": s["link_bytes"],
                             "link_bandwidth_gbps": s["link_bandwidth_gbps"],
                             "tokens_match_resident": res.tokens == ref.tokens})
                log(f"rep {rep} C/W {ratio} C {C} {policy:9s} {s['tokens_per_second']:8.1f} tokens/s, "
                    f"{s['demand_misses']} misses, {s['speculative_transfers']} speculative, "
                    f"stall {s['stall_seconds']:.2f} s, {s['achieved_gbps']:.1f} GB/s")
        if truncated:
            log(f"time budget {a.time_budget:.0f} s reached: stopping after {rep} full repetitions")
            break
    summary["paired"] = paired_summary(rows, a.ratios)
    summary["truncated"] = truncated
    gbps = [r["achieved_gbps"] for r in rows if r["link_bytes"]]
    # dry run: the emulated link's configured bandwidth is the peak its achieved GB/s is set against
    peak = summary["pinned_copy"].get("peak_gbps") if cuda else next((r["link_bandwidth_gbps"] for r in rows), None)
    summary["h2d"] = {"engine_achieved_gbps_median": statistics.median(gbps) if gbps else None,
                      "peak_gbps": peak,
                      "engine_vs_peak": statistics.median(gbps) / peak if gbps and peak else None,
                      "expert_copy_gbps": summary["pinned_copy"].get("expert_copy_gbps")}
    summary["all_tokens_match_resident"] = all(r["tokens_match_resident"] for r in rows)


if __name__ == "__main__":
    sys.exit(main())
