"""Link priority: when speculative copies may use the copy engine, modelled (CopyTimeline) and held
(SpeculativeHold).

  fifo    one queue in issue order, whole copies: a demand copy waits for every copy issued before it,
          speculative or not (the paper's setting).
  demand  two queues. Speculative copies are split into chunks of at most `chunk_bytes`, and a chunk is
          started only while no demand copy is waiting, so a demand copy waits for at most the one
          speculative chunk already on the engine. A speculative copy that becomes needed (its expert is
          demanded, or a later copy targets its slot) is promoted: its remaining chunks join the demand
          queue, in order, so that slot's bytes land in issue order.

Latency applies per chunk: each chunk is a separate copy on a real copy engine (one cudaMemcpyAsync),
so chunking costs (chunks - 1) * latency of extra link time per speculative copy, and nothing else.

CopyTimeline is pure: copies are issued at host times the caller passes in, and end times are computed
lazily, from the queues as they are at the host time asked, because a speculative copy's end depends on
demand copies issued after it. An end asked for at host time `now` is final whenever the caller then
blocks until it (nothing can be issued while the host sleeps), which is what EmulatedLink.wait does.

SpeculativeHold is the same rule for a real copy stream, where a queued copy cannot be overtaken: it
keeps speculative chunks on the host and issues them, at the engine's issue points (`pump`), only while
`drained()` says the demand copies are done (on CUDA: event.query() on the last demand copy's event)
and fewer than `depth` speculative chunks are in flight. No host thread: nothing moves between pumps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

PRIORITIES = ("fifo", "demand")
# real time, or a VirtualClock advanced by modelled costs (offload/links/costs.py)
CLOCKS = ("wall", "virtual")
REFERENCE_CHUNK_BYTES = 1 << 20  # 1 MiB: ~42 us on PCIe 4, a sixth of a LLaDA2.0-mini expert


def check_priority(priority: str, chunk_bytes: int | None) -> None:
    if priority not in PRIORITIES:
        raise ValueError(f"unknown link priority {priority!r}; choose one of {PRIORITIES}")
    if chunk_bytes is not None and (not isinstance(chunk_bytes, int) or chunk_bytes < 1):
        raise ValueError(f"chunk_bytes must be a positive integer number of bytes, got {chunk_bytes!r}")


def split(nbytes: int, chunk_bytes: int | None) -> list[int]:
    """Chunk sizes of one copy: full chunks and a shorter last one (one chunk if chunk_bytes is None)."""
    if chunk_bytes is None or nbytes <= chunk_bytes:
        return [nbytes]
    full, rest = divmod(nbytes, chunk_bytes)
    return [chunk_bytes] * full + ([rest] if rest else [])


@dataclass(eq=False)
class Copy:
    nbytes: int
    speculative: bool
    issued: float  # host time of the copy call
    key: Hashable  # its destination; a later copy to the same key promotes this one
    chunks: list[int]  # chunk sizes in bytes
    start: float | None = None  # when its first chunk started (committed)
    end: float | None = None  # when its last chunk ended (committed)


class CopyTimeline:
    """One copy engine with a demand queue and a speculative queue (see the module docstring).
    Queue entries are [copy, next chunk index, host time it became available to this queue]."""

    def __init__(
        self, bandwidth_gbps: float, latency: float, priority: str = "fifo", chunk_bytes: int | None = None
    ):
        check_priority(priority, chunk_bytes)
        self.bandwidth_gbps, self.latency = bandwidth_gbps, latency
        self.priority = priority
        self.chunk_bytes = chunk_bytes if priority == "demand" else None  # fifo: whole copies, never chunked
        self.free_at = 0.0  # end of the last committed chunk
        self.demand: deque[list] = deque()
        self.speculative: deque[list] = deque()
        self._last: dict[Hashable, Copy] = {}

    def chunk_seconds(self, nbytes: int) -> float:
        return self.latency + nbytes / (self.bandwidth_gbps * 1e9)  # the EmulatedLink formula, term for term

    def issue(self, now: float, nbytes: int, speculative: bool = False, key: Hashable = None) -> Copy:
        self.advance(now)
        if key is not None:
            prev = self._last.get(key)
            if prev is not None and prev.end is None:
                self.promote(prev, now)  # its slot's bytes must land before ours: keep them in order
            self._last[key] = c = Copy(nbytes, speculative, now, key, [])
        else:
            c = Copy(nbytes, speculative, now, key, [])
        spec = speculative and self.priority == "demand"
        c.chunks = split(nbytes, self.chunk_bytes if spec else None)
        (self.speculative if spec else self.demand).append([c, 0, now])
        return c

    def promote(self, c: Copy, now: float) -> None:
        """A speculative copy is needed now: its chunks not yet started move to the demand queue."""
        self.advance(now)
        for i, entry in enumerate(self.speculative):
            if entry[0] is c:
                del self.speculative[i]
                self.demand.append([c, entry[1], now])
                return

    def advance(self, now: float) -> None:
        """Commit every chunk that starts at or before host time `now` (all copies issued by then are
        known)."""
        self.free_at = self._run(self.free_at, self.demand, self.speculative, now, commit=True)

    def end(self, c: Copy, now: float) -> float:
        """When copy c lands, as known at host time `now` (final if no copy is issued before then)."""
        self.advance(now)
        if c.end is not None:
            return c.end
        dq = deque(list(e) for e in self.demand)
        sq = deque(list(e) for e in self.speculative)
        return self._run(self.free_at, dq, sq, math.inf, commit=False, stop=c)

    def drain(self) -> float:
        """End of run: commit everything queued; returns when the link goes idle."""
        self.advance(math.inf)
        return self.free_at

    def _run(
        self, free_at: float, dq: deque, sq: deque, until: float, commit: bool, stop: Copy | None = None
    ):
        """Start chunks in priority order while their start is <= until. Returns the link's free time,
        or with `stop`, the end of that copy's last chunk."""
        while dq or sq:
            td = max(free_at, dq[0][2]) if dq else math.inf
            ts = max(free_at, sq[0][2]) if sq else math.inf
            q, s = (dq, td) if td <= ts else (sq, ts)  # a waiting demand copy always goes first
            if s > until:
                break
            entry = q[0]
            c, i = entry[0], entry[1]
            free_at = s + self.chunk_seconds(c.chunks[i])
            entry[1] = i + 1
            if commit and i == 0:
                c.start = s
            if entry[1] == len(c.chunks):
                q.popleft()
                if commit:
                    c.end = free_at
                if c is stop:
                    return free_at
        assert stop is None, "asked for the end of a copy that is not queued"
        return free_at


class Event(Protocol):
    def query(self) -> bool: ...


@dataclass(eq=False)
class Held:
    copy: object  # the link's handle for the whole copy
    nbytes: int
    key: Hashable
    chunks: deque = field(default_factory=deque)  # (lo, hi) byte ranges not yet issued


class SpeculativeHold:
    """Demand priority on a real copy stream: speculative chunks wait on the host (see module docstring).

    issue(copy, lo, hi) enqueues bytes [lo, hi) of a held copy on the copy stream and returns an event
    recorded after it; drained() is True when no demand copy is queued or running. The link calls
    `before_copy(key)` before any copy to `key` (a held copy to the same slot is issued first, so the
    slot's bytes land in order), `promote(copy)` when a held copy is demanded, `pump()` at every issue
    point of the engine, and `flush()` at the end of a run."""

    def __init__(
        self,
        issue: Callable[[object, int, int], Event],
        drained: Callable[[], bool],
        chunk_bytes: int,
        depth: int = 1,
    ):
        check_priority("demand", chunk_bytes)
        if depth < 1:
            raise ValueError(f"depth (speculative chunks in flight) must be >= 1, got {depth}")
        self._issue, self.drained = issue, drained
        self.chunk_bytes, self.depth = chunk_bytes, depth
        self.held: deque[Held] = deque()
        self.in_flight: deque[Event] = deque()

    def hold(self, copy, nbytes: int, key: Hashable = None) -> None:
        self.before_copy(key)
        h = Held(copy, nbytes, key)
        lo = 0
        for size in split(nbytes, self.chunk_bytes):
            h.chunks.append((lo, lo + size))
            lo += size
        self.held.append(h)

    def before_copy(self, key: Hashable) -> None:
        if key is not None:
            for h in [h for h in self.held if h.key == key]:
                self._release(h)

    def promote(self, copy) -> None:
        for h in [h for h in self.held if h.copy is copy]:
            self._release(h)

    def pump(self) -> int:
        """Issue held chunks while the demand queue is drained and fewer than `depth` are in flight."""
        n = 0
        while self.held:
            while self.in_flight and self.in_flight[0].query():
                self.in_flight.popleft()
            if len(self.in_flight) >= self.depth or not self.drained():
                break
            h = self.held[0]
            lo, hi = h.chunks.popleft()
            self.in_flight.append(self._issue(h.copy, lo, hi))
            n += 1
            if not h.chunks:
                self.held.popleft()
        return n

    def flush(self) -> None:
        while self.held:
            self._release(self.held[0])

    def _release(self, h: Held) -> None:
        """Issue all of a held copy's remaining chunks now (they go on the stream ahead of what follows)."""
        while h.chunks:
            lo, hi = h.chunks.popleft()
            self.in_flight.append(self._issue(h.copy, lo, hi))
        self.held.remove(h)


class ManualClock:
    """A clock that only moves when slept on: inject it as a link's `clock` and `sleep` to run copies on
    virtual time (tests of the link's arithmetic, virtual-time benchmarks)."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


class VirtualClock(ManualClock):
    """The clock of a virtual-time run (offload/trace_engine.py, clock "virtual"): the run advances it by each
    action's modelled cost, and a link that waits on it jumps exactly to the copy's end (no float drift
    from sleeping a difference), so a wait's length is the stall, to the bit."""

    def advance(self, dt: float) -> None:
        assert dt >= 0, f"virtual time cannot run backwards ({dt})"
        self.t += dt

    def sleep_until(self, deadline: float) -> None:
        self.t = max(self.t, deadline)
