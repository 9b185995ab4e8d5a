"""The host-to-device link: one Protocol, two implementations.

  CudaLink      copies from pinned memory, non_blocking, on a dedicated copy stream, entered once per
                batch of copies (one batch per layer, plus one per wave). Compute waits for a copy on the
                GPU timeline (stream.wait_event), never on the host. Events are preallocated and
                re-recorded: one per destination slot (copy landed), one per layer (compute that read the
                layer's slots done). A bandwidth cap is paced on the GPU timeline by the copy stream
                itself: after each chunk it spins for the time that chunk would have taken at the cap
                minus the time it took (a calibrated torch.cuda._sleep); uncapped, the spin is zero and
                the code path is the same. With demand priority, speculative copies are held on the host
                (timeline.SpeculativeHold) and issued chunk by chunk at the engine's issue points (`pump`)
                while the last demand copy's event says the demand copies are done; no host thread.
  EmulatedLink  for CPU runs: a copy engine on a timeline (offload/timeline.py): FIFO, or with demand
                priority two queues and chunked speculative copies. Each copy (chunk) starts when the
                link is free and takes latency + bytes / bandwidth; `wait` blocks until the copy ends
                (the stall is real wall-clock time) and only then moves the bytes, so a compute that
                skipped its wait would read stale weights and the exactness tests would see it.

Both count transfers, bytes, busy seconds (link occupied) and stall seconds (compute waiting). Every
host-side wait has a timeout and names the copy it waited for.

close() ends a link for good, also after an exception in a forward: once it returns, no copy issued on
the link writes into its destination any more, so the engine's slots may be freed. EmulatedLink moves
bytes only in `wait`, which a closed link refuses. CudaLink drops the speculative chunks it still holds
and drains its copy stream (a wait bounded by close_timeout_s); if that wait times out it keeps the
destinations of every copy alive (never freed, so never reused) and raises LinkTimeout.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from artifact.offload.timeline import (
    PRIORITIES,
    REFERENCE_CHUNK_BYTES,
    Copy,
    CopyTimeline,
    SpeculativeHold,
    check_priority,
)

LINKS = ("emulated", "cuda")
PCIE4_GBPS = 25.0          # effective host-to-device bandwidth of a PCIe 4.0 x16 slot
PCIE_LATENCY_US = 10.0     # per-copy setup cost
REFERENCE_EXPERT_BYTES = 3 * 512 * 2048 * 2    # one LLaDA2.0-mini routed expert in bf16 (6 MiB)
WAIT_TIMEOUT_S = 60.0      # a host-side wait longer than this is a hang, not a slow link: raise
CLOSE_TIMEOUT_S = 10.0     # close(): the copy stream's in-flight copies get this long to land
_QUARANTINE: list = []     # destinations of copies a close() could not drain: kept alive, never reused


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

    def copy(self, items: Sequence[tuple[torch.Tensor, torch.Tensor, str]], after=None,
             speculative: bool = False) -> list:
        """Issue the copies (dst, src, label) in order, all after `after`; one ticket per copy.
        `speculative`: prefetches, which a demand-priority link never lets delay a demand copy."""
        ...

    def landed(self, ticket) -> bool:
        """The copy has completed (a non-blocking query)."""
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

    # priority/chunk_bytes/speculative: the demand-priority link, see offload/timeline.py.
    def __init__(self, bandwidth_gbps: float, latency_us: float = PCIE_LATENCY_US,
                 cap_gbps: float | None = None, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, priority: str = "fifo",
                 chunk_bytes: int | None = None, timeout_s: float = WAIT_TIMEOUT_S,
                 copy_bytes: int | None = None):
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
            self.stats.busy_seconds += sum(self.duration(n) for n in c.chunks)   # latency once per chunk
            out.append(EmulatedTicket(dst, src, c, self, label))
        return out

    def copy_one(self, dst: torch.Tensor, src: torch.Tensor, label: str = "",
                 speculative: bool = False) -> EmulatedTicket:
        return self.copy([(dst, src, label)], speculative=speculative)[0]

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
            if self.closed:          # the bytes move here: a closed link's destinations may be freed
                raise LinkClosed(f"wait for {describe(t.label, t.src.numel() * t.src.element_size())} on a "
                                 "closed link: the copy was cancelled")
            now = self.clock()
            end = t.end            # final: nothing is issued while this thread sleeps
            if now < end:
                if end - now > self.timeout:
                    raise LinkTimeout(f"{describe(t.label, t.src.numel() * t.src.element_size())} lands in "
                                      f"{end - now:.1f} s, beyond the {self.timeout:.0f} s wait timeout "
                                      f"(is the link bandwidth {self.bandwidth_gbps:g} GB/s what you meant?)")
                self._sleep_until(end)
                self.stats.stall_seconds += self.clock() - now
            t.dst.copy_(t.src)
            t.landed = True

    def landed(self, t: EmulatedTicket) -> bool:
        return t.landed or self.clock() >= t.end

    ready = landed          # compute on the CPU host waits on the host: only a landed copy costs nothing

    def compute_done(self, key):
        return None          # CPU compute is synchronous: a slot is free as soon as the call returns

    def _sleep_until(self, deadline: float) -> None:
        exact = getattr(self.clock, "sleep_until", None)
        if exact is not None:          # a virtual clock: jump to the deadline
            exact(deadline)
            return
        while True:          # coarse sleep, then a short spin: time.sleep overshoots by ~0.1 ms
            left = deadline - self.clock()
            if left <= 0:
                return
            if left > 1e-3:
                self.sleep(left - 5e-4)      # > 0.5 ms: never a negative argument
            elif self.sleep is not time.sleep:
                self.sleep(left)

    def pump(self) -> None:
        pass                 # the timeline orders speculative copies itself

    def finish(self) -> LinkStats:
        return self.stats

    def close(self) -> None:
        """Cancel every copy not yet landed: they never move their bytes (wait refuses)."""
        self.closed = True


# ---------------------------------------------------------------------------------------------
# Pacing: pure arithmetic, so it is tested on the CPU with an injected clock
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pacing:
    """How the copy stream paces itself. A chunk of b bytes copies at the measured peak in b / peak
    seconds; the stream then spins (b / cap - b / peak) seconds, so over any run of chunks the rate is
    the cap, on the GPU timeline, with no host thread. Uncapped (cap None, or cap >= peak) the spin is
    zero and nothing else changes: capped and uncapped are the same copies in the same chunks."""
    peak_gbps: float                   # measured pinned H2D rate of a chunk
    cap_gbps: float | None = None
    spin_hz: float = 1.0               # GPU spin cycles per second (torch.cuda._sleep), calibrated
    chunk_bytes: int | None = None     # None: a copy is one chunk (the cap then holds per copy)
    spin_scale: float = 1.0            # feedback: corrects the spin for a peak or clock that drifted

    def __post_init__(self):
        if not self.peak_gbps > 0:
            raise ValueError(f"pacing needs a measured peak > 0 GB/s, got {self.peak_gbps}")
        if self.cap_gbps is not None and not self.cap_gbps > 0:
            raise ValueError(f"bandwidth cap must be > 0 GB/s, got {self.cap_gbps}")
        if self.chunk_bytes is not None and self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {self.chunk_bytes}")
        if not self.spin_hz > 0:
            raise ValueError(f"spin_hz must be > 0, got {self.spin_hz}")

    def chunks(self, nbytes: int) -> list[tuple[int, int]]:
        step = self.chunk_bytes or max(nbytes, 1)
        return [(a, min(a + step, nbytes)) for a in range(0, nbytes, step)]

    def spin_seconds(self, nbytes: int) -> float:
        if self.cap_gbps is None or self.cap_gbps >= self.peak_gbps:
            return 0.0
        return max(0.0, nbytes / (self.cap_gbps * 1e9) - nbytes / (self.peak_gbps * 1e9))

    def spin_cycles(self, nbytes: int) -> int:
        return round(self.spin_seconds(nbytes) * self.spin_hz * self.spin_scale)

    def observed(self, nbytes: int, seconds: float, weight: float = 0.5) -> Pacing:
        """Feedback from one paced batch that took `seconds` on the GPU timeline for `nbytes`: scale the
        spin so the next batch takes nbytes / cap. Expert-sized copies can run below the calibration's
        peak, and the SM clock that times a spin moves with boost; both show up here and are absorbed.
        The step is damped (weight) and bounded (x0.5 .. x2 per batch)."""
        if self.cap_gbps is None or self.cap_gbps >= self.peak_gbps or nbytes <= 0 or not seconds > 0:
            return self
        target = nbytes / (self.cap_gbps * 1e9)
        copy = nbytes / (self.peak_gbps * 1e9)
        ratio = (target - copy) / (seconds - copy) if seconds > copy else 2.0
        ratio = min(2.0, max(0.5, ratio))
        return dataclasses.replace(self, spin_scale=self.spin_scale * ratio ** weight)

    def schedule(self, nbytes: int) -> list[tuple[int, int, int]]:
        """(start, end, spin cycles after it) for each chunk of a copy."""
        return [(a, b, self.spin_cycles(b - a)) for a, b in self.chunks(nbytes)]


def calibrate_rate(run: Callable[[int], None], clock: Callable[[], float], units: int, reps: int = 3) -> float:
    """Units per second of `run(units)` timed by `clock`, free of any fixed cost per measurement.

    Each timed interval holds the work and a fixed overhead: on CUDA the host's sync on the start event,
    the launch that follows and the end event's record (tens of us to ~1 ms of polling), which made a
    plain units / seconds read 2-10 % low, so a capped link ran above its cap. So the rate is read off the
    difference of two sizes: units / (t(2 units) - t(units)), each the best of `reps` (after a warm-up),
    which cancels any overhead that does not grow with the work. On CUDA, `run` enqueues work and
    `clock` is a device-timed clock; the tests inject both (timeline.ManualClock)."""
    if units < 1:
        raise ValueError(f"calibration needs units >= 1, got {units}")
    run(units)

    def best(n: int) -> float:
        b = math.inf
        for _ in range(reps):
            t0 = clock()
            run(n)
            b = min(b, clock() - t0)
        return b

    one, two = best(units), best(2 * units)
    if not one > 0 or not two > 0:
        raise RuntimeError(f"calibration measured {min(one, two)} s for {units} units: the clock did not advance")
    if not two > one:
        raise RuntimeError(f"calibration: {2 * units} units took {two:.3g} s, not longer than {units} units "
                           f"({one:.3g} s); the measurement is noise, not the work")
    return units / (two - one)


# ---------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class CudaTicket:
    done: object            # torch.cuda.Event of the destination slot, re-recorded by every copy into it
    label: object           # str() names the copy (built only when a message needs it)
    nbytes: int
    # Demand priority only: a speculative copy held on the host until its chunks are issued.
    d: object = None        # destination bytes (uint8 view)
    s: object = None        # source bytes (uint8 view)
    after: object = None    # the event its first chunk waits for on the copy stream
    held: bool = False      # some chunks not yet on the stream: `done` does not describe this copy yet
    cancelled: bool = False  # dropped by close(): it never lands


class _TimingPairs:
    """Timing event pairs from a pool, harvested without a host sync once their end has passed."""

    def __init__(self, on_busy: Callable[[int, float], None] | None = None):
        self.free: list[tuple] = []
        self.live: list[tuple] = []         # (start, end, kind, bytes)
        self.seconds = {"busy": 0.0, "stall": 0.0}
        self.on_busy = on_busy              # (bytes, seconds) of each finished busy pair: the pacing feedback

    def start(self, stream, kind: str, nbytes: int = 0):
        if not self.free:
            self.harvest()
        if self.free:
            s, e = self.free.pop()
        else:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
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


class CudaLink:
    kind = "cuda"

    def __init__(self, device: torch.device | str = "cuda", cap_gbps: float | None = None,
                 chunk_bytes: int | None = None, timeout_s: float = WAIT_TIMEOUT_S,
                 pacing: Pacing | None = None, priority: str = "fifo", hold_depth: int = 1,
                 close_timeout_s: float = CLOSE_TIMEOUT_S):
        """chunk_bytes: under fifo the pacing chunk (None: whole copies); under demand priority the size of
        a held speculative chunk (None: REFERENCE_CHUNK_BYTES). hold_depth: speculative chunks in flight
        at once under demand priority (a demand copy waits for at most that many)."""
        if not torch.cuda.is_available():
            raise RuntimeError("--link cuda needs a CUDA GPU, and torch.cuda.is_available() is False "
                               "(use --link emulated on CPU)")
        if cap_gbps is not None and cap_gbps <= 0:
            raise ValueError(f"bandwidth cap must be > 0 GB/s, got {cap_gbps}")
        check_priority(priority, chunk_bytes)
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(self.device)
        self.timeout, self.close_timeout = timeout_s, close_timeout_s
        self.stats = LinkStats()
        self.timing = _TimingPairs(on_busy=self._observe)
        self.slot_events: dict[int, object] = {}        # dst data_ptr -> its re-recorded "landed" event
        self.layer_events: dict[object, object] = {}    # key -> re-recorded "compute that read it done"
        self._bytes: dict[int, object] = {}             # data_ptr -> uint8 view of a tensor (made once)
        self._dsts: dict[int, torch.Tensor] = {}        # dst data_ptr -> the tensor (kept if close times out)
        self._schedules: dict[int, list] = {}           # nbytes -> pacing schedule (reset by feedback)
        self.last: CudaTicket | None = None
        self.closed = False
        self.priority = priority
        pace_chunk = chunk_bytes if priority == "fifo" else None
        self.pacing = pacing or (self._calibrate(cap_gbps, pace_chunk) if cap_gbps else
                                 Pacing(peak_gbps=math.inf, cap_gbps=None, chunk_bytes=pace_chunk))
        self.cap = self.pacing.cap_gbps
        self.hold: SpeculativeHold | None = None
        self.demand_done = None                         # event after the last demand batch on the copy stream
        if priority == "demand":
            self.hold = SpeculativeHold(self._issue_held, self._drained, chunk_bytes or REFERENCE_CHUNK_BYTES,
                                        depth=hold_depth)

    def _calibrate(self, cap_gbps: float, chunk_bytes: int | None, nbytes: int = 64 << 20) -> Pacing:
        """Peak pinned H2D rate and the spin kernel's cycles per second, timed with CUDA events once at
        construction (not in the hot path); calibrate_rate differences two sizes (half and all of nbytes)."""
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        clock = _EventClock(self.stream, self.timeout)
        with torch.cuda.stream(self.stream):
            peak = calibrate_rate(lambda n: dst[:n].copy_(src[:n], non_blocking=True), clock, nbytes // 2) / 1e9
            hz = calibrate_rate(torch.cuda._sleep, clock, 10_000_000)
        return Pacing(peak_gbps=peak, cap_gbps=cap_gbps, spin_hz=hz, chunk_bytes=chunk_bytes)

    def _observe(self, nbytes: int, seconds: float) -> None:
        self.pacing = self.pacing.observed(nbytes, seconds)
        self._schedules.clear()

    def _as_bytes(self, t: torch.Tensor):
        """t's bytes as a flat uint8 view, made once per tensor (slots and store rows are long-lived)."""
        ptr = t.data_ptr()
        v = self._bytes.get(ptr)
        if v is None or v.numel() != t.numel() * t.element_size():
            v = self._bytes[ptr] = t.view(-1).view(torch.uint8)
        return v

    def _schedule(self, nbytes: int) -> list:
        sched = self._schedules.get(nbytes)
        if sched is None:
            sched = self._schedules[nbytes] = self.pacing.schedule(nbytes)
        return sched

    def _slot_event(self, dst: torch.Tensor):
        ptr = dst.data_ptr()
        ev = self.slot_events.get(ptr)
        if ev is None:
            ev = self.slot_events[ptr] = torch.cuda.Event()
            self._dsts[ptr] = dst
        return ev

    def copy(self, items, after=None, speculative: bool = False) -> list[CudaTicket]:
        if self.closed:
            raise LinkClosed("copy on a closed link")
        out = []
        if not items:
            return out
        if self.hold is not None:
            if speculative:
                return self._hold(items, after)
            for dst, _, _ in items:                   # a held copy into one of these slots goes first
                self.hold.before_copy(dst.data_ptr())
        if self.pacing.cap_gbps is not None:
            self.timing.harvest(window=4)             # pacing feedback from batches that have finished
        views = [(self._as_bytes(dst), self._as_bytes(src), dst, label) for dst, src, label in items]
        total = sum(s.numel() for _, s, _, _ in views)
        with torch.cuda.stream(self.stream):          # entered once per batch
            if after is not None:
                self.stream.wait_event(after)
            end = self.timing.start(self.stream, "busy", total)   # after the wait: waiting is not busy
            for d, s, dst, label in views:
                nbytes = s.numel()
                for a, b, spin in self._schedule(nbytes):
                    d[a:b].copy_(s[a:b], non_blocking=True)
                    if spin:
                        torch.cuda._sleep(spin)
                ev = self._slot_event(dst)
                ev.record(self.stream)
                out.append(CudaTicket(ev, label, nbytes))
            end.record(self.stream)
            if self.hold is not None:                 # drained() reads this: the demand copies issued so far
                if self.demand_done is None:
                    self.demand_done = torch.cuda.Event()
                self.demand_done.record(self.stream)
        self.stats.transfers += len(out)
        self.stats.bytes += total
        self.last = out[-1]
        return out

    # --- demand priority: speculative copies held on the host (timeline.SpeculativeHold) ------------
    def _hold(self, items, after) -> list[CudaTicket]:
        out = []
        for dst, src, label in items:
            d, s = self._as_bytes(dst), self._as_bytes(src)
            t = CudaTicket(self._slot_event(dst), label, s.numel(), d, s, after, held=True)
            self.hold.hold(t, t.nbytes, key=dst.data_ptr())
            self.stats.transfers += 1
            self.stats.bytes += t.nbytes
            out.append(t)
        self.hold.pump()
        return out

    def _drained(self) -> bool:
        return self.demand_done is None or self.demand_done.query()

    def _issue_held(self, t: CudaTicket, lo: int, hi: int):
        """Bytes [lo, hi) of a held copy on the copy stream; returns an event recorded after them."""
        with torch.cuda.stream(self.stream):
            if lo == 0 and t.after is not None:
                # `after` is a re-recorded layer event: by now it may mark a later compute of that layer,
                # which only delays this copy (never before the compute that freed its slot).
                self.stream.wait_event(t.after)
            end = self.timing.start(self.stream, "busy", hi - lo)
            t.d[lo:hi].copy_(t.s[lo:hi], non_blocking=True)
            spin = self.pacing.spin_cycles(hi - lo)
            if spin:
                torch.cuda._sleep(spin)
            end.record(self.stream)
            if hi == t.nbytes:
                t.done.record(self.stream)
                t.held = False
                self.last = t
            ev = torch.cuda.Event()
            ev.record(self.stream)
        return ev

    def promote(self, t: CudaTicket) -> None:
        """The held copy's expert is demanded: its remaining chunks go on the stream now."""
        if t.held and self.hold is not None:
            self.hold.promote(t)

    def pump(self) -> None:
        if self.hold is not None and self.hold.held:
            self.hold.pump()

    def landed(self, t: CudaTicket) -> bool:
        return not t.held and not t.cancelled and t.done.query()

    def ready(self, t: CudaTicket) -> bool:
        return True          # issued copies are ordered before compute on the GPU, not by the host

    def wait(self, tickets) -> None:
        if isinstance(tickets, CudaTicket):
            tickets = (tickets,)
        if self.closed:
            raise LinkClosed("wait on a closed link: its copies were drained or cancelled")
        for t in tickets:
            if t.held:       # an unrecorded event would not order anything: issue its chunks first
                self.promote(t)
        tickets = [t for t in tickets if not t.done.query()]
        if not tickets:
            return
        stream = torch.cuda.current_stream(self.device)
        end = self.timing.start(stream, "stall")          # the compute stream reaches its wait ...
        for t in tickets:
            stream.wait_event(t.done)
        end.record(stream)                                # ... and passes it: the interval is the stall

    def compute_done(self, key):
        ev = self.layer_events.get(key)
        if ev is None:
            ev = self.layer_events[key] = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def finish(self) -> LinkStats:
        """Land everything (a bounded wait that names the last copy), then read the timing pairs."""
        if self.hold is not None:
            self.hold.flush()
        streams = (self.stream, torch.cuda.current_stream(self.device))
        for stream in streams:
            ev = torch.cuda.Event()
            ev.record(stream)
            what = describe(self.last.label, self.last.nbytes) if self.last and stream is self.stream else \
                "the compute stream"
            wait_event(ev, self.timeout, what)
        self.timing.harvest(everything=True)
        self.stats.busy_seconds += self.timing.seconds["busy"]
        self.stats.stall_seconds += self.timing.seconds["stall"]
        self.timing.seconds = {"busy": 0.0, "stall": 0.0}
        return self.stats

    def close(self) -> None:
        """Drop the held speculative chunks (they never land), then drain the copy stream within
        close_timeout_s. Past it, every destination this link ever wrote is kept alive for the life of
        the process (_QUARANTINE: a copy still in flight cannot land in reused memory) and LinkTimeout
        is raised. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.hold is not None:
            for h in self.hold.held:
                h.copy.cancelled = True
            self.hold.held.clear()
        ev = torch.cuda.Event()
        ev.record(self.stream)
        last = describe(self.last.label, self.last.nbytes) if self.last else "no copy"
        try:
            wait_event(ev, self.close_timeout, f"closing the link: the copy stream's copies (last issued: {last})")
        except LinkTimeout:
            _QUARANTINE.extend(self._dsts.values())
            raise
        finally:
            self._bytes.clear()
        self._dsts.clear()


def wait_event(ev, timeout_s: float, what: str, clock: Callable[[], float] = time.perf_counter,
               sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll `ev.query()` until it is done; past timeout_s raise LinkTimeout naming `what`."""
    t0 = clock()
    pause = 1e-5
    while not ev.query():
        if clock() - t0 > timeout_s:
            raise LinkTimeout(f"{what} did not complete within {timeout_s:g} s (the copy stream or the "
                              "compute it waits for is stuck)")
        sleep(pause)
        pause = min(pause * 2, 1e-3)


class _EventClock:
    """A clock in seconds read off CUDA events on one stream (calibration only: it syncs the host)."""

    def __init__(self, stream, timeout_s: float):
        self.stream, self.timeout = stream, timeout_s
        self.origin = torch.cuda.Event(enable_timing=True)
        self.origin.record(stream)

    def __call__(self) -> float:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        wait_event(ev, self.timeout, "a calibration copy")
        return self.origin.elapsed_time(ev) / 1e3


def make_link(kind: str, *, device="cpu", bandwidth_gbps: float | None = None, latency_us: float = PCIE_LATENCY_US,
              cap_gbps: float | None = None, expert_bytes: int | None = None, priority: str = "fifo",
              chunk_bytes: int | None = None, clock=None):
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
        caps = [c for c in (cap_gbps, bandwidth_gbps) if c]
        if chunk_bytes is None and priority == "demand":     # as on the emulated link: one expert per chunk
            chunk_bytes = expert_bytes if expert_bytes else REFERENCE_CHUNK_BYTES
        return CudaLink(device, cap_gbps=min(caps) if caps else None, priority=priority,
                        chunk_bytes=chunk_bytes if priority == "demand" else None)
    if bandwidth_gbps is None:
        if expert_bytes is None:
            raise ValueError("the emulated link needs bandwidth_gbps or expert_bytes to scale its default")
        bandwidth_gbps = emulated_bandwidth_gbps(expert_bytes)
    if chunk_bytes is None and priority == "demand":
        # One expert per chunk: a demand copy waits for at most one speculative expert copy. Smaller chunks pay
        # the per-copy latency again each (measured: 1/6-expert chunks made demand priority slower than fifo).
        chunk_bytes = expert_bytes if expert_bytes else REFERENCE_CHUNK_BYTES
    if clock is not None:              # virtual time (timeline.VirtualClock): copies of `expert_bytes` each
        return EmulatedLink(bandwidth_gbps, latency_us, cap_gbps, clock=clock, sleep=clock.sleep, priority=priority,
                            chunk_bytes=chunk_bytes, timeout_s=math.inf, copy_bytes=expert_bytes)
    return EmulatedLink(bandwidth_gbps, latency_us, cap_gbps, priority=priority, chunk_bytes=chunk_bytes)
