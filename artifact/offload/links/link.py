"""The host-to-device link: one Protocol, two implementations, in these modules.

  link.py          the Protocol (what the engine calls), the stats and errors, EmulatedLink
  cuda_link.py     CudaLink: copies from pinned memory on a dedicated copy stream, one event and one timing
                   pair per batch; its CUDA calls go through an injectable runtime (cuda_stub.py on the CPU)
  cuda_batch.py    the cudaMemcpyBatchAsync binding and its probe (CudaLink's batched copy)
  pacing.py        the capped CUDA link's pacing arithmetic (Pacing, calibrate_rate)
  link_factory.py  make_link: a link by name (it imports both implementations; link.py imports neither)

  EmulatedLink  for CPU runs: a copy engine on a timeline (offload/links/timeline.py): FIFO, or with demand
                priority two queues and chunked speculative copies. Each copy (chunk) starts when the
                link is free and takes latency + bytes / bandwidth; `wait` blocks until the copy ends
                (the stall is real wall-clock time) and only then moves the bytes, so a compute that
                skipped its wait would read stale weights and the exactness tests would see it.

Both count transfers, bytes, busy seconds (link occupied) and stall seconds (compute waiting). Every
host-side wait has a timeout and names the copy it waited for.

close() ends a link for good, also after an exception in a forward: once it returns, no copy issued on
the link writes into its destination any more, so the engine's slots may be freed. EmulatedLink moves
bytes only in `wait`, which a closed link refuses; CudaLink drains its copy stream (cuda_link.py).

"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from artifact.model.config import PRESETS
from artifact.offload.links.timeline import (
    REFERENCE_CHUNK_BYTES,
    Copy,
    CopyTimeline,
    check_priority,
)

LINKS = ("emulated", "cuda")
PCIE4_GBPS = 25.0  # effective host-to-device bandwidth of a PCIe 4.0 x16 slot
PCIE_LATENCY_US = 10.0  # per-copy setup cost
# one LLaDA2.0-mini routed expert in bf16 (6 MiB)
REFERENCE_EXPERT_BYTES = PRESETS["llada2-mini"].expert_bytes(2)
WAIT_TIMEOUT_S = 60.0  # a host-side wait longer than this is a hang, not a slow link: raise
CLOSE_TIMEOUT_S = 10.0  # close(): the copy stream's in-flight copies get this long to land


class LinkClosed(RuntimeError):
    """A copy or wait on a link after close(): nothing may write into the destinations any more."""


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


class LinkTimeout(TimeoutError):
    """A host-side wait on the link outlived its timeout (the message names the copy)."""


class Link(Protocol):
    """What the engine needs from a host-to-device link. `after` values come from compute_done."""

    stats: LinkStats

    def copy(
        self, items: Sequence[tuple[torch.Tensor, torch.Tensor, str]], after=None, speculative: bool = False
    ) -> list:
        """Issue the copies (dst, src, label) in order, all after `after`; one ticket per copy (copies of
        one batch may share one, landing together). `speculative`: prefetches, which a demand-priority link
        never lets delay a demand copy."""
        ...

    def landed(self, ticket) -> bool:
        """The copy has completed (a non-blocking query)."""
        ...

    def promote(self, ticket) -> None:
        """The copy's expert is demanded: from now on it is a demand copy (a no-op where nothing is held
        back, e.g. under fifo)."""
        ...

    def ready(self, ticket) -> bool:
        """Compute issued now after this copy would not block the host: landed on a host-timed link;
        always on a GPU link, where compute waits on the device timeline."""
        ...

    def wait(self, tickets: Sequence) -> None:
        """Compute that follows reads the tickets' destinations only once they have landed."""
        ...

    def compute_done(self, key):
        """Mark the end of the compute issued so far that read `key`'s slots: the marker to pass as
        `after` to a copy into them. None where compute is synchronous (CPU)."""
        ...

    def pump(self) -> None:
        """An issue point of the engine: a link that holds speculative copies may issue some now."""
        ...

    def finish(self) -> LinkStats:
        """Land everything, settle the timing, return the totals."""
        ...

    def close(self) -> None:
        """No copy writes into a destination once this returns (see the module docstring)."""
        ...


def describe(label: str, nbytes: int) -> str:
    return f"copy {label or '(unlabelled)'} ({nbytes} bytes)"


# ---------------------------------------------------------------------------------------------
# Emulated (CPU)
# ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class EmulatedTicket:
    dst: torch.Tensor
    src: torch.Tensor
    copy: Copy
    link: "EmulatedLink"
    label: str = ""
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

    # priority/chunk_bytes/speculative: the demand-priority link, see offload/links/timeline.py.
    def __init__(
        self,
        bandwidth_gbps: float,
        latency_us: float = PCIE_LATENCY_US,
        cap_gbps: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        priority: str = "fifo",
        chunk_bytes: int | None = None,
        timeout_s: float = WAIT_TIMEOUT_S,
        copy_bytes: int | None = None,
    ):
        """copy_bytes: the bytes every copy stands for on the timeline and in the counts, whatever the
        tensors hold (a virtual-time run of a real model's shape over a small stand-in store)."""
        if bandwidth_gbps <= 0:
            raise ValueError(f"link bandwidth must be > 0 GB/s, got {bandwidth_gbps}")
        if latency_us < 0:
            raise ValueError(f"link latency must be >= 0 us, got {latency_us}")
        if cap_gbps is not None and cap_gbps <= 0:
            raise ValueError(f"bandwidth cap must be > 0 GB/s, got {cap_gbps}")
        self.bandwidth_gbps = min(bandwidth_gbps, cap_gbps) if cap_gbps else bandwidth_gbps
        self.latency = latency_us * 1e-6
        check_priority(priority, chunk_bytes)
        self.clock, self.sleep, self.timeout = clock, sleep, timeout_s
        self.priority, self.chunk_bytes = priority, chunk_bytes
        self.copy_bytes = copy_bytes
        self.timeline = CopyTimeline(self.bandwidth_gbps, self.latency, priority, chunk_bytes)
        self.stats = LinkStats()
        self.closed = False

    def duration(self, nbytes: int) -> float:
        return self.timeline.chunk_seconds(nbytes)

    def copy(self, items, after=None, speculative: bool = False) -> list[EmulatedTicket]:
        if self.closed:
            raise LinkClosed("copy on a closed link")
        out = []
        for dst, src, label in items:
            nbytes = self.copy_bytes or src.numel() * src.element_size()
            # The slot's address names the destination: a copy into a slot promotes an earlier speculative
            # copy into it that is still waiting, so the slot's copies land in issue order.
            c = self.timeline.issue(self.clock(), nbytes, speculative, key=dst.data_ptr())
            self.stats.transfers += 1
            self.stats.bytes += nbytes
            self.stats.busy_seconds += sum(self.duration(n) for n in c.chunks)  # latency once per chunk
            out.append(EmulatedTicket(dst, src, c, self, label))
        return out

    def promote(self, t: EmulatedTicket) -> None:
        """The copy's expert is demanded: from now on it is a demand copy (no-op under fifo)."""
        if not t.landed:
            self.timeline.promote(t.copy, self.clock())

    def wait(self, tickets) -> None:
        if isinstance(tickets, EmulatedTicket):
            tickets = (tickets,)
        for t in tickets:
            if t.landed:
                continue
            if self.closed:  # the bytes move here: a closed link's destinations may be freed
                raise LinkClosed(
                    f"wait for {describe(t.label, t.src.numel() * t.src.element_size())} on a "
                    "closed link: the copy was cancelled"
                )
            now = self.clock()
            end = t.end  # final: nothing is issued while this thread sleeps
            if now < end:
                if end - now > self.timeout:
                    raise LinkTimeout(
                        f"{describe(t.label, t.src.numel() * t.src.element_size())} lands in "
                        f"{end - now:.1f} s, beyond the {self.timeout:.0f} s wait timeout "
                        f"(is the link bandwidth {self.bandwidth_gbps:g} GB/s what you meant?)"
                    )
                self._sleep_until(end)
                self.stats.stall_seconds += self.clock() - now
            t.dst.copy_(t.src)
            t.landed = True

    def landed(self, t: EmulatedTicket) -> bool:
        return t.landed or self.clock() >= t.end

    ready = landed  # compute on the CPU host waits on the host: only a landed copy costs nothing

    def compute_done(self, key):
        return None  # CPU compute is synchronous: a slot is free as soon as the call returns

    def _sleep_until(self, deadline: float) -> None:
        exact = getattr(self.clock, "sleep_until", None)
        if exact is not None:  # a virtual clock: jump to the deadline
            exact(deadline)
            return
        while True:  # coarse sleep, then a short spin: time.sleep overshoots by ~0.1 ms
            left = deadline - self.clock()
            if left <= 0:
                return
            if left > 1e-3:
                self.sleep(left - 5e-4)  # > 0.5 ms: never a negative argument
            elif self.sleep is not time.sleep:
                self.sleep(left)

    def pump(self) -> None:
        pass  # the timeline orders speculative copies itself

    def finish(self) -> LinkStats:
        return self.stats

    def close(self) -> None:
        """Cancel every copy not yet landed: they never move their bytes (wait refuses)."""
        self.closed = True
