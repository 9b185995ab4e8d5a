"""forward "segmented": the forward as segments between the router syncs (artifact/model/segments.py).

On the CPU the segments run eagerly; these tests check what capture relies on and what it must not change:
the segments equal the eager forward bit for bit (float32), resident and offloaded, with and without routed
rows and the cross-layer prediction; tokens, logits and engine counts through whole runs; exactly one host
read per MoE layer and no host data reaching a tensor (nothing a CUDA graph would have to leave); programs
reused per forward shape and bounded."""

from __future__ import annotations

import pytest
import torch

from artifact.model.kv_cache import KVCache
from artifact.model.options import FORWARD_MODES, ForwardOptions
from artifact.model.routing import StepInfo
from artifact.model.segments import MAX_PROGRAMS, programs
from artifact.model.syncs import SyncCounter
from artifact.offload.backend.engine import offload
from artifact.offload.links.link_factory import make_link
from artifact.offload.policy.policies import make_policy


def inputs(cfg, batch, seed):
    g = torch.Generator().manual_seed(seed)
    n = cfg.block_length
    prefix = torch.randint(8, cfg.vocab_size - 8, (batch, n), generator=g)  # (B, 32) committed first
    ids = torch.randint(8, cfg.vocab_size - 8, (batch, 2 * n), generator=g)  # (B, 64): commit + block
    return prefix, ids


def decode_like(model, opts, prefix, ids, rows):
    """Prefill a block (eager), then a committing denoising forward and a plain one, as the decoder does.
    -> (logits of both denoising forwards, the KV cache after them)."""
    cfg = model.cfg
    B, n = prefix.shape[0], cfg.block_length
    cache = KVCache(cfg, B, 4 * n, "cpu", torch.float32)
    model(
        prefix,
        torch.arange(n).expand(B, n),
        cache=cache,
        commit=n,
        logits_rows=slice(0, 0),
        options=opts,
        step=StepInfo(0, -1, -1, "prefill"),
    )
    pos = torch.arange(n, 3 * n).expand(B, 2 * n)
    a = model(
        ids,
        pos,
        cache=cache,
        commit=n,
        rows=rows,
        logits_rows=slice(n, 2 * n),
        options=opts,
        step=StepInfo(1, 0, 0, "denoise"),
    )
    b = model(
        ids[:, n:],
        pos[:, n:],
        cache=cache,
        rows=None if rows is None else rows[:, n:],
        logits_rows=slice(0, n),
        options=opts,
        step=StepInfo(2, 0, 1, "denoise"),
    )
    return (a, b), cache


def options(tiny, policy, capacity, forward, predict_next=None):
    """Options of a forward with a fresh offloaded engine (policy at capacity C), or resident when policy is
    None; the cross-layer prediction when the policy reads it (or as given)."""
    if policy is None:
        return ForwardOptions(forward, predict_next=bool(predict_next))
    pol = make_policy(policy, len(tiny.cfg.moe_layers), tiny.cfg.num_experts, engine=True)
    engine = offload(tiny.model, tiny.experts, capacity, pol, make_link("emulated", bandwidth_gbps=1000.0))
    predict = pol.needs_prediction if predict_next is None else predict_next
    return ForwardOptions(forward, predict_next=predict, backend=engine)


@pytest.mark.parametrize(
    "policy, capacity", [(None, 0), ("demand", 6), ("last_step", 12), ("cross_layer", 12)]
)
@pytest.mark.parametrize("finished_row", [False, True])
def test_segments_equal_the_eager_forward_bit_for_bit(tiny, policy, capacity, finished_row):
    B = 2
    prefix, ids = inputs(tiny.cfg, B, seed=3)
    rows = None
    if finished_row:  # row 1 has finished its block: fed, not routed
        rows = torch.tensor([[True], [False]]).expand(B, ids.shape[1])
    (a0, b0), c0 = decode_like(tiny.model, options(tiny, policy, capacity, "eager"), prefix, ids, rows)
    (a1, b1), c1 = decode_like(tiny.model, options(tiny, policy, capacity, "segmented"), prefix, ids, rows)
    assert torch.equal(a0, a1) and torch.equal(b0, b1)
    assert c0.lengths == c1.lengths == [2 * tiny.cfg.block_length] * B
    assert torch.equal(c0.lens, c1.lens)
    assert all(torch.equal(x, y) for x, y in zip(c0.k + c0.v, c1.k + c1.v))


@pytest.mark.parametrize("policy", [None, "demand", "last_step", "cross_layer"])
def test_one_host_read_per_moe_layer_and_no_host_data_when_segmented(tiny, policy):
    B = 2
    prefix, ids = inputs(tiny.cfg, B, seed=4)
    rows = torch.tensor([[True], [False]]).expand(B, ids.shape[1])
    n_moe = len(tiny.cfg.moe_layers)

    counter = SyncCounter()
    model = tiny.model
    opts = options(tiny, policy, 6, "segmented")
    n = tiny.cfg.block_length
    cache = KVCache(tiny.cfg, B, 4 * n, "cpu", torch.float32)
    model(
        prefix,
        torch.arange(n).expand(B, n),
        cache=cache,
        commit=n,
        logits_rows=slice(0, 0),
        options=opts,
        step=StepInfo(0, -1, -1, "prefill"),
    )
    pos = torch.arange(n, 3 * n).expand(B, 2 * n)
    with counter:
        model(
            ids,
            pos,
            cache=cache,
            commit=n,
            rows=rows,
            logits_rows=slice(n, 2 * n),
            options=opts,
            step=StepInfo(1, 0, 0, "denoise"),
        )
        model(
            ids[:, n:],
            pos[:, n:],
            cache=cache,
            logits_rows=slice(0, n),
            options=opts,
            step=StepInfo(2, 0, 1, "denoise"),
        )
    c = counter
    assert c.kinds == {"tolist": 2 * n_moe}, c.kinds  # 2 forwards: the counts of each MoE layer, nothing else
    assert c.uploads == 0


def test_programs_are_kept_per_forward_shape_and_bounded(tiny):
    model, cfg = tiny.model, tiny.cfg
    n = cfg.block_length
    opts = ForwardOptions("segmented")
    progs = programs(model)
    progs.clear()
    cache = KVCache(cfg, 1, 8 * n, "cpu", torch.float32)
    ids = torch.randint(8, 100, (1, n))
    for _ in range(3):  # same shape, same cache: one program, three runs
        model(
            ids,
            torch.arange(n)[None],
            cache=cache,
            logits_rows=slice(0, n),
            options=opts,
            step=StepInfo(0, 0, 0, "denoise"),
        )
    assert len(progs) == 1 and next(iter(progs.values())).runs == 3
    model(
        ids,
        torch.arange(n)[None],
        cache=cache,
        commit=n,
        logits_rows=slice(0, 0),
        options=opts,
        step=StepInfo(1, -1, -1, "prefill"),
    )
    assert len(progs) == 1  # a prefill forward stays eager
    for _ in range(MAX_PROGRAMS + 2):  # each cache is a new shape key
        other = KVCache(cfg, 1, 8 * n, "cpu", torch.float32)
        model(
            ids,
            torch.arange(n)[None],
            cache=other,
            logits_rows=slice(0, n),
            options=opts,
            step=StepInfo(2, 0, 0, "denoise"),
        )
    assert len(progs) == MAX_PROGRAMS
    progs.clear()


def test_a_second_run_of_the_same_shapes_reuses_the_programs(tiny):
    """The decoder's KV caches come from the model's pool, so a second generate over the same prompts finds
    the programs (and on CUDA the graphs) of the first: nothing new is built."""
    from artifact.model.decode import DecodeConfig, generate

    model = tiny.model
    opts = ForwardOptions("segmented")
    prompts = [[11, 12, 13] * 5, [14, 15] * 20]
    programs(model).clear()
    first = generate(model, prompts, DecodeConfig(gen_length=32), options=opts)
    built = dict(programs(model))
    runs = {k: p.runs for k, p in built.items()}
    second = generate(model, prompts, DecodeConfig(gen_length=32), options=opts)
    assert second.tokens == first.tokens
    assert dict(programs(model)) == built  # the same Program objects
    assert sum(p.runs for p in built.values()) == 2 * sum(runs.values())
    programs(model).clear()


def test_a_bad_forward_mode_is_refused():
    with pytest.raises(
        ValueError,
        match=r"unknown forward mode 'yes'; choose one of \('eager', "
        r"'segmented'\)",
    ):
        ForwardOptions("yes")
    assert ForwardOptions().forward == FORWARD_MODES[0] == "eager"


def test_a_run_refuses_a_bad_forward_mode_before_it_decodes(tiny):
    from artifact.errors import SettingError
    from artifact.offload.runner import decode_prompts
    from artifact.offload.spec import RunSpec

    with pytest.raises(
        SettingError,
        match=r"unknown forward mode 'on'; choose one of \('eager', "
        r"'segmented'\)",
    ):
        decode_prompts(tiny, [[11, 12]], 1, RunSpec(forward="on"))


@pytest.mark.parametrize("policy", [None, "last_step"])
def test_segmented_runs_equal_eager_runs(tiny, tiny_prompts, policy):
    """Whole runs: tokens, every step's logits and the engine's counts are the same."""
    from artifact.model.decode import DecodeConfig
    from artifact.offload.runner import decode_prompts
    from artifact.offload.spec import RunSpec

    dc = DecodeConfig(gen_length=40)
    # a link that never makes compute wait: the run checks exactness, not timing
    spec = RunSpec(decode=dc)
    if policy is not None:
        spec = spec.replace(capacity=12, policy=policy, link_gbps=1000.0, latency_us=0.0)
    off = decode_prompts(tiny, tiny_prompts[:3], 3, spec.replace(forward="eager"), record_logits=True)
    on = decode_prompts(tiny, tiny_prompts[:3], 3, spec.replace(forward="segmented"), record_logits=True)
    assert on.tokens == off.tokens and on.stats.forward == "segmented" and off.segments is None
    # CPU: eager segments
    assert on.segments.captures == on.segments.replays == 0 and not on.segments.replayed
    assert policy is None or on.stats.demand_misses > 0  # the groups came through the engine
    for x, y in zip(off.generations, on.generations):
        assert x.step_logits.keys() == y.step_logits.keys()
        assert all(torch.equal(x.step_logits[k], y.step_logits[k]) for k in x.step_logits)
    keys = (
        "demand_hits",
        "demand_misses",
        "speculative_transfers",
        "prefetch_hits",
        "transfers",
        "link_bytes",
    )
    assert {k: getattr(on.stats, k) for k in keys} == {k: getattr(off.stats, k) for k in keys}
    assert len(on.stats.forward_host_ms) == on.stats.forwards
