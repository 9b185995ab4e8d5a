"""Per-layer slot caches: turn each demand into an execution plan, and count what happened.

One ExpertCache drives one Policy over the demand stream. The engine executes its plans on a link;
the simulator only calls it. Both therefore count the same hits, misses and transfers by
construction; no timing enters (a prefetched expert still in flight when demanded is a prefetch hit,
and the engine's stall for it is measured separately).

A plan for a demand D on a layer with C slots:
  hits   resident demanded experts, computed first;
  loads  the misses, in the order they are loaded and computed. A load takes a free slot or evicts a
         non-demanded resident (the policy's victim order); when D is larger than C the misses stream
         in waves through slots whose demanded occupant has already been computed (`after` names it:
         the copy must not start before that compute is done). The policy's keep order decides which
         C of D are still resident afterwards.
"""
from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from artifact.offload.policies import Policy

EMPTY = -1


@dataclass(frozen=True)
class Load:
    layer: int            # model layer index
    expert: int
    slot: int
    victim: int           # expert evicted from the slot, EMPTY if it was free
    after: int            # demanded expert whose compute must finish before the copy starts, EMPTY: none
    speculative: bool = False


@dataclass
class Plan:
    layer: int
    hits: list[tuple[int, int]]      # (expert, slot)
    loads: list[Load]


@dataclass
class CacheCounts:
    demand_hits: int = 0
    demand_misses: int = 0            # compute needed an expert that no load had been issued for
    speculative_transfers: int = 0
    prefetch_hits: int = 0            # demanded while resident (or in flight) thanks to an unused prefetch
    wasted_prefetches: int = 0        # prefetched, then evicted (or left at the end) without a use
    bytes_h2d: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LayerCache:
    capacity: int
    num_experts: int
    slot_of: np.ndarray = field(init=False)       # (E,) slot or EMPTY
    expert_in: np.ndarray = field(init=False)     # (C,) expert or EMPTY
    unused: np.ndarray = field(init=False)        # (E,) prefetched and not yet demanded

    def __post_init__(self):
        self.slot_of = np.full(self.num_experts, EMPTY, dtype=np.int64)
        self.expert_in = np.full(self.capacity, EMPTY, dtype=np.int64)
        self.unused = np.zeros(self.num_experts, dtype=bool)

    def resident(self) -> np.ndarray:
        return self.expert_in[self.expert_in != EMPTY]

    def place(self, expert: int, slot: int) -> int:
        victim = int(self.expert_in[slot])
        if victim != EMPTY:
            self.slot_of[victim] = EMPTY
        self.expert_in[slot] = expert
        self.slot_of[expert] = slot
        assert (self.expert_in != EMPTY).sum() <= self.capacity
        return victim


class ExpertCache:
    """C slots for each MoE layer, driven by one policy. Layer arguments are model layer indices."""

    def __init__(self, moe_layers: list[int], num_experts: int, capacity: int, policy: Policy,
                 expert_bytes: int):
        if not 1 <= capacity <= num_experts:
            raise ValueError(f"cache capacity must be in [1, {num_experts}] experts per layer, got {capacity}")
        self.moe_layers = list(moe_layers)
        self.index = {layer: i for i, layer in enumerate(self.moe_layers)}
        self.capacity, self.num_experts, self.expert_bytes = capacity, num_experts, expert_bytes
        self.layers = [LayerCache(capacity, num_experts) for _ in self.moe_layers]
        self.policy = policy
        self.counts = CacheCounts()
        self.finished = False

    # --- the one call the engine and the simulator make per demand -----------------------------
    def serve(self, demand) -> tuple[Plan, list[Load]]:
        """Plan one (forward, layer) demand, then let the policy ask for speculative loads (issued
        after the demand's own loads). `demand` has .layer, .experts, .counts and .step."""
        i = self.index[demand.layer]
        experts = np.asarray(demand.experts, dtype=np.int64)
        counts = np.asarray(demand.counts, dtype=np.int64)
        plan = self._plan_demand(i, demand.layer, experts, counts, demand.step)
        guess = self.policy.predict(i, experts, counts, demand.step)
        self.policy.advance()
        spec = []
        if guess is not None and guess[0] != i:      # never prefetch into the layer being computed
            spec = self._plan_prefetch(guess[0], np.asarray(guess[1], dtype=np.int64))
        return plan, spec

    def finish(self) -> CacheCounts:
        """End of run: prefetched experts never used count as wasted."""
        if not self.finished:
            self.counts.wasted_prefetches += int(sum(lc.unused.sum() for lc in self.layers))
            for lc in self.layers:
                lc.unused[:] = False
            self.finished = True
        return self.counts

    # --- planning ------------------------------------------------------------------------------
    def _plan_demand(self, i, layer, experts, counts, step) -> Plan:
        lc, pol, c = self.layers[i], self.policy, self.counts
        pol.observe(i, experts, counts, step)
        slots = lc.slot_of[experts]
        hit = slots >= 0
        c.demand_hits += int(hit.sum())
        c.demand_misses += int((~hit).sum())
        c.prefetch_hits += int(lc.unused[experts[hit]].sum())
        lc.unused[experts] = False
        order = pol.keep_order(i, experts, counts, hit, step)
        keep = set(order[-self.capacity:].tolist()) if len(experts) > self.capacity else None
        hits = [(int(e), int(s)) for e, s in zip(experts[hit], slots[hit])]
        loads = []
        if not hit.all():
            loads = self._plan_misses(i, layer, experts, hit, order, keep, hits)
        pol.touch(i, order)
        return Plan(layer, hits, loads)

    def _free_and_victims(self, i: int, protect: np.ndarray):
        """Slots usable right now: free ones first, then those of non-protected residents in the
        policy's eviction order (a generator, so victims are chosen only as needed)."""
        lc = self.layers[i]
        for s in np.flatnonzero(lc.expert_in == EMPTY):
            yield int(s)
        res = lc.resident()
        cand = res[~np.isin(res, protect)]
        for e in self.policy.victim_order(i, cand):
            yield int(lc.slot_of[e])

    def _evict(self, i: int, expert: int, slot: int, speculative: bool, layer: int, after: int) -> Load:
        lc = self.layers[i]
        victim = lc.place(expert, slot)
        if victim != EMPTY and lc.unused[victim]:
            lc.unused[victim] = False
            self.counts.wasted_prefetches += 1
        self.counts.bytes_h2d += self.expert_bytes
        return Load(layer, expert, slot, victim, after, speculative)

    def _plan_misses(self, i, layer, experts, hit, order, keep, hits) -> list[Load]:
        miss_set = set(experts[~hit].tolist())
        misses = [int(e) for e in order if int(e) in miss_set]          # streaming ones first, kept ones last
        immediate = self._free_and_victims(i, experts)
        # Slots whose demanded occupant, once computed, may be overwritten: (slot, occupant).
        reusable: deque[tuple[int, int]] = deque()
        kept_hits: list[tuple[int, int]] = []
        if keep is not None:
            rank = {int(e): r for r, e in enumerate(order)}
            for e, s in hits:
                (kept_hits if e in keep else reusable).append((s, e))
            kept_hits.sort(key=lambda se: rank[se[1]])                  # least worth keeping first
        loads = []
        for e in misses:
            slot = next(immediate, None)
            after = EMPTY
            if slot is None:
                if not reusable:                                        # every slot holds a kept hit:
                    reusable.append(kept_hits.pop(0))                   # demote the least worth keeping
                slot, after = reusable.popleft()
            loads.append(self._evict(i, e, slot, False, layer, after))
            if keep is not None and e not in keep:
                reusable.append((slot, e))
        return loads

    def _plan_prefetch(self, i: int, ranked: np.ndarray) -> list[Load]:
        """Make the C most wanted of a prediction resident: load those missing, evicting residents
        outside them in the policy's order."""
        lc = self.layers[i]
        target = ranked[:self.capacity]
        wanted = target[lc.slot_of[target] < 0]
        if len(wanted) == 0:
            return []
        slots = self._free_and_victims(i, target)
        layer = self.moe_layers[i]
        loads = []
        for e in wanted:
            loads.append(self._evict(i, int(e), next(slots), True, layer, EMPTY))
            lc.unused[e] = True
        self.counts.speculative_transfers += len(loads)
        self.policy.touch(i, wanted)
        return loads

    # --- inspection ----------------------------------------------------------------------------
    def resident(self, layer: int) -> np.ndarray:
        return np.sort(self.layers[self.index[layer]].resident())
