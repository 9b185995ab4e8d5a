"""The host-to-device link: one interface, two implementations.

  CudaLink      copies from pinned memory, non_blocking, on a dedicated copy stream; a copy waits for
                the event that frees its slot, compute waits for the copy's event (no host sync).
                A bandwidth cap paces chunked copies from a worker thread (token bucket).
  EmulatedLink  for CPU runs: a copy engine on a timeline (offload/timeline.py): FIFO, or with demand
                priority two queues and chunked speculative copies. Each copy (chunk) starts when the
                link is free and takes latency + bytes / bandwidth; `wait` blocks until the copy ends
                (the stall is real wall-clock time) and only then moves the bytes, so a compute that
                skipped its wait would read stale weights and the exactness tests would see it.

Both count transfers, bytes, busy seconds (link occupied) and stall seconds (compute waiting).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from artifact.offload.timeline import PRIORITIES, REFERENCE_CHUNK_BYTES, Copy, CopyTimeline, check_priority

LINKS = ("emulated", "cuda")
PCIE4_GBPS = 25.0          # effective host-to-device bandwidth of a PCIe 4.0 x16 slot
PCIE_LATENCY_US = 10.0     # per-copy setup cost
REFERENCE_EXPERT_BYTES = 3 * 512 * 2048 * 2    # one LLaDA2.0-mini routed expert in bf16 (6 MiB)


def emulated_bandwidth_gbps(expert_bytes: int, gbps: float = PCIE4_GBPS) -> float:
    """Bandwidth that moves one of *these* experts in the time PCIe 4 moves a LLaDA2.0-mini expert.
    For the tiny model (24 KiB experts) this is ~0.1 GB/s, so an expert costs ~250 us as on the real
    system, which keeps the transfer/compute ratio of the real model. A real mini checkpoint gets 25."""
    return gbps * expert_bytes / REFERENCE_EXPERT_BYTES


@dataclass
class LinkStats:
    transfers: int = 0
    bytes: int = 0
    busy_seconds: float = 0.0
    stall_seconds: float = 0.0

    @property
    def achieved_gbps(self) -> float:
        return self.bytes / self.busy_seconds / 1e9 if self.busy_seconds else 0.0


@dataclass(eq=False)
class EmulatedTicket:
    dst: torch.Tensor
    src: torch.Tensor
    copy: Copy
    link: "EmulatedLink"
    landed: bool = False

    @property
    def end(self) -> float:
        """When the copy lands, as the link's timeline knows it now (priority: later demand copies may
        still delay a speculative copy's chunks that have not started)."""
        return self.link.timeline.end(self.copy, self.link.clock())


def scaled_chunk_bytes(expert_bytes: int) -> int:
    """Speculative chunk size that takes as long on the scaled emulated link as 1 MiB on PCIe 4 (see
    emulated_bandwidth_gbps): a sixth of an expert, for any model."""
    return max(1, round(REFERENCE_CHUNK_BYTES * expert_bytes / REFERENCE_EXPERT_BYTES))


class EmulatedLink:
    kind = "emulated"

    # priority/chunk_bytes/speculative: the demand-priority link (issue 13), see offload/timeline.py.
    def __init__(self, bandwidth_gbps: float, latency_us: float = PCIE_LATENCY_US,
                 cap_gbps: float | None = None, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, priority: str = "fifo",
                 chunk_bytes: int | None = None):
        if bandwidth_gbps <= 0:
            raise ValueError(f"link bandwidth must be > 0 GB/s, got {bandwidth_gbps}")
        if latency_us < 0:
            raise ValueError(f"link latency must be >= 0 us, got {latency_us}")
        if cap_gbps is not None and cap_gbps <= 0:
            raise ValueError(f"bandwidth cap must be > 0 GB/s, got {cap_gbps}")
        self.bandwidth_gbps = min(bandwidth_gbps, cap_gbps) if cap_gbps else bandwidth_gbps
        self.latency = latency_us * 1e-6
        check_priority(priority, chunk_bytes)
        self.clock, self.sleep = clock, sleep
        self.priority, self.chunk_bytes = priority, chunk_bytes
        self.timeline = CopyTimeline(self.bandwidth_gbps, self.latency, priority, chunk_bytes)
        self.stats = LinkStats()

    def duration(self, nbytes: int) -> float:
        return self.timeline.chunk_seconds(nbytes)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after=None, speculative: bool = False) -> EmulatedTicket:
        nbytes = src.numel() * src.element_size()
        # The slot's address names the destination: a copy into a slot promotes an earlier speculative
        # copy into it that is still waiting, so the slot's copies land in issue order.
        c = self.timeline.issue(self.clock(), nbytes, speculative, key=dst.data_ptr())
        self.stats.transfers += 1
        self.stats.bytes += nbytes
        self.stats.busy_seconds += sum(self.duration(n) for n in c.chunks)   # latency once per chunk
        return EmulatedTicket(dst, src, c, self)

    def promote(self, t: EmulatedTicket) -> None:
        """The copy's expert is demanded: from now on it is a demand copy (no-op under fifo)."""
        if not t.landed:
            self.timeline.promote(t.copy, self.clock())

    def wait(self, t: EmulatedTicket) -> None:
        if t.landed:
            return
        now = self.clock()
        end = t.end                # final: nothing is issued while this thread sleeps
        if now < end:
            self._sleep_until(end)
            self.stats.stall_seconds += self.clock() - now
        t.dst.copy_(t.src)
        t.landed = True

    def ready(self, t: EmulatedTicket) -> bool:
        return t.landed or self.clock() >= t.end

    def compute_done(self, dst: torch.Tensor):
        return None          # CPU compute is synchronous: a slot is free as soon as the call returns

    def _sleep_until(self, deadline: float) -> None:
        while True:          # coarse sleep, then a short spin: time.sleep overshoots by ~0.1 ms
            left = deadline - self.clock()
            if left <= 0:
                return
            if left > 1e-3:
                self.sleep(left - 5e-4)
            elif self.sleep is not time.sleep:
                self.sleep(left)

    def finish(self) -> LinkStats:
        return self.stats

    def close(self) -> None:
        pass


@dataclass
class CudaTicket:
    done: torch.cuda.Event
    start: torch.cuda.Event
    issued: threading.Event = field(default_factory=threading.Event)


class CudaLink:
    kind = "cuda"

    def __init__(self, device: torch.device | str = "cuda", cap_gbps: float | None = None,
                 chunk_bytes: int = 1 << 20):
        if not torch.cuda.is_available():
            raise RuntimeError("--link cuda needs a CUDA GPU, and torch.cuda.is_available() is False "
                               "(use --link emulated on CPU)")
        if cap_gbps is not None and cap_gbps <= 0:
            raise ValueError(f"bandwidth cap must be > 0 GB/s, got {cap_gbps}")
        self.device = torch.device(device)
        if self.device.index is None:        # the pacing thread's set_device needs an index
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(self.device)
        self.cap = cap_gbps
        self.chunk = chunk_bytes
        self.stats = LinkStats()
        self._copies: list[CudaTicket] = []
        self._waits: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._queue: queue.Queue | None = None
        if cap_gbps:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._paced_worker, daemon=True)
            self._worker.start()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: torch.cuda.Event | None = None,
             speculative: bool = False) -> CudaTicket:     # speculative: accepted, ignored (fifo only so far)
        t = CudaTicket(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        self.stats.transfers += 1
        self.stats.bytes += src.numel() * src.element_size()
        self._copies.append(t)
        if self._queue is not None:
            self._queue.put((dst, src, after, t))
        else:
            with torch.cuda.stream(self.stream):
                if after is not None:
                    self.stream.wait_event(after)
                t.start.record(self.stream)
                dst.copy_(src, non_blocking=True)
                t.done.record(self.stream)
            t.issued.set()
        return t

    def _paced_worker(self):
        torch.cuda.set_device(self.device)
        rate = self.cap * 1e9
        budget_time = time.perf_counter()
        while True:
            item = self._queue.get()
            if item is None:
                return
            dst, src, after, t = item
            d, s = dst.view(-1).view(torch.uint8), src.view(-1).view(torch.uint8)
            with torch.cuda.stream(self.stream):
                if after is not None:
                    self.stream.wait_event(after)
                t.start.record(self.stream)
                for a in range(0, d.numel(), self.chunk):
                    b = min(a + self.chunk, d.numel())
                    budget_time = max(budget_time, time.perf_counter()) + (b - a) / rate
                    d[a:b].copy_(s[a:b], non_blocking=True)
                    while time.perf_counter() < budget_time:         # token bucket: pace the next chunk
                        time.sleep(min(1e-4, budget_time - time.perf_counter()))
                t.done.record(self.stream)
            t.issued.set()

    def wait(self, t: CudaTicket) -> None:
        t.issued.wait()
        stream = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event(enable_timing=True)
        ready.record(stream)
        stream.wait_event(t.done)
        self._waits.append((ready, t.done))

    def ready(self, t: CudaTicket) -> bool:
        return t.issued.is_set() and t.done.query()

    def compute_done(self, dst: torch.Tensor) -> torch.cuda.Event:
        """Event after the compute that last read a slot: a later copy into the slot waits for it."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def finish(self) -> LinkStats:
        """Synchronise once and read the timing events: busy = sum of copy durations, stall = time
        compute was ready but its copy had not landed."""
        if self._queue is not None:
            for t in self._copies:
                t.issued.wait()
        torch.cuda.synchronize(self.device)
        self.stats.busy_seconds += sum(t.start.elapsed_time(t.done) for t in self._copies) / 1e3
        self.stats.stall_seconds += sum(max(0.0, r.elapsed_time(d)) for r, d in self._waits) / 1e3
        self._copies.clear()
        self._waits.clear()
        return self.stats

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)


def make_link(kind: str, *, device="cpu", bandwidth_gbps: float | None = None, latency_us: float = PCIE_LATENCY_US,
              cap_gbps: float | None = None, expert_bytes: int | None = None, priority: str = "fifo",
              chunk_bytes: int | None = None):
    """Build a link by name. The emulated link's default bandwidth is scaled to the model (see
    emulated_bandwidth_gbps); its default speculative chunk under demand priority is one expert; on CUDA the
    bandwidth is the hardware's, and bandwidth_gbps, if given, acts as the cap."""
    if kind not in LINKS:
        raise ValueError(f"unknown link {kind!r}; choose one of {LINKS}")
    if priority not in PRIORITIES:
        raise ValueError(f"unknown link priority {priority!r}; choose one of {PRIORITIES}")
    if kind == "cuda":
        if torch.device(device).type != "cuda":
            raise ValueError("--link cuda needs --device cuda")
        if priority != "fifo":       # timeline.SpeculativeHold is the logic; CudaLink does not call it yet
            raise ValueError("link priority 'demand' is not wired into the cuda link yet; use --link emulated")
        caps = [c for c in (cap_gbps, bandwidth_gbps) if c]
        return CudaLink(device, cap_gbps=min(caps) if caps else None)
    if bandwidth_gbps is None:
        if expert_bytes is None:
            raise ValueError("the emulated link needs bandwidth_gbps or expert_bytes to scale its default")
        bandwidth_gbps = emulated_bandwidth_gbps(expert_bytes)
    if chunk_bytes is None and priority == "demand":
        # One expert per chunk: a demand copy waits for at most one speculative expert copy. Smaller chunks pay
        # the per-copy latency again each (measured: 1/6-expert chunks made demand priority slower than fifo).
        chunk_bytes = expert_bytes if expert_bytes else REFERENCE_CHUNK_BYTES
    return EmulatedLink(bandwidth_gbps, latency_us, cap_gbps, priority=priority, chunk_bytes=chunk_bytes)
