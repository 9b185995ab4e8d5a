"""CUDA paths: offloaded generation on the GPU, the CUDA link and the pinned host store.
Marked cuda: conftest skips them, with a reason, where torch.cuda.is_available() is False."""

from __future__ import annotations

import pytest
import torch

from artifact.model.decode import DecodeConfig
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def tiny_cuda():
    """The tiny checkpoint in float32 on the GPU, all experts resident (the reference)."""
    from artifact.model.checkpoint import load_checkpoint
    from artifact.model.tiny import tiny_checkpoint

    return load_checkpoint(tiny_checkpoint(), device="cuda")


@pytest.mark.parametrize("mode", ["cached", "full"])
@pytest.mark.parametrize("policy", ["demand", "last_step", "interval_refresh"])
def test_offloaded_tokens_equal_resident_on_cuda(tiny_cuda, tiny_prompts, policy, mode):
    dc = DecodeConfig(gen_length=48, mode=mode)
    ref = decode_prompts(tiny_cuda, tiny_prompts, 2, RunSpec(decode=dc, device="cuda"))
    res = decode_prompts(
        tiny_cuda,
        tiny_prompts,
        2,
        RunSpec(decode=dc, device="cuda", capacity=12, policy=policy, link="cuda"),
    )
    assert res.tokens == ref.tokens
    s = res.stats.as_dict()
    assert s["link"] == "cuda" and s["demand_misses"] > 0
    expert_bytes = tiny_cuda.cfg.expert_params * 4
    assert s["link_bytes"] == (s["demand_misses"] + s["speculative_transfers"]) * expert_bytes
    assert s["transfers"] == s["demand_misses"] + s["speculative_transfers"]
    assert s["link_busy_seconds"] > 0 and s["achieved_gbps"] > 0 and s["stall_seconds"] >= 0


def test_offloaded_logits_match_resident_on_cuda(tiny_cuda, tiny_prompts):
    dc = DecodeConfig(gen_length=32)
    ref = decode_prompts(
        tiny_cuda, tiny_prompts[:1], 1, RunSpec(decode=dc, device="cuda"), record_logits=True
    )
    res = decode_prompts(
        tiny_cuda,
        tiny_prompts[:1],
        1,
        RunSpec(decode=dc, device="cuda", capacity=8, link="cuda"),
        record_logits=True,
    )
    a, b = ref.generations[0].step_logits, res.generations[0].step_logits
    assert a.keys() == b.keys()
    for k in a:  # bit for bit is promised on the CPU; on the GPU a stale slot would be off by far more
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5)


def test_cuda_link_copies_land_and_are_counted():
    from artifact.offload.links.cuda_link import CudaLink

    link = CudaLink("cuda")
    srcs = [torch.randn(1000 + 37 * i).pin_memory() for i in range(6)]
    dsts = [torch.zeros(s.numel(), device="cuda") for s in srcs]
    tickets = link.copy([(d, s, f"test copy {i}") for i, (d, s) in enumerate(zip(dsts, srcs))])
    link.wait(tickets)  # the compute stream waits, not the host
    got = [d.cpu() for d in dsts]  # reads on the compute stream
    assert all(torch.equal(g, s) for g, s in zip(got, srcs))
    stats = link.finish()
    assert stats.transfers == 6 and stats.bytes == sum(s.numel() * 4 for s in srcs)
    assert stats.busy_seconds > 0 and stats.achieved_gbps > 0
    assert all(link.landed(t) and link.ready(t) for t in tickets)
    assert len({id(t.done) for t in tickets}) == 1  # one event for the batch


def test_cuda_link_copy_waits_for_the_compute_that_frees_its_slot():
    """A copy issued after compute_done must not overwrite a slot a queued kernel still reads."""
    from artifact.offload.links.cuda_link import CudaLink

    link = CudaLink("cuda")
    slot = torch.full((1 << 22,), 1.0, device="cuda")
    new = torch.full((1 << 22,), 2.0).pin_memory()
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):  # keep the compute stream busy
        big = big @ big * 1e-3
    total = slot.sum()  # reads the old contents
    link.wait(link.copy([(slot, new, "slot")], after=link.compute_done("layer")))
    assert total.item() == float(slot.numel())  # 1.0 each: read before the copy
    assert torch.equal(slot.cpu(), new)
    link.finish()


def test_cuda_stall_is_the_time_compute_waited_on_the_gpu():
    from artifact.offload.links.cuda_link import CudaLink

    link = CudaLink("cuda", cap_gbps=1.0)  # 64 MiB at 1 GB/s: ~67 ms
    src = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    link.wait(link.copy([(dst, src, "big")]))
    stats = link.finish()
    assert stats.stall_seconds > 0.03 and stats.busy_seconds > 0.05


@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_capped_cuda_link_paces_the_copy_engine(fraction):
    """The cap holds on the GPU timeline: busy time of paced copies is bytes / cap (loose bound here;
    gpu_check reports the achieved rate)."""
    from artifact.offload.links.cuda_link import CudaLink

    peak = CudaLink("cuda", cap_gbps=1e9).pacing.peak_gbps
    link = CudaLink("cuda", cap_gbps=peak * fraction)
    src = torch.empty(6 << 20, dtype=torch.uint8, pin_memory=True)
    dst = [torch.empty(6 << 20, dtype=torch.uint8, device="cuda") for _ in range(2)]
    link.wait(link.copy([(dst[i % 2], src, f"c{i}") for i in range(32)]))
    stats = link.finish()
    assert 0.8 <= stats.achieved_gbps / (peak * fraction) <= 1.2


def test_pin_host_registers_exactly_the_bytes_in_place():
    from artifact.offload.backend.store import pin_host, pinned_bytes

    t = torch.randn(3, 1000, 77)
    ptr = t.data_ptr()
    assert pin_host(t) is t and t.is_pinned() and t.data_ptr() == ptr
    assert pinned_bytes(t) == t.numel() * 4
    d = torch.empty_like(t, device="cuda")
    d.copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(d.cpu(), t)


def test_host_store_pins_memory_for_cuda(tiny):
    from artifact.offload.backend.engine import offload
    from artifact.offload.backend.store import HostStore
    from artifact.offload.links.cuda_link import CudaLink
    from artifact.offload.policy.policies import make_policy

    cfg = tiny.cfg
    assert HostStore(tiny.experts.clone(), cfg.moe_layers, pin=True).pinned  # pinned in place: a copy
    assert not HostStore(tiny.experts.clone(), cfg.moe_layers, pin=False).pinned
    saved = tiny.model.backend
    link = CudaLink("cuda")
    try:
        engine = offload(
            tiny.model,
            tiny.experts.clone(),
            8,
            make_policy("demand", len(cfg.moe_layers), cfg.num_experts),
            link,
            "cuda",
        )
        assert engine.store.pinned and all(s.is_cuda for s in engine.slots.values())
    finally:
        tiny.model.backend = saved
        link.close()


# --- issue 23: the finished CUDA link -------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["last_step", "cross_layer"])
def test_demand_priority_on_cuda_tokens_equal_resident(tiny_cuda, tiny_prompts, policy):
    dc = DecodeConfig(gen_length=48)
    ref = decode_prompts(tiny_cuda, tiny_prompts, 2, RunSpec(decode=dc, device="cuda"))
    res = decode_prompts(
        tiny_cuda,
        tiny_prompts,
        2,
        RunSpec(decode=dc, device="cuda", capacity=12, policy=policy, link="cuda", link_priority="demand"),
    )
    assert res.tokens == ref.tokens and res.stats.link_priority == "demand"
    s = res.stats.as_dict()
    assert s["transfers"] == s["demand_misses"] + s["speculative_transfers"]
    assert s["speculative_transfers"] > 0 or policy != "last_step"


def test_after_an_exception_in_a_forward_close_leaves_no_copy_in_flight(tiny_cuda, tiny_prompts, monkeypatch):
    import artifact.offload.runner as runner

    engines = []
    inner = runner.build_engine
    monkeypatch.setattr(runner, "build_engine", lambda *a, **k: engines.append(inner(*a, **k)) or engines[-1])
    seen = []

    def boom(demand):
        seen.append(demand)
        if len(seen) == 7:
            raise RuntimeError("injected failure inside a forward")

    spec = RunSpec(
        decode=DecodeConfig(gen_length=32),
        device="cuda",
        capacity=6,
        policy="last_step",
        link="cuda",
        link_priority="demand",
        cap_gbps=0.05,
    )
    with tiny_cuda.model.listening(boom), pytest.raises(RuntimeError, match="injected failure"):
        decode_prompts(tiny_cuda, tiny_prompts[:1], 1, spec)
    (eng,) = engines
    assert eng.link.closed and eng.link.stream.query()  # drained: nothing can land in freed slots
    assert all(t.cancelled or not t.held for p in eng.pending.values() for t in p.values())


def test_calibrated_peak_and_spin_are_plausible():
    from artifact.offload.links.cuda_link import CudaLink

    p = CudaLink("cuda", cap_gbps=1e9).pacing
    assert 1 < p.peak_gbps < 1000 and 1e8 < p.spin_hz < 1e10


def test_one_host_sync_per_moe_layer_on_cuda(tiny_cuda):
    from artifact.model.llada2 import MoE
    from artifact.model.syncs import SyncCounter
    from artifact.offload.backend.engine import install, offload
    from artifact.offload.links.cuda_link import CudaLink
    from artifact.offload.policy.policies import make_policy

    cfg, model = tiny_cuda.cfg, tiny_cuda.model
    ids = torch.randint(8, cfg.vocab_size - 8, (2, cfg.block_length), device="cuda")
    pos = torch.arange(cfg.block_length, device="cuda").expand(2, -1)
    saved, link = model.backend, CudaLink("cuda", priority="demand", chunk_bytes=cfg.expert_params)
    counter = SyncCounter()
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    hooks = [m.register_forward_pre_hook(lambda mod, a: setattr(counter, "key", mod.layer)) for m in layers]
    try:
        install(
            model,
            offload(
                model,
                tiny_cuda.experts.cpu(),
                6,
                make_policy("last_step", len(cfg.moe_layers), cfg.num_experts),
                link,
                "cuda",
            ),
        )
        model(ids, pos)
        with counter:
            model(ids, pos)
    finally:
        for h in hooks:
            h.remove()
        model.backend = saved
        link.close()
    assert [counter.by_key[layer] for layer in cfg.moe_layers] == [1] * len(cfg.moe_layers), counter.kinds
    assert counter.kinds == {"copy to host": len(cfg.moe_layers)}


def test_pin_host_portable_and_empty():
    from artifact.offload.backend.store import pin_host, pinned_bytes

    e = torch.empty(0)
    assert pin_host(e) is e and pinned_bytes(e) == 0
    t = torch.ones(1000)
    assert pin_host(t).is_pinned()


# --- forward "segmented": segments captured as CUDA graphs (artifact/model/segments.py)
# ---------------------------
@pytest.mark.parametrize("policy", [None, "demand", "last_step"])
def test_segmented_captures_and_replays_whole_recorded_runs_on_cuda(tiny_cuda, tiny_prompts, policy):
    """float32 tiny, recorded (the cross-layer prediction rides in every MoE layer's counts but the last's):
    segments captured and replayed (its experts take the eager loop stage: CUDA's grouped GEMM needs bf16),
    the run's counts are the simulator's replay of its own trace, and a second run replays only."""
    from artifact.model.segments import programs
    from artifact.offload.replay.sim import replay

    dc = DecodeConfig(gen_length=48)
    spec = RunSpec(decode=dc, device="cuda", forward="segmented")
    if policy is not None:
        spec = spec.replace(capacity=12, policy=policy, link="cuda")
    programs(tiny_cuda.model).clear()
    on = decode_prompts(tiny_cuda, tiny_prompts[:3], 3, spec, record=True)
    assert on.segments.replayed and on.segments.captures > 0, on.segments
    if spec.offloaded:
        sim = replay(on.trace, policy, 12)
        for k in ("demand_hits", "demand_misses", "speculative_transfers"):
            assert getattr(on.stats, k) == sim[k], k
    again = decode_prompts(tiny_cuda, tiny_prompts[:3], 3, spec.replace(capture=False), record=True)
    assert (
        again.segments.captures == 0 and again.segments.replays > 0 and again.segments.capture_error is None
    )


FLIP_EPS = 1e-3  # a router score gap below this may flip between two float paths that differ in the last bits


@pytest.mark.parametrize("finished_row", [False, True])
def test_segmented_equals_eager_on_cuda_except_at_router_near_ties(tiny_cuda, finished_row):
    """float32, forward by forward on the same inputs (warm-up, capture, replays): eager routes only the rows
    that route, the segments every row, so their matmuls may differ in the last bits and a near tie of a
    router may flip. By construction: a forward whose MoE layers all demand the same has close logits; one
    that differs does so first at a layer whose eager router margin (tests/helpers_margins.py) is a near
    tie."""
    from contextlib import nullcontext

    from helpers_margins import RouterMargins

    from artifact.model.kv_cache import KVCache
    from artifact.model.options import ForwardOptions
    from artifact.model.routing import StepInfo
    from artifact.model.segments import programs

    model, cfg = tiny_cuda.model, tiny_cuda.cfg
    B, n = 2, cfg.block_length
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(8, cfg.vocab_size - 8, (B, n), generator=g).cuda()
    ids = torch.randint(8, cfg.vocab_size - 8, (B, n), generator=g).cuda()
    rows = torch.tensor([[True], [not finished_row]], device="cuda").expand(B, n)
    programs(model).clear()

    def forwards(opts, margins: bool):
        cache = KVCache(cfg, B, 4 * n, "cuda", torch.float32)
        model(
            prefix,
            torch.arange(n, device="cuda").expand(B, n),
            cache=cache,
            commit=n,
            logits_rows=slice(0, 0),
            options=opts,
            step=StepInfo(0, -1, -1, "prefill"),
        )
        out = []
        for s in range(4):
            demands = []
            with model.listening(demands.append), RouterMargins(model) if margins else nullcontext() as m:
                logits = model(
                    ids,
                    torch.arange(n, 2 * n, device="cuda").expand(B, n),
                    cache=cache,
                    rows=rows,
                    logits_rows=slice(0, n),
                    options=opts,
                    step=StepInfo(1 + s, 0, s, "denoise"),
                )
            out.append(
                (logits.cpu(), [(d.layer, d.experts, d.counts) for d in demands], m.calls if m else [])
            )
        return out

    eager = forwards(ForwardOptions("eager"), margins=True)
    seg = forwards(ForwardOptions("segmented"), margins=False)
    counts = model.programs.counts
    assert counts.captures > 0 and counts.replays > 0 and counts.capture_error is None
    for (le, de, me), (ls, ds, _) in zip(eager, seg):
        if de == ds:
            torch.testing.assert_close(ls, le, rtol=1e-4, atol=1e-4)
            continue
        layer = next(a[0] for a, b in zip(de, ds) if a != b)
        margin = min(m for lay, m in me if lay == layer)
        assert margin < FLIP_EPS, f"MoE layer {layer} routed differently with a router margin of {margin:g}"


def test_segmented_grouped_stage_is_captured_in_bf16_on_cuda():
    """bf16 on compute capability >= 9.0: the expert stages too are graphs (grouped GEMM); a second run of
    the same shapes replays only (no new capture); logits close to the eager forward."""
    import dataclasses

    from artifact.model.config import get_preset
    from artifact.model.segments import programs
    from artifact.model.tiny import random_model

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the grouped GEMM on CUDA needs compute capability >= 9.0")
    cfg = dataclasses.replace(get_preset("tiny"), num_hidden_layers=3)
    loaded = random_model(cfg, seed=0, dtype="bfloat16", device="cuda")
    prompts = [[5, 6, 7, 8] * 10, [9, 10] * 30]
    dc = DecodeConfig(gen_length=64, threshold=1.0)
    spec = RunSpec(decode=dc, device="cuda", forward="segmented", capacity=16, policy="demand", link="cuda")
    decode_prompts(loaded, prompts, 2, spec)
    progs = programs(loaded.model)
    captured = sum(p.captures for p in progs.values())
    stages = sum(1 for p in progs.values() for name in p.graphs if name[0] == "stage")
    assert captured > 0 and stages > 0
    again = decode_prompts(loaded, prompts, 2, spec, record_logits=True)
    assert sum(p.captures for p in progs.values()) == captured
    off = decode_prompts(loaded, prompts, 2, spec.replace(forward="eager"), record_logits=True)
    a, b = off.generations[0].step_logits, again.generations[0].step_logits
    first = min(a)
    torch.testing.assert_close(b[first], a[first], rtol=2e-2, atol=2e-2)  # bf16; later steps may diverge
