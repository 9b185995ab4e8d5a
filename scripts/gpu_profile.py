"""The graphs check's profiled run (scripts/gpu_check_graphs.py, step 6): what the host issues inside each
denoising forward, counted from torch.profiler's host-side events: kernel launches (a graph replay is one),
copies and syncs (CUDA runtime calls), top-level ATen ops; and SyncCounter's device reads."""

from __future__ import annotations

import bisect
import re

FORWARD = "gpu_check.forward"  # the profiler range around each denoising forward
# Kernel launches the host issues (a graph replay is one launch, whatever it holds), copies, and syncs:
# CUDA runtime calls as torch.profiler names them on the CPU side.
LAUNCHES = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
)
COPIES = ("cudaMemcpyAsync", "cudaMemcpyBatchAsync", "cudaMemcpy2DAsync")
EVENT_SYNCS, STREAM_SYNCS, DEVICE_SYNCS = (
    ("cudaEventSynchronize",),
    ("cudaStreamSynchronize",),
    ("cudaDeviceSynchronize",),
)
BLOCKING_COPIES = ("cudaMemcpy", "cudaMemcpy2D")
KINDS = {
    **dict.fromkeys(LAUNCHES, "launches"),
    **dict.fromkeys(COPIES, "copies"),
    **dict.fromkeys(EVENT_SYNCS, "event_syncs"),
    **dict.fromkeys(STREAM_SYNCS, "stream_syncs"),
    **dict.fromkeys(DEVICE_SYNCS, "device_syncs"),
    **dict.fromkeys(BLOCKING_COPIES, "blocking_copies"),
}
# What the profiler may append to a runtime call's name: its API version (cudaLaunchKernel_v7000), the
# per-thread default stream variants (_ptsz, _ptds).
SUFFIX = re.compile(r"(_v\d+|_ptsz|_ptds)+$")


def call_kind(name: str) -> str | None:
    """The kind (KINDS) of a CUDA runtime call by its profiler name: one of the names above, exactly or
    followed by a version or stream suffix; None for anything else (cudaMemcpyAsync is a copy, never a
    blocking cudaMemcpy)."""
    return KINDS.get(name) or KINDS.get(SUFFIX.sub("", name))


class ForwardHooks:
    """A context manager around each forward of `model`: before(kind) as the forward starts, with the kind of
    the step the decoder passed it (prefill or denoise), and after() as it returns (a forward pre-hook and a
    forward hook on the model, removed on exit). Subclasses say what they do."""

    def __init__(self, model):
        self.model, self.hooks = model, []

    def before(self, kind: str) -> None:
        pass

    def after(self) -> None:
        pass

    def __enter__(self):
        def pre(mod, args, kwargs):
            # the decoder passes each its step
            self.before(kwargs["step"].kind if "step" in kwargs else "denoise")

        self.hooks = [
            self.model.register_forward_pre_hook(pre, with_kwargs=True),
            self.model.register_forward_hook(lambda mod, args, kwargs, out: self.after(), with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()


class ForwardRanges(ForwardHooks):
    """Forward hooks that open a profiler range (FORWARD) around each denoising forward, and point a
    SyncCounter's key at the forward's kind, so both count what happens inside the forwards only."""

    def __init__(self, torch, model, counter=None):
        super().__init__(model)
        self.torch, self.counter, self.open = torch, counter, None

    def before(self, kind: str) -> None:
        if self.counter is not None:
            self.counter.key = kind
        if kind == "denoise":
            self.open = self.torch.autograd.profiler.record_function(FORWARD)
            self.open.__enter__()

    def after(self) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None
        if self.counter is not None:
            self.counter.key = None


def raw_events(torch, prof) -> list[tuple[str, int, int]]:
    """(name, start ns, end ns) of every host-side event torch.profiler recorded (its raw results: building
    the FunctionEvent tree of a run's ~10^5 events takes seconds). Device-side events (kernels, the GPU's copy
    of a record_function range) are left out: their times are on the GPU's timeline."""
    cpu = torch.autograd.DeviceType.CPU
    return [
        (e.name(), e.start_ns(), e.start_ns() + e.duration_ns())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == cpu
    ]


def count_in_forwards(events: list[tuple[str, int, int]]) -> dict:
    """Of (name, start, end) events: the CUDA runtime calls that start inside a FORWARD range, by kind, and
    the top-level ATen ops inside one (not inside another ATen op: the ops the forward issues outside any
    graph; on the CPU the stand-in for launches)."""
    ranges = sorted((lo, hi) for name, lo, hi in events if name == FORWARD)
    starts = [lo for lo, _ in ranges]

    def inside(t: int) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t <= ranges[i][1]

    out = {
        "forwards": len(ranges),
        "launches": 0,
        "copies": 0,
        "event_syncs": 0,
        "stream_syncs": 0,
        "device_syncs": 0,
        "blocking_copies": 0,
        "aten_ops": 0,
    }
    for name, lo, _ in events:
        kind = call_kind(name)
        if kind is not None and inside(lo):
            out[kind] += 1
    end = -1
    for lo, hi in sorted((lo, -hi) for name, lo, hi in events if name.startswith("aten::") and inside(lo)):
        if lo >= end:  # not inside the last top-level op
            out["aten_ops"] += 1
            end = -hi
    return out


def profiled(torch, a, loaded, prompts, batch, spec) -> dict:
    """One run under torch.profiler and SyncCounter: per MoE layer of a denoising forward, the host-issued
    launches, copies and syncs (CUDA runtime calls), ATen ops called by the forward, and device reads."""
    from torch.profiler import ProfilerActivity, profile

    from artifact.model.syncs import SyncCounter
    from artifact.offload.runner import decode_prompts

    moe = len(loaded.cfg.moe_layers)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    counter = SyncCounter()
    with profile(activities=acts) as prof, ForwardRanges(torch, loaded.model):
        profiled_run = decode_prompts(loaded, prompts, batch, spec)
    c = count_in_forwards(raw_events(torch, prof))
    with counter, ForwardRanges(torch, loaded.model, counter):  # apart: its modes would show in the profile
        res = decode_prompts(loaded, prompts, batch, spec)
    n = max(c["forwards"], 1)
    out = {f"{k}_per_moe_layer": v / n / moe for k, v in c.items() if k != "forwards"}
    out.update(
        forwards=c["forwards"],
        moe_layers=moe,
        device_reads_per_moe_layer=counter.reads_by_key["denoise"] / max(res.stats.forwards, 1) / moe,
        host_data_uploads_per_moe_layer=counter.uploads_by_key["denoise"] / max(res.stats.forwards, 1) / moe,
        run_device_read_kinds=dict(counter.kinds),
    )  # the whole run's, decode loop included
    if spec.forward == "segmented":
        out.update(replay_counters(profiled_run, res))
    return out


def replay_counters(*results) -> dict:
    """The profiled runs' own segment counters (RunResult.segments): `replayed` only where every one of them
    replayed with no capture error and no piece eager (hardware.replayed), so that the counts above are of
    the graphs, not of segments that ran eagerly."""
    from artifact.experiments.hardware import replayed

    segs = [getattr(r, "segments", None) for r in results]
    if any(s is None for s in segs):
        return {
            "replayed": False,
            "replays": None,
            "not_replayed": "the profiled runs report no segment counters",
        }
    rows = [{"replays": s.replays, "eager": s.eager, "capture_error": s.capture_error} for s in segs]
    ok = all(replayed(r) for r in rows)
    out = {
        "replayed": ok,
        "replays": [r["replays"] for r in rows],
        "eager": [r["eager"] for r in rows],
        "captures": [s.captures for s in segs],
    }
    if not ok:
        bad = next(r for r in rows if not replayed(r))
        out["not_replayed"] = bad["capture_error"] or (
            f"{bad['eager']} pieces ran eagerly" if bad["eager"] else "no replays"
        )
    return out
