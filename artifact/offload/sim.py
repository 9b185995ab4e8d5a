"""Deterministic miss accounting: replay a routing trace through the same cache and policy objects the
engine drives. No timing enters: the counts are exact, and equal an engine run's for the same stream.

A policy is given as a spec, `name[:key=value,...]` (policies.make_policy); run-wide settings such as
lookahead= and tau= go to every policy that takes them."""
from __future__ import annotations

import time
from typing import Iterable

from artifact.errors import SettingError, TraceError
from artifact.offload.cache import COUNTS, ExpertCache
from artifact.offload.policies import make_policy, parse_policy
from artifact.offload.trace import Trace, mean_working_set

__all__ = ["COUNTS", "build_cache", "capacity_for", "replay", "sweep"]


def capacity_for(ratio: float, working_set: float, num_experts: int) -> int:
    """C for a cache ratio C/W, rounded, clamped to [1, E]."""
    if ratio <= 0:
        raise SettingError(f"cache ratio C/W must be > 0, got {ratio}")
    return max(1, min(num_experts, round(ratio * working_set)))


def build_cache(trace: Trace, policy: str, capacity: int, expert_bytes: int = 1, **settings) -> ExpertCache:
    meta = trace.meta
    layers, E = meta["moe_layers"], meta["num_experts"]
    cls, _ = parse_policy(policy)
    future = trace.future() if cls.needs_trace else None
    if cls.needs_prediction:                        # reads Demand.predicted (cross_layer)
        trace.require_predictions(f"policy {policy!r}")
    pol = make_policy(policy, len(layers), E, future=future, **settings)
    return ExpertCache(layers, E, capacity, pol, expert_bytes)


def replay(trace: Trace, policy: str, capacity: int, expert_bytes: int | None = None, by_phase: bool = False,
           **settings) -> dict:
    """Counts of one policy (spec) at one capacity over the whole trace; with by_phase, also
    {"by_phase": {"prefill": {...}, "first": {...}, "later": {...}}}, whose phases add up to the totals."""
    if expert_bytes is None:
        expert_bytes = int(trace.meta.get("expert_bytes", 1))
    t0 = time.perf_counter()
    cache = build_cache(trace, policy, capacity, expert_bytes, **settings)
    predicted = trace.predicted
    if cache.policy.needs_prediction and predicted is None:
        raise TraceError(f"policy {policy!r} needs the cross-layer prediction of each demand, and trace "
                         f"{trace.path or '(in memory)'} does not record it (schema {trace.meta.get('schema', 1)}): "
                         "record the trace with the prediction switched on (trace schema 2)")
    plan = cache.plan
    if predicted is None:
        for i, e, c, s, p in zip(trace.positions, trace.expert_arrays, trace.count_arrays, trace.steps,
                                 trace.phases):
            plan(i, e, c, s, p)
    else:
        for i, e, c, s, p, q in zip(trace.positions, trace.expert_arrays, trace.count_arrays, trace.steps,
                                    trace.phases, predicted):
            plan(i, e, c, s, p, q)
    counts = cache.finish()
    out = counts.as_dict()
    if by_phase:
        out["by_phase"] = counts.by_phase()
    out["replay_seconds"] = time.perf_counter() - t0
    out["accesses"] = trace.accesses
    return out


def sweep(traces: Iterable[Trace], ratios: Iterable[float], policies: Iterable[str], progress: bool = False,
          by_phase: bool = False, **settings):
    """Every (trace, C/W, policy spec) replayed; a DataFrame with one row each, W measured per trace."""
    import pandas as pd
    from tqdm.auto import tqdm
    traces, ratios, policies = list(traces), list(ratios), list(policies)
    for p in policies:
        parse_policy(p)                      # every spec checked before any replay
    rows = []
    jobs = [(t, r, p) for t in traces for r in ratios for p in policies]
    for t, r, p in tqdm(jobs, desc="replay", disable=not progress):
        W = mean_working_set(t)
        C = capacity_for(r, W, t.meta["num_experts"])
        row = {"task": t.meta.get("task"), "batch_size": t.meta.get("batch_size"), "trace": str(t.path or ""),
               "policy": p, "cache_ratio": r, "working_set": W, "cache_experts": C}
        row.update(replay(t, p, C, by_phase=by_phase, **settings))
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        base = df[df.policy == "demand"].set_index(["trace", "task", "batch_size", "cache_ratio"]).demand_misses
        key = list(zip(df.trace, df.task, df.batch_size, df.cache_ratio))
        df["misses_vs_lru"] = [m / base.get(k, float("nan")) if base.get(k) else float("nan")
                               for m, k in zip(df.demand_misses, key)]
    return df
