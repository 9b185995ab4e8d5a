"""StubCuda: a CPU stand-in for the CUDA runtime a CudaLink calls (cuda_runtime.TorchCuda's methods), so the
link's own code runs, and is tested and timed, without a GPU.

Streams and events are bookkeeping. Copies move their bytes at once (CPU tensors; the batched copy by
pointer, as cudaMemcpyBatchAsync would), or not at all with move=False, for a benchmark of the link's own
host cost. An event completes `delay` queries after it was recorded, or never while `stuck` (a hung copy
stream), so "the demand copies are not done yet" happens as on a GPU. With log=True every call is a tuple
in `calls`, in order:

  ("record", event, stream)           ("wait", stream, event)          ("on", stream)
  ("copy", dst ptr, src ptr, bytes)   ("batch", stream, ((dst ptr, src ptr, bytes), ...))
  ("sleep", cycles)                   ("event", event, timing)          ("sync", event)
  ("wait_stream", stream, other)      ("sync_stream", stream)           ("last_error", error it cleared)

events by their number (creation order), streams by name ("copy": the link's stream, "compute": the
current stream). StubCudart stands in for libcudart's batched copy (cuda_batch.probe_memcpy_batch's calls).
What a stub cannot show (real asynchrony, timing, pinned memory) is in tests/test_cuda.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools

import torch


class StubEvent:
    def __init__(self, cuda: StubCuda, n: int, timing: bool = False):
        self.cuda, self.n, self.timing = cuda, n, timing
        self.recorded, self.left = False, 0

    def record(self, stream=None) -> None:
        self.recorded = True
        self.left = -1 if self.cuda.stuck else self.cuda.delay  # -1: never completes
        if self.cuda.log:
            self.cuda.calls.append(("record", self.n, stream.name if stream is not None else None))

    def query(self) -> bool:
        if not self.recorded:  # as on CUDA: an event never recorded reads as complete
            return True
        if self.left > 0:
            self.left -= 1
        return self.left == 0

    def synchronize(self) -> None:
        assert self.left >= 0, "synchronize on a stuck event would hang"
        self.left = 0
        if self.cuda.log:
            self.cuda.calls.append(("sync", self.n))

    def elapsed_time(self, other: StubEvent) -> float:
        return self.cuda.elapsed_ms


class StubStream:
    def __init__(self, cuda: StubCuda, name: str):
        self.cuda, self.name, self.waits = cuda, name, []
        self.cuda_stream = id(self)  # the handle a raw runtime call takes
        cuda.by_handle[self.cuda_stream] = self

    def wait_event(self, ev: StubEvent) -> None:
        self.waits.append(ev)
        if self.cuda.log:
            self.cuda.calls.append(("wait", self.name, ev.n))

    def query(self) -> bool:
        return not self.cuda.stuck

    def wait_stream(self, other: StubStream) -> None:
        if self.cuda.log:
            self.cuda.calls.append(("wait_stream", self.name, other.name))

    def synchronize(self) -> None:
        assert not self.cuda.stuck, "synchronize on a stuck stream would hang"
        if self.cuda.log:
            self.cuda.calls.append(("sync_stream", self.name))


class StubCuda:
    """batched: offer the batched copy (cudaMemcpyBatchAsync); False: the link falls back to its copy_ loop.
    elapsed_ms: what every timing pair reads."""

    def __init__(
        self,
        batched: bool = True,
        move: bool = True,
        log: bool = True,
        delay: int = 0,
        elapsed_ms: float = 0.5,
    ):
        self.batched, self.move, self.log = batched, move, log
        self.delay, self.stuck, self.elapsed_ms = delay, False, elapsed_ms
        self.calls: list[tuple] = []
        self.by_handle: dict[int, StubStream] = {}
        self.compute = StubStream(self, "compute")
        self._n = itertools.count()

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def stream(self, device=None) -> StubStream:
        return StubStream(self, "copy")

    def event(self, timing: bool = False) -> StubEvent:
        ev = StubEvent(self, next(self._n), timing)
        if self.log:
            self.calls.append(("event", ev.n, timing))
        return ev

    def current_stream(self, device=None) -> StubStream:
        return self.compute

    @contextlib.contextmanager
    def on(self, stream: StubStream):
        if self.log:
            self.calls.append(("on", stream.name))
        yield stream

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self.log:
            self.calls.append(("copy", dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size()))
        if self.move:
            dst.copy_(src)

    def sleep(self, cycles: int) -> None:
        if self.log:
            self.calls.append(("sleep", cycles))

    def memcpy_batch(self, device=None):
        return (self._batch, "stub batched copy") if self.batched else (None, "stub without a batched copy")

    def _batch(self, dsts: list[int], srcs: list[int], sizes: list[int], stream: StubStream) -> None:
        if self.log:
            self.calls.append(("batch", stream.name, tuple(zip(dsts, srcs, sizes))))
        if self.move:  # CPU tensors' memory: the pointers are real
            for d, s, n in zip(dsts, srcs, sizes):
                ctypes.memmove(d, s, n)

    def only(self, *kinds: str) -> list[tuple]:
        """The logged calls of these kinds, in order."""
        return [c for c in self.calls if c[0] in kinds]


class StubCudart:
    """The libcudart calls of the batched copy (cuda_batch.probe_memcpy_batch, lib=): cudaRuntimeGetVersion,
    cudaMemcpyBatchAsync (moves the bytes by pointer and logs ("batch", ...) on `cuda`, or with `fail` set
    returns that error and leaves it as the last error, as the runtime does) and cudaGetLastError (returns the
    last error and clears it). Functions, not methods: the binding sets their restype and argtypes."""

    def __init__(self, cuda: StubCuda, version: int = 12080, fail: int = 0):
        self.cuda, self.version, self.fail, self.last_error = cuda, version, fail, 0

        def get_version(ref) -> int:
            ref._obj.value = self.version  # ctypes.byref(c_int): the int it points at
            return 0

        def batch(dsts, srcs, sizes, n, attrs, first, n_attrs, *rest) -> int:
            if self.fail:
                self.last_error = self.fail
                return self.fail
            cuda._batch(list(dsts[:n]), list(srcs[:n]), list(sizes[:n]), cuda.by_handle[rest[-1]])
            return 0

        def get_last_error() -> int:
            err, self.last_error = self.last_error, 0
            if cuda.log:
                cuda.calls.append(("last_error", err))
            return err

        self.cudaRuntimeGetVersion, self.cudaMemcpyBatchAsync, self.cudaGetLastError = (
            get_version,
            batch,
            get_last_error,
        )
