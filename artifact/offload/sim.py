"""Deterministic miss accounting: replay a routing trace through the same cache and policy objects the
engine drives. No timing enters: the counts are exact, and equal an engine run's for the same stream."""
from __future__ import annotations

import time
from typing import Iterable

from artifact.offload.cache import ExpertCache
from artifact.offload.policies import POLICIES, make_policy
from artifact.offload.trace import Trace, mean_working_set

COUNTS = ("demand_hits", "demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches",
          "bytes_h2d")


def capacity_for(ratio: float, working_set: float, num_experts: int) -> int:
    """C for a cache ratio C/W, rounded, clamped to [1, E]."""
    if ratio <= 0:
        raise ValueError(f"cache ratio C/W must be > 0, got {ratio}")
    return max(1, min(num_experts, round(ratio * working_set)))


def build_cache(trace: Trace, policy: str, capacity: int, expert_bytes: int = 1, **options) -> ExpertCache:
    meta = trace.meta
    layers, E = meta["moe_layers"], meta["num_experts"]
    future = trace.future() if POLICIES.get(policy) and POLICIES[policy].needs_trace else None
    if getattr(POLICIES.get(policy), "needs_prediction", False):    # reads Demand.predicted (cross_layer)
        trace.require_predictions(f"policy {policy!r}")
    pol = make_policy(policy, len(layers), E, future=future, **options)
    return ExpertCache(layers, E, capacity, pol, expert_bytes)


def replay(trace: Trace, policy: str, capacity: int, expert_bytes: int | None = None, **options) -> dict:
    """Counts of one policy at one capacity over the whole trace."""
    if expert_bytes is None:
        expert_bytes = int(trace.meta.get("expert_bytes", 1))
    cache = build_cache(trace, policy, capacity, expert_bytes, **options)
    t0 = time.perf_counter()
    for d in trace.demands:
        cache.serve(d)
    counts = cache.finish().as_dict()
    counts["replay_seconds"] = time.perf_counter() - t0
    counts["accesses"] = trace.accesses
    return counts


def sweep(traces: Iterable[Trace], ratios: Iterable[float], policies: Iterable[str], progress: bool = False,
          **options):
    """Every (trace, C/W, policy) replayed; a DataFrame with one row each, W measured per trace."""
    import pandas as pd
    from tqdm.auto import tqdm
    traces, ratios, policies = list(traces), list(ratios), list(policies)
    for p in policies:
        if p not in POLICIES:
            raise ValueError(f"unknown policy {p!r}; choose from {sorted(POLICIES)}")
    rows = []
    jobs = [(t, r, p) for t in traces for r in ratios for p in policies]
    for t, r, p in tqdm(jobs, desc="replay", disable=not progress):
        W = mean_working_set(t)
        C = capacity_for(r, W, t.meta["num_experts"])
        row = {"task": t.meta.get("task"), "batch_size": t.meta.get("batch_size"), "trace": str(t.path or ""),
               "policy": p, "cache_ratio": r, "working_set": W, "cache_experts": C}
        row.update(replay(t, p, C, **options))
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        base = df[df.policy == "demand"].set_index(["trace", "task", "batch_size", "cache_ratio"]).demand_misses
        key = list(zip(df.trace, df.task, df.batch_size, df.cache_ratio))
        df["misses_vs_lru"] = [m / base.get(k, float("nan")) if base.get(k) else float("nan")
                               for m, k in zip(df.demand_misses, key)]
    return df
