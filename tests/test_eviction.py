"""The eviction interface (artifact/offload/policy/eviction.py): the `prefetch+eviction` spec, the registry,
and each eviction policy against a plain reference written from its stated rule (Python sets and histories,
no numpy state), on the stored traces and on random streams with demands larger than the cache."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artifact.model.routing import Demand, StepInfo
from artifact.offload.policy.eviction import EVICTIONS, LRU, Eviction, TokenLRU
from artifact.offload.policy.policies import (
    check_policy,
    describe_evictions,
    make_policy,
    parse_spec,
    split_policies,
)
from artifact.offload.replay.sim import COUNTS, capacity_for, replay
from artifact.offload.replay.trace import Trace, TraceRecorder, mean_working_set

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = [FIXTURES / "tiny-gsm8k-b1.safetensors", FIXTURES / "tiny-mbpp-b4.safetensors"]


# --- the spec and the registry ---------------------------------------------------------------
def test_a_spec_names_a_prefetch_policy_and_an_eviction():
    cls, opts, ev, ev_opts = parse_spec(" last_step:lookahead=2 + lrfu:lam=0.25 ")
    assert (cls.name, opts, ev.name, ev_opts) == ("last_step", {"lookahead": 2}, "lrfu", {"lam": 0.25})
    assert parse_spec("demand")[2] is LRU
    pol = make_policy("last_step+token_lru:reverse=true", 4, 8, lookahead=3)
    assert pol.lookahead == 3 and isinstance(pol.eviction, TokenLRU) and pol.eviction.reverse is True
    assert type(make_policy("demand", 4, 8).eviction) is LRU
    assert split_policies("demand,demand+lrfu:lam=0.5,last_step+lfu_window:steps=4,oracle") == [
        "demand",
        "demand+lrfu:lam=0.5",
        "last_step+lfu_window:steps=4",
        "oracle",
    ]
    assert check_policy("oracle+lfu", engine=True).name == "oracle"


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "token_lru",
            "'token_lru' is an eviction policy, not a prefetch policy: combine it with one, e.g. "
            "'demand+token_lru'",
        ),
        ("demand+lruu", "unknown eviction policy 'lruu'"),
        ("demand+lrfu:lamda=1", "eviction 'lrfu' has no option 'lamda'; its options: lam=0.5"),
        ("demand+lrfu:lam=x", "option lam='x' is not a float"),
        ("demand+", "one '+', a name on each side"),
        ("demand+lru+lfu", "one '+', a name on each side"),
        ("belady+token_lru", "'belady' decides eviction itself"),
        ("demand+lfu_window:steps=0", "eviction 'lfu_window': steps must be >= 1, got 0"),
        ("demand+lrfu:lam=-1", "eviction 'lrfu': lam must be >= 0, got -1.0"),
        ("demand+lrfu:lam=inf", "eviction 'lrfu': lam must be a finite number"),
        ("demand+block_tokens:carry=2", "eviction 'block_tokens': carry must be in [0, 1], got 2.0"),
    ],
)
def test_bad_specs_fail_with_one_line_naming_the_problem(spec, message):
    with pytest.raises(ValueError) as e:
        make_policy(spec, 2, 8)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_every_eviction_is_documented_and_listed():
    rows = {r["name"]: r for r in describe_evictions()}
    assert {"lru", "token_lru", "lfu", "lfu_window", "lrfu", "block_tokens"} <= set(rows)
    for name, cls in EVICTIONS.items():
        assert cls.name == name and cls.summary and cls.__doc__ and len(cls.__doc__) > 80, name
        assert issubclass(cls, Eviction)


@pytest.mark.parametrize("path", RECORDED + sorted(FIXTURES.glob("random-*.safetensors")))
def test_lru_named_or_not_is_the_demand_policy(path):
    t = Trace.load(path)
    for C in (1, capacity_for(0.8, mean_working_set(t), t.meta["num_experts"]), t.meta["num_experts"]):
        for p in ("demand", "last_step"):
            a, b = replay(t, p, C), replay(t, f"{p}+lru", C)
            assert {k: a[k] for k in COUNTS} == {k: b[k] for k in COUNTS}


# --- each rule against a plain reference -----------------------------------------------------
class Reference:
    """One layer's cache under this cache's rules, with the eviction rule given as two key functions of the
    demand history: `keep(e)` (the lowest is least worth keeping) and `victim(e)` (the lowest goes first).
    Every score is recomputed from the history at each use, unlike the incremental numpy state of
    eviction.py."""

    def __init__(self, C, rule, **opt):
        self.C, self.rule, self.opt = C, rule, opt
        self.res: set[int] = set()
        self.stamp: dict[int, int] = {}
        self.history: list[tuple[dict[int, int], StepInfo]] = []  # this layer's demands: {expert: tokens}
        self.loaded_at: dict[int, int] = {}  # history index of the expert's last miss
        self.clock = 0

    def score(self, e):
        h, now, o = self.history, len(self.history), self.opt
        if self.rule == "lfu":
            start = 0 if o.get("perfect") else self.loaded_at.get(e, now)
            return sum(1 for d, _ in h[start:] if e in d)
        if self.rule == "lfu_window":
            return sum(1 for d, _ in h[-o["steps"] :] if e in d)
        if self.rule == "lrfu":
            return sum(d[e] * 2.0 ** (-o["lam"] * (now - 1 - k)) for k, (d, _) in enumerate(h) if e in d)
        if self.rule == "block_tokens":
            start = max(
                (k for k, (_, s) in enumerate(h) if s.kind == "prefill" or s.block_step == 0), default=0
            )
            return sum(d.get(e, 0) for d, _ in h[start:])
        return 0

    def demand(self, experts, counts, step) -> tuple[int, int]:
        d = dict(zip(experts, counts))
        hit = {e for e in experts if e in self.res}
        for e in experts:
            if e not in hit:
                self.loaded_at[e] = len(self.history)
        self.history.append((d, step))
        lru = sorted(hit) + sorted(set(experts) - hit)  # LRU's keep order
        if self.rule == "lru":
            order = lru
        elif self.rule == "token_lru":
            order = sorted(experts, key=lambda e: (d[e], e), reverse=self.opt.get("reverse", False))
        else:
            order = sorted(lru, key=lambda e: self.score(e))  # stable: ties keep LRU's order
        if len(experts) <= self.C:
            for e in order:
                if e in hit:
                    continue
                if len(self.res) >= self.C:
                    victim = min(self.res - set(experts), key=lambda x: (self.score(x), self.stamp[x]))
                    self.res.remove(victim)
                    self.loaded_at.pop(victim, None)
                self.res.add(e)
        else:  # a wave: the last C of the keep order stay, except ...
            kept = order[-self.C :]
            if all(e in hit for e in kept):  # ... when all of them are hits: the first of them gives up its
                # slot to the stream, the last miss stays
                kept = kept[1:] + [[e for e in order if e not in hit][-1]]
            for x in self.res - set(kept):
                self.loaded_at.pop(x, None)
            self.res = set(kept)
        for e in order:
            self.stamp[e] = self.clock
            self.clock += 1
        return len(hit), len(experts) - len(hit)


def reference(trace: Trace, C: int, rule: str, **opt) -> tuple[int, int]:
    layers: dict[int, Reference] = {}
    hits = misses = 0
    for n, step in enumerate(trace.steps):
        ref = layers.setdefault(int(trace.layer[n]), Reference(C, rule, **opt))
        h, m = ref.demand(trace.expert_arrays[n].tolist(), trace.count_arrays[n].tolist(), step)
        hits, misses = hits + h, misses + m
    return hits, misses


RULES = [
    ("lru", {}),
    ("token_lru", {}),
    ("token_lru", {"reverse": True}),
    ("lfu", {}),
    ("lfu", {"perfect": True}),
    ("lfu_window", {"steps": 3}),
    ("lrfu", {"lam": 0.5}),
    ("lrfu", {"lam": 0.0}),
    ("block_tokens", {}),
]


def spec_of(rule, opt):
    text = ",".join(f"{k}={str(v).lower()}" for k, v in opt.items())
    return f"demand+{rule}" + (f":{text}" if text else "")


def random_trace(streams, num_layers, E=16):
    rec = TraceRecorder()
    for t, (kind_prefill, step) in enumerate(streams):
        info = StepInfo(
            t,
            -1 if kind_prefill else t // 4,
            0 if kind_prefill else t % 4,
            "prefill" if kind_prefill else "denoise",
        )
        for i in range(num_layers):
            exp, cnt = step[i % len(step)]
            exp = sorted(exp)
            rec(Demand(info, i + 1, tuple(exp), tuple(1 + (e * cnt) % 5 for e in exp)))
    return rec.trace({"moe_layers": list(range(1, num_layers + 1)), "num_experts": E, "config_hash": "x"})


@pytest.mark.parametrize("rule, opt", RULES, ids=[spec_of(r, o) for r, o in RULES])
def test_each_eviction_follows_its_stated_rule_on_the_recorded_traces(rule, opt):
    t = Trace.load(RECORDED[0])
    W = mean_working_set(t)
    for ratio in (0.43, 1.0, 1.73):  # waves at 0.43 (demands larger than C)
        C = capacity_for(ratio, W, 256)
        got = replay(t, spec_of(rule, opt), C)
        assert (got["demand_hits"], got["demand_misses"]) == reference(t, C, rule, **opt), (ratio, C)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(RULES),
    st.integers(1, 2),
    st.integers(1, 16),
    st.lists(
        st.tuples(
            st.booleans(),
            st.lists(
                st.tuples(st.sets(st.integers(0, 15), min_size=1, max_size=16), st.integers(1, 7)),
                min_size=1,
                max_size=2,
            ),
        ),
        min_size=1,
        max_size=14,
    ),
)
def test_each_eviction_follows_its_stated_rule_on_random_streams(rule_opt, num_layers, C, streams):
    rule, opt = rule_opt
    t = random_trace(streams, num_layers)
    got = replay(t, spec_of(rule, opt), C)
    assert (got["demand_hits"], got["demand_misses"]) == reference(t, C, rule, **opt)


def test_token_counts_decide_what_token_lru_keeps():
    """Two slots; step 1 uses experts 0 (5 tokens) and 1 (1 token), step 2 needs 2: LRU evicts 0 (the
    lower id was used first), token_lru evicts 1 (fewer tokens); step 3 wants 0 again."""
    rec = TraceRecorder()
    for t, (exp, cnt) in enumerate([((0, 1), (5, 1)), ((2,), (1,)), ((0,), (1,))]):
        rec(Demand(StepInfo(t, 0, t, "denoise"), 1, exp, cnt))
    tr = rec.trace({"moe_layers": [1], "num_experts": 4, "config_hash": "x"})
    assert replay(tr, "demand", 2)["demand_misses"] == 4
    assert replay(tr, "demand+token_lru", 2)["demand_misses"] == 3
    assert replay(tr, "demand+token_lru:reverse=true", 2)["demand_misses"] == 4


def test_a_profile_names_evictions_in_the_same_syntax():
    from artifact.experiments.settings import load_profile

    s = load_profile(
        "cpu", {"policies": ["demand", "last_step+token_lru"], "sim_policies": ["demand", "demand+arc"]}
    )
    assert s.policies == ("demand", "last_step+token_lru") and s.sim_policies == ("demand", "demand+arc")
    with pytest.raises(ValueError, match="policies has 'demand\\+nope': unknown eviction policy 'nope'"):
        load_profile("cpu", {"policies": ["demand+nope"]})
