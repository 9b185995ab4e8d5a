"""The demand-priority link: the two-queue timeline (injected clock), its EmulatedLink, the CUDA
holding logic with fake callables, and the engine's issue order and counts under both priorities."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from artifact.model.decode import DecodeConfig
from artifact.offload.links.link import EmulatedLink, scaled_chunk_bytes
from artifact.offload.links.link_factory import make_link
from artifact.offload.links.timeline import CopyTimeline, ManualClock, SpeculativeHold, split
from artifact.offload.replay.sim import replay
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

MB = 1_000_000
COUNTS = (
    "demand_hits",
    "demand_misses",
    "speculative_transfers",
    "prefetch_hits",
    "wasted_prefetches",
    "bytes_h2d",
)


FakeClock = ManualClock  # virtual time: the clock moves only when slept on


def links(chunk=100_000, latency_us=0.0):
    clock = FakeClock()
    return clock, {
        p: EmulatedLink(1.0, latency_us, clock=clock, sleep=clock.sleep, priority=p, chunk_bytes=chunk)
        for p in ("fifo", "demand")
    }


# --- the timeline ------------------------------------------------------------------------------
@pytest.mark.parametrize("priority", ["fifo", "demand"])
def test_a_demand_copy_behind_queued_speculative_copies(priority):
    """1 GB/s, no latency: 1 MB = 1 ms, a 100 kB chunk = 0.1 ms. Four speculative copies are queued at
    t=0; a demand copy issued at 0.25 ms starts within one chunk under demand, after all four under fifo."""
    clock, by = links()
    link = by[priority]
    x = torch.zeros(MB // 4)  # 1 MB of float32
    spec = [link.copy([(torch.empty_like(x), x, "")], speculative=True)[0] for _ in range(4)]
    assert spec[0].end == pytest.approx(1e-3)
    clock.t = 0.25e-3
    d = link.copy([(torch.empty_like(x), x, "")])[0]
    start = link.timeline.end(d.copy, clock()) - 1e-3
    if priority == "demand":
        assert 0.25e-3 <= start <= 0.25e-3 + 0.1e-3 + 1e-12
        assert start == pytest.approx(0.3e-3)  # the chunk on the engine finishes first
        assert spec[0].end == pytest.approx(2e-3), "the speculative copy resumes after the demand copy"
    else:
        assert start == pytest.approx(4e-3)
    assert max(s.end for s in spec + [d]) == pytest.approx(5e-3), "the link stays busy either way"


def test_chunking_keeps_bytes_and_adds_only_per_chunk_latency():
    _, by = links(chunk=300_000, latency_us=10.0)
    x = torch.zeros(MB // 4)
    for link in by.values():
        for i in range(6):
            link.copy([(torch.empty_like(x), x, "")], speculative=i % 2 == 0)[0]
    fifo, demand = by["fifo"].stats, by["demand"].stats
    assert fifo.bytes == demand.bytes == 6 * MB and fifo.transfers == demand.transfers == 6
    chunks = len(split(MB, 300_000))  # 300k, 300k, 300k, 100k
    assert chunks == 4
    assert demand.busy_seconds - fifo.busy_seconds == pytest.approx(3 * (chunks - 1) * 10e-6)
    # no idle gaps: work-conserving
    assert by["demand"].timeline.drain() == pytest.approx(demand.busy_seconds)


def today_fifo_ends(issues, bandwidth_gbps, latency):
    """The EmulatedLink before priorities, verbatim in effect: start = max(now, free_at)."""
    free_at, ends = 0.0, []
    for now, nbytes in issues:
        start = max(now, free_at)
        free_at = start + (latency + nbytes / (bandwidth_gbps * 1e9))  # d = duration(nbytes), then start + d
        ends.append(free_at)
    return ends


def test_fifo_reproduces_the_old_end_times_exactly():
    rng = random.Random(0)
    t, issues = 0.0, []
    for _ in range(300):
        t += rng.choice([0.0, rng.random() * 2e-4])
        issues.append((t, rng.randint(1, 60_000)))
    tl = CopyTimeline(0.1, 10e-6, "fifo", chunk_bytes=1000)  # chunk_bytes is ignored under fifo
    copies, ends = [], []
    for i, (now, nbytes) in enumerate(issues):
        copies.append(tl.issue(now, nbytes, speculative=i % 3 == 0, key=i % 7))
        if i % 5 == 0:  # ask at issue time, like wait/ready do
            ends.append((i, tl.end(copies[-1], now)))
    ref = today_fifo_ends(issues, 0.1, 10e-6)
    assert all(e == ref[i] for i, e in ends)  # bit-identical, not approximately
    tl.drain()
    assert [c.end for c in copies] == ref


def test_end_times_are_lazy_a_later_demand_copy_delays_a_queued_speculative_one():
    tl = CopyTimeline(1.0, 0.0, "demand", chunk_bytes=100_000)
    s = tl.issue(0.0, MB, speculative=True)
    assert tl.end(s, 0.0) == pytest.approx(1e-3)  # as known at t=0
    tl.issue(0.5e-3, MB)  # a demand copy arrives mid-way
    assert tl.end(s, 0.5e-3) == pytest.approx(2e-3)
    assert s.start == 0.0


def test_promoted_speculative_copy_goes_before_later_demand_copies():
    tl = CopyTimeline(1.0, 0.0, "demand", chunk_bytes=100_000)
    a = tl.issue(0.0, MB, speculative=True)
    b = tl.issue(0.0, MB, speculative=True)
    tl.promote(b, 0.05e-3)  # b's expert is demanded
    d = tl.issue(0.05e-3, MB)
    tl.drain()
    assert b.end == pytest.approx(1.1e-3), "b runs right after a's first chunk"
    assert d.end == pytest.approx(2.1e-3) and a.end == pytest.approx(3e-3)


def test_a_copy_into_a_slot_lands_after_the_earlier_speculative_copy_into_it():
    tl = CopyTimeline(1.0, 0.0, "demand", chunk_bytes=100_000)
    s = tl.issue(0.0, MB, speculative=True, key="slot3")
    other = tl.issue(0.0, MB, speculative=True, key="slot4")
    d = tl.issue(0.1e-3, MB, key="slot3")
    tl.drain()
    assert s.end <= d.start, "the slot's bytes must land in issue order"
    assert other.end > d.end


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 3e-4), st.integers(1, 400_000), st.booleans()), min_size=1, max_size=40),
    st.integers(1_000, 200_000),
)
def test_demand_priority_delays_a_demand_copy_by_at_most_one_chunk(copies, chunk):
    """Property: a demand copy starts by max(its issue, the previous demand copy's end) + one chunk."""
    bw, lat = 1.0, 5e-6
    tl = CopyTimeline(bw, lat, "demand", chunk_bytes=chunk)
    t, out = 0.0, []
    for gap, nbytes, spec in copies:
        t += gap
        out.append((t, tl.issue(t, nbytes, speculative=spec), spec))
    busy = sum(tl.chunk_seconds(n) for _, c, _ in out for n in c.chunks)
    assert tl.drain() >= busy - 1e-12
    prev_end = 0.0
    for issued, c, spec in out:
        if not spec:
            assert c.start <= max(issued, prev_end) + tl.chunk_seconds(chunk) + 1e-12
            prev_end = c.end
    assert sum(c.nbytes for _, c, _ in out) == sum(sum(c.chunks) for _, c, _ in out)


def test_emulated_link_waits_for_the_lazily_known_end_and_moves_bytes_then():
    clock, by = links()
    link = by["demand"]
    src = torch.arange(MB // 4, dtype=torch.float32)
    dst = torch.zeros_like(src)
    s = link.copy([(dst, src, "")], speculative=True)[0]
    clock.t = 0.5e-3
    d = link.copy([(torch.empty_like(src), src, "")])[0]
    assert not link.ready(s) and not dst.any()
    link.wait(s)  # delayed by the demand copy: 2 ms, not 1
    assert clock.t == pytest.approx(2e-3) and torch.equal(dst, src)
    assert link.stats.stall_seconds == pytest.approx(1.5e-3) and link.ready(d)


def test_priority_settings_are_checked():
    with pytest.raises(ValueError, match="unknown link priority 'lifo'"):
        EmulatedLink(1.0, priority="lifo")
    with pytest.raises(ValueError, match="chunk_bytes must be a positive integer"):
        EmulatedLink(1.0, priority="demand", chunk_bytes=0)
    with pytest.raises(ValueError, match="unknown link priority"):
        RunSpec(capacity=4, link_priority="urgent")
    link = make_link("emulated", expert_bytes=24_576, priority="demand")
    assert link.priority == "demand" and link.chunk_bytes == 24_576  # one expert per chunk
    assert scaled_chunk_bytes(24_576) == 4096
    assert make_link("emulated", expert_bytes=24_576).priority == "fifo"


# --- the CUDA holding logic, with fake callables ---------------------------------------------------
class FakeEvent:
    def __init__(self):
        self.done = False

    def query(self):
        return self.done


class FakeStream:
    """Records what the holder issues, in stream order."""

    def __init__(self):
        self.issued: list[tuple[str, int, int]] = []
        self.events: list[FakeEvent] = []
        self.demand_busy = False

    def issue(self, copy, lo, hi):
        self.issued.append((copy, lo, hi))
        self.events.append(FakeEvent())
        return self.events[-1]

    def drained(self):
        return not self.demand_busy


def test_hold_issues_one_chunk_at_a_time_and_only_while_demand_is_drained():
    s = FakeStream()
    h = SpeculativeHold(s.issue, s.drained, chunk_bytes=100)
    h.hold("a", 250, key=1)
    h.hold("b", 100, key=2)
    s.demand_busy = True
    assert h.pump() == 0 and s.issued == []
    s.demand_busy = False
    assert h.pump() == 1 and s.issued == [("a", 0, 100)]
    assert h.pump() == 0, "depth 1: the next chunk waits for the one in flight"
    s.events[-1].done = True
    assert h.pump() == 1 and s.issued[-1] == ("a", 100, 200)
    s.events[-1].done = True
    s.demand_busy = True  # a demand copy was queued meanwhile
    assert h.pump() == 0
    s.demand_busy = False
    h.pump()
    s.events[-1].done = True
    h.pump()
    assert s.issued == [("a", 0, 100), ("a", 100, 200), ("a", 200, 250), ("b", 0, 100)]
    assert not h.held


def test_hold_releases_a_slots_chunks_before_a_new_copy_into_it_and_on_promote_and_flush():
    s = FakeStream()
    h = SpeculativeHold(s.issue, s.drained, chunk_bytes=100, depth=2)
    h.hold("a", 300, key="slot0")
    h.hold("b", 200, key="slot1")
    h.hold("c", 100, key="slot2")
    h.before_copy("slot1")  # a demand copy into slot1 follows
    assert s.issued == [("b", 0, 100), ("b", 100, 200)]
    h.promote("c")
    assert s.issued[-1] == ("c", 0, 100) and [x.copy for x in h.held] == ["a"]
    h.flush()
    assert [x for x in s.issued if x[0] == "a"] == [("a", 0, 100), ("a", 100, 200), ("a", 200, 300)]
    assert not h.held
    with pytest.raises(ValueError, match="depth"):
        SpeculativeHold(s.issue, s.drained, 100, depth=0)


# --- the engine -----------------------------------------------------------------------------------
DC = DecodeConfig(gen_length=32)


class LoggingLink(EmulatedLink):
    """The real emulated link; it also logs each copy's kind, to check the engine's issue order."""

    def __init__(self, log, **kw):
        super().__init__(1e9, 0.0, **kw)  # fast: order matters here, not time
        self.log = log

    def copy(self, items, after=None, speculative=False):
        self.log.extend(("S" if speculative else "D") for _ in items)
        return super().copy(items, after=after, speculative=speculative)


@pytest.mark.parametrize("priority", ["fifo", "demand"])
def test_engine_issues_speculative_loads_after_all_demand_loads_of_the_layer(tiny, tiny_prompts, priority):
    from artifact.model.decode import generate
    from artifact.model.options import ForwardOptions
    from artifact.offload.backend.engine import offload
    from artifact.offload.policy.policies import make_policy

    log: list[str] = []
    cfg = tiny.cfg
    pol = make_policy("last_step", len(cfg.moe_layers), cfg.num_experts, engine=True)
    link = LoggingLink(log, priority=priority, chunk_bytes=4096)
    model = tiny.model
    engine = offload(model, tiny.experts, 8, pol, link)  # C=8 < W: misses stream in waves
    with model.listening(lambda d: log.append("|")):
        generate(model, tiny_prompts[:1], DC, options=ForwardOptions(backend=engine))
    engine.finish()
    layers = "".join(log).split("|")
    assert any("S" in x and x.count("D") > 8 for x in layers), "the check needs waves and prefetches together"
    for x in layers:
        assert "SD" not in x, f"a demand copy was issued after a speculative one: {x}"


@pytest.mark.parametrize(
    "policy",
    ["demand", "last_step", "last_step:lookahead=2", "last_step_conservative", "cross_layer", "oracle"],
)
def test_engine_counts_equal_replay_under_demand_priority(tiny, tiny_prompts, policy):
    ids = ["a", "b"]
    rec = decode_prompts(tiny, tiny_prompts[:2], 2, RunSpec(decode=DC), record=True, prompt_ids=ids)
    out = {}
    for prio in ("fifo", "demand"):
        spec = RunSpec(decode=DC, capacity=12, policy=policy, link_priority=prio)
        out[prio] = decode_prompts(
            tiny,
            tiny_prompts[:2],
            2,
            spec,
            record=True,
            prompt_ids=ids,
            oracle=rec.trace if policy == "oracle" else None,
        )
        assert out[prio].tokens == rec.tokens and out[prio].stats.link_priority == prio
    sim = replay(out["demand"].trace, policy, 12)
    for k in COUNTS:
        assert getattr(out["demand"].stats, k) == sim[k] == getattr(out["fifo"].stats, k), k
    assert out["demand"].stats.link_bytes == out["fifo"].stats.link_bytes
    if policy not in ("demand", "last_step_conservative"):  # conservative never transfers (docs/policies.md)
        assert sim["speculative_transfers"] > 0
