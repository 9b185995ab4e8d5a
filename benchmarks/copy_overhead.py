"""Host time per expert copy on the link (printed, not asserted): what one `Link.copy` costs the host per
expert, against the bare floor of issuing the same copies with `Tensor.copy_(non_blocking=True)`.

The engine hands the link one batch per MoE layer (the layer's misses, `--batch` copies). A batch is issued
`--calls` times over `--slots` slot tensors of `--expert-kib` KiB each, from page-locked host rows, and only
the host's time inside the calls is counted (the copies themselves run on the copy engine meanwhile; every
`--drain` calls the host waits for them, untimed, so the stream never backs up):

  link_us_per_copy    host us per expert inside CudaLink.copy (views, schedule, stream switch, one event
                      record per slot, the batch's timing pair, stats)
  bare_us_per_copy    host us per expert of the same copies issued directly (torch's launch floor; 0 on CPU)
  python_us_per_copy  the difference: the link's own Python per copy (issue target: under 3 us)

On a CPU-only machine the emulated link is measured instead (`--device cpu`): it has no launch floor and runs
the timeline's bookkeeping, which CudaLink does not, so its figure is an upper bound on that Python only.

`--stub` (the default without a GPU) measures CudaLink itself on the CPU, with every CUDA call it makes
stubbed (offload/links/cuda_stub.StubCuda, no bytes moved: a call costs a Python call), at 1 and 8 copies per
call:

  batched / loop     host us per copy inside CudaLink.copy, on the cudaMemcpyBatchAsync path and on the
                     copy_ loop (a CUDA runtime without the batched copy): the link's own Python, plus
                     the stub's calls (an upper bound). Target at 8 copies per call: <= 5 us.
  before             the CudaLink before the lean link (one module, an event per copy), loaded from git
                     (BEFORE_COMMIT) with torch.cuda stubbed the same way; its copy_ moves real bytes on
                     the CPU, so a bare copy_ of the same byte views is subtracted, as on the GPU. Without
                     git, the committed H200 figure (REFERENCE_FILE) is printed instead.

    .venv/bin/python benchmarks/copy_overhead.py [--device cuda | --stub] [--batch 8] [--calls 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import time
import types

import torch

from artifact.offload.links import timeline
from artifact.offload.links.cuda_link import CudaLink
from artifact.offload.links.cuda_stub import StubCuda
from artifact.offload.links.link_factory import make_link

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "2c159b43318f6297bc270e97d53bba2e487d5ba0"  # the last commit with the per-copy CudaLink
REFERENCE_FILE = "data/gpu_check/h200_copy_overhead_b8.json"  # its H200 figure: 27.02 us, 20.12 of Python
TARGET_PYTHON_US = 5.0  # the target: the link's own host us per copy at 8 copies per call


def measure(device: str, batch: int, calls: int, slots: int, expert_kib: int, drain: int, reps: int) -> dict:
    n = expert_kib * 1024 // 2  # bf16 elements per expert
    cuda = torch.device(device).type == "cuda"
    dst = torch.empty(slots, n, dtype=torch.bfloat16, device=device)  # the slot tensor
    src = torch.zeros(slots, n, dtype=torch.bfloat16, pin_memory=cuda)  # host rows of the store
    link = make_link("cuda" if cuda else "emulated", device=device, expert_bytes=n * 2)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    batches = [
        [(dst[(k * batch + i) % slots], src[(k * batch + i) % slots], "") for i in range(batch)]
        for k in range(max(1, slots // batch))
    ]

    def timed(issue) -> float:
        spent = 0.0
        for c in range(calls):
            items = batches[c % len(batches)]
            t0 = time.perf_counter()
            issue(items)
            spent += time.perf_counter() - t0
            if (c + 1) % drain == 0:
                sync()
        sync()
        return 1e6 * spent / (calls * batch)

    def via_link(items):
        link.copy(items)

    def bare(items):
        for d, s, _ in items:
            d.copy_(s, non_blocking=True)

    link_us, bare_us = [], []
    try:
        for _ in range(reps):  # interleaved, so a busy machine slows both alike
            link_us.append(timed(via_link))
            if cuda:  # on CPU copy_ moves the bytes at once: no launch floor to compare
                bare_us.append(timed(bare))
    finally:
        link.close()
    lk = statistics.median(link_us)
    br = statistics.median(bare_us) if bare_us else 0.0
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "link": link.kind,
        "batch": batch,
        "copy_path": getattr(link, "copy_path", None),
        "batch_note": getattr(link, "batch_note", None),
        "calls": calls,
        "reps": reps,
        "expert_kib": expert_kib,
        "link_us_per_copy": round(lk, 2),
        "bare_us_per_copy": round(br, 2),
        "python_us_per_copy": round(lk - br, 2),
        "link_us_per_copy_reps": [round(x, 2) for x in link_us],
        "bare_us_per_copy_reps": [round(x, 2) for x in bare_us],
        "torch": torch.__version__,
    }


class _StubbedTorchCuda:
    """The torch.cuda names the CudaLink before BEFORE_COMMIT called, onto a StubCuda."""

    def __init__(self, stub: StubCuda):
        self.s = stub

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def Event(self, enable_timing: bool = False):  # noqa: N802 (torch's name)
        return self.s.event(enable_timing)

    def Stream(self, device=None):  # noqa: N802
        return self.s.stream(device)

    def current_stream(self, device=None):
        return self.s.current_stream(device)

    def stream(self, s):
        return self.s.on(s)

    def _sleep(self, cycles: int) -> None:
        self.s.sleep(cycles)


class _StubbedTorch:
    def __init__(self, stub: StubCuda):
        self.cuda = _StubbedTorchCuda(stub)

    def __getattr__(self, name):
        return getattr(torch, name)


def link_before(stub: StubCuda):
    """CudaLink as of BEFORE_COMMIT (from git, not kept in the tree) on the stub, or None without git."""
    try:
        src = subprocess.run(
            ["git", "show", f"{BEFORE_COMMIT}:artifact/offload/link.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    src = re.sub(r"\bartifact\.offload\.timeline\b", timeline.__name__, src)  # where its import lives now
    name = "_link_before_lean"
    mod = types.ModuleType(name)
    sys.modules[name] = mod  # dataclasses look their module up
    try:
        exec(compile(src, f"{BEFORE_COMMIT[:7]}:artifact/offload/link.py", "exec"), mod.__dict__)
    finally:
        del sys.modules[name]
    mod.torch = _StubbedTorch(stub)
    return mod.CudaLink("cuda")


def measure_stub(batches: tuple[int, ...], calls: int, slots: int, expert_kib: int, reps: int) -> dict:
    """Host us per copy of CudaLink.copy with the CUDA calls stubbed, per copies-per-call (see the
    docstring)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a CPU copy_ of 64 KiB on a thread pool: ms of jitter
    try:
        return _measure_stub(batches, calls, slots, expert_kib, reps)
    finally:
        torch.set_num_threads(threads)


def _measure_stub(batches: tuple[int, ...], calls: int, slots: int, expert_kib: int, reps: int) -> dict:
    n = expert_kib * 1024 // 2
    dst = torch.empty(slots, n, dtype=torch.bfloat16)
    src = torch.zeros(slots, n, dtype=torch.bfloat16)
    dst_rows, src_rows = dst.unbind(0), src.unbind(0)  # made once, as the engine's slot and store rows
    quiet = {"move": False, "log": False}
    links = {
        "batched": CudaLink("cuda", runtime=StubCuda(batched=True, **quiet)),
        "loop": CudaLink("cuda", runtime=StubCuda(batched=False, **quiet)),
    }
    before = link_before(StubCuda(**quiet))
    out: dict = {
        "device": "cpu (CUDA calls stubbed)",
        "calls": calls,
        "reps": reps,
        "expert_kib": expert_kib,
        "torch": torch.__version__,
        "target_python_us_per_copy_at_8": TARGET_PYTHON_US,
        "before_commit": BEFORE_COMMIT if before is not None else None,
        "reference_file": REFERENCE_FILE,
        "rows": [],
    }
    for batch in batches:
        items = [
            [(dst_rows[(k * batch + i) % slots], src_rows[(k * batch + i) % slots], "") for i in range(batch)]
            for k in range(max(1, slots // batch))
        ]
        byte_items = [[(d.view(torch.uint8), s.view(torch.uint8)) for d, s, _ in b] for b in items]

        def timed(issue, what, per_call=batch) -> float:
            t0 = time.perf_counter()
            for c in range(calls):
                issue(what[c % len(what)])
            return 1e6 * (time.perf_counter() - t0) / (calls * per_call)

        def bare(pairs):
            for d, s in pairs:
                d.copy_(s, non_blocking=True)

        got: dict[str, list] = {k: [] for k in (*links, "before", "bare")}
        for _ in range(reps):  # interleaved, so a busy machine slows all alike
            for k, link in links.items():
                got[k].append(timed(link.copy, items))
            if before is not None:
                got["before"].append(timed(before.copy, items))
                got["bare"].append(timed(bare, byte_items))
        row = {"batch": batch}
        for k, v in got.items():
            if v:
                row[f"{k}_us_per_copy"] = round(statistics.median(v), 2)
                row[f"{k}_us_per_copy_reps"] = [round(x, 2) for x in v]
        if before is not None:
            row["before_python_us_per_copy"] = round(row["before_us_per_copy"] - row["bare_us_per_copy"], 2)
        out["rows"].append(row)
    for link in links.values():
        link.close()
    return out


def print_stub(r: dict) -> None:
    print(
        f"CudaLink host us per copy with the CUDA calls stubbed (median of {r['reps']} x {r['calls']} calls, "
        f"torch {r['torch']}):"
    )
    for row in r["rows"]:
        b = row["batch"]
        line = (
            f"  {b} cop{'y' if b == 1 else 'ies'} per call: batched {row['batched_us_per_copy']} us, "
            f"copy_ loop {row['loop_us_per_copy']} us"
        )
        if "before_python_us_per_copy" in row:
            line += (
                f" | before ({r['before_commit'][:7]}): {row['before_python_us_per_copy']} us of Python "
                f"({row['before_us_per_copy']} - {row['bare_us_per_copy']} bare copy_)"
            )
        print(line)
    (at8,) = [row for row in r["rows"] if row["batch"] == 8] or [None]
    if at8 is not None:
        for k in ("batched", "loop"):
            v = at8[f"{k}_us_per_copy"]
            print(
                f"  target: <= {TARGET_PYTHON_US:g} us of the link's Python per copy at 8 copies per call; "
                f"{k}: {v} us -> {'met' if v <= TARGET_PYTHON_US else 'not met'}"
            )
    ref = json.loads((ROOT / REFERENCE_FILE).read_text())
    print(
        f"  today on the H200 ({REFERENCE_FILE}, batch {ref['batch']}): "
        f"{ref['link_us_per_copy']} us per copy, {ref['python_us_per_copy']} us of it the link's Python"
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="cuda: CudaLink on the GPU (the default with one); cpu: the emulated link",
    )
    ap.add_argument(
        "--stub",
        action="store_true",
        help="CudaLink on the CPU with its CUDA calls stubbed, at 1 and 8 copies per call "
        "(the default without a GPU and without --device)",
    )
    ap.add_argument("--batch", type=int, default=8, help="copies per call (a layer's misses)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument(
        "--expert-kib", type=int, default=64, help="bytes per copy (host cost barely depends on it)"
    )
    ap.add_argument("--drain", type=int, default=16, help="untimed wait for the copies every N calls")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for k in ("batch", "calls", "slots", "expert_kib", "drain", "reps"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1, got {getattr(a, k)}")
    if a.stub and a.device is not None:
        ap.error("--stub runs CudaLink on the CPU with stubbed CUDA calls: leave out --device")
    if a.stub or (a.device is None and not torch.cuda.is_available()):
        r = measure_stub(tuple(dict.fromkeys((1, a.batch))), a.calls, a.slots, a.expert_kib, a.reps)
        print(json.dumps(r, indent=1)) if a.json else print_stub(r)
        return
    r = measure(a.device or "cuda", a.batch, a.calls, a.slots, a.expert_kib, a.drain, a.reps)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        path = f"; {r['copy_path']}: {r['batch_note']}" if r["copy_path"] else ""
        print(
            f"{r['link']} link on {r['device']}: "
            f"{r['link_us_per_copy']} us per copy inside Link.copy, "
            f"{r['bare_us_per_copy']} us bare copy_ -> {r['python_us_per_copy']} us of the link's Python "
            f"per copy (median of {r['reps']}; batch {r['batch']}{path})"
        )


if __name__ == "__main__":
    main()
