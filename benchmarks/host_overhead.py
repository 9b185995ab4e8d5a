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

The offloaded path (rows with "path": "offloaded"; the tiny model through the engine, cache and an
emulated link with no latency and a fast bandwidth, so no time is spent waiting for copies; policy
last_step; C/W 0.83 and 1.73 of the batch's mean working set), per MoE layer of one denoising forward:

  ops_per_moe_layer   top-level ATen ops, as above (each is at least one kernel launch on CUDA)
  syncs_per_moe_layer host reads of device data (artifact.model.syncs.SyncCounter: on CUDA each one waits)
  python_us_per_moe_layer  wall us of the layer minus the time inside its top-level ATen ops (torch.profiler
                      on both): the Python of the model, the engine, the cache and the link. It includes the
                      emulated link's timeline bookkeeping, which CudaLink does not run, and profiler
                      overhead.
  copies_per_moe_layer, groups_per_moe_layer   what the engine did
  derived_host_ms_per_mini_step   19 MoE layers x (ops x launch_us + python_us): the host time of one
                      LLaDA2.0-mini denoising step's MoE layers at a stated per-launch cost (--launch-us,
                      default 5 us: a CUDA eager op's dispatch and launch), from these measured counts. The
                      tiny model's W (~58 at batch 1) is close to mini's (~70); its experts are smaller,
                      which changes kernel time, not host time.
  h2d_ms_per_mini_step_at_1.73   the goal's yardstick: 22 ms (9 misses x 19 layers x 6.29 MB at 50 GB/s)

The lean host path, printed first (--lean-only prints only these), today's path beside the new one:

  engine per demand   the engine's host us per demand at 60 and 150 queued copies, over a link whose calls
                      cost nothing (target <= 50 us at both), with the planning's share
  link per copy       CudaLink's own host us per copy with the CUDA calls stubbed (cuda_stub.StubCuda), at 1
                      and 8 copies per call, beside the link before the lean rewrite run on the same stub
                      (target <= 5 us at 8 copies per call; benchmarks/copy_overhead.py)
  forward eager / segmented   per MoE layer of a denoising forward over a prefix cache (tiny, offloaded,
                      last_step): ATen ops issued outside graphs (on CUDA each is a launch; segmented: only
                      the inputs' copies and fills remain, plus one row-map copy per expert group that the CPU
                      does not show), ops a graph replays, link copies, host reads, tensors from host data

    .venv/bin/python benchmarks/host_overhead.py --json [--reps 20] [--launch-us 5] [--lean-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import copy_overhead  # benchmarks/copy_overhead.py, beside this script: the link's host us per copy
import torch
from engine_per_demand import print_engine_per_demand  # beside this script: the engine's host us per demand
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from artifact.cli import OneLineParser
from artifact.cli.args import floats, ints, names, positive_floats, refused_in_one_line
from artifact.errors import SettingError
from artifact.model.config import get_preset
from artifact.model.decode import MAX_BATCH
from artifact.model.kv_cache import KVCache
from artifact.model.llada2 import MoE
from artifact.model.options import FORWARD_MODES, ForwardOptions
from artifact.model.routing import StepInfo
from artifact.model.syncs import SyncCounter
from artifact.model.tiny import random_model
from artifact.offload.backend.engine import install, offload
from artifact.offload.links.link_factory import make_link
from artifact.offload.policy.policies import make_policy
from artifact.offload.replay.sim import capacity_for
from artifact.offload.spec import RunSpec
from artifact.validate import check_number

MINI_MOE_LAYERS = 19
H2D_MS_AT_173 = 22.0  # docs/host_path.md: LLaDA2.0-mini batch 1 at C/W 1.73, 50 GB/s

KERNELS = ("loop", "grouped")
RANGE = "moe_layer"


def models() -> dict:
    tiny = get_preset("tiny")
    mini = dataclasses.replace(
        get_preset("llada2-mini"),
        num_hidden_layers=3,
        vocab_size=4096,
        mask_token_id=4095,
        eos_token_id=4092,
        name="mini-width",
    )
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


def count_ops(model, ids, pos, opts: ForwardOptions) -> float:
    """Top-level ATen ops inside MoE.forward, per MoE layer, for one forward."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    ranges = []
    hooks = [
        m.register_forward_pre_hook(lambda mod, args: ranges.append(record_function(RANGE).__enter__()))
        for m in layers
    ]
    hooks += [
        m.register_forward_hook(lambda mod, args, out: ranges.pop().__exit__(None, None, None))
        for m in layers
    ]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(ids, pos, options=opts)
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
    ids = torch.randint(8, cfg.vocab_size - 8, (batch, cfg.block_length), generator=g)  # (B, 32)
    pos = torch.arange(cfg.block_length).expand(batch, -1)
    resident = model.backend
    kernels = {
        k: RunSpec(expert_kernel=k).forward_options() for k in KERNELS
    }  # resident experts, each kernel
    out = {}
    for kernel in KERNELS:
        model(ids, pos, options=kernels[kernel])  # warm-up
        ops = count_ops(model, ids, pos, kernels[kernel])
        timed = TimedBackend(resident)
        model(ids, pos, options=RunSpec(expert_kernel=kernel).forward_options(backend=timed))
        out[kernel] = {
            "model": name,
            "batch": batch,
            "kernel": kernel,
            "ops_per_moe_layer": ops,
            "host_us_per_expert": 1e6 * timed.seconds / timed.experts,
            "working_set": timed.experts / len(cfg.moe_layers),
            "times": [],
        }
    for _ in range(reps):  # interleaved: fair on a shared machine
        for kernel in KERNELS:
            t0 = time.perf_counter()
            model(ids, pos, options=kernels[kernel])
            out[kernel]["times"].append(time.perf_counter() - t0)
    # The routed-expert section again, interleaved and repeated, for a steadier per-expert figure.
    for kernel in KERNELS:
        timed = TimedBackend(resident)
        for _ in range(max(3, reps // 4)):
            model(ids, pos, options=RunSpec(expert_kernel=kernel).forward_options(backend=timed))
        out[kernel]["host_us_per_expert"] = 1e6 * timed.seconds / timed.experts
    rows = []
    for kernel in KERNELS:
        r = out[kernel]
        r["step_ms"] = 1e3 * statistics.median(r.pop("times"))
        rows.append(r)
    return rows


class CountingBackend:
    """Wraps the engine: copies issued and groups served, per demand."""

    def __init__(self, engine):
        self.engine, self.groups_served, self.copies = engine, 0, 0
        inner = engine.link.copy

        def copy(items, *a, **k):
            self.copies += len(items)
            return inner(items, *a, **k)

        engine.link.copy = copy

    def groups(self, demand):
        for g in self.engine.groups(demand):
            self.groups_served += 1
            yield g


def moe_ranges(model):
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    ranges = []
    hooks = [
        m.register_forward_pre_hook(lambda mod, args: ranges.append(record_function(RANGE).__enter__()))
        for m in layers
    ]
    hooks += [
        m.register_forward_hook(lambda mod, args, out: ranges.pop().__exit__(None, None, None))
        for m in layers
    ]
    return layers, hooks


def offloaded(name: str, cfg, dtype: str, batch: int, ratio: float, reps: int, launch_us: float) -> dict:
    """The offloaded path's host cost per MoE layer (see the module docstring)."""
    loaded = random_model(cfg, seed=0, dtype=dtype, device="cpu", resident=True)
    model = loaded.model
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(8, cfg.vocab_size - 8, (batch, cfg.block_length), generator=g)  # (B, 32)
    pos = torch.arange(cfg.block_length).expand(batch, -1)
    W = []
    with model.listening(lambda d: W.append(len(d.experts))):
        model(ids, pos)
    C = capacity_for(ratio, sum(W) / len(W), cfg.num_experts)
    L = len(cfg.moe_layers)
    pol = make_policy("last_step", L, cfg.num_experts, engine=True)
    link = make_link("emulated", bandwidth_gbps=1000.0, latency_us=0.0)
    engine = offload(model, loaded.experts, C, pol, link)
    counting = CountingBackend(engine)
    install(model, counting)
    model(ids, pos)  # warm-up: the cache fills
    layers, hooks = moe_ranges(model)
    counter = SyncCounter()
    syncs = [
        m.register_forward_pre_hook(lambda mod, args: setattr(counter, "key", mod.layer)) for m in layers
    ]
    syncs += [m.register_forward_hook(lambda mod, args, out: setattr(counter, "key", None)) for m in layers]
    ops = python = 0.0
    copies0, groups0 = counting.copies, counting.groups_served
    try:
        with counter:
            for _ in range(reps):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    model(ids, pos)
                for ev in prof.events():
                    if ev.name == RANGE:
                        inside = sum(
                            c.time_range.elapsed_us() for c in ev.cpu_children if c.name.startswith("aten::")
                        )
                        python += ev.time_range.elapsed_us() - inside
                        ops += sum(1 for c in ev.cpu_children if c.name.startswith("aten::"))
    finally:
        for h in hooks + syncs:
            h.remove()
    n = reps * L
    engine.finish()
    row = {
        "path": "offloaded",
        "model": name,
        "batch": batch,
        "policy": "last_step",
        "cache_ratio": ratio,
        "cache_experts": C,
        "working_set": sum(W) / len(W),
        "ops_per_moe_layer": ops / n,
        "syncs_per_moe_layer": sum(counter.by_key[layer] for layer in cfg.moe_layers) / n,
        "python_us_per_moe_layer": python / n,
        "copies_per_moe_layer": (counting.copies - copies0) / n,
        "groups_per_moe_layer": (counting.groups_served - groups0) / n,
        "launch_us": launch_us,
    }
    row["derived_host_ms_per_mini_step"] = (
        MINI_MOE_LAYERS * (row["ops_per_moe_layer"] * launch_us + row["python_us_per_moe_layer"]) / 1e3
    )
    row["h2d_ms_per_mini_step_at_1.73"] = H2D_MS_AT_173
    row["host_over_h2d_at_1.73"] = row["derived_host_ms_per_mini_step"] / H2D_MS_AT_173
    return row


class OpCounter(TorchDispatchMode):
    """ATen ops at dispatch (what becomes a kernel launch on CUDA), split by whether a graph segment or expert
    stage was running (the model's programs' `active`, artifact/model/segments.py): on CUDA with forward
    "segmented" those are replayed from a graph, the rest the host issues one by one. Copies (aten.copy_ into
    the slots: the link's) apart."""

    def __init__(self, slots: set[int], programs):
        super().__init__()
        self.slots = slots  # storage addresses of the engine's slot tensors
        self.programs = programs  # the model's programs (LLaDA2MoE.programs)
        self.inside = self.outside = self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.programs.active > 0:
            self.inside += 1
        elif (
            func.overloadpacket is torch.ops.aten.copy_ and args[0].untyped_storage().data_ptr() in self.slots
        ):
            self.copies += 1
        else:
            self.outside += 1
        return func(*args, **(kwargs or {}))


def graphs_side_by_side(batch: int, ratio: float, reps: int) -> list[dict]:
    """The eager forward and the segmented one on the tiny model in one process: a denoising
    forward over a prefix cache, offloaded (last_step, emulated link with no latency), per MoE layer: ATen ops
    issued outside graphs, ops a graph would replay, link copies, host reads, tensors made from host data.
    On the CPU forward "segmented" runs its segments eagerly: the split says what CUDA would capture."""
    cfg, dtype = models()["tiny"]
    loaded = random_model(cfg, seed=0, dtype=dtype, device="cpu", resident=True)
    model, n, L = loaded.model, cfg.block_length, len(cfg.moe_layers)
    g = torch.Generator().manual_seed(batch)
    prefix = torch.randint(8, cfg.vocab_size - 8, (batch, n), generator=g)
    ids = torch.randint(8, cfg.vocab_size - 8, (batch, n), generator=g)
    W = []
    with model.listening(lambda d: W.append(len(d.experts))):
        model(ids, torch.arange(n, 2 * n).expand(batch, n))
    C = capacity_for(ratio, sum(W) / len(W), cfg.num_experts)
    out = []
    for forward in FORWARD_MODES:
        pol = make_policy("last_step", L, cfg.num_experts, engine=True)
        engine = offload(
            model, loaded.experts, C, pol, make_link("emulated", bandwidth_gbps=1000.0, latency_us=0.0)
        )
        opts = RunSpec(forward=forward).forward_options(backend=engine)
        cache = KVCache(cfg, batch, 2 * n, "cpu", torch.float32)
        model(
            prefix,
            torch.arange(n).expand(batch, n),
            cache=cache,
            commit=n,
            logits_rows=slice(0, 0),
            options=opts,
            step=StepInfo(0, -1, -1, "prefill"),
        )
        pos = torch.arange(n, 2 * n).expand(batch, n)
        for _ in range(2):  # warm-up: the cache fills, programs exist
            model(
                ids,
                pos,
                cache=cache,
                logits_rows=slice(0, n),
                options=opts,
                step=StepInfo(1, 0, 0, "denoise"),
            )
        ops = OpCounter({t.untyped_storage().data_ptr() for t in engine.slots.values()}, model.programs)
        syncs = SyncCounter()
        with syncs, ops:
            for _ in range(reps):
                model(
                    ids,
                    pos,
                    cache=cache,
                    logits_rows=slice(0, n),
                    options=opts,
                    step=StepInfo(1, 0, 0, "denoise"),
                )
        engine.finish()
        k = reps * L
        out.append(
            {
                "path": "graphs",
                "forward": forward,
                "model": "tiny",
                "batch": batch,
                "cache_ratio": ratio,
                "cache_experts": C,
                "ops_outside_graphs_per_moe_layer": ops.outside / k,
                "ops_in_graphs_per_moe_layer": ops.inside / k,
                "link_copies_per_moe_layer": ops.copies / k,
                "host_reads_per_moe_layer": syncs.reads / k,
                "host_data_tensors_per_moe_layer": syncs.uploads / k,
            }
        )
    return out


def parse_args(argv=None):
    """The flags, each value checked before anything is measured (a bad one: exit 2); and models()."""
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--models", type=names, default=["tiny", "mini-width"], help="tiny, mini-width")
    ap.add_argument("--batches", type=ints, default=[1, 4], help=f"batch sizes (1-{MAX_BATCH})")
    ap.add_argument("--launch-us", type=float, default=5.0, help="stated host cost of one CUDA op launch, us")
    ap.add_argument("--ratios", type=floats, default=[0.83, 1.73], help="C/W of the offloaded rows")
    ap.add_argument("--no-resident", action="store_true", help="only the offloaded rows")
    ap.add_argument(
        "--lean-only",
        action="store_true",
        help="only the lean host path: the engine per demand, the link per copy, eager vs segmented",
    )
    a = ap.parse_args(argv)
    known = models()
    with refused_in_one_line(ap):  # every value, before anything is measured
        check_number("--reps", a.reps, low=1, integer=True)
        check_number("--launch-us", a.launch_us, low=0)
        positive_floats("--ratios", a.ratios)
        if not a.batches:
            raise SettingError("--batches: expected at least one batch size")
        for b in a.batches:
            check_number("--batches", b, low=1, high=MAX_BATCH, integer=True)
        if not a.models or any(m not in known for m in a.models):
            raise SettingError(f"--models: expected names from {sorted(known)}, got {a.models}")
    return a, known


def json_line(r: dict) -> str:
    """A row as one JSON object, its floats rounded to 3 decimals (--json)."""
    return json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})


def print_graphs_rows(a) -> None:
    """The lean host path's forward eager / segmented rows, per batch and C/W."""
    for batch in a.batches:
        for ratio in a.ratios:
            for r in graphs_side_by_side(batch, ratio, max(3, a.reps // 4)):
                if a.json:
                    print(json_line(r), flush=True)
                else:
                    print(
                        f"forward {r['forward']:9s} tiny batch {batch} C/W {ratio}: per MoE layer "
                        f"{r['ops_outside_graphs_per_moe_layer']:.1f} ops issued outside graphs "
                        f"({r['ops_in_graphs_per_moe_layer']:.1f} in graphs), "
                        f"{r['link_copies_per_moe_layer']:.1f} "
                        f"link copies, {r['host_reads_per_moe_layer']:.2f} host reads, "
                        f"{r['host_data_tensors_per_moe_layer']:.2f} tensors from host data",
                        flush=True,
                    )


def print_offloaded_rows(a, known: dict) -> None:
    """The offloaded path's rows (the tiny model), per batch and C/W."""
    for batch in a.batches:
        for ratio in a.ratios:
            r = offloaded("tiny", *known["tiny"], batch, ratio, max(3, a.reps // 4), a.launch_us)
            if a.json:
                print(json_line(r), flush=True)
            else:
                print(
                    f"offloaded tiny batch {batch} C/W {ratio}: ops {r['ops_per_moe_layer']:.1f}, "
                    f"syncs {r['syncs_per_moe_layer']:.2f}, "
                    f"python {r['python_us_per_moe_layer']:.0f} us per MoE layer; "
                    f"{r['copies_per_moe_layer']:.1f} copies, "
                    f"{r['groups_per_moe_layer']:.1f} groups; "
                    f"derived {r['derived_host_ms_per_mini_step']:.1f} ms host per mini step at "
                    f"{a.launch_us:g} us/launch (H2D at C/W 1.73: {H2D_MS_AT_173:g} ms)",
                    flush=True,
                )


def print_resident_rows(a, known: dict) -> None:
    """The resident rows, loop and grouped, per model and batch; then grouped / loop step time per batch."""
    for name in a.models:
        cfg, dtype = known[name]
        rows = []
        for batch in a.batches:
            rows += measure(name, cfg, dtype, batch, a.reps)
        for r in rows:
            if a.json:
                print(json_line(r), flush=True)
            else:
                print(
                    f"{r['model']:10s} batch {r['batch']} {r['kernel']:7s} W {r['working_set']:6.1f}  "
                    f"ops/MoE layer {r['ops_per_moe_layer']:6.1f}  host {r['host_us_per_expert']:7.1f} "
                    f"us/expert  step {r['step_ms']:8.2f} ms",
                    flush=True,
                )
        by = {(r["batch"], r["kernel"]): r for r in rows}
        for batch in sorted({r["batch"] for r in rows}):
            ratio = by[batch, "grouped"]["step_ms"] / by[batch, "loop"]["step_ms"]
            if not a.json:
                print(f"{name:10s} batch {batch}: grouped / loop step time {ratio:.2f}", flush=True)


def main(argv=None):
    a, known = parse_args(argv)
    torch.set_num_threads(1)
    print_engine_per_demand(a.json)
    # the link's own us
    link = copy_overhead.measure_stub((1, 8), calls=2000, slots=64, expert_kib=64, reps=5)
    if a.json:
        print(json.dumps({"path": "link", **link}), flush=True)
    else:
        copy_overhead.print_stub(link)
    print_graphs_rows(a)
    if a.lean_only:
        return
    print_offloaded_rows(a, known)
    if a.no_resident:
        return
    print_resident_rows(a, known)


if __name__ == "__main__":
    main()
