"""Host overhead of an MoE layer: the per-expert loop against grouped expert compute (printed, not asserted).

For the tiny model and a LLaDA2.0-mini-width model with 2 MoE layers (random weights, CPU, 1 thread),
at batch 1 and 4, one denoising step = one forward of a 32-token block per row, all experts resident:

  ops_per_moe_layer   top-level ATen ops of one MoE layer's forward (router, shared expert, routed
                      experts: the ops the layer calls directly, not their internals), per forward,
                      counted with torch.profiler. Grouped: must not grow with W (target <= 60).
  host_us_per_expert  wall-clock us of the routed-expert section (from the backend's first group to its
                      last) per expert served. On tiny, whose matmuls take ~1 us, this is host dispatch;
                      on mini-width it includes the CPU matmuls.
  step_ms             median ms per forward (target: grouped / loop <= 0.6 on tiny at batch 4).

Loop and grouped run interleaved in one process, so their ratio is fair on a shared machine.

    .venv/bin/python benchmarks/host_overhead.py --json [--reps 20]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from artifact.model.checkpoint import random_model
from artifact.model.config import get_preset
from artifact.model.llada2 import MoE

KERNELS = ("loop", "grouped")
RANGE = "moe_layer"


def models() -> dict:
    tiny = get_preset("tiny")
    mini = dataclasses.replace(get_preset("llada2-mini"), num_hidden_layers=3, vocab_size=4096,
                               mask_token_id=4095, eos_token_id=4092, name="mini-width")
    return {"tiny": (tiny, "float32"), "mini-width": (mini, "bfloat16")}


class TimedBackend:
    """Wraps a backend: seconds from a layer's first group to its last, and experts served."""

    def __init__(self, inner):
        self.inner, self.seconds, self.experts = inner, 0.0, 0

    def groups(self, demand):
        t0 = time.perf_counter()
        yield from self.inner.groups(demand)
        self.seconds += time.perf_counter() - t0
        self.experts += len(demand.experts)


def count_ops(model, ids, pos) -> float:
    """Top-level ATen ops inside MoE.forward, per MoE layer, for one forward."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    ranges = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: ranges.append(record_function(RANGE).__enter__()))
             for m in layers]
    hooks += [m.register_forward_hook(lambda mod, args, out: ranges.pop().__exit__(None, None, None))
              for m in layers]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(ids, pos)
    finally:
        for h in hooks:
            h.remove()
    n = 0
    for ev in prof.events():
        parent = ev.cpu_parent
        if ev.name.startswith("aten::") and parent is not None and parent.name == RANGE:
            n += 1
    return n / len(layers)


def measure(name: str, cfg, dtype: str, batch: int, reps: int) -> list[dict]:
    loaded = random_model(cfg, seed=0, dtype=dtype, device="cpu", resident=True)
    model = loaded.model
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(8, cfg.vocab_size - 8, (batch, cfg.block_length), generator=g)   # (B, 32)
    pos = torch.arange(cfg.block_length).expand(batch, -1)
    resident = model.backend
    out = {}
    for kernel in KERNELS:
        model.expert_kernel = kernel
        model(ids, pos)                                                 # warm-up
        ops = count_ops(model, ids, pos)
        timed = TimedBackend(resident)
        model.backend = timed
        model(ids, pos)
        model.backend = resident
        out[kernel] = {"model": name, "batch": batch, "kernel": kernel, "ops_per_moe_layer": ops,
                       "host_us_per_expert": 1e6 * timed.seconds / timed.experts,
                       "working_set": timed.experts / len(cfg.moe_layers), "times": []}
    for _ in range(reps):                                               # interleaved: fair on a shared machine
        for kernel in KERNELS:
            model.expert_kernel = kernel
            t0 = time.perf_counter()
            model(ids, pos)
            out[kernel]["times"].append(time.perf_counter() - t0)
    # The routed-expert section again, interleaved and repeated, for a steadier per-expert figure.
    for kernel in KERNELS:
        model.expert_kernel = kernel
        timed = TimedBackend(resident)
        model.backend = timed
        for _ in range(max(3, reps // 4)):
            model(ids, pos)
        model.backend = resident
        out[kernel]["host_us_per_expert"] = 1e6 * timed.seconds / timed.experts
    model.expert_kernel = "grouped"
    rows = []
    for kernel in KERNELS:
        r = out[kernel]
        r["step_ms"] = 1e3 * statistics.median(r.pop("times"))
        rows.append(r)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--models", default="tiny,mini-width")
    ap.add_argument("--batches", default="1,4")
    a = ap.parse_args()
    torch.set_num_threads(1)
    known = models()
    for name in a.models.split(","):
        if name not in known:
            ap.error(f"unknown model {name!r}; choose from {sorted(known)}")
        cfg, dtype = known[name]
        rows = []
        for batch in (int(b) for b in a.batches.split(",")):
            rows += measure(name, cfg, dtype, batch, a.reps)
        for r in rows:
            if a.json:
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
            else:
                print(f"{r['model']:10s} batch {r['batch']} {r['kernel']:7s} W {r['working_set']:6.1f}  "
                      f"ops/MoE layer {r['ops_per_moe_layer']:6.1f}  host {r['host_us_per_expert']:7.1f} us/expert  "
                      f"step {r['step_ms']:8.2f} ms", flush=True)
        by = {(r["batch"], r["kernel"]): r for r in rows}
        for batch in sorted({r["batch"] for r in rows}):
            ratio = by[batch, "grouped"]["step_ms"] / by[batch, "loop"]["step_ms"]
            if not a.json:
                print(f"{name:10s} batch {batch}: grouped / loop step time {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
