"""Deterministic miss accounting: replay a routing trace through the same cache and policy objects the
engine drives. No timing enters: the counts are exact, and equal an engine run's for the same stream.

A policy is given as a spec, `name[:key=value,...]` (policies.make_policy); run-wide settings such as
lookahead= and tau= go to every policy that takes them.

Besides the policies, the simulator takes the bound `min` (bounds.relaxed_min). It is not a cache policy
(it never runs in the engine) and the two floors hold under different rules (docs/bounds.md):
  belady  the floor under *this cache's* rules: a demanded expert stays resident until its demand is
          done, and a demand larger than C first evicts every non-demanded resident;
  min     the floor of *any* demand-paging schedule with C slots per layer (evict after compute, any
          order inside a demand, non-demanded residents may stay during a wave), so
          min <= belady, min <= every demand-paging policy, and min <= demand_misses +
          speculative_transfers of every prefetching policy. belady <= demand, interval_refresh holds
          when no demand outgrows the cache; with waves belady's greedy keep order can lose (a tested
          counterexample: tests/test_bounds.py::test_belady_is_no_floor_with_waves).

Every count is also kept per phase (`by_phase=True`): prefill (prefill forwards), first (a denoising
block's step 0) and later (its other steps); the phases add up to the totals. So every count has two
counting bases (BASES): all demands (`included`: the totals) and denoising steps only (`excluded`: the
totals less the prefill phase, `denoising_only`); `by_basis` pools a sweep's counts on both."""

from __future__ import annotations

import time
from typing import Iterable

from artifact.errors import SettingError, TraceError
from artifact.offload.backend.cache import ExpertCache
from artifact.offload.backend.engine import build_cache as new_cache
from artifact.offload.backend.plans import COUNTS, PHASES
from artifact.offload.policy.policies import make_policy, parse_policy
from artifact.offload.replay.bounds import relaxed_min
from artifact.offload.replay.trace import Trace, mean_working_set

__all__ = [
    "BASES",
    "BOUNDS",
    "COUNTS",
    "DENOISING_ONLY",
    "PHASES",
    "WITH_PREFILL",
    "build_cache",
    "by_basis",
    "capacity_for",
    "check_spec",
    "denoising_only",
    "phase_columns",
    "replay",
    "ruling_basis",
    "sweep",
]

# The two counting bases of a count, by what happens to the prefill phase: included (all demands) or
# excluded (denoising steps only: the first and later phases).
# Which forwards the paper's oracle figure counts, the abstract does not say.
BASES = ("included", "excluded")
WITH_PREFILL, DENOISING_ONLY = BASES

# Simulator-only bounds: a name the simulator replays besides the registered policies (no options).
BOUNDS = {"min": relaxed_min}


def check_spec(spec: str) -> None:
    """A policy spec or a bound name, checked before any replay."""
    if isinstance(spec, str) and spec.strip().partition(":")[0].strip() in BOUNDS:
        if spec.strip() not in BOUNDS:
            raise SettingError(f"the bound {spec.strip().partition(':')[0]!r} takes no options, got {spec!r}")
        return
    parse_policy(spec)


def capacity_for(ratio: float, working_set: float, num_experts: int) -> int:
    """C for a cache ratio C/W, rounded, clamped to [1, E]."""
    if ratio <= 0:
        raise SettingError(f"cache ratio C/W must be > 0, got {ratio}")
    return max(1, min(num_experts, round(ratio * working_set)))


def build_cache(trace: Trace, policy: str, capacity: int, expert_bytes: int = 1, **settings) -> ExpertCache:
    """The simulator's cache of `policy` (a spec, its settings: lookahead, tau) at `capacity` over the trace's
    layers: the engine's own cache (backend.engine.build_cache), the oracle's future from the trace itself."""
    meta = trace.meta
    layers, E = meta["moe_layers"], meta["num_experts"]
    cls, _ = parse_policy(policy)
    future = trace.future() if cls.needs_trace else None
    if cls.needs_prediction:  # reads Demand.predicted (cross_layer)
        trace.require_predictions(f"policy {policy!r}")
    pol = make_policy(policy, len(layers), E, future=future, **settings)
    return new_cache(layers, E, capacity, pol, expert_bytes)


def replay(
    trace: Trace,
    policy: str,
    capacity: int,
    expert_bytes: int | None = None,
    by_phase: bool = False,
    **settings,
) -> dict:
    """Counts of one policy (spec), or of the bound `min`, at one capacity over the whole trace; with
    by_phase, also {"by_phase": {"prefill": {...}, "first": {...}, "later": {...}}} (the count keys and
    accesses), whose phases add up to the totals."""
    if isinstance(policy, str) and policy.strip() in BOUNDS:  # a bound: no cache, no policy settings
        out = BOUNDS[policy.strip()](trace, capacity, expert_bytes, by_phase=by_phase)
        out.setdefault("accesses", trace.accesses)
        return out
    check_spec(policy)
    if expert_bytes is None:
        expert_bytes = int(trace.meta.get("expert_bytes", 1))
    t0 = time.perf_counter()
    cache = build_cache(trace, policy, capacity, expert_bytes, **settings)
    predicted = trace.predicted
    if cache.policy.needs_prediction and predicted is None:
        raise TraceError(
            f"policy {policy!r} needs the cross-layer prediction of each demand, and trace "
            f"{trace.path or '(in memory)'} does not record it (schema "
            f"{trace.meta.get('schema', 1)}): "
            "record the trace with the prediction switched on (trace schema 2)"
        )
    plan = cache.plan
    if predicted is None:
        for i, e, c, s, p in zip(
            trace.positions, trace.expert_arrays, trace.count_arrays, trace.steps, trace.phases
        ):
            plan(i, e, c, s, p)
    else:
        for i, e, c, s, p, q in zip(
            trace.positions, trace.expert_arrays, trace.count_arrays, trace.steps, trace.phases, predicted
        ):
            plan(i, e, c, s, p, q)
    counts = cache.finish()
    out = counts.as_dict()
    if by_phase:
        out["by_phase"] = counts.by_phase()
        for phase in out["by_phase"].values():  # every demanded expert is a hit or a miss
            phase["accesses"] = phase["demand_hits"] + phase["demand_misses"]
    out["replay_seconds"] = time.perf_counter() - t0
    out["accesses"] = trace.accesses
    return out


def sweep(
    traces: Iterable[Trace],
    ratios: Iterable[float],
    policies: Iterable[str],
    progress: bool = False,
    by_phase: bool = False,
    **settings,
):
    """Every (trace, C/W, policy spec or bound) replayed; a DataFrame with one row each, W measured per
    trace. With by_phase, each row also holds a `by_phase` dict (see replay; phase_columns flattens it)."""
    import pandas as pd
    from tqdm.auto import tqdm

    traces, ratios, policies = list(traces), list(ratios), list(policies)
    for p in policies:
        check_spec(p)  # every spec checked before any replay
    rows = []
    jobs = [(t, r, p) for t in traces for r in ratios for p in policies]
    for t, r, p in tqdm(jobs, desc="replay", disable=not progress):
        W = mean_working_set(t)
        C = capacity_for(r, W, t.meta["num_experts"])
        row = {
            "task": t.meta.get("task"),
            "batch_size": t.meta.get("batch_size"),
            "trace": str(t.path or ""),
            "policy": p,
            "cache_ratio": r,
            "working_set": W,
            "cache_experts": C,
        }
        row.update(replay(t, p, C, by_phase=by_phase, **settings))
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        df["misses_vs_lru"] = _vs_lru(df, ("trace", "task", "batch_size", "cache_ratio"))
    return df


def replay_capacities(
    traces: Iterable[Trace], capacities: Iterable[int], policies: Iterable[str], **settings
):
    """Like sweep, at absolute capacities C instead of ratios C/W (cache_ratio = C / W per trace), so an
    engine run at --cache-experts C can be replayed by hand."""
    import pandas as pd

    rows = []
    for t in traces:
        W = mean_working_set(t)
        for C in capacities:
            for p in policies:
                row = {
                    "task": t.meta.get("task"),
                    "batch_size": t.meta.get("batch_size"),
                    "trace": str(t.path or ""),
                    "policy": p,
                    "cache_ratio": C / W,
                    "working_set": W,
                    "cache_experts": C,
                }
                row.update(replay(t, p, C, **settings))
                rows.append(row)
    df = pd.DataFrame(rows)
    df["misses_vs_lru"] = _vs_lru(df, ("trace", "cache_experts"))
    return df


def lru_misses(df, keys) -> list:
    """Each row's LRU ('demand') demand misses: those of the 'demand' row with the same values of `keys`
    (nan where there is none)."""
    keys = list(keys)
    lru = df[df.policy == "demand"]
    base = dict(zip(zip(*(lru[k] for k in keys)), lru.demand_misses))
    return [base.get(k, float("nan")) for k in zip(*(df[k] for k in keys))]


def _vs_lru(df, keys) -> list:
    """demand misses / LRU's at the same keys; nan where LRU has none (or no 'demand' row)."""
    return [m / b if b == b and b else float("nan") for m, b in zip(df.demand_misses, lru_misses(df, keys))]


def relative_to_lru(counts, keys):
    """Pooled counts (a row per `keys` x policy) against LRU's at the same keys: lru_misses, misses_vs_lru,
    transfers (demand misses + speculative transfers), transfers_vs_lru and misses_removed."""
    g = counts.copy()
    g["lru_misses"] = lru_misses(g, keys)
    g["misses_vs_lru"] = g.demand_misses / g.lru_misses
    g["transfers"] = g.demand_misses + g.speculative_transfers
    g["transfers_vs_lru"] = g.transfers / g.lru_misses
    g["misses_removed"] = g.lru_misses - g.demand_misses
    return g


def denoising_only(df, counts):
    """A phase-split sweep (phase_columns) with each of `counts` over the denoising steps only: its total
    less its prefill phase (`<count>_prefill`), i.e. the first and later phases."""
    out = df.copy()
    for c in counts:
        out[c] = df[c] - df[f"{c}_prefill"]
    return out


def by_basis(df, keys, counts):
    """`counts` of a sweep summed per `keys` x policy on each counting basis (column `prefill`: BASES), each
    relative to LRU's at the same keys and basis (relative_to_lru). The `excluded` rows (denoising steps only)
    need the per-phase columns (sweep(by_phase=True), then phase_columns); without them only `included`."""
    import pandas as pd

    keys, counts = list(keys), list(counts)
    parts = []
    for basis in BASES:
        if basis == DENOISING_ONLY:
            if not all(f"{c}_prefill" in df for c in counts):
                continue
            src = denoising_only(df, counts)
        else:
            src = df
        g = src.groupby([*keys, "policy"], sort=True)[counts].sum().reset_index()
        g.insert(0, "prefill", basis)
        parts.append(g)
    return relative_to_lru(pd.concat(parts, ignore_index=True), ["prefill", *keys])


def ruling_basis(summary) -> str:
    """The basis a count claim rules on: denoising steps only where the summary has it, else all demands."""
    return DENOISING_ONLY if DENOISING_ONLY in set(summary.prefill) else WITH_PREFILL


def phase_columns(df, counts=(*COUNTS, "accesses")):
    """A sweep's `by_phase` dicts as flat columns `<count>_<phase>` (e.g. demand_misses_prefill), for CSV."""
    df = df.copy()
    for phase in PHASES:
        for c in counts:
            df[f"{c}_{phase}"] = [d[phase][c] for d in df.by_phase]
    return df.drop(columns=["by_phase"])
