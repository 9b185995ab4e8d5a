"""One policy code path: an engine run's counters equal the simulator's replay of its trace; traces
are deterministic and validated; Belady is the demand-paging floor; the metrics are right."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artifact.cli import main
from artifact.experiments.settings import Settings
from artifact.model.decode import DecodeConfig
from artifact.model.routing import Demand, StepInfo
from artifact.offload.policy.eviction import EVICTIONS
from artifact.offload.replay.sim import capacity_for, replay, sweep
from artifact.offload.replay.trace import (
    SCHEMA,
    Trace,
    TraceError,
    TraceRecorder,
    mean_working_set,
    step_similarity,
    working_sets,
)
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

DC = DecodeConfig(gen_length=40)
COUNTS = (
    "demand_hits",
    "demand_misses",
    "speculative_transfers",
    "prefetch_hits",
    "wasted_prefetches",
    "bytes_h2d",
)


@pytest.fixture(scope="module")
def recorded(tiny, tiny_prompts):
    """A resident run of two batches (three prompts, batch size 2), recorded."""
    return decode_prompts(
        tiny, tiny_prompts[:3], 2, RunSpec(decode=DC), record=True, prompt_ids=["a", "b", "c"], task="test"
    )


def test_a_second_greedy_run_reproduces_the_trace(tiny, tiny_prompts, recorded):
    again = decode_prompts(
        tiny, tiny_prompts[:3], 2, RunSpec(decode=DC), record=True, prompt_ids=["a", "b", "c"], task="test"
    )
    assert again.trace.equal_routing(recorded.trace) and again.tokens == recorded.tokens
    assert recorded.trace.meta["batch_size"] == 2 and recorded.stats.batches == 2
    f = recorded.trace.forward
    assert (np.diff(f) >= 0).all(), "forward indices run on across the two batches"


@pytest.mark.parametrize(
    "policy, capacity, lookahead",
    [
        ("demand", 12, 1),
        ("demand", 40, 1),
        ("last_step", 12, 1),
        ("last_step", 40, 1),
        ("last_step", 12, 2),
        ("oracle", 40, 1),
        ("oracle", 12, 2),
        ("interval_refresh", 12, 1),
        ("last_step_conservative", 12, 1),
        ("last_step_conservative", 40, 2),
    ],
)
def test_engine_counts_equal_the_simulator_replay(tiny, tiny_prompts, recorded, policy, capacity, lookahead):
    eng = decode_prompts(
        tiny,
        tiny_prompts[:3],
        2,
        RunSpec(decode=DC, capacity=capacity, policy=policy, tau=2, lookahead=lookahead),
        record=True,
        oracle=recorded.trace if policy == "oracle" else None,
        prompt_ids=["a", "b", "c"],
        task="test",
    )
    assert eng.trace.equal_routing(recorded.trace)
    sim = replay(
        eng.trace,
        f"{policy}:lookahead={lookahead}" if lookahead > 1 else policy,
        capacity,
        tau=2,
        by_phase=True,
    )
    for k in COUNTS:
        assert getattr(eng.stats, k) == sim[k], k
    assert all(sum(p[k] for p in sim["by_phase"].values()) == sim[k] for k in COUNTS)
    if policy in ("last_step", "oracle"):
        assert sim["speculative_transfers"] > 0


# arc and s3fifo keep LRU's last C of a demand larger than C, so they need a C that most demands fit in.
@pytest.mark.parametrize(
    "spec, capacity",
    [
        *((f"demand+{e}", 100 if e in ("arc", "s3fifo") else 12) for e in sorted(EVICTIONS)),
        ("last_step+token_lru", 20),
        ("interval_refresh+lfu", 12),
    ],
)
def test_every_eviction_counts_alike_in_engine_and_replay(tiny, tiny_prompts, recorded, spec, capacity):
    """The eviction interface is one code path too: `prefetch+eviction` in the engine, replayed."""
    eng = decode_prompts(
        tiny,
        tiny_prompts[:3],
        2,
        RunSpec(decode=DC, capacity=capacity, policy=spec, tau=2),
        record=True,
        prompt_ids=["a", "b", "c"],
        task="test",
    )
    assert eng.tokens == recorded.tokens and eng.trace.equal_routing(recorded.trace)
    sim = replay(eng.trace, spec, capacity, by_phase=True, tau=2)
    assert {k: getattr(eng.stats, k) for k in COUNTS} == {k: sim[k] for k in COUNTS}
    prefetch, eviction = spec.split("+")
    if eviction != "lru":  # the eviction reaches the cache: another rule, other counts
        lru = replay(eng.trace, prefetch, capacity, tau=2)
        assert {k: sim[k] for k in COUNTS} != {k: lru[k] for k in COUNTS}
    if prefetch == "last_step":
        assert sim["speculative_transfers"] > 0


def test_simulator_bounds_on_a_real_trace(recorded):
    t = recorded.trace
    W = mean_working_set(t)
    for ratio in (0.43, 1.0, 1.73):
        C = capacity_for(ratio, W, 256)
        lru = replay(t, "demand", C)["demand_misses"]
        assert replay(t, "belady", C)["demand_misses"] <= lru
        assert replay(t, "oracle", C)["demand_misses"] <= replay(t, "last_step", C)["demand_misses"]
    pairs = {
        (int(layer), int(e))
        for n, layer in enumerate(t.layer)
        for e in t.experts[t.offsets[n] : t.offsets[n + 1]]
    }
    for p in ("demand", "last_step", "interval_refresh", "belady"):
        r = replay(t, p, 256)
        assert r["demand_misses"] == len(pairs) and r["speculative_transfers"] == 0, p


def synthetic(streams, num_layers, E=24):
    rec = TraceRecorder()
    for t, step in enumerate(streams):
        for i in range(num_layers):
            exp = tuple(sorted(step[i % len(step)]))
            rec(Demand(StepInfo(t, t // 5, t % 5, "denoise"), i + 1, exp, tuple(1 + (e % 3) for e in exp)))
    return rec.trace({"moe_layers": list(range(1, num_layers + 1)), "num_experts": E, "config_hash": "x"})


@settings(max_examples=120, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 24),
    st.lists(
        st.lists(st.sets(st.integers(0, 23), min_size=1, max_size=24), min_size=1, max_size=3),
        min_size=1,
        max_size=15,
    ),
)
def test_belady_never_misses_more_than_lru(num_layers, C, streams):
    t = synthetic(streams, num_layers)
    b, l = replay(t, "belady", C), replay(t, "demand", C)
    assert b["demand_misses"] <= l["demand_misses"]
    assert replay(t, "oracle", C)["demand_misses"] <= replay(t, "last_step", C)["demand_misses"]


def test_trace_round_trip_and_metadata(recorded, tmp_path):
    p = recorded.trace.save(tmp_path / "t.safetensors")
    back = Trace.load(p)
    assert back.equal_routing(recorded.trace) and back.meta == recorded.trace.meta
    assert back.meta["prompt_ids"] == ["a", "b", "c"] and back.meta["decode"]["gen_length"] == 40
    assert len(back.demands) == len(back) and back.demands[5] == recorded.trace.demands[5]


def test_corrupt_and_mismatched_traces_fail_clearly(recorded, tmp_path):
    good = recorded.trace.save(tmp_path / "good.safetensors")
    raw = good.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match="corrupt or truncated"):
        Trace.load(tmp_path / "cut.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a trace at all")
    with pytest.raises(TraceError, match="not a readable trace"):
        Trace.load(tmp_path / "junk.safetensors")
    with pytest.raises(TraceError, match="config hash"):
        Trace.load(good, expect_config_hash="0123456789abcdef")
    with pytest.raises(FileNotFoundError, match="trace file not found"):
        Trace.load(tmp_path / "absent.safetensors")
    # another schema version: rewrite the header's metadata
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"]["schema"] = str(SCHEMA + 1)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    (tmp_path / "v2.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + raw[8 + n :])
    with pytest.raises(TraceError, match=f"schema '{SCHEMA + 1}'"):
        Trace.load(tmp_path / "v2.safetensors")
    from artifact.offload.replay.trace import ARRAYS

    t = recorded.trace
    bad = Trace(meta=t.meta, **{a: getattr(t, a).copy() for a in ARRAYS})
    bad.experts[3] = 999
    with pytest.raises(TraceError, match="expert ids outside"):
        bad.validate()


def test_oracle_refuses_a_trace_of_another_run(tiny, tiny_prompts, recorded):
    with pytest.raises(TraceError, match="another run"):
        decode_prompts(
            tiny,
            tiny_prompts[1:4],
            2,
            RunSpec(decode=DC, capacity=20, policy="oracle"),
            oracle=recorded.trace,
            prompt_ids=["b", "c", "d"],
            task="test",
        )


def test_metrics_on_a_hand_made_trace():
    t = synthetic([[{1, 2, 3}], [{2, 3, 4}], [{2, 3, 4}], [{9}]], num_layers=1)
    ws = working_sets(t)
    assert ws.working_set.tolist() == [3, 3, 3, 1] and mean_working_set(t) == 2.5
    sim = step_similarity(t)
    assert sim.jaccard.tolist() == pytest.approx([2 / 4, 1.0, 0.0])
    assert sim.reuse.tolist() == pytest.approx([2 / 3, 1.0, 0.0])


def test_sweep_table(recorded):
    df = sweep([recorded.trace], [0.5, 1.0], ["demand", "last_step", "belady"])
    assert len(df) == 6 and set(df.policy) == {"demand", "last_step", "belady"}
    assert (df[df.policy == "demand"].misses_vs_lru == 1.0).all()
    assert (
        df.cache_experts == [capacity_for(r, mean_working_set(recorded.trace), 256) for r in df.cache_ratio]
    ).all()
    with pytest.raises(ValueError, match="unknown policy 'mru'"):
        sweep([recorded.trace], [1.0], ["mru"])


def test_cli_trace_and_simulate(tmp_path, capsys):
    out = tmp_path / "t.safetensors"
    assert (
        main(
            [
                "trace",
                "--task",
                "gsm8k",
                "--n",
                "2",
                "--batch-size",
                "2",
                "--gen-length",
                "32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "mean working set W" in capsys.readouterr().out
    assert main(["trace", "--task", "gsm8k", "--n", "2", "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(out),
                "--cache-ratios",
                "0.5,1",
                "--policies",
                "demand,belady",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4 and {r["policy"] for r in rows} == {"demand", "belady"}
    csv = tmp_path / "s.csv"
    assert main(["simulate", "--trace", str(out), "--csv", str(csv)]) == 0
    assert len(csv.read_text().splitlines()) == 1 + 5 * len(Settings().sim_policies)  # the default policies
    assert main(["trace", "--task", "nope", "--n", "2", "--out", str(tmp_path / "x")]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


def test_a_user_policy_runs_in_engine_and_simulator_alike(tiny, tiny_prompts, recorded, user_policy):
    """docs/policies.md's example file (a Policy subclass, registered): both paths use it unchanged."""
    eng = decode_prompts(
        tiny,
        tiny_prompts[:3],
        2,
        RunSpec(decode=DC, capacity=20, policy="top_count"),
        record=True,
        prompt_ids=["a", "b", "c"],
        task="test",
    )
    assert eng.tokens == recorded.tokens
    two, one = replay(eng.trace, "top_count:lookahead=2", 20), replay(eng.trace, "top_count", 20)
    assert [two[k] for k in COUNTS] != [one[k] for k in COUNTS], "the spec option reaches the constructor"
    sim = replay(eng.trace, "top_count", 20)
    assert all(getattr(eng.stats, k) == sim[k] for k in COUNTS) and sim["speculative_transfers"] > 0
