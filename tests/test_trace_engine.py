"""The stream-driven engine: driven by a model-driven run's own trace it counts what that run counted (and
what the simulator's replay counts), computes every expert from the right weights, and fails clearly."""

import numpy as np
import pytest

from artifact.model.decode import DecodeConfig
from artifact.offload.replay.sim import replay
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec
from artifact.offload.trace_engine import Calibration, ExpertShape, calibrate, make_store, run_stream

DC = DecodeConfig(gen_length=40)
COUNTS = (
    "demand_hits",
    "demand_misses",
    "speculative_transfers",
    "prefetch_hits",
    "wasted_prefetches",
    "bytes_h2d",
)
FAST = dict(link_gbps=50.0, latency_us=0.0)  # the counts do not depend on the link's speed


def shape_of(loaded) -> ExpertShape:
    return ExpertShape(loaded.cfg.hidden_size, loaded.cfg.moe_intermediate_size)


@pytest.fixture(scope="module")
def recorded(tiny, tiny_prompts):
    """A resident run of two batches (three prompts, batch size 2), recorded."""
    return decode_prompts(
        tiny, tiny_prompts[:3], 2, RunSpec(decode=DC), record=True, prompt_ids=["a", "b", "c"], task="test"
    )


@pytest.mark.parametrize(
    "policy, capacity",
    [("demand", 12), ("last_step", 12), pytest.param("oracle", 40, marks=pytest.mark.slow)],
)
def test_stream_counts_equal_the_model_driven_run_and_the_replay(
    tiny, tiny_prompts, recorded, policy, capacity
):
    spec = RunSpec(decode=DC, capacity=capacity, policy=policy, **FAST)
    model = decode_prompts(
        tiny,
        tiny_prompts[:3],
        2,
        spec,
        record=True,
        prompt_ids=["a", "b", "c"],
        task="test",
        oracle=recorded.trace if policy == "oracle" else None,
    )
    assert model.trace.equal_routing(recorded.trace)
    stream = run_stream(model.trace, spec, shape_of(tiny), verify=True)
    sim = replay(model.trace, policy, capacity)
    for k in COUNTS:
        assert stream[k] == getattr(model.stats, k) == sim[k], k
    assert stream["transfers"] == model.stats.transfers
    assert stream["forwards"] == model.stats.forwards
    assert stream["prefill_forwards"] == model.stats.prefill_forwards
    if policy != "demand":
        assert stream["speculative_transfers"] > 0


def small_stream():
    return synth(
        SynthParams(
            layers=3,
            experts=32,
            top_k=2,
            tokens=8,
            blocks=1,
            steps=6,
            w=8,
            w_spread=0.0,
            novelty=0.25,
            seed=3,
        )
    )


def test_calibration_pads_compute_and_other_time():
    t, shape = small_stream(), ExpertShape(16, 8)
    spec = RunSpec(capacity=32, policy="demand", **FAST)  # every expert fits: only compulsory loads
    bare = run_stream(t, spec, shape)
    slow = run_stream(t, spec, shape, Calibration(compute_us_per_expert=500.0, other_us_per_demand=1000.0))
    floor = (500.0 * t.accesses + 1000.0 * len(t)) * 1e-6
    assert slow["seconds"] >= floor  # the spins are lower bounds on wall time
    layer_of = np.repeat(t.layer, np.diff(t.offsets))  # (M,) the layer of each access
    compulsory = len(set(zip(layer_of.tolist(), t.experts.tolist(), strict=True)))
    assert slow["demand_misses"] == bare["demand_misses"] == compulsory
    assert slow["forwards_per_second"] == pytest.approx(slow["forwards"] / slow["seconds"])


def test_calibrate_measures_the_tiny_model(tiny, tiny_prompts):
    c = calibrate(tiny, tiny_prompts[:2], RunSpec(decode=DecodeConfig(gen_length=32)))
    assert c.compute_us_per_expert > 0 and c.other_us_per_demand > 0
    assert "tiny" in c.source


def test_a_synthetic_stream_runs_and_the_link_stalls_on_misses():
    t = small_stream()
    shape = ExpertShape(16, 8)
    store = make_store(t, shape)
    spec = RunSpec(
        capacity=8, policy="demand", link_gbps=0.01, latency_us=0.0
    )  # 1.5 KiB expert: ~150 us a copy
    s = run_stream(t, spec, shape, store=store, verify=True)
    assert s["demand_misses"] == replay(t, "demand", 8, expert_bytes=store.expert_bytes)["demand_misses"]
    assert s["stall_seconds"] > 0 and s["link_busy_seconds"] >= s["transfers"] * 1.5e-4 * 0.99
    assert s["forwards"] == 6 and s["demands"] == 18


def test_bad_input_fails_clearly(recorded, tiny):
    t = recorded.trace
    with pytest.raises(ValueError, match="cache capacity"):  # out of every model's range: refused when made
        run_stream(t, RunSpec(capacity=0, policy="demand"), shape_of(tiny))
    with pytest.raises(ValueError, match=r"cache capacity must be an integer in \[1, 256\]"):  # beyond E
        run_stream(t, RunSpec(capacity=257, policy="demand"), shape_of(tiny))
    with pytest.raises(ValueError, match="host store"):
        run_stream(
            t, RunSpec(capacity=8, policy="demand"), ExpertShape(8, 8), store=make_store(t, shape_of(tiny))
        )
    with pytest.raises(ValueError, match="other_us_per_demand"):
        Calibration(other_us_per_demand=-1.0)


@pytest.mark.cuda
def test_stream_on_the_cuda_link_counts_like_the_replay():
    t, shape = small_stream(), ExpertShape(16, 8)
    s = run_stream(t, RunSpec(device="cuda", capacity=8, policy="last_step", link="cuda"), shape, verify=True)
    sim = replay(t, "last_step", 8, expert_bytes=shape.params * 4)
    for k in COUNTS:
        assert s[k] == sim[k], k
    assert s["link_busy_seconds"] > 0 and s["transfers"] == s["demand_misses"] + s["speculative_transfers"]
