"""The relaxed MIN (artifact.offload.replay.bounds): it equals an exhaustive search over every demand-paging
schedule on small streams, and min <= belady <= demand-paging policies, min <= misses + speculative
transfers of prefetchers, on random streams and on recorded traces of the tiny model."""

from functools import lru_cache
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artifact.model.decode import DecodeConfig
from artifact.model.routing import Demand, StepInfo
from artifact.offload.replay.bounds import PHASES, min_schedule, next_use, relaxed_min
from artifact.offload.replay.sim import capacity_for, replay
from artifact.offload.replay.trace import TraceRecorder, mean_working_set
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

COUNTS = (
    "demand_hits",
    "demand_misses",
    "speculative_transfers",
    "prefetch_hits",
    "wasted_prefetches",
    "bytes_h2d",
    "accesses",
)


def stream(steps, num_layers=1, E=8, prefill=0, block_len=5):
    """A trace from per-forward lists of per-layer expert sets; the first `prefill` forwards are prefill."""
    rec = TraceRecorder()
    for t, per_layer in enumerate(steps):
        d = t - prefill
        step = (
            StepInfo(t, -1, -1, "prefill") if d < 0 else StepInfo(t, d // block_len, d % block_len, "denoise")
        )
        for i in range(num_layers):
            exp = tuple(sorted(per_layer[i % len(per_layer)]))
            rec(Demand(step, i + 1, exp, tuple(1 + (e % 3) for e in exp)))
    return rec.trace(
        {
            "moe_layers": list(range(1, num_layers + 1)),
            "num_experts": E,
            "config_hash": "x",
            "expert_bytes": 3,
        }
    )


def exhaustive_min(demands: list[frozenset], C: int, streaming: bool = False) -> int:
    """Fewest loads over every demand-paging schedule of one layer with C slots (plus one streaming slot
    during each demand if `streaming`): every order of serving each demand, every victim on every load
    (even an expert the demand still needs), and any evictions when a demand ends. A search over cache
    states, demand by demand; independent of the greedy's theory."""
    slots = C + streaming

    @lru_cache(maxsize=None)
    def serve(todo: frozenset, cache: frozenset) -> dict:
        """End states of serving `todo` from `cache`, with the fewest loads for each."""
        if not todo:
            return {cache: 0}
        out: dict = {}
        for x in todo:
            if x in cache:
                nxt = [(cache, 0)]
            else:
                nxt = [(cache - {v} | {x}, 1) for v in cache] + (
                    [(cache | {x}, 1)] if len(cache) < slots else []
                )
            for state, cost in nxt:
                for end, c in serve(todo - {x}, state).items():
                    if c + cost < out.get(end, 1 << 30):
                        out[end] = c + cost
        return out

    states = {frozenset(): 0}
    for d in demands:
        new: dict = {}
        for s, c in states.items():
            for end, k in serve(d, s).items():
                for r in range(min(C, len(end)) + 1):  # evictions at the end of the demand are free
                    for kept in combinations(sorted(end), r):
                        if c + k < new.get(frozenset(kept), 1 << 30):
                            new[frozenset(kept)] = c + k
        states = new
    return min(states.values())


# --- the hand-worked example (also in docs/bounds.md) --------------------------------------------
# One MoE layer, E = 4 (a, b, c, d = 0, 1, 2, 3), C = 2, five forwards (a prefill, then steps 0-3 of a block):
#     t0 {a, b}   t1 {b, c}   t2 {a}   t3 {b, c, d}   t4 {a}
# belady, under the cache's rules (a demanded expert stays until its demand is done; a demand larger than C
# first evicts every non-demanded resident):
#   t0: a, b miss (2)                          -> {a, b}
#   t1: b hits; c misses and, with b kept, must evict a (1)        -> {b, c}
#   t2: a misses (1), evicting b or c (both next used at t3)       -> {a, c} (tie: either)
#   t3: |D| = 3 > C: a is evicted; one of b, c hits, the other and d miss (2)      -> two of {b, c, d}
#   t4: a misses (1)                                                                  total 7
# min (relaxed) = 5, and a schedule within exactly C = 2 slots attains it:
#   t0: a, b miss (2)                          -> {a, b}
#   t1: b hits and is computed; c misses and takes b's slot (b is next used at t3, a at t2) (1)  -> {a, c}
#   t2: a hits (0)
#   t3: c hits and is computed; b misses into c's slot, d misses into b's slot; a stays (2)      -> {a, d}
#   t4: a hits (0)                                                                    total 5
# (relaxed_min's own greedy keeps {a, b} at t1 and lets c pass through the streaming slot: also 5.)
# By phase, min: prefill 2 (t0), first 1 (t1), later 2 (t2-t4); belady: 2, 1, 4. LRU (demand) also pays 7.
EXAMPLE = [[{0, 1}], [{1, 2}], [{0}], [{1, 2, 3}], [{0}]]


def test_hand_worked_example():
    t = stream(EXAMPLE, E=4, prefill=1)
    m, b = relaxed_min(t, 2, by_phase=True), replay(t, "belady", 2)
    assert min_schedule(t, 2)["demand_misses"] == 5
    assert b["demand_misses"] == 7 and replay(t, "demand", 2)["demand_misses"] == 7
    assert m["demand_misses"] == 5 and m["demand_hits"] == 9 - 5 and m["bytes_h2d"] == 5 * 3
    assert [m["by_phase"][p]["demand_misses"] for p in PHASES] == [2, 1, 2]
    assert [m["by_phase"][p]["accesses"] for p in PHASES] == [2, 2, 5]
    assert (
        exhaustive_min([frozenset(s[0]) for s in EXAMPLE], 2)
        == 5
        == exhaustive_min([frozenset(s[0]) for s in EXAMPLE], 2, streaming=True)
    )


def test_next_use_is_the_next_demand_of_the_same_layer():
    t = stream([[{0, 1}, {1}], [{1}, {0, 1}], [{0}, {2}]], num_layers=2, E=4)
    # demands in order: (t0,L1){0,1} (t0,L2){1} (t1,L1){1} (t1,L2){0,1} (t2,L1){0} (t2,L2){2}; N = 6
    assert next_use(t).tolist() == [4, 2, 3, 6, 6, 6, 6, 6]


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 3), st.lists(st.sets(st.integers(0, 4), min_size=1, max_size=4), min_size=1, max_size=5)
)
def test_min_is_the_exact_floor_found_by_an_exhaustive_search(C, sets):
    """relaxed_min is the optimum with a streaming slot, hence at most the C-slot optimum, which
    min_schedule (a real C-slot schedule) can only match or exceed."""
    t = stream([[s] for s in sets], E=5)
    demands = [frozenset(s) for s in sets]
    floor, exact = exhaustive_min(demands, C, streaming=True), exhaustive_min(demands, C)
    assert relaxed_min(t, C)["demand_misses"] == floor <= exact <= min_schedule(t, C)["demand_misses"]


def test_the_streaming_slot_is_what_separates_the_floor_from_the_c_slot_optimum():
    """C = 1, {a, b} {a, b} {a}: with one slot the last load of a demand stays, so the best is to load b
    last at t0 and a last at t1 (3 loads); the greedy schedule, keeping the miss needed soonest (ties by
    id: a) pays 4; the streaming slot lets t1's miss pass without evicting a (3)."""
    sets = [{0, 1}, {0, 1}, {0}]
    t = stream([[s] for s in sets], E=5)
    assert exhaustive_min([frozenset(s) for s in sets], 1) == 3 == relaxed_min(t, 1)["demand_misses"]
    assert min_schedule(t, 1)["demand_misses"] == 4


def check_bounds(t, C):
    m = relaxed_min(t, C, by_phase=True)
    b = replay(t, "belady", C)
    assert m["demand_misses"] <= b["demand_misses"], (C, m["demand_misses"], b["demand_misses"])
    assert m["demand_misses"] <= min_schedule(t, C)["demand_misses"]
    waves = int(np.diff(t.offsets).max()) > C  # some demand outgrows the cache
    for p in ("demand", "interval_refresh"):
        r = replay(t, p, C, tau=2)
        assert m["demand_misses"] <= r["demand_misses"], p
        if not waves:  # belady's greedy is a floor only without waves (test_belady_is_no_floor_with_waves)
            assert b["demand_misses"] <= r["demand_misses"], p
    for p in ("last_step", "oracle"):
        r = replay(t, p, C)
        assert m["demand_misses"] <= r["demand_misses"] + r["speculative_transfers"], p
    assert m["demand_hits"] + m["demand_misses"] == m["accesses"] == t.accesses
    for k in COUNTS:
        assert sum(m["by_phase"][p][k] for p in PHASES) == m[k], k
    return m


def test_belady_is_no_floor_with_waves():
    """A counterexample hypothesis found: when a demand outgrows the cache, belady's keep order (farthest next
    use first, ties by id) can stream the wrong expert, and interval_refresh's top-C-by-count keeps the
    right one. One layer, C = 11: expert 0 is used five times, then {0..11} twice, then {1..11}. At the
    first big demand every expert's next use is the next step (a tie); belady lets 0 stream (lowest id),
    so it reloads 0 at the next step and must evict one of {1..11} to do it: 14 loads. Keeping 0 and
    streaming one of {1..11} costs 13. min, the true floor, is 13 too."""
    steps = [[{0}]] * 5 + [[set(range(12))]] * 2 + [[set(range(1, 12))]]
    t = stream(steps, 1, E=12, prefill=0)
    b = replay(t, "belady", 11)["demand_misses"]
    r = replay(t, "interval_refresh", 11, tau=2)["demand_misses"]
    m = relaxed_min(t, 11)["demand_misses"]
    assert (m, r, b) == (13, 13, 14)


def compulsory(t) -> int:
    return len(
        {
            (int(layer), int(e))
            for n, layer in enumerate(t.layer)
            for e in t.experts[t.offsets[n] : t.offsets[n + 1]]
        }
    )


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(0, 2),
    st.integers(1, 12),
    st.lists(
        st.lists(st.sets(st.integers(0, 11), min_size=1, max_size=12), min_size=1, max_size=3),
        min_size=1,
        max_size=14,
    ),
)
def test_min_le_belady_le_policies_on_random_streams(num_layers, prefill, C, steps):
    t = stream(steps, num_layers, E=12, prefill=min(prefill, len(steps) - 1))
    check_bounds(t, C)
    assert relaxed_min(t, 12)["demand_misses"] == compulsory(t)


@pytest.fixture(scope="module")
def recorded(tiny, tiny_prompts):
    """A resident run of three prompts at batch size 2 (two of them longer than a block: prefill)."""
    return decode_prompts(
        tiny,
        tiny_prompts[2:5],
        2,
        RunSpec(decode=DecodeConfig(gen_length=40)),
        record=True,
        prompt_ids=["a", "b", "c"],
        task="test",
    ).trace


def test_min_le_belady_le_policies_on_a_recorded_trace(recorded):
    t = recorded
    assert (t.kind == 0).any(), "the test wants prefill demands too"
    W = mean_working_set(t)
    for ratio in (0.43, 1.0, 1.73):
        m = check_bounds(t, capacity_for(ratio, W, 256))
        assert m["by_phase"]["prefill"]["demand_misses"] > 0 and m["by_phase"]["later"]["demand_misses"] > 0
    full = relaxed_min(t, 256)
    assert full["demand_misses"] == compulsory(t) == replay(t, "belady", 256)["demand_misses"]


def test_min_is_below_belady_on_the_recorded_trace_at_a_w_scale_cache(recorded):
    """The two rules min drops cost belady loads on real routing (the issue saw up to ~10%)."""
    C = capacity_for(1.0, mean_working_set(recorded), 256)
    assert relaxed_min(recorded, C)["demand_misses"] < replay(recorded, "belady", C)["demand_misses"]


def test_bad_capacity_is_refused_with_the_range():
    t = stream(EXAMPLE, E=4)
    for bad in (0, 5, 2.5, float("nan")):
        with pytest.raises(ValueError, match=r"cache capacity C.*\[1, 4\]|integer|finite"):
            relaxed_min(t, bad)


def test_min_is_deterministic_and_takes_expert_bytes():
    t = stream(
        [[set(np.random.default_rng(s).choice(12, 5, replace=False).tolist())] for s in range(30)], E=12
    )
    a, b = relaxed_min(t, 4), relaxed_min(t, 4, expert_bytes=10)
    assert a["demand_misses"] == b["demand_misses"] and a["bytes_h2d"] == 3 * a["demand_misses"]
    assert b["bytes_h2d"] == 10 * b["demand_misses"]
