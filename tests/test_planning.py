"""Cache planning: the demand policy against a plain reference LRU, per-phase counts, the plan's array
fields, the policy registry and its one factory, and the new prefetchers (last_step_conservative,
cross_layer) in the cache and the simulator."""

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artifact.model.routing import Demand, StepInfo
from artifact.offload.backend.cache import ExpertCache
from artifact.offload.backend.plans import COUNTS, EMPTY, PHASES, phase_of
from artifact.offload.policy.policies import (
    POLICIES,
    Policy,
    check_policy,
    make_policy,
    options_of,
    parse_policy,
    register,
    split_policies,
)
from artifact.offload.policy.prefetch import DemandPolicy, LastStep
from artifact.offload.replay.sim import replay, sweep
from artifact.offload.replay.trace import Trace, TraceRecorder

FIXTURES = Path(__file__).parent / "fixtures"
TRACES = sorted(FIXTURES.glob("*.safetensors"))


# --- the demand policy is a plain LRU ---------------------------------------------------------
def reference_lru(trace: Trace, C: int) -> tuple[int, int]:
    """Per-layer LRU written with an OrderedDict (most recent last), the cache's rules: demanded experts
    are used hits first, then misses, each ascending; a demand larger than C keeps its last C."""
    caches: dict[int, OrderedDict] = {}
    hits = misses = 0
    for n in range(len(trace)):
        lru = caches.setdefault(int(trace.layer[n]), OrderedDict())
        demand = trace.experts[trace.offsets[n] : trace.offsets[n + 1]].tolist()
        hit = [e for e in demand if e in lru]
        miss = [e for e in demand if e not in lru]
        hits, misses = hits + len(hit), misses + len(miss)
        for e in miss:  # evict the oldest non-demanded residents
            if len(lru) >= C:
                victim = next((x for x in lru if x not in demand), None)
                if victim is None:  # every resident is demanded: a wave
                    break
                del lru[victim]
            lru[e] = True
        for e in hit + miss:
            lru[e] = True
            lru.move_to_end(e)
        while len(lru) > C:  # a wave keeps the last C used
            lru.popitem(last=False)
    return hits, misses


def stream_trace(num_layers: int, steps, E: int = 24, predicted: bool = False) -> Trace:
    """A trace of random demands: each step is a prefill (every 5th) or a denoising step of a block."""
    rec = TraceRecorder()
    for t, step in enumerate(steps):
        kind = "prefill" if t % 5 == 0 else "denoise"
        info = StepInfo(t, -1 if kind == "prefill" else t // 5, -1 if kind == "prefill" else t % 5 - 1, kind)
        for i in range(num_layers):
            exp = tuple(sorted(step[i % len(step)]))
            nxt = tuple(sorted(step[(i + 1) % len(step)]))
            pred = (nxt, tuple(1 + e % 4 for e in nxt)) if predicted and i + 1 < num_layers else None
            rec(Demand(info, i + 1, exp, tuple(1 + (e * 7 + t) % 5 for e in exp), pred))
    return rec.trace({"moe_layers": list(range(1, num_layers + 1)), "num_experts": E, "config_hash": "x"})


streams = st.tuples(
    st.integers(1, 3),
    st.integers(1, 24),
    st.lists(
        st.lists(st.sets(st.integers(0, 23), min_size=1, max_size=24), min_size=1, max_size=3),
        min_size=1,
        max_size=14,
    ),
)


@settings(max_examples=150, deadline=None)
@given(streams)
def test_demand_replay_equals_a_plain_lru(stream):
    num_layers, C, steps = stream
    t = stream_trace(num_layers, steps)
    r = replay(t, "demand", C, expert_bytes=5)
    assert (r["demand_hits"], r["demand_misses"]) == reference_lru(t, C)
    assert r["bytes_h2d"] == 5 * r["demand_misses"] and r["speculative_transfers"] == 0


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_demand_replay_equals_a_plain_lru_on_stored_traces(path):
    t = Trace.load(path)
    for C in (1, 17, 60, 130):
        r = replay(t, "demand", min(C, t.meta["num_experts"]))
        assert (r["demand_hits"], r["demand_misses"]) == reference_lru(t, min(C, t.meta["num_experts"]))


# --- per-phase counts ---------------------------------------------------------------------------
def per_phase_accesses(t: Trace) -> list[int]:
    w = np.diff(t.offsets)
    return [int(w[np.asarray(t.phases) == p].sum()) for p in range(len(PHASES))]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_phases_add_up_to_the_totals(path):
    t = Trace.load(path)
    W = np.diff(t.offsets).mean()
    for policy in [
        "demand",
        "last_step",
        "last_step:lookahead=2",
        "last_step_conservative",
        "oracle",
        "oracle:lookahead=2",
        "interval_refresh:tau=2",
        "belady",
    ]:
        for C in (1, max(1, round(0.6 * W)), round(1.3 * W)):
            r = replay(t, policy, min(C, t.meta["num_experts"]), by_phase=True)
            phases = r["by_phase"]
            assert list(phases) == list(PHASES)
            for k in COUNTS:
                assert sum(p[k] for p in phases.values()) == r[k], (policy, C, k)
            for name, p in phases.items():  # each prefetch is booked once, in its issuing phase
                assert p["speculative_transfers"] == p["prefetch_hits"] + p["wasted_prefetches"], (
                    policy,
                    name,
                )
            assert [p["demand_hits"] + p["demand_misses"] for p in phases.values()] == per_phase_accesses(t)


def test_phase_of_a_step():
    assert [
        phase_of(StepInfo(0, -1, -1, "prefill")),
        phase_of(StepInfo(1, 0, 0, "denoise")),
        phase_of(StepInfo(2, 0, 5, "denoise")),
    ] == [0, 1, 2]


def hand_stream():
    """Two MoE layers, C = 2, cross_layer with chosen predictions (worked out in the test below)."""
    pre, first, later, later2 = (
        StepInfo(0, -1, -1, "prefill"),
        StepInfo(1, 0, 0, "denoise"),
        StepInfo(2, 0, 1, "denoise"),
        StepInfo(3, 0, 2, "denoise"),
    )
    return [
        Demand(pre, 1, (0, 1), (1, 1), ((2, 3), (2, 1))),
        Demand(pre, 2, (2, 4), (1, 1)),
        Demand(first, 1, (0, 1), (1, 1), ((5,), (1,))),
        Demand(first, 2, (4,), (1,)),
        Demand(later, 1, (6,), (1,), ((4,), (1,))),
        Demand(later, 2, (5,), (1,)),
        Demand(later2, 1, (6,), (1,), ((7,), (1,))),
        Demand(later2, 2, (5,), (1,)),
    ]


def test_hand_worked_phase_split():
    """prefill: layer 1 misses 0, 1 and prefetches 2, 3 into layer 2; layer 2 demands 2 (a prefetch hit)
    and 4 (a miss that evicts the unused 3: wasted). first: layer 1 hits 0, 1 and prefetches 5 (evicting
    2); layer 2 hits 4. later: layer 1 misses 6; layer 2 hits 5 (a prefetch hit booked to `first`, which
    issued it); then layer 1 hits 6 and prefetches 7 (evicting 4); layer 2 hits 5; 7 is never used,
    wasted at the end in `later`."""
    cache = ExpertCache([1, 2], 8, 2, make_policy("cross_layer", 2, 8), expert_bytes=10)
    for d in hand_stream():
        cache.serve(d)
    got = cache.finish().by_phase()
    want = {"prefill": [1, 3, 2, 1, 1, 50], "first": [3, 0, 1, 1, 0, 10], "later": [3, 1, 1, 0, 1, 20]}
    assert got == {p: dict(zip(COUNTS, v)) for p, v in want.items()}
    rec = TraceRecorder()  # the simulator, from a trace holding the predictions
    for d in hand_stream():
        rec(d)
    t = rec.trace({"moe_layers": [1, 2], "num_experts": 8, "expert_bytes": 10})
    sim = replay(t, "cross_layer", 2, by_phase=True)["by_phase"]  # the replay adds each phase's accesses
    assert {p: {k: v for k, v in d.items() if k != "accesses"} for p, d in sim.items()} == got
    assert replay(t, "cross_layer:conservative=true", 2)["demand_misses"] == 4


def test_counts_read_mid_run_derive_prefetch_hits_from_what_is_still_unused():
    cache = ExpertCache([1, 2], 8, 2, make_policy("cross_layer", 2, 8), expert_bytes=1)
    d = hand_stream()
    cache.serve(d[0])  # 2, 3 prefetched, not yet used
    assert cache.counts.speculative_transfers == 2 and cache.counts.prefetch_hits == 0
    cache.serve(d[1])  # 2 used, 3 evicted unused
    assert (cache.counts.prefetch_hits, cache.counts.wasted_prefetches) == (1, 1)


# --- the plan's arrays and the engine-facing lists ----------------------------------------------
def test_plan_arrays_match_the_lists_and_the_waves_are_sound():
    t = Trace.load(FIXTURES / "tiny-mbpp-b4.safetensors")
    cache = ExpertCache(t.meta["moe_layers"], 256, 40, make_policy("last_step", 4, 256), expert_bytes=1)
    waves = 0
    for d in t.demands:
        plan, spec = cache.serve(d)
        assert plan.layer == d.layer and plan.index == t.meta["moe_layers"].index(d.layer)
        assert plan.hits == list(zip(plan.hit_experts.tolist(), plan.hit_slots.tolist()))
        rows = list(
            zip(
                plan.load_experts.tolist(),
                plan.load_slots.tolist(),
                plan.load_victims.tolist(),
                plan.load_after.tolist(),
            )
        )
        assert [(ld.expert, ld.slot, ld.victim, ld.after) for ld in plan.loads] == rows
        assert not any(ld.speculative for ld in plan.loads) and all(ld.speculative for ld in spec)
        occupant = {s: e for e, s in plan.hits}
        done = {e for e, _ in plan.hits}  # hits are computed first
        for e, s, v, a in rows:  # a reused slot's occupant is computed before its copy
            if a != EMPTY:
                assert a in done and occupant.get(s) == a == v
                waves += 1
            done.add(e)
            occupant[s] = e
    assert waves > 0


# --- the registry and the factory ---------------------------------------------------------------
def test_the_registry_is_built_from_the_classes():
    assert {
        "demand",
        "last_step",
        "last_step_conservative",
        "cross_layer",
        "oracle",
        "interval_refresh",
        "belady",
    } <= set(POLICIES)
    assert POLICIES["oracle"].needs_trace and not POLICIES["belady"].engine_ok
    assert POLICIES["cross_layer"].needs_prediction and not POLICIES["last_step"].needs_prediction
    assert options_of(POLICIES["last_step"]) == {"lookahead": 1}
    assert options_of(POLICIES["interval_refresh"]) == {"tau": 4} and options_of(POLICIES["demand"]) == {}
    assert all(c.summary for c in POLICIES.values())


def test_policy_specs_carry_options_and_reject_unknown_ones():
    cls, opts = parse_policy(" last_step : lookahead = 2 ")
    assert cls is LastStep and opts == {"lookahead": 2}
    assert make_policy("last_step:lookahead=2", 4, 8).lookahead == 2
    assert make_policy("cross_layer:conservative=yes", 4, 8).conservative is True
    assert make_policy("last_step", 4, 8, lookahead=3, tau=2).lookahead == 3  # settings go where they apply
    assert make_policy("last_step:lookahead=2", 4, 8, lookahead=3).lookahead == 2  # the spec wins
    with pytest.raises(
        ValueError,
        match=r"policy 'last_step' has no option 'lookahaed'; its options: "
        r"lookahead=1",
    ):
        make_policy("last_step:lookahaed=2", 4, 8)
    with pytest.raises(ValueError, match=r"policy 'demand' has no option 'tau'; its options: none"):
        make_policy("demand:tau=2", 4, 8)
    with pytest.raises(ValueError, match=r"lookahead='two' is not a int"):
        make_policy("last_step:lookahead=two", 4, 8)
    with pytest.raises(ValueError, match=r"no policy takes the option\(s\) \['taus'\]"):
        make_policy("interval_refresh", 4, 8, taus=2)
    with pytest.raises(ValueError, match="expected key=value"):
        parse_policy("last_step:2")
    with pytest.raises(ValueError, match="unknown policy 'lru2'"):
        make_policy("lru2", 4, 8)
    with pytest.raises(ValueError, match="simulator only"):
        check_policy("belady", engine=True)
    with pytest.raises(ValueError, match="needs a trace"):
        make_policy("oracle", 4, 8)
    with pytest.raises(ValueError, match="policy 'last_step': lookahead must be >= 1, got 0"):
        make_policy("last_step:lookahead=0", 4, 8)
    with pytest.raises(ValueError, match="policy 'interval_refresh': tau must be >= 1, got 0"):
        make_policy("interval_refresh:tau=0", 4, 8)


def test_split_policies_keeps_a_specs_own_commas():
    assert split_policies("demand, last_step:lookahead=2,conservative=1 ,oracle") == [
        "demand",
        "last_step:lookahead=2,conservative=1",
        "oracle",
    ]


def test_register_checks_the_class():
    class NoDefault(Policy):
        name = "no_default"

        def __init__(self, num_layers, num_experts, k):
            super().__init__(num_layers, num_experts)

    with pytest.raises(TypeError, match=r"options \['k'\] need defaults"):
        register(NoDefault)

    class Liar(Policy):
        name = "liar"
        needs_trace = True

    with pytest.raises(TypeError, match="needs_trace=True but its constructor lacks a `future`"):
        register(Liar)

    class Nameless(Policy):
        summary = "a policy without a name"

    with pytest.raises(TypeError, match="Nameless has no name"):
        register(Nameless)
    with pytest.raises(TypeError, match="not a Policy subclass"):  # the base is no policy of its own
        register(Policy)
    assert "no_default" not in POLICIES and "liar" not in POLICIES and "" not in POLICIES
    assert POLICIES["demand"] is DemandPolicy and DemandPolicy.__bases__ == (Policy,)


def test_sweep_takes_specs_and_phases():
    t = Trace.load(FIXTURES / "random-l3-e32.safetensors")
    df = sweep([t], [1.0], ["demand", "last_step:lookahead=2"], by_phase=True)
    assert list(df.policy) == ["demand", "last_step:lookahead=2"]
    assert all(
        sum(p["demand_misses"] for p in row.values()) == m for row, m in zip(df.by_phase, df.demand_misses)
    )
    assert (
        replay(t, "last_step", 8, lookahead=2)["demand_misses"]
        == replay(t, "last_step:lookahead=2", 8)["demand_misses"]
    )


# --- the new prefetchers ------------------------------------------------------------------------
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_conservative_last_step_equals_lru_under_these_rules(path):
    """last_step's prediction for a layer is that layer's previous demand, and under LRU that demand is
    either all resident (|D| <= C) or fills the whole cache (a wave keeps C of it): so a placement that
    never evicts a predicted expert has nothing to load. The counts are LRU's, for any lookahead."""
    t = Trace.load(path)
    E = t.meta["num_experts"]
    for C in (1, 20, 60, E):
        lru = replay(t, "demand", min(C, E), by_phase=True)
        for spec in ("last_step_conservative", "last_step_conservative:lookahead=2"):
            r = replay(t, spec, min(C, E), by_phase=True)
            assert [r[k] for k in (*COUNTS, "by_phase")] == [lru[k] for k in (*COUNTS, "by_phase")], (spec, C)


@settings(max_examples=120, deadline=None)
@given(streams, st.booleans())
def test_conservative_prefetch_never_evicts_a_predicted_resident(stream, conservative):
    num_layers, C, steps = stream
    t = stream_trace(max(num_layers, 2), steps, predicted=True)
    cache = ExpertCache(
        t.meta["moe_layers"],
        24,
        C,
        make_policy(f"cross_layer:conservative={conservative}", len(t.meta["moe_layers"]), 24),
        1,
    )
    swapped = 0
    for d in t.demands:
        nxt = d.layer + 1
        before = set(cache.resident(nxt).tolist()) if nxt in cache.index else set()
        _, spec = cache.serve(d)
        if d.predicted is not None:
            evicted = {ld.victim for ld in spec} - {EMPTY}
            lost = evicted & before & set(d.predicted[0])
            swapped += len(lost)
            if conservative:
                assert not lost
                room = C - len(before & set(d.predicted[0]))
                assert len(spec) == min(room, len(set(d.predicted[0]) - before))
    counts = cache.finish()
    assert counts.prefetch_hits + counts.wasted_prefetches == counts.speculative_transfers


def test_cross_layer_replays_the_prediction_and_says_when_it_is_missing():
    t = stream_trace(3, [[{1, 2, 3}, {4, 5}, {6}], [{1, 2}, {4, 7}, {6, 8}]] * 3, predicted=True)
    r = replay(t, "cross_layer", 4)
    assert r["speculative_transfers"] > 0 and r["prefetch_hits"] > 0
    assert r["demand_misses"] < replay(t, "demand", 4)["demand_misses"]
    plain = stream_trace(3, [[{1, 2, 3}, {4, 5}, {6}]] * 3)
    with pytest.raises(ValueError, match=r"needs the cross-layer prediction.*schema 2"):
        replay(plain, "cross_layer", 4)
    cache = ExpertCache([1, 2, 3], 24, 4, make_policy("cross_layer", 3, 24), 1)
    with pytest.raises(ValueError, match=r"Demand\.predicted.*MoE layer 0"):
        cache.serve(plain.demands[0])
    cache = ExpertCache([1, 2, 3], 24, 4, make_policy("cross_layer", 3, 24), 1)
    last = Demand(StepInfo(0, 0, 0, "denoise"), 3, (1,), (1,))  # the last MoE layer needs none
    assert cache.serve(last)[1] == []
