"""The true floor: `relaxed_min`, a lower bound on the expert loads of every demand-paging cache of C slots
per layer (a relaxed MIN: each demand may also use one streaming slot), and `min_schedule`, a real C-slot
schedule that bounds the C-slot optimum from above:

    relaxed_min <= the C-slot optimum <= min(min_schedule, belady).

What the schedules are, why the greedy is optimal with the streaming slot (Belady's exchange argument for
set demands) and where the two differ: docs/bounds.md. Counts use the keys of `sim.replay`; `by_phase=True`
splits them into prefill (prefill forwards), first (a denoising block's step 0) and later (its other steps).
"""

from __future__ import annotations

import time

import numpy as np

from artifact.offload.backend.plans import COUNTS as CACHE_COUNTS
from artifact.offload.backend.plans import PHASES
from artifact.offload.replay.trace import KINDS, Trace
from artifact.validate import check_number

COUNTS = (*CACHE_COUNTS, "accesses")  # the cache's counts, and the demands' expert accesses


def phase_of(trace: Trace) -> np.ndarray:
    """(N,) index into PHASES for each demand: prefill forwards, a block's first denoising step, the rest."""
    prefill = trace.kind == KINDS.index("prefill")
    return np.where(prefill, 0, np.where(trace.block_step == 0, 1, 2)).astype(np.int64)


def next_use(trace: Trace) -> np.ndarray:
    """(M,) for each access (demand n, expert e): the index of the next demand of the same layer that
    asks for e again, or len(trace) when e is never asked for again in that layer."""
    N, M = len(trace), trace.accesses
    demand = np.repeat(np.arange(N, dtype=np.int64), np.diff(trace.offsets))  # (M,) demand of each access
    pair = trace.layer.astype(np.int64)[demand] * (1 << 16) + trace.experts  # (M,) (layer, expert)
    order = np.argsort(pair, kind="stable")  # grouped by (layer, expert); stable keeps stream order
    same = pair[order][1:] == pair[order][:-1]
    out = np.full(M, N, dtype=np.int64)
    out[order[:-1]] = np.where(same, demand[order][1:], N)
    return out


def relaxed_min(trace: Trace, capacity: int, expert_bytes: int | None = None, by_phase: bool = False) -> dict:
    """The floor: fewest loads of any demand-paging schedule with `capacity` slots per MoE layer plus one
    streaming slot per demand (module docstring), in the count keys of sim.replay (no prefetch)."""
    return _greedy(trace, capacity, expert_bytes, by_phase, streaming_slot=True)


def min_schedule(
    trace: Trace, capacity: int, expert_bytes: int | None = None, by_phase: bool = False
) -> dict:
    """Loads of the greedy schedule within exactly `capacity` slots per layer: an upper bound on the C-slot
    optimum, and never below relaxed_min."""
    return _greedy(trace, capacity, expert_bytes, by_phase, streaming_slot=False)


def _greedy(trace: Trace, capacity, expert_bytes, by_phase: bool, streaming_slot: bool) -> dict:
    E = int(trace.meta["num_experts"])
    C = check_number(f"cache capacity C (experts per layer, E = {E})", capacity, low=1, high=E, integer=True)
    if expert_bytes is None:
        expert_bytes = int(trace.meta.get("expert_bytes", 1))
    expert_bytes = check_number("expert_bytes", expert_bytes, low=1, integer=True)
    t0 = time.perf_counter()
    N = len(trace)
    o = trace.offsets.astype(np.int64)
    experts = trace.experts.astype(np.int64)
    # Eviction key: next use first, expert id breaks ties, so the schedule is deterministic.
    key = next_use(trace) * E + experts  # (M,)
    index = {layer: i for i, layer in enumerate(trace.meta["moe_layers"])}
    layer_of = [index[int(x)] for x in trace.layer]
    resident = np.zeros((len(index), E), dtype=bool)  # per layer: which experts hold a slot
    held = np.zeros(len(index), dtype=np.int64)  # per layer: slots in use
    state = np.zeros((len(index), E), dtype=np.int64)  # per layer: eviction key of each resident
    misses = np.zeros(N, dtype=np.int64)
    for n in range(N):
        i, a, b = layer_of[n], o[n], o[n + 1]
        e, k, res = experts[a:b], key[a:b], resident[i]
        hit = res[e]
        m = int(len(e) - hit.sum())
        misses[n] = m
        state[i, e] = k  # computed experts now wait for their next use
        if m == 0:
            continue
        if held[i] + m <= C:  # room for every miss: nothing is evicted
            res[e] = True
            held[i] += m
            continue
        miss = e[~hit]
        pool = np.concatenate([np.flatnonzero(res), miss])  # everyone who held a slot during D
        res[:] = False
        keep = C
        if not streaming_slot:
            last = miss[np.argmin(k[~hit])]  # the miss needed soonest, loaded last, stays
            res[last] = True
            pool = pool[pool != last]
            keep = C - 1
        if keep:
            res[pool[np.argpartition(state[i, pool], keep - 1)[:keep]]] = True
        held[i] = C
    seconds = time.perf_counter() - t0
    total = _counts(int(trace.accesses), int(misses.sum()), expert_bytes)
    total["replay_seconds"] = seconds
    if by_phase:
        phase = phase_of(trace)
        acc = np.bincount(phase, weights=np.diff(o), minlength=len(PHASES))
        mis = np.bincount(phase, weights=misses, minlength=len(PHASES))
        total["by_phase"] = {p: _counts(int(acc[q]), int(mis[q]), expert_bytes) for q, p in enumerate(PHASES)}
    return total


def _counts(accesses: int, misses: int, expert_bytes: int) -> dict:
    return dict(
        zip(COUNTS, (accesses - misses, misses, 0, 0, 0, misses * expert_bytes, accesses), strict=True)
    )
