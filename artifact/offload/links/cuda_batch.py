"""cudaMemcpyBatchAsync for CudaLink: the binding (ctypes, from the libcudart torch loaded) and its probe.

probe_memcpy_batch binds the call for this runtime (CUDA >= 12.8; CUDA 13 dropped the failIdx argument)
and self-tests it once with two crossed copies; probe_in_child runs that probe first in a fresh interpreter,
so a binding this code got wrong cannot take the run with it. Set NO_BATCH_ENV to 1 and the probe is never
made: the link copies with its copy_ loop (an A/B comparison of the two paths).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import subprocess
import sys

import torch

NO_BATCH_ENV = "ARTIFACT_NO_MEMCPY_BATCH"  # set to 1: never probe cudaMemcpyBatchAsync (the copy_ loop)


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


SRC_ACCESS_ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream: sources are read in stream order (pinned rows)
BATCH_MIN_RUNTIME = 12080  # cudaMemcpyBatchAsync appeared in CUDA 12.8 ...
BATCH_NO_FAIL_IDX = 13000  # ... with a failIdx out-parameter before the stream, which CUDA 13 dropped


def _libcudart():
    """The libcudart torch loaded (its path from /proc/self/maps), else one by soname; None if none loads."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "libcudart" in ln.rsplit("/", 1)[-1]})
    except OSError:
        paths = []
    for name in paths + ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def probe_memcpy_batch(device: torch.device, lib=None, runtime=None):
    """cudaMemcpyBatchAsync as `issue(dst pointers, src pointers, sizes, stream)`, and a note saying which
    runtime it came from; or (None, why not). Needs a CUDA runtime >= 12.8 and a self-test batch (two
    copies, crossed) that lands the right bytes: a signature or struct this code got wrong fails here, once,
    and the link falls back to the copy_ loop. lib: the runtime library (None: the libcudart torch loaded;
    cuda_stub.StubCudart on the CPU); runtime: the streams (None: torch.cuda; cuda_stub.StubCuda)."""
    if os.environ.get(NO_BATCH_ENV, "") not in ("", "0"):
        return None, f"{NO_BATCH_ENV} is set"
    lib = lib if lib is not None else _libcudart()
    if lib is None:
        return None, "no libcudart in the process"
    v = ctypes.c_int(0)
    try:
        if lib.cudaRuntimeGetVersion(ctypes.byref(v)) != 0:
            return None, "cudaRuntimeGetVersion failed"
        fn = lib.cudaMemcpyBatchAsync
    except AttributeError:
        return None, f"CUDA runtime {v.value} has no cudaMemcpyBatchAsync (needs >= {BATCH_MIN_RUNTIME})"
    if v.value < BATCH_MIN_RUNTIME:
        return None, f"CUDA runtime {v.value} < {BATCH_MIN_RUNTIME}: no cudaMemcpyBatchAsync"
    issue = bind(lib, fn, v.value)
    try:
        if not self_test(issue, device, runtime):
            return None, "cudaMemcpyBatchAsync self-test landed the wrong bytes"
    except Exception as e:  # any failure of the probe means: use the copy_ loop
        lib.cudaGetLastError()  # and leave no sticky error behind for the next CUDA call to report
        return None, f"cudaMemcpyBatchAsync self-test failed: {e}"
    return issue, f"cudaMemcpyBatchAsync (CUDA runtime {v.value})"


def bind(lib, fn, version: int):
    """issue(dst pointers, src pointers, sizes, stream): one cudaMemcpyBatchAsync of the copies on `stream`
    (sources read in stream order). A failed call raises, after clearing the runtime's last error
    (cudaGetLastError), so that the failure is not reported again by an unrelated later call."""
    P, S = ctypes.c_void_p, ctypes.c_size_t
    fail_idx = version < BATCH_NO_FAIL_IDX
    fn.restype = ctypes.c_int
    fn.argtypes = (
        [
            ctypes.POINTER(P),
            ctypes.POINTER(P),
            ctypes.POINTER(S),
            S,
            ctypes.POINTER(_MemcpyAttributes),
            ctypes.POINTER(S),
            S,
        ]
        + ([ctypes.POINTER(S)] if fail_idx else [])
        + [P]
    )
    attrs = _MemcpyAttributes(srcAccessOrder=SRC_ACCESS_ORDER_STREAM)  # location hints: none (type 0)
    first = (S * 1)(0)  # the one attribute covers copy 0..n-1
    failed = S(0)
    tail = (ctypes.byref(failed),) if fail_idx else ()

    def issue(dsts: list[int], srcs: list[int], sizes: list[int], stream) -> None:
        n = len(dsts)
        rc = fn(
            (P * n)(*dsts), (P * n)(*srcs), (S * n)(*sizes), n, attrs, first, 1, *tail, stream.cuda_stream
        )
        if rc:
            lib.cudaGetLastError()
            raise RuntimeError(f"cudaMemcpyBatchAsync of {n} copies failed with CUDA error {rc}")

    return issue


def self_test(issue, device: torch.device, runtime=None) -> bool:
    """Two crossed 4 KiB copies on a stream of their own: whether they landed the right bytes. The stream
    waits for the current stream first, where the destination was zero-filled: the copies land after it."""
    cuda = device.type == "cuda"
    with torch.cuda.device(device) if cuda else contextlib.nullcontext():
        src = (torch.arange(8192) % 251).to(torch.uint8)
        src = src.pin_memory() if cuda else src
        dst = torch.zeros(8192, dtype=torch.uint8, device=device)
        if runtime is None:
            s, current = torch.cuda.Stream(device), torch.cuda.current_stream(device)
        else:
            s, current = runtime.stream(device), runtime.current_stream(device)
        s.wait_stream(current)
        issue(
            [dst.data_ptr(), dst.data_ptr() + 4096], [src.data_ptr() + 4096, src.data_ptr()], [4096, 4096], s
        )
        s.synchronize()
        return torch.equal(dst.cpu(), torch.cat([src[4096:], src[:4096]]))


def probe_in_child(device: torch.device, timeout_s: float = 120.0) -> tuple[bool, str]:
    """probe_memcpy_batch in a fresh interpreter: (passed, its note, or how the child failed)."""
    if os.environ.get(NO_BATCH_ENV, "") not in ("", "0"):
        return False, f"{NO_BATCH_ENV} is set"
    code = "\n".join(
        [
            "import sys, torch",
            "from artifact.offload.links.cuda_batch import probe_memcpy_batch",
            f"issue, note = probe_memcpy_batch(torch.device('cuda', {device.index}))",
            "print(note)",
            "sys.exit(0 if issue is not None else 3)",
            "",
        ]
    )
    # the checkout this module came from
    root = str(pathlib.Path(__file__).resolve().parents[__name__.count(".")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    try:
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"the cudaMemcpyBatchAsync probe did not run: {e}"
    note = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode == 0:
        return True, note
    if r.returncode == 3:
        return False, note
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    return False, f"the cudaMemcpyBatchAsync probe's process exited with {r.returncode}: {tail}"
