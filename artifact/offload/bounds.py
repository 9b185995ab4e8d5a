"""The true floor: a relaxed MIN, a lower bound on the expert loads of every demand-paging cache of C
slots per layer, and a real C-slot schedule that bounds the C-slot optimum from above.

Two floors, under two sets of rules (both simulator only, both need the whole trace):

  belady (policies.py)  the floor under *this cache's* rules: a demanded expert stays resident until the
                        demand is done (|D| <= C: all of D is resident afterwards), and a demand larger
                        than C first evicts every non-demanded resident, then streams through C slots.
  min (this module)     a floor for *any* demand-paging schedule with C slots per layer.

The schedules. Each MoE layer is an independent cache; its demands D(1), D(2), ... arrive in trace
order. A schedule serves each demand's experts one at a time, in any order (within one (step, layer)
demand the order is free); an expert is computed from a slot; a non-resident one is loaded into a slot
(a miss), evicting any resident: an expert of the same demand that is already computed, one not
demanded at all, even one the demand still needs (it is then loaded again). Nothing is loaded before it
is needed (demand paging); every load counts. A prefetcher's loads can always be postponed to their
first use without adding loads (the classic lazy-paging argument), so a floor on demand paging is also
a floor on misses + speculative transfers of every prefetching policy.

What `min` is the minimum of: the loads of such schedules when each demand may also use one extra,
streaming slot that is released when the demand ends (a miss may be computed without keeping it).
Every C-slot schedule is one of these, so min <= the C-slot optimum <= belady, and min <= every policy
under the cache's rules (demand, interval_refresh). With the streaming slot, serving D from residents S
costs |D - S| loads and can leave *any* subset of S | D of at most C experts resident (hits first, then
the misses through the streaming slot and the slots of whatever is not kept). The greedy keeps the C
experts of S | D whose next use (the next demand of this layer that asks for them) is soonest.

Why nothing does better, by induction over demands. Every schedule pays at least |D - S| for D, and
ends in a state T within S | D of at most C experts (extra loads only add to its cost). The greedy's
state G is element-wise no later than T in next use. Belady's exchange argument holds for set demands:
a state that holds x where another holds y, with x next demanded no later than y, never needs more
future loads (mimic the other schedule with x in y's role: if x comes first, the mimic saves that load
and owes at most one when y comes; if both come in the same demand, both pay one and the mimic can then
take the other's state), and a superset of a state never needs more. Swapping T into G one expert at a
time, G's future costs no more than T's. At C = E only compulsory misses remain (one per distinct
(layer, expert)).

Within exactly C slots the last expert loaded for a demand still holds its slot when the demand ends, so
the end state must hold a miss of D (or leave a slot free). `min_schedule` is the greedy with that rule
(hits first, misses loaded in order of decreasing next use, each evicting the resident needed farthest:
the miss needed soonest is loaded last and stays): a real C-slot schedule, so

    relaxed_min <= the C-slot optimum <= min(min_schedule, belady).

They can differ (tests/test_bounds.py has a three-demand example); on the traces measured so far they
coincide, so there min is the C-slot optimum. The tests check both against an exhaustive search.
Next-use ties are broken by expert id (deterministic); with the streaming slot they cannot change the
count, without it they can (why min_schedule is an upper bound, not the optimum).

Counts use the keys of `sim.replay`; `by_phase=True` splits them into prefill (prefill forwards),
first (a denoising block's step 0) and later (its other steps).
"""
from __future__ import annotations

import time

import numpy as np

from artifact.offload.trace import KINDS, Trace
from artifact.validate import check_number

PHASES = ("prefill", "first", "later")
COUNTS = ("demand_hits", "demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches",
          "bytes_h2d", "accesses")


def phase_of(trace: Trace) -> np.ndarray:
    """(N,) index into PHASES for each demand: prefill forwards, a block's first denoising step, the rest."""
    prefill = trace.kind == KINDS.index("prefill")
    return np.where(prefill, 0, np.where(trace.block_step == 0, 1, 2)).astype(np.int64)


def next_use(trace: Trace) -> np.ndarray:
    """(M,) for each access (demand n, expert e): the index of the next demand of the same layer that
    asks for e again, or len(trace) when e is never asked for again in that layer."""
    N, M = len(trace), trace.accesses
    demand = np.repeat(np.arange(N, dtype=np.int64), np.diff(trace.offsets))       # (M,) demand of each access
    pair = trace.layer.astype(np.int64)[demand] * (1 << 16) + trace.experts               # (M,) (layer, expert)
    order = np.argsort(pair, kind="stable")        # grouped by (layer, expert); stable keeps stream order
    same = pair[order][1:] == pair[order][:-1]
    out = np.full(M, N, dtype=np.int64)
    out[order[:-1]] = np.where(same, demand[order][1:], N)
    return out


def relaxed_min(trace: Trace, capacity: int, expert_bytes: int | None = None, by_phase: bool = False) -> dict:
    """The floor: fewest loads of any demand-paging schedule with `capacity` slots per MoE layer plus one
    streaming slot per demand (module docstring), in the count keys of sim.replay (no prefetch)."""
    return _greedy(trace, capacity, expert_bytes, by_phase, streaming_slot=True)


def min_schedule(trace: Trace, capacity: int, expert_bytes: int | None = None, by_phase: bool = False) -> dict:
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
    key = next_use(trace) * E + experts                                                 # (M,)
    index = {layer: i for i, layer in enumerate(trace.meta["moe_layers"])}
    layer_of = [index[int(x)] for x in trace.layer]
    resident = np.zeros((len(index), E), dtype=bool)          # per layer: which experts hold a slot
    held = np.zeros(len(index), dtype=np.int64)               # per layer: slots in use
    state = np.zeros((len(index), E), dtype=np.int64)         # per layer: eviction key of each resident
    misses = np.zeros(N, dtype=np.int64)
    for n in range(N):
        i, a, b = layer_of[n], o[n], o[n + 1]
        e, k, res = experts[a:b], key[a:b], resident[i]
        hit = res[e]
        m = int(len(e) - hit.sum())
        misses[n] = m
        state[i, e] = k                                       # computed experts now wait for their next use
        if m == 0:
            continue
        if held[i] + m <= C:                                  # room for every miss: nothing is evicted
            res[e] = True
            held[i] += m
            continue
        miss = e[~hit]
        pool = np.concatenate([np.flatnonzero(res), miss])    # everyone who held a slot during D
        res[:] = False
        keep = C
        if not streaming_slot:
            last = miss[np.argmin(k[~hit])]                   # the miss needed soonest, loaded last, stays
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
    return dict(zip(COUNTS, (accesses - misses, misses, 0, 0, 0, misses * expert_bytes, accesses), strict=True))
