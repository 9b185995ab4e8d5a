"""The identities between counts that docs/DESIGN.md ("What every count means") states, on random streams."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from artifact.model.routing import Demand, StepInfo
from artifact.offload.replay.sim import replay
from artifact.offload.replay.trace import TraceRecorder

E = 16


def stream(layers: int, steps: list[list[set[int]]]):
    rec = TraceRecorder()
    for t, step in enumerate(steps):
        for i in range(layers):
            exp = tuple(sorted(step[i % len(step)]))
            rec(Demand(StepInfo(t, t // 4, t % 4, "denoise"), i + 1, exp, tuple(1 + e % 3 for e in exp)))
    return rec.trace({"moe_layers": list(range(1, layers + 1)), "num_experts": E, "config_hash": "x"})


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, E),
    st.sampled_from(["demand", "last_step", "oracle", "interval_refresh"]),
    st.lists(
        st.lists(st.sets(st.integers(0, E - 1), min_size=1, max_size=E), min_size=1, max_size=3),
        min_size=1,
        max_size=12,
    ),
)
def test_count_identities(layers, C, policy, steps):
    c = replay(stream(layers, steps), policy, C, expert_bytes=3)
    assert c["demand_hits"] + c["demand_misses"] == c["accesses"]
    assert c["prefetch_hits"] <= c["demand_hits"]
    assert c["prefetch_hits"] + c["wasted_prefetches"] == c["speculative_transfers"]  # at the end of a run
    assert c["bytes_h2d"] == 3 * (c["demand_misses"] + c["speculative_transfers"])
    if policy == "demand":
        assert c["speculative_transfers"] == c["prefetch_hits"] == c["wasted_prefetches"] == 0
