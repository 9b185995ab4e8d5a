"""The CUDA link's logic on the CPU, and close() on both links.

CudaLink runs here on a stub CUDA runtime (offload/links/cuda_stub.StubCuda): streams and events are
bookkeeping, copies run on CPU tensors at once, and an event completes only after `delay` queries (or
never, for a stuck stream), so "the demand copies are not drained yet" happens as it does on a GPU. What
this cannot check (real asynchrony, timing, pinned memory) is in tests/test_cuda.py, which skips without a
GPU; the call sequence of a batch is in tests/test_cuda_link.py.
"""

from __future__ import annotations

import pytest
import torch

import artifact.offload.links.cuda_link as cuda_link_mod
from artifact.offload.links.cuda_link import CudaLink
from artifact.offload.links.cuda_stub import StubCuda
from artifact.offload.links.link import EmulatedLink, LinkClosed, LinkTimeout
from artifact.offload.links.link_factory import make_link
from artifact.offload.links.pacing import calibrate_rate
from artifact.offload.links.timeline import ManualClock


@pytest.fixture
def fake_cuda():
    return StubCuda()


def tensors(n, size=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=g) for _ in range(n)], [torch.zeros(size) for _ in range(n)]


def spy_chunks(link):
    """Log (label, lo, hi) of every held chunk the link issues."""
    log = []
    inner = link._issue_held

    def issue(t, lo, hi):
        log.append((str(t.label), lo, hi))
        return inner(t, lo, hi)

    link._issue_held = issue
    link.hold._issue = issue
    return log


# --- the CUDA link's logic, on the fake -----------------------------------------------------------
def test_fifo_copies_land_and_are_counted(fake_cuda):
    link = CudaLink("cuda", runtime=fake_cuda)
    srcs, dsts = tensors(3)
    tickets = link.copy([(d, s, f"c{i}") for i, (d, s) in enumerate(zip(dsts, srcs))])
    link.wait(tickets)
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs))
    assert link.stats.transfers == 3 and link.stats.bytes == 3 * 4000
    assert len(tickets) == 3 and len({id(t.done) for t in tickets}) == 1, "one event for the batch"
    assert link.finish().busy_seconds > 0
    link.close()


def test_demand_priority_holds_speculative_chunks_until_the_demand_copies_are_done(fake_cuda):
    fake_cuda.delay = 3  # an event completes on its third query
    link = CudaLink("cuda", runtime=fake_cuda, priority="demand", chunk_bytes=1000)
    log = spy_chunks(link)
    (ds, dd), (xd, xs) = tensors(2, seed=1), tensors(2, seed=2)
    link.copy([(dd[0], ds[0], "demand 0")])
    (spec,) = link.copy([(xd[0], xs[0], "spec 0")], speculative=True)  # 4000 bytes: 4 chunks
    assert log == [] and spec.held and not link.landed(spec)
    assert spec.done.query(), "the slot's event was never recorded: query() alone would call it landed"
    link.pump()
    link.pump()  # demand copy's event: done on the third query
    assert log == [("spec 0", 0, 1000)]
    link.pump()
    assert len(log) == 1, "depth 1: the next chunk waits for the one in flight"
    for _ in range(6):
        link.pump()
    assert log[:2] == [("spec 0", 0, 1000), ("spec 0", 1000, 2000)]
    link.wait([spec])  # compute needs it: the rest is issued at once
    assert log[-1] == ("spec 0", 3000, 4000) and not spec.held and torch.equal(xd[0], xs[0])
    assert fake_cuda.compute.waits[-1] is spec.done  # and the compute stream waits on its event
    assert link.stats.transfers == 2 and link.stats.bytes == 8000
    link.finish()
    link.close()


def test_a_demand_copy_into_a_held_copys_slot_lands_after_it(fake_cuda):
    fake_cuda.stuck = True  # nothing ever drains: held copies stay held
    link = CudaLink("cuda", runtime=fake_cuda, priority="demand", chunk_bytes=1000)
    log = spy_chunks(link)
    (src_a, src_b), _ = tensors(2, seed=3)
    slot = torch.zeros(1000)
    link.copy([(torch.zeros(1000), src_b, "demand elsewhere")])
    (held,) = link.copy([(slot, src_a, "spec into slot")], speculative=True)
    assert held.held and log == []
    link.copy([(slot, src_b, "demand into slot")])  # before_copy: the held one goes first
    assert log == [("spec into slot", 0, 4000 // 4)] or log[0][0] == "spec into slot"
    assert not held.held and torch.equal(slot, src_b)  # the later copy's bytes are the slot's


def test_promote_issues_a_held_copy_and_finish_flushes(fake_cuda):
    fake_cuda.stuck = True
    link = CudaLink("cuda", runtime=fake_cuda, priority="demand", chunk_bytes=500)
    log = spy_chunks(link)
    srcs, dsts = tensors(2, seed=4)
    link.copy([(torch.zeros(10), torch.ones(10), "demand")])
    a, b = link.copy([(dsts[0], srcs[0], "a"), (dsts[1], srcs[1], "b")], speculative=True)
    link.promote(b)
    assert [x[0] for x in log] == ["b"] * 8 and a.held
    fake_cuda.stuck = False
    for ev in (link.demand_done,):
        ev.left = 0
    link.finish()
    assert not a.held and torch.equal(dsts[0], srcs[0])


def test_close_drops_held_chunks_and_drains_the_copy_stream(fake_cuda):
    fake_cuda.stuck = True
    link = CudaLink("cuda", runtime=fake_cuda, priority="demand", chunk_bytes=1000, close_timeout_s=0.05)
    srcs, dsts = tensors(2, seed=5)
    link.copy([(dsts[0], srcs[0], "layer 1 expert 3 -> slot 0")])
    (held,) = link.copy([(dsts[1], srcs[1], "prefetch")], speculative=True)
    with pytest.raises(LinkTimeout, match=r"closing the link.*layer 1 expert 3 -> slot 0.*within 0.05 s"):
        link.close()  # the stream never drains: bounded, then raise
    assert held.cancelled and not dsts[1].any(), "a cancelled prefetch must never write"
    assert any(t is dsts[0] for t in cuda_link_mod._QUARANTINE), "an undrained slot is kept, never reused"
    cuda_link_mod._QUARANTINE.clear()
    with pytest.raises(LinkClosed):
        link.copy([(dsts[0], srcs[0], "late")])
    with pytest.raises(LinkClosed):
        link.wait([held])
    link.close()  # idempotent

    fake_cuda.stuck = False
    ok = CudaLink("cuda", runtime=fake_cuda)
    ok.copy([(dsts[0], srcs[0], "x")])
    ok.close()  # drains at once
    assert ok.closed and not ok._dsts


@pytest.mark.parametrize("delay", [1, 2, 5])
def test_engine_on_the_cuda_link_logic_equals_resident(tiny, fake_cuda, delay):
    """The engine with demand priority on the CUDA link's code (fake stream): prefetches held, promoted,
    pumped and flushed; every expert computed from its own weights, so the logits equal the resident run's."""
    from artifact.offload.backend.engine import install, offload
    from artifact.offload.policy.policies import make_policy

    cfg = tiny.cfg
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(8, cfg.vocab_size - 8, (2, cfg.block_length), generator=g)
    pos = torch.arange(cfg.block_length).expand(2, -1)
    ref = [tiny.model(ids, pos), tiny.model(ids + 1, pos)]
    saved = tiny.model.backend
    fake_cuda.delay = delay
    link = CudaLink(
        "cuda", runtime=fake_cuda, priority="demand", chunk_bytes=tiny.cfg.expert_params
    )  # a quarter expert
    log = spy_chunks(link)
    try:
        eng = offload(
            tiny.model, tiny.experts, 6, make_policy("last_step", len(cfg.moe_layers), cfg.num_experts), link
        )
        install(tiny.model, eng)
        out = [tiny.model(ids, pos), tiny.model(ids + 1, pos)]
        stats = eng.finish()
    finally:
        tiny.model.backend = saved
        link.close()
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert len(log) == 4 * stats["speculative_transfers"], "every prefetch went through the hold, in chunks"
    assert (
        stats["speculative_transfers"] > 0
        and stats["transfers"] == stats["demand_misses"] + stats["speculative_transfers"]
    )


def test_make_link_builds_cuda_with_demand_priority(fake_cuda):
    link = make_link("cuda", device="cuda", priority="demand", expert_bytes=24_576, runtime=fake_cuda)
    assert isinstance(link, CudaLink) and link.priority == "demand" and link.hold.chunk_bytes == 24_576
    assert link.rt is fake_cuda and make_link("cuda", device="cuda", runtime=fake_cuda).hold is None
    with pytest.raises(ValueError, match="needs --device cuda"):
        make_link("cuda", device="cpu", priority="demand")


# --- close() after an exception inside a forward, emulated link (the CPU's real path) ----------------
def test_after_an_exception_in_a_forward_no_copy_writes_into_the_slots(tiny, monkeypatch):
    import artifact.offload.runner as runner
    from artifact.model.decode import DecodeConfig
    from artifact.offload.runner import decode_prompts
    from artifact.offload.spec import RunSpec

    engines = []
    inner = runner.build_engine

    def keep(*a, **k):
        engines.append(inner(*a, **k))
        return engines[-1]

    monkeypatch.setattr(runner, "build_engine", keep)
    seen = []

    def boom(demand):
        seen.append(demand)
        if len(seen) == 7:  # mid-forward, prefetches in flight
            raise RuntimeError("injected failure inside a forward")

    prompt = [list(range(10, 50))]
    spec = RunSpec(  # slow: copies stay in flight
        decode=DecodeConfig(gen_length=32), capacity=6, policy="last_step", link_gbps=1e-3
    )
    with tiny.model.listening(boom), pytest.raises(RuntimeError, match="injected failure"):
        decode_prompts(tiny, prompt, 1, spec)
    (eng,) = engines
    assert eng.link.closed
    pending = [t for p in eng.pending.values() for t in p.values() if not t.landed]
    assert pending, "the test needs copies still in flight when the forward failed"
    before = {layer: s.clone() for layer, s in eng.slots.items()}
    for t in pending:
        with pytest.raises(LinkClosed, match="cancelled"):
            eng.link.wait([t])
    assert all(torch.equal(eng.slots[layer], before[layer]) for layer in before)


def test_emulated_close_cancels_what_has_not_landed():
    clock = ManualClock()
    link = EmulatedLink(1e-3, latency_us=0, clock=clock, sleep=clock.sleep)
    src, dst = torch.ones(100), torch.zeros(100)
    (t,) = link.copy([(dst, src, "layer 2 expert 5 -> slot 1")])
    link.close()
    with pytest.raises(LinkClosed, match="layer 2 expert 5 -> slot 1"):
        link.wait([t])
    assert not dst.any() and clock.t == 0
    with pytest.raises(LinkClosed):
        link.copy([(dst, src, "x")])


# --- calibration and pinning ---------------------------------------------------------------------------
@pytest.mark.parametrize("overhead", [0.0, 50e-6, 1e-3])
def test_calibration_is_unbiased_by_a_fixed_overhead_per_measurement(overhead):
    """A known rate behind a fixed cost per timed interval (the host's sync and launch on CUDA): the old
    units / seconds read was low by overhead / (work + overhead); the difference of two sizes is exact."""
    clock = ManualClock()
    rate = 25e9  # bytes per second
    units = 32 << 20  # 1.34 ms of work

    def run(n):
        clock.sleep(overhead + n / rate)

    got = calibrate_rate(run, clock, units)
    assert got == pytest.approx(rate, rel=1e-9)
    biased = units / (overhead + units / rate)
    assert overhead == 0 or biased < 0.97 * rate  # what a plain read would have said
    with pytest.raises(RuntimeError, match="not longer"):
        calibrate_rate(lambda n: clock.sleep(1e-3), clock, 10)  # no work at all: refused


def test_pin_host_is_portable_and_takes_empty_tensors(monkeypatch):
    import artifact.model.memory as memory

    calls = []

    class Cudart:
        def cudaHostRegister(self, ptr, nbytes, flags):  # noqa: N802 (the CUDA runtime's name)
            calls.append((ptr, nbytes, flags))
            return 0

        def cudaHostUnregister(self, ptr):  # noqa: N802
            calls.append(("unregister", ptr))
            return 0

    monkeypatch.setattr(memory.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory.torch.cuda, "cudart", lambda: Cudart())
    monkeypatch.setattr(memory.torch.cuda, "check_error", lambda rc: None)
    empty = torch.empty(0)
    assert memory.pin_host(empty) is empty and calls == []  # nothing to lock, nothing refused
    t = torch.ones(3, 5)
    assert memory.pin_host(t) is t
    assert calls == [(t.data_ptr(), 60, memory.HOST_REGISTER_PORTABLE)] and memory.HOST_REGISTER_PORTABLE == 1
    assert memory.pin_host(t) is t and len(calls) == 1  # registered once
    ptr = t.data_ptr()
    del t
    import gc

    gc.collect()
    assert calls[-1] == ("unregister", ptr)


# --- settings: cuda + demand priority is accepted; what is refused is refused before the load ---------
def test_cuda_link_with_demand_priority_passes_the_settings_check():
    from artifact.errors import SettingError
    from artifact.offload.spec import RunSpec

    # the values alone (RunSpec.check, run when one is made): no GPU is needed to check them
    spec = RunSpec(device="cuda", capacity=8, policy="last_step", link="cuda", link_priority="demand")
    spec.check()
    spec.fits(256)
    with pytest.raises(
        SettingError, match="link cuda computes on the GPU, but device is 'cpu'; use link emulated"
    ):
        RunSpec(capacity=8, link="cuda", link_priority="demand")


def test_generate_cuda_demand_on_a_cpu_machine_fails_only_at_the_device_check(capsys, monkeypatch):
    from test_cli import one_line_error

    import artifact.offload.prepare as prepare
    from artifact.cli import main

    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a GPU")
    monkeypatch.setattr(prepare, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a model"))
    code = main(
        [
            "generate",
            "--prompt",
            "hi",
            "--device",
            "cuda",
            "--link",
            "cuda",
            "--link-priority",
            "demand",
            "--offload",
            "--cache-experts",
            "8",
        ]
    )
    assert one_line_error(capsys, code) == (
        "error: --device cuda asked for, but torch.cuda.is_available() is False"
    )
