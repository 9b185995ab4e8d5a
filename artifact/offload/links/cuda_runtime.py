"""What a CudaLink stands on: the CUDA runtime it calls (TorchCuda: torch.cuda, and libcudart for the batched
copy; cuda_stub.StubCuda stands in on the CPU), the tickets of its copies (a batch's event, a held speculative
copy), the pool of timing event pairs read without a host sync, and the bounded wait on an event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from artifact.offload.links.cuda_batch import probe_in_child, probe_memcpy_batch
from artifact.offload.links.link import (
    LinkTimeout,
    describe,
)


# ---------------------------------------------------------------------------------------------
# The runtime: every CUDA call a CudaLink makes
# ---------------------------------------------------------------------------------------------
class TorchCuda:
    """The CUDA calls of a CudaLink, through torch.cuda; the batched copy through libcudart (probed once
    per device). cuda_stub.StubCuda has the same methods."""

    def __init__(self):
        self._batch: dict = {}  # device -> (issue or None, note)

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def stream(self, device):
        return torch.cuda.Stream(device)

    def event(self, timing: bool = False):
        return torch.cuda.Event(enable_timing=timing)

    def current_stream(self, device):
        return torch.cuda.current_stream(device)

    def on(self, stream):
        return torch.cuda.stream(stream)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def sleep(self, cycles: int) -> None:
        torch.cuda._sleep(cycles)

    def memcpy_batch(self, device: torch.device):
        """(issue, note): issue(dst pointers, src pointers, sizes, stream) or None, and why. The probe runs
        first in a child process: a raw call this code got wrong could crash, and must not take the run
        with it; only if the child's self-test passed does this process probe (and self-test) too."""
        if device not in self._batch:
            if device.index != torch.cuda.current_device():  # the raw call uses the current device
                self._batch[device] = (None, f"{device} is not the current device")
            else:
                ok, note = probe_in_child(device)
                self._batch[device] = probe_memcpy_batch(device) if ok else (None, note)
        return self._batch[device]


_TORCH_CUDA: TorchCuda | None = None


def torch_cuda() -> TorchCuda:
    global _TORCH_CUDA
    if _TORCH_CUDA is None:
        _TORCH_CUDA = TorchCuda()
    return _TORCH_CUDA


# ---------------------------------------------------------------------------------------------
# Tickets and timing
# ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class CudaBatch:
    """The ticket of every copy of one batch: they land together, when `done` (recorded after the last
    copy) completes."""

    done: object  # the batch's event
    items: Sequence  # the batch's (dst, src, label), read only when a message names a copy
    nbytes: int  # bytes of the whole batch
    held = False  # (class attributes) a batch is on the stream as soon as it is issued
    cancelled = False

    def what(self) -> str:
        _, src, label = self.items[-1]
        n = len(self.items)
        return describe(label, src.numel() * src.element_size()) + (
            f", last of a batch of {n}" if n > 1 else ""
        )


@dataclass(eq=False)
class HeldCopy:
    """A speculative copy under demand priority: held on the host, issued chunk by chunk; its own ticket."""

    done: object  # its event, recorded after its last chunk (never recorded: query() is True)
    label: object  # str() names the copy (built only when a message needs it)
    nbytes: int
    d: object  # destination bytes (uint8 view)
    s: object  # source bytes (uint8 view)
    after: object = None  # the event its first chunk waits for on the copy stream
    held: bool = True  # some chunks not yet on the stream: `done` does not describe this copy yet
    cancelled: bool = False  # dropped by close(): it never lands

    def what(self) -> str:
        return describe(self.label, self.nbytes)


class TimingPairs:
    """Timing event pairs from a pool, harvested without a host sync once their end has passed."""

    def __init__(self, runtime, on_busy: Callable[[int, float], None] | None = None):
        self.rt = runtime
        self.free: list[tuple] = []
        self.live: list[tuple] = []  # (start, end, kind, bytes)
        self.seconds = {"busy": 0.0, "stall": 0.0}
        self.on_busy = on_busy  # (bytes, seconds) of each finished busy pair: the pacing feedback

    def start(self, stream, kind: str, nbytes: int = 0):
        if not self.free:
            self.harvest()
        if self.free:
            s, e = self.free.pop()
        else:
            s, e = self.rt.event(timing=True), self.rt.event(timing=True)
        s.record(stream)
        self.live.append((s, e, kind, nbytes))
        return e

    def harvest(self, everything: bool = False, window: int = 64) -> None:
        """Read the pairs whose end has passed, among the oldest `window` (all when `everything`, after
        the caller synchronised): a host that runs far ahead does not rescan a long queue each time."""
        keep = []
        for n, (s, e, kind, nbytes) in enumerate(self.live):
            if everything or (n < window and e.query()):
                seconds = s.elapsed_time(e) / 1e3
                self.seconds[kind] += seconds
                if kind == "busy" and self.on_busy is not None:
                    self.on_busy(nbytes, seconds)
                self.free.append((s, e))
            else:
                keep.append((s, e, kind, nbytes))
        self.live = keep


def wait_event(
    ev,
    timeout_s: float,
    what: str,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Poll `ev.query()` until it is done; past timeout_s raise LinkTimeout naming `what`."""
    t0 = clock()
    pause = 1e-5
    while not ev.query():
        if clock() - t0 > timeout_s:
            raise LinkTimeout(
                f"{what} did not complete within {timeout_s:g} s (the copy stream or the "
                "compute it waits for is stuck)"
            )
        sleep(pause)
        pause = min(pause * 2, 1e-3)


class EventClock:
    """A clock in seconds read off CUDA events on one stream (calibration only: it syncs the host)."""

    def __init__(self, runtime, stream, timeout_s: float):
        self.rt, self.stream, self.timeout = runtime, stream, timeout_s
        self.origin = runtime.event(timing=True)
        self.origin.record(stream)

    def __call__(self) -> float:
        ev = self.rt.event(timing=True)
        ev.record(self.stream)
        wait_event(ev, self.timeout, "a calibration copy")
        return self.origin.elapsed_time(ev) / 1e3
