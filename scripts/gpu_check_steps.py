"""scripts/gpu_check.py's device steps: pinned H2D peak, the capped link, one MoE layer loop vs grouped,
page-locking a host store (steps 3-6; the graphs check runs steps 3 and 4 too)."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

BF16_RTOL, BF16_ATOL = 1.6e-2, 1e-2  # torch.testing's bf16 tolerance; loop and grouped sum in other orders


def _best_seconds(torch, fn, reps: int = 5) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def pinned_peak(a, torch, expert_bytes: int) -> dict:
    if a.device != "cuda":
        return {"skipped": "dry run on the CPU: no pinned memory; the emulated link's bandwidth is its peak"}
    total = 256 << 20
    src = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(total, dtype=torch.uint8, device="cuda")
    big = _best_seconds(torch, lambda: dst.copy_(src, non_blocking=True))
    n = total // expert_bytes

    def experts():
        for i in range(n):
            dst[i * expert_bytes : (i + 1) * expert_bytes].copy_(
                src[i * expert_bytes : (i + 1) * expert_bytes], non_blocking=True
            )

    small = _best_seconds(torch, experts)
    from artifact.offload.backend.store import pin_host

    store = pin_host(torch.empty(total, dtype=torch.uint8))  # registered in place, as HostStore pins
    store_big = _best_seconds(torch, lambda: dst.copy_(store, non_blocking=True))

    def store_experts():
        for i in range(n):
            dst[i * expert_bytes : (i + 1) * expert_bytes].copy_(
                store[i * expert_bytes : (i + 1) * expert_bytes], non_blocking=True
            )

    store_small = _best_seconds(torch, store_experts)
    return {
        "peak_gbps_256MiB": total / big / 1e9,
        "expert_copy_gbps": n * expert_bytes / small / 1e9,
        "store_peak_gbps_256MiB": total / store_big / 1e9,
        "store_expert_copy_gbps": n * expert_bytes / store_small / 1e9,
        "expert_bytes": expert_bytes,
        "statistic": "best of 5",
        "measures": "H2D GB/s of one 256 MiB copy and of back-to-back expert-sized copies, "
        "from a fresh pin_memory() buffer and from a cudaHostRegister'd store (what the engine copies from)",
    }


def capped_link(a, torch, expert_bytes: int) -> dict:
    """Copies of expert size through the link, capped at fractions of its peak: link busy vs wall."""
    from artifact.offload.links.cuda_link import CudaLink
    from artifact.offload.links.link import EmulatedLink, emulated_bandwidth_gbps

    cuda = a.device == "cuda"
    n = 64
    src = torch.empty(expert_bytes, dtype=torch.uint8, pin_memory=cuda)
    dst = [torch.empty(expert_bytes, dtype=torch.uint8, device=a.device) for _ in range(4)]
    out = {
        "copies": n,
        "expert_bytes": expert_bytes,
        "caps": [],
        "measures": "per cap (a fraction of the link's calibrated peak): "
        "64 expert-sized copies through the link, "
        "their bytes over the wall time from the first copy to the host seeing the last land "
        "(achieved_gbps), against the cap (within_10pct: the pacing's accuracy)",
    }
    if cuda:
        peak = CudaLink("cuda", cap_gbps=1e9).pacing.peak_gbps  # calibration only: the cap never binds
    else:
        peak = emulated_bandwidth_gbps(expert_bytes)
    out["peak_gbps"] = peak
    for fraction in (1.0, 0.5, 0.25):
        target = peak * fraction
        link = (
            CudaLink("cuda", cap_gbps=target) if cuda else EmulatedLink(peak, latency_us=0, cap_gbps=target)
        )
        items = [(dst[i % 4], src, f"check copy {i}") for i in range(n)]
        link.copy(items[:4])  # warm-up
        link.wait(link.copy(items[:4]))
        link.finish()
        t0 = time.perf_counter()
        link.wait(link.copy(items))
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        achieved = n * expert_bytes / wall / 1e9
        out["caps"].append(
            {
                "fraction": fraction,
                "target_gbps": target,
                "achieved_gbps": achieved,
                "achieved_over_target": achieved / target,
                "within_10pct": abs(achieved / target - 1) <= 0.1,
            }
        )
        link.close()
    return out


def moe_layer(a, torch, cfg, dtype) -> dict:
    from artifact.model.routing import FIRST_STEP
    from artifact.model.tiny import random_model
    from artifact.offload.spec import RunSpec

    one = dataclasses.replace(cfg, num_hidden_layers=2, name=cfg.name + "-1moe")
    loaded = random_model(one, seed=0, dtype=dtype, device=a.device, resident=True)
    layer = loaded.model.model.layers[1].mlp  # the MoE layer
    cuda = a.device == "cuda"
    out = {
        "tokens": None,
        "kernels": {},
        "measures": "one MoE layer's forward on a batch of 4 blocks, experts resident, "
        "per expert kernel (loop, grouped): host_ms = CPU time of the call (launches and Python; "
        "the GPU runs behind it), gpu_ms = CUDA-event time of the same call on the GPU; "
        "medians of 5 after a warm-up; loop vs grouped outputs within the stated bf16 tolerance",
    }
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, cfg.block_length, cfg.hidden_size, generator=g)  # (B, T, D): batch 4
    x = x.to(device=a.device, dtype=next(layer.parameters()).dtype)
    out["tokens"] = x.shape[0] * x.shape[1]
    results = {}
    for kernel in ("loop", "grouped"):
        # the layer's experts: resident
        opts = RunSpec(device=a.device, expert_kernel=kernel).forward_options(backend=loaded.model.backend)
        layer(x, None, opts, FIRST_STEP)  # warm-up
        if cuda:
            torch.cuda.synchronize()
        host, dev = [], []
        for _ in range(5):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            y = layer(x, None, opts, FIRST_STEP)
            host.append(time.perf_counter() - t0)
            if cuda:
                end.record()
                end.synchronize()
                dev.append(start.elapsed_time(end) / 1e3)
        results[kernel] = y
        out["kernels"][kernel] = {
            "host_ms": 1e3 * statistics.median(host),
            "gpu_ms": 1e3 * statistics.median(dev) if dev else None,
        }
    a_, b_ = results["loop"].float(), results["grouped"].float()
    out["equal_outputs"] = bool(torch.equal(a_, b_))
    out["max_abs_diff"] = float((a_ - b_).abs().max())
    rtol, atol = (BF16_RTOL, BF16_ATOL) if dtype == "bfloat16" else (0.0, 0.0)
    out["tolerance"] = {
        "rtol": rtol,
        "atol": atol,
        "dtype": dtype,
        "why": "bf16: loop and grouped GEMMs may sum in different orders on the GPU"
        if rtol
        else "fp32 on the CPU: bit for bit",
    }
    out["within_tolerance"] = bool(torch.allclose(b_, a_, rtol=rtol, atol=atol))
    out["grouped_over_loop_host"] = out["kernels"]["grouped"]["host_ms"] / out["kernels"]["loop"]["host_ms"]
    return out


def pinned_store(a, torch) -> dict:
    if a.device != "cuda":
        return {"skipped": "dry run on the CPU: page-locking needs CUDA"}
    from artifact.offload.backend.store import pin_host, pinned_bytes

    nbytes = int(a.store_gb * 1e9)
    t0 = time.perf_counter()
    store = torch.empty(nbytes, dtype=torch.uint8)
    alloc = time.perf_counter() - t0
    t0 = time.perf_counter()
    pin_host(store)
    pin = time.perf_counter() - t0
    out = {
        "bytes_requested": nbytes,
        "bytes_pinned": pinned_bytes(store),
        "is_pinned": store.is_pinned(),
        "allocate_seconds": alloc,
        "pin_seconds": pin,
        "measures": "page-locking a store_gb host tensor in place (cudaHostRegister, artifact pin_host): "
        "the bytes pinned (no power-of-two rounding, compare power_of_two_would_be) and the seconds it takes",
        "power_of_two_would_be": 1 << (nbytes - 1).bit_length(),
    }
    del store
    return out
