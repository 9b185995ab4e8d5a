"""CudaLink: the host-to-device link on a GPU, lean on the host.

Copies go from pinned host rows to device slots, non_blocking, on a dedicated copy stream, one batch per
`copy` call (a layer's misses, or a wave). Per batch, whatever its size, the host issues:

  stream.wait_event(after)   the compute that read the slots is done (only when `after` is given)
  timing pair                start and end events around the copies: busy time, the pacing feedback
  the copies                 one cudaMemcpyBatchAsync where the runtime has it (CUDA >= 12.8, probed once
                             per process with a self-test copy: cuda_batch.py), else one copy_ per copy;
                             capped or chunked, copy_ per chunk with a spin after each (pacing.py)
  one event                  recorded after the copies: the batch's ticket

Every copy of a batch gets the batch as its ticket: a copy lands when its batch does, and compute waits
for it on the GPU timeline (stream.wait_event), never on the host. Byte views and pointers are made once
per tensor object (the engine's store rows and slot rows are made once), so a copy costs two dict
lookups, not two slices.

A bandwidth cap is paced on the GPU timeline by the copy stream itself: after each chunk it spins for the
time that chunk would have taken at the cap minus the time it took (a calibrated torch.cuda._sleep).
With demand priority, speculative copies are held on the host (timeline.SpeculativeHold), each with its
own ticket, and issued chunk by chunk at the engine's issue points (`pump`) while the last demand batch's
event says the demand copies are done; no host thread.

Every CUDA call goes through `runtime`: TorchCuda (torch.cuda, and libcudart for the batched copy) by
default; cuda_stub.StubCuda on the CPU, which records the calls, so the tests and the host-cost benchmark
run this code without a GPU.

close() drops the speculative chunks still held and drains the copy stream (a wait bounded by
close_timeout_s); if that wait times out it keeps the destinations of every copy alive (never freed, so
never reused) and raises LinkTimeout.
"""

from __future__ import annotations

import math

import torch

from artifact.offload.links.cuda_runtime import (
    CudaBatch,
    EventClock,
    HeldCopy,
    TimingPairs,
    torch_cuda,
    wait_event,
)
from artifact.offload.links.link import (
    CLOSE_TIMEOUT_S,
    WAIT_TIMEOUT_S,
    LinkClosed,
    LinkStats,
    LinkTimeout,
    describe,
)
from artifact.offload.links.pacing import Pacing, calibrate_rate
from artifact.offload.links.timeline import REFERENCE_CHUNK_BYTES, SpeculativeHold, check_priority

_QUARANTINE: list = []  # destinations of copies a close() could not drain: kept alive, never reused
VIEW_CACHE = 1 << 16  # tensors whose views a link keeps; past it the cache starts over (fresh views per call)


# ---------------------------------------------------------------------------------------------
# The link
# ---------------------------------------------------------------------------------------------
def _bad_items(items) -> Exception | None:
    """The one-line error for a batch that is not a sequence of (dst, src, label), or None if it is one."""
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            return TypeError(f"copy {i} of the batch is not a (dst, src, label) triple: {item!r:.80}")
        for what, t in zip(("destination", "source"), item[:2]):
            if not isinstance(t, torch.Tensor):
                return TypeError(f"copy {i} ({item[2]}): its {what} is a {type(t).__name__}, not a tensor")
            if not t.is_contiguous():
                return ValueError(
                    f"copy {i} ({item[2]}): its {what} is not contiguous (shape "
                    f"{tuple(t.shape)}, "
                    f"strides {t.stride()})"
                )
    return None


class CudaLink:
    kind = "cuda"

    def __init__(
        self,
        device: torch.device | str = "cuda",
        cap_gbps: float | None = None,
        chunk_bytes: int | None = None,
        timeout_s: float = WAIT_TIMEOUT_S,
        pacing: Pacing | None = None,
        priority: str = "fifo",
        hold_depth: int = 1,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
        runtime=None,
    ):
        """chunk_bytes: under fifo the pacing chunk (None: whole copies); under demand priority the size of
        a held speculative chunk (None: REFERENCE_CHUNK_BYTES). hold_depth: speculative chunks in flight
        at once under demand priority (a demand copy waits for at most that many). runtime: the CUDA calls
        (None: torch.cuda, see TorchCuda)."""
        self.rt = rt = runtime if runtime is not None else torch_cuda()
        if not rt.is_available():
            raise RuntimeError(
                "--link cuda needs a CUDA GPU, and torch.cuda.is_available() is False "
                "(use --link emulated on CPU)"
            )
        if cap_gbps is not None and cap_gbps <= 0:
            raise ValueError(f"bandwidth cap must be > 0 GB/s, got {cap_gbps}")
        check_priority(priority, chunk_bytes)
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaLink copies to a cuda device, got {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", rt.current_device())
        self.stream = rt.stream(self.device)
        self.timeout, self.close_timeout = timeout_s, close_timeout_s
        self.stats = LinkStats()
        self.timing = TimingPairs(rt, on_busy=self._observe)
        self.layer_events: dict[object, object] = {}  # key -> re-recorded "compute that read it done"
        self._views: dict[int, tuple] = {}  # id(t) -> (t, data_ptr, bytes, uint8 view), made once
        self._dsts: dict[int, torch.Tensor] = {}  # dst data_ptr -> the tensor (kept if close times out)
        self._schedules: dict[int, list] = {}  # nbytes -> pacing schedule (reset by feedback)
        self.last: CudaBatch | HeldCopy | None = None
        self.closed = False
        self.priority = priority
        pace_chunk = chunk_bytes if priority == "fifo" else None
        self.pacing = pacing or (
            self._calibrate(cap_gbps, pace_chunk)
            if cap_gbps
            else Pacing(peak_gbps=math.inf, cap_gbps=None, chunk_bytes=pace_chunk)
        )
        self.cap = self.pacing.cap_gbps
        # Paced (a cap, or chunks): copy_ per chunk with its spin. Else whole copies, batched where possible.
        self.paced = self.pacing.cap_gbps is not None or self.pacing.chunk_bytes is not None
        self._batch, self.batch_note = rt.memcpy_batch(self.device)
        self.copy_path = (
            "copy_ per chunk, paced"
            if self.paced
            else "cudaMemcpyBatchAsync"
            if self._batch is not None
            else "copy_ loop"
        )
        self.hold: SpeculativeHold | None = None
        self.demand_done = None  # the last demand batch's event
        if priority == "demand":
            self.hold = SpeculativeHold(
                self._issue_held, self._drained, chunk_bytes or REFERENCE_CHUNK_BYTES, depth=hold_depth
            )

    def _calibrate(self, cap_gbps: float, chunk_bytes: int | None, nbytes: int = 64 << 20) -> Pacing:
        """Peak pinned H2D rate and the spin kernel's cycles per second, timed with CUDA events once at
        construction (not in the hot path); calibrate_rate differences two sizes (half and all of nbytes)."""
        rt = self.rt
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        clock = EventClock(rt, self.stream, self.timeout)
        with rt.on(self.stream):
            peak = calibrate_rate(lambda n: rt.copy(dst[:n], src[:n]), clock, nbytes // 2) / 1e9
            hz = calibrate_rate(rt.sleep, clock, 10_000_000)
        return Pacing(peak_gbps=peak, cap_gbps=cap_gbps, spin_hz=hz, chunk_bytes=chunk_bytes)

    def _observe(self, nbytes: int, seconds: float) -> None:
        self.pacing = self.pacing.observed(nbytes, seconds)
        self._schedules.clear()

    def _view(self, t: torch.Tensor, dst: bool = False) -> tuple:
        """(t, data_ptr, bytes, flat uint8 view), made once per tensor object: the engine's store rows and
        slot rows are made once and outlive the link. The entry keeps t alive, so its id is not reused."""
        v = self._views.get(id(t))
        if v is None:
            if len(self._views) >= VIEW_CACHE:
                self._views.clear()
            nbytes = t.numel() * t.element_size()
            v = self._views[id(t)] = (t, t.data_ptr(), nbytes, t.view(-1).view(torch.uint8))
            if dst:
                self._dsts[v[1]] = t
        return v

    def _schedule(self, nbytes: int) -> list:
        sched = self._schedules.get(nbytes)
        if sched is None:
            sched = self._schedules[nbytes] = self.pacing.schedule(nbytes)
        return sched

    def _pairs(self, items) -> list[tuple]:
        """(dst view, src view) per copy, checked: equal and nonzero bytes (a one-line error otherwise)."""
        cache, view = self._views, self._view
        pairs = []
        try:
            for dst, src, label in items:
                d = cache.get(id(dst)) or view(dst, dst=True)
                s = cache.get(id(src)) or view(src)
                if d[2] != s[2] or not s[2]:
                    raise ValueError(
                        f"{describe(label, s[2])}: its destination holds {d[2]} bytes; a copy "
                        "moves all of its source's bytes, and at least one"
                    )
                pairs.append((d, s))
        except (AttributeError, TypeError, ValueError, RuntimeError) as e:
            bad = _bad_items(items)  # the happy path pays nothing for this check
            if bad is not None:
                raise bad from None
            raise e from None
        return pairs

    def copy(self, items, after=None, speculative: bool = False) -> list:
        if self.closed:
            raise LinkClosed("copy on a closed link")
        if not items:
            return []
        if self.hold is not None and speculative:
            return self._hold(items, after)
        pairs = self._pairs(items)
        if self.hold is not None:
            for d, _ in pairs:  # a held copy into one of these slots goes first
                self.hold.before_copy(d[1])
        rt, stream = self.rt, self.stream
        if self.pacing.cap_gbps is not None:
            self.timing.harvest(window=4)  # pacing feedback from batches that have finished
        total = sum(s[2] for _, s in pairs)
        if after is not None:
            stream.wait_event(after)
        end = self.timing.start(stream, "busy", total)  # after the wait: waiting is not busy
        if self._batch is not None and not self.paced:
            self._batch([d[1] for d, _ in pairs], [s[1] for _, s in pairs], [s[2] for _, s in pairs], stream)
        else:
            with rt.on(stream):  # entered once per batch
                if self.paced:
                    for d, s in pairs:
                        dv, sv = d[3], s[3]
                        for a, b, spin in self._schedule(s[2]):
                            rt.copy(dv[a:b], sv[a:b])
                            if spin:
                                rt.sleep(spin)
                else:
                    for d, s in pairs:
                        rt.copy(d[3], s[3])
        end.record(stream)
        done = rt.event()
        done.record(stream)
        batch = CudaBatch(done, items, total)
        if self.hold is not None:  # drained() reads this: the demand copies issued so far
            self.demand_done = done
        self.stats.transfers += len(pairs)
        self.stats.bytes += total
        self.last = batch
        return [batch] * len(pairs)

    # --- demand priority: speculative copies held on the host (timeline.SpeculativeHold) ------------
    def _hold(self, items, after) -> list[HeldCopy]:
        out = []
        for (d, s), (_, _, label) in zip(self._pairs(items), items):
            t = HeldCopy(self.rt.event(), label, s[2], d[3], s[3], after)
            self.hold.hold(t, t.nbytes, key=d[1])
            self.stats.transfers += 1
            self.stats.bytes += t.nbytes
            out.append(t)
        self.hold.pump()
        return out

    def _drained(self) -> bool:
        return self.demand_done is None or self.demand_done.query()

    def _issue_held(self, t: HeldCopy, lo: int, hi: int):
        """Bytes [lo, hi) of a held copy on the copy stream; returns an event recorded after them."""
        rt, stream = self.rt, self.stream
        if lo == 0 and t.after is not None:
            # `after` is a re-recorded layer event: by now it may mark a later compute of that layer,
            # which only delays this copy (never before the compute that freed its slot).
            stream.wait_event(t.after)
        end = self.timing.start(stream, "busy", hi - lo)
        with rt.on(stream):
            rt.copy(t.d[lo:hi], t.s[lo:hi])
            spin = self.pacing.spin_cycles(hi - lo)
            if spin:
                rt.sleep(spin)
        end.record(stream)
        if hi == t.nbytes:  # its last chunk: the ticket's event is the chunk's
            t.done.record(stream)
            t.held = False
            self.last = t
            return t.done
        ev = rt.event()
        ev.record(stream)
        return ev

    def promote(self, t) -> None:
        """The held copy's expert is demanded: its remaining chunks go on the stream now (a batch: no-op)."""
        if t.held and self.hold is not None:
            self.hold.promote(t)

    def pump(self) -> None:
        if self.hold is not None and self.hold.held:
            self.hold.pump()

    def landed(self, t) -> bool:
        return not t.held and not t.cancelled and t.done.query()

    def ready(self, t) -> bool:
        return True  # issued copies are ordered before compute on the GPU, not by the host

    def wait(self, tickets) -> None:
        if isinstance(tickets, (CudaBatch, HeldCopy)):
            tickets = (tickets,)
        if self.closed:
            raise LinkClosed("wait on a closed link: its copies were drained or cancelled")
        events = {}
        for t in tickets:  # a batch's copies share its event: wait on it once
            if t.held:  # an unrecorded event would not order anything: issue its chunks first
                self.promote(t)
            events[id(t.done)] = t.done
        events = [ev for ev in events.values() if not ev.query()]
        if not events:
            return
        stream = self.rt.current_stream(self.device)
        end = self.timing.start(stream, "stall")  # the compute stream reaches its wait ...
        for ev in events:
            stream.wait_event(ev)
        end.record(stream)  # ... and passes it: the interval is the stall

    def compute_done(self, key):
        ev = self.layer_events.get(key)
        if ev is None:
            ev = self.layer_events[key] = self.rt.event()
        ev.record(self.rt.current_stream(self.device))
        return ev

    def finish(self) -> LinkStats:
        """Land everything (a bounded wait that names the last copy), then read the timing pairs."""
        if self.hold is not None:
            self.hold.flush()
        streams = (self.stream, self.rt.current_stream(self.device))
        for stream in streams:
            ev = self.rt.event()
            ev.record(stream)
            what = self.last.what() if self.last and stream is self.stream else "the compute stream"
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
        ev = self.rt.event()
        ev.record(self.stream)
        last = self.last.what() if self.last else "no copy"
        try:
            wait_event(
                ev, self.close_timeout, f"closing the link: the copy stream's copies (last issued: {last})"
            )
        except LinkTimeout:
            _QUARANTINE.extend(self._dsts.values())
            raise
        finally:
            self._views.clear()
        self._dsts.clear()
