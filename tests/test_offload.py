"""The offloaded engine: same tokens and bits as the resident model, a cache that never exceeds C,
compulsory misses only at C = E, an emulated link that follows its timing model, clear errors."""

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from artifact.cli import main
from artifact.model.decode import DecodeConfig
from artifact.model.routing import StepInfo
from artifact.offload.backend.cache import ExpertCache, LayerCache
from artifact.offload.backend.plans import EMPTY
from artifact.offload.backend.store import HostStore
from artifact.offload.links.link import EmulatedLink, emulated_bandwidth_gbps
from artifact.offload.links.link_factory import make_link
from artifact.offload.links.timeline import ManualClock
from artifact.offload.policy.policies import make_policy
from artifact.offload.policy.prefetch_base import TraceFuture
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

DC = DecodeConfig(gen_length=40)


@pytest.fixture(scope="module")
def resident(tiny, tiny_prompts):
    """Resident reference run on two prompts (a batch), with per-step logits and the trace."""
    return decode_prompts(tiny, tiny_prompts[:2], 2, RunSpec(decode=DC), record=True, record_logits=True)


def same_bits(a, b):
    return (
        a.tokens == b.tokens
        and all(
            torch.equal(x.step_logits[k], y.step_logits[k])
            for x, y in zip(a.generations, b.generations)
            for k in y.step_logits
        )
        and all(x.step_logits.keys() == y.step_logits.keys() for x, y in zip(a.generations, b.generations))
    )


@pytest.mark.parametrize(
    "capacity, policy",
    [(1, "demand"), (20, "demand"), (256, "demand"), (20, "last_step"), (20, "interval_refresh")],
)
def test_offloaded_equals_resident_bit_for_bit(tiny, tiny_prompts, resident, capacity, policy):
    from artifact.offload.replay.trace import mean_working_set

    assert capacity < mean_working_set(resident.trace) or capacity == 256 or capacity == 1
    off = decode_prompts(
        tiny,
        tiny_prompts[:2],
        2,
        RunSpec(decode=DC, capacity=capacity, policy=policy),
        record_logits=True,
    )
    assert off.tokens == resident.tokens
    assert same_bits(off, resident)
    assert off.stats.demand_misses > 0 and off.stats.cache_experts == capacity


def test_oracle_run_is_exact_too(tiny, tiny_prompts, resident):
    off = decode_prompts(
        tiny,
        tiny_prompts[:2],
        2,
        RunSpec(decode=DC, capacity=20, policy="oracle"),
        oracle=resident.trace,
        record_logits=True,
    )
    assert same_bits(off, resident)
    assert off.stats.speculative_transfers > 0


def test_full_capacity_has_only_compulsory_misses(tiny, tiny_prompts, resident):
    off = decode_prompts(tiny, tiny_prompts[:2], 2, RunSpec(decode=DC, capacity=256, policy="demand"))
    t = resident.trace
    pairs = {
        (int(layer), int(e))
        for n, layer in enumerate(t.layer)
        for e in t.experts[t.offsets[n] : t.offsets[n + 1]]
    }
    assert off.stats.demand_misses == len(pairs)
    assert off.stats.demand_hits + off.stats.demand_misses == t.accesses
    assert off.stats.bytes_h2d == len(pairs) * tiny.cfg.expert_params * 4


# --- the cache, on random demand streams ------------------------------------------------------
def demand_streams(max_layers=3, max_steps=12):
    E = 32
    return st.tuples(
        st.integers(1, max_layers),
        st.integers(1, E),
        st.lists(
            st.lists(st.sets(st.integers(0, E - 1), min_size=1, max_size=E), min_size=1, max_size=max_layers),
            min_size=1,
            max_size=max_steps,
        ),
        st.sampled_from(["demand", "last_step", "oracle", "interval_refresh", "belady"]),
        st.integers(1, 3),
    )


class Ev:
    def __init__(self, step, layer, experts):
        self.step, self.layer = step, layer
        self.experts = tuple(sorted(experts))
        self.counts = tuple((e * 7 + step.forward) % 5 + 1 for e in self.experts)


def events_of(num_layers, steps):
    out = []
    for t, step in enumerate(steps):
        for i in range(num_layers):
            out.append(Ev(StepInfo(t, t // 4, t % 4, "denoise"), i + 1, step[i % len(step)]))
    return out


@settings(max_examples=150, deadline=None)
@given(demand_streams())
def test_cache_never_exceeds_capacity_and_plans_are_sound(stream):
    num_layers, C, steps, policy, lookahead = stream
    E = 32
    events = events_of(num_layers, steps)
    future = TraceFuture(
        [(ev.step.forward, ev.layer - 1, np.array(ev.experts), np.array(ev.counts)) for ev in events]
    )
    pol = make_policy(policy, num_layers, E, future=future, lookahead=lookahead)
    cache = ExpertCache(list(range(1, num_layers + 1)), E, C, pol, expert_bytes=10)
    for ev in events:
        lc = cache.layers[ev.layer - 1]
        before = set(lc.resident().tolist())
        plan, spec = cache.serve(ev)
        computed = [e for e, _ in plan.hits] + [ld.expert for ld in plan.loads]
        assert sorted(computed) == list(ev.experts)  # every demanded expert exactly once
        assert {e for e, _ in plan.hits} == before & set(ev.experts)
        done = {e for e, _ in plan.hits}
        for ld in plan.loads:  # a reused slot waits for its occupant
            if ld.after != EMPTY:
                assert ld.after in done and ld.victim == ld.after
            done.add(ld.expert)
        for c in cache.layers:
            c.check()  # slots and experts: one bijection
        if len(ev.experts) <= C:
            assert set(ev.experts) <= set(lc.resident().tolist()) | {ld.expert for ld in spec}
    counts = cache.finish()
    total = sum(len(ev.experts) for ev in events)
    assert counts.demand_hits + counts.demand_misses == total
    assert counts.prefetch_hits + counts.wasted_prefetches <= counts.speculative_transfers
    assert counts.bytes_h2d == 10 * (counts.demand_misses + counts.speculative_transfers)


def test_layer_cache_check_names_each_broken_bijection():
    """LayerCache.check passes a cache the engine filled and refuses each way slot_of and expert_in can
    disagree."""

    def filled():
        lc = LayerCache(4, 10)
        for s, e in enumerate((7, 2, 5)):
            lc.expert_in[s], lc.slot_of[e] = e, s
        lc.filled = 3
        return lc

    filled().check()
    LayerCache(4, 10).check()  # empty: a bijection of nothing
    broken = {
        "an expert sits in two slots": lambda lc: lc.expert_in.__setitem__(2, 7),
        "slot_of disagrees": lambda lc: lc.slot_of.__setitem__(2, 0),
        "slot_of gives a slot to experts in none: \\[9\\]": lambda lc: lc.slot_of.__setitem__(9, 3),
        "not exactly \\[0, 3\\)": lambda lc: lc.expert_in.__setitem__(3, 9),
        "filled = 5 outside": lambda lc: setattr(lc, "filled", 5),
    }
    for message, damage in broken.items():
        lc = filled()
        damage(lc)
        with pytest.raises(RuntimeError, match=message):
            lc.check()


# --- the link ---------------------------------------------------------------------------------
FakeClock = ManualClock  # virtual time: the clock moves only when slept on


def test_emulated_link_is_a_fifo_with_latency_plus_bytes_over_bandwidth():
    clock = FakeClock()
    link = EmulatedLink(bandwidth_gbps=1.0, latency_us=10, clock=clock, sleep=clock.sleep)
    src = [torch.full((250_000,), float(i)) for i in range(3)]  # 1 MB each -> 1 ms + 10 us
    dst = [torch.zeros(250_000) for _ in range(3)]
    tickets = link.copy([(d, s, f"copy {i}") for i, (d, s) in enumerate(zip(dst, src))])
    assert [t.end for t in tickets] == pytest.approx([1.01e-3, 2.02e-3, 3.03e-3])
    assert not dst[0].any(), "bytes move when the copy lands, not when it is issued"
    clock.t = 1.5e-3  # compute ran meanwhile
    link.wait(tickets[0])  # already landed: no stall
    assert link.stats.stall_seconds == 0 and torch.equal(dst[0], src[0])
    link.wait(tickets[2])
    assert clock.t == pytest.approx(3.03e-3)
    assert link.stats.stall_seconds == pytest.approx(3.03e-3 - 1.5e-3)
    assert link.stats.busy_seconds == pytest.approx(3.03e-3) and link.stats.bytes == 3_000_000
    clock.t = 10.0  # an idle link starts a copy at once
    t = link.copy([(dst[1], src[1], "")])[0]
    assert t.end == pytest.approx(10.0 + 1.01e-3)


def test_throttled_link_is_proportionally_slower():
    clock = FakeClock()
    fast = EmulatedLink(2.0, 0, clock=clock, sleep=clock.sleep)
    slow = EmulatedLink(2.0, 0, cap_gbps=0.5, clock=clock, sleep=clock.sleep)
    x = torch.zeros(1_000_000)
    for link in (fast, slow):
        for _ in range(5):
            link.copy([(torch.empty_like(x), x, "")])[0]
    assert slow.stats.busy_seconds == pytest.approx(4 * fast.stats.busy_seconds)


def test_emulated_link_real_clock_within_tolerance():
    link = EmulatedLink(bandwidth_gbps=0.4, latency_us=0)  # 400 KB -> 1 ms per copy
    x = torch.zeros(100_000)
    t0 = time.perf_counter()
    tickets = [link.copy([(torch.empty_like(x), x, "")])[0] for _ in range(20)]
    for t in tickets:
        link.wait(t)
    took = time.perf_counter() - t0
    assert 0.020 <= took < 0.020 * 3 + 0.05  # never early; late only by load


def test_tiny_link_default_moves_an_expert_like_pcie4_moves_a_mini_expert(tiny):
    bw = emulated_bandwidth_gbps(tiny.cfg.expert_bytes(4))
    link = make_link("emulated", expert_bytes=tiny.cfg.expert_bytes(4))
    mini_seconds = 6 * 2**20 / 25e9
    assert link.duration(tiny.cfg.expert_bytes(4)) == pytest.approx(mini_seconds + 10e-6)
    assert bw == pytest.approx(25 * tiny.cfg.expert_bytes(4) / (6 * 2**20))


def test_host_store_packs_each_expert_contiguously(tiny):
    store = HostStore(tiny.experts, tiny.cfg.moe_layers)
    e = store.expert(3, 17)
    assert e.is_contiguous() and e.numel() == tiny.cfg.expert_params
    assert e.data_ptr() == store.packed[2, 17].data_ptr()
    assert store.expert_bytes == tiny.cfg.expert_params * 4
    with pytest.raises(ValueError, match="must be"):
        HostStore(tiny.experts[0], tiny.cfg.moe_layers)


# --- errors before any work -------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--cache-experts", "0"],
            "--cache-experts: cache capacity must be at least 1 expert per layer, got 0",
        ),
        (["--cache-experts", "257"], "cache capacity must be an integer in [1, 256]"),
        (["--cache-experts", "8", "--policy", "lru2"], "unknown policy 'lru2'"),
        (["--cache-experts", "8", "--link", "nvlink"], "unknown link 'nvlink'"),
        (["--cache-experts", "8", "--policy", "belady"], "simulator only"),
        (["--cache-experts", "8", "--policy", "oracle"], "needs --oracle-trace"),
        ([], "--offload needs --cache-experts"),
    ],
)
def test_cli_rejects_bad_offload_arguments_before_loading(monkeypatch, capsys, args, message):
    import artifact.model.checkpoint as ck

    monkeypatch.setattr(
        ck, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a model despite bad input")
    )
    code = main(["generate", "--prompt", "hi", "--offload", *args])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when CUDA is missing")
def test_cuda_link_without_cuda_is_a_clear_error(capsys, monkeypatch):
    import artifact.model.checkpoint as ck

    monkeypatch.setattr(
        ck, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a model despite bad input")
    )
    offload = ["generate", "--prompt", "hi", "--offload", "--cache-experts", "8", "--link", "cuda"]
    assert main(offload) == 2  # on the CPU device: the link's pairing refused (RunSpec.check)
    assert "--link: link cuda computes on the GPU, but device is 'cpu'" in capsys.readouterr().err
    assert main([*offload, "--device", "cuda"]) == 2  # on a cuda device: the missing GPU refused
    assert "--device cuda asked for, but torch.cuda.is_available() is False" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="CUDA"):
        make_link("cuda", device="cuda")
