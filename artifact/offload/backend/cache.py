"""Per-layer slot caches: turn each demand into an execution plan, and count what happened.

One ExpertCache drives one Policy over the demand stream. The engine executes its plans on a link;
the simulator only plans. Both therefore count the same hits, misses and transfers by construction;
no timing enters (a prefetched expert still in flight when demanded is a prefetch hit, and the
engine's stall for it is measured separately).

A plan for a demand D on a layer with C slots:
  hits   resident demanded experts, computed first;
  loads  the misses, in the order they are loaded and computed. A load takes a free slot or evicts a
         non-demanded resident (the policy's victim order); when D is larger than C the misses stream
         in waves through slots whose demanded occupant has already been computed (`after` names it:
         the copy must not start before that compute is done). The policy's keep order decides which
         C of D are still resident afterwards.

Every order is total, so the counts never depend on how a sort places ties: victims go by the policy's
victim key, ties by ascending expert id (np.lexsort; Eviction.victim_order likewise), a prefetch ranks by
token count, ties by ascending id, and every keep order breaks its ties by expert id (eviction.py). Nothing
depends on hash order, on thread count or on numpy's SIMD dispatch (tests/test_exact_counts.py).

Inside this module (and the policies and the simulator) a layer is its MoE position i = 0..L_moe-1;
`serve(demand)` converts the model layer index once, and Plan/Load keep `.layer` (model index) for
the engine.

Every count is kept per phase of the demand stream: `prefill` (step.kind == "prefill"), `first` (the
first denoising step of a block round, block_step == 0) and `later`; the totals are their sums. A
count belongs to the phase of the demand whose plan made it, and a prefetch's fate (prefetch hit or
wasted prefetch) belongs to the phase of the demand that issued the prefetch, so in every phase
speculative_transfers == prefetch_hits + wasted_prefetches once the run is finished.
"""

from __future__ import annotations

import numpy as np

from artifact.errors import SettingError
from artifact.offload.backend.plans import (
    BYTES,
    EMPTY,
    HITS,
    MISSES,
    NONE,
    PHASES,
    SPECULATIVE,
    WASTED,
    CacheCounts,
    Load,
    Plan,
    phase_of,
)
from artifact.offload.policy.eviction import Eviction
from artifact.offload.policy.policies import Policy, Prediction

_NEVER_EVICT = np.iinfo(np.int64).max
_INT64 = np.dtype(np.int64)


class LayerCache:
    """One layer's C slots. Slots fill in order 0, 1, ... and never empty again, so the free slots are
    always [filled, C)."""

    __slots__ = ("capacity", "num_experts", "slot_of", "expert_in", "unused", "filled", "prefetched")

    def __init__(self, capacity: int, num_experts: int):
        self.capacity, self.num_experts = capacity, num_experts
        self.slot_of = np.full(num_experts, EMPTY, dtype=np.int64)  # (E,) slot or EMPTY
        self.expert_in = np.full(capacity, EMPTY, dtype=np.int64)  # (C,) expert or EMPTY
        self.unused = np.zeros(num_experts, dtype=np.int8)  # (E,) prefetched, not yet demanded: 1 + phase
        self.filled = 0
        self.prefetched = False  # a prefetch was ever placed here: only then is `unused` looked at

    def resident(self) -> np.ndarray:
        return self.expert_in[: self.filled]

    def check(self) -> None:
        """Raise RuntimeError, naming what is wrong, unless the slots and the experts are one bijection: slots
        [0, filled) each hold a distinct expert, slots [filled, C) hold none, and slot_of maps exactly the
        resident experts back to their slots (EMPTY for every other expert)."""
        held = self.expert_in[: self.filled]
        if not 0 <= self.filled <= self.capacity:
            raise RuntimeError(f"layer cache: filled = {self.filled} outside [0, {self.capacity}]")
        if (held == EMPTY).any() or (self.expert_in[self.filled :] != EMPTY).any():
            raise RuntimeError(
                f"layer cache: the slots in use are not exactly [0, {self.filled}): "
                f"expert_in = {self.expert_in.tolist()}"
            )
        if len(np.unique(held)) != len(held):
            raise RuntimeError(f"layer cache: an expert sits in two slots: expert_in = {held.tolist()}")
        wrong = [(int(e), s, int(self.slot_of[e])) for s, e in enumerate(held) if self.slot_of[e] != s]
        if wrong:
            raise RuntimeError(
                f"layer cache: slot_of disagrees with expert_in (expert, slot, slot_of): {wrong}"
            )
        stray = np.flatnonzero(self.slot_of != EMPTY)
        if len(stray) != len(held):
            extra = sorted(set(stray.tolist()) - set(held.tolist()))
            raise RuntimeError(f"layer cache: slot_of gives a slot to experts in none: {extra}")


class ExpertCache:
    """C slots for each MoE layer, driven by one policy. `serve` takes the model's Demand (model layer
    index); `plan` is the same call on the MoE position with arrays (the simulator's entry)."""

    def __init__(
        self, moe_layers: list[int], num_experts: int, capacity: int, policy: Policy, expert_bytes: int
    ):
        if not 1 <= capacity <= num_experts:
            raise SettingError(
                f"cache capacity must be in [1, {num_experts}] experts per layer, got {capacity}"
            )
        if policy.num_layers != len(moe_layers) or policy.num_experts != num_experts:
            raise ValueError(
                f"policy built for {policy.num_layers} layers x {policy.num_experts} experts, "
                f"cache has {len(moe_layers)} x {num_experts}"
            )
        self.moe_layers = list(moe_layers)
        self.index = {layer: i for i, layer in enumerate(self.moe_layers)}
        self.capacity, self.num_experts, self.expert_bytes = capacity, num_experts, expert_bytes
        self.layers = [LayerCache(capacity, num_experts) for _ in self.moe_layers]
        self.policy = policy
        self.counts = CacheCounts(self._still_unused)
        self.finished = False
        self._slots = np.arange(capacity, dtype=np.int64)  # slot ids, sliced for free slots
        self._slots.flags.writeable = False
        self._keep = np.zeros(num_experts, dtype=bool)  # scratch mark for oversized demands
        # The eviction hooks, resolved once (the one dispatch): a policy that defines one decides it (belady,
        # interval_refresh's keep order), else its eviction policy does (policy.eviction: LRU unless the
        # spec named one). Fast paths: the LRU keep order is computed inline, and victims come from
        # eviction keys unless the deciding object orders candidates itself.
        ev = policy.eviction
        ev.attach(capacity)
        own = {h: policy.decides(h) for h in ("keep_order", "victim_keys", "touch", "victim_order")}
        self._keep_order = policy.keep_order if own["keep_order"] else ev.keep_order
        self._victim_keys = policy.victim_keys if own["victim_keys"] else ev.victim_keys
        self._touch = policy.touch if own["touch"] else ev.touch
        self._lru_keep = not own["keep_order"] and type(ev).keep_order is Eviction.keep_order
        if own["victim_order"]:
            self._victim_order = policy.victim_order
        elif not own["victim_keys"] and type(ev).victim_order is not Eviction.victim_order:
            self._victim_order = ev.victim_order
        else:
            self._victim_order = None
        self._demanded = ev.demanded if type(ev).demanded is not Eviction.demanded else None
        self._evicted = ev.evicted if type(ev).evicted is not Eviction.evicted else None

    # --- the calls the engine and the simulator make per demand --------------------------------
    def serve(self, demand) -> tuple[Plan, list[Load]]:
        """Plan one (forward, layer) demand of the model (.layer model index, .experts, .counts, .step,
        optional .predicted), then the policy's speculative loads (issued after the demand's own)."""
        plan, prefetch = self.serve_plans(demand)
        return plan, (prefetch.loads if prefetch is not None else [])

    def serve_plans(self, demand) -> tuple[Plan, Plan | None]:
        """serve, with the prefetch as its plan (arrays; None: no prefetch): the engine's entry."""
        return self.plan(
            self.index[demand.layer],
            np.asarray(demand.experts, dtype=np.int64),
            np.asarray(demand.counts, dtype=np.int64),
            demand.step,
            phase_of(demand.step),
            getattr(demand, "predicted", None),
        )

    def plan(
        self, i: int, experts: np.ndarray, counts: np.ndarray, step, phase: int, predicted=None
    ) -> tuple[Plan, Plan | None]:
        """Plan the demand of MoE layer i (experts ascending, int64), then ask the policy for a
        prediction and plan it. Returns (demand plan, prefetch plan or None)."""
        pol = self.policy
        plan = self._plan_demand(i, experts, counts, step, phase)
        if pol.needs_prediction:
            pol.predicted = predicted
        guess = pol.predict(i, experts, counts, step)
        pol.advance()
        if guess is None:
            return plan, None
        if type(guess) is not Prediction:
            guess = Prediction(*guess)  # a policy may return a plain tuple
        if guess.target == i:  # never prefetch into the layer being computed
            return plan, None
        return plan, self._plan_prefetch(guess.target, guess.experts, guess.counts, phase)

    def finish(self) -> CacheCounts:
        """End of run: prefetched experts never used count as wasted (in their issuing phase)."""
        if not self.finished:
            for lc in self.layers:
                if lc.prefetched:
                    self._book_wasted(lc.unused)
                    lc.unused[:] = 0
            self.finished = True
        return self.counts

    # --- planning ------------------------------------------------------------------------------
    def _still_unused(self) -> list[int]:
        """Prefetched experts resident and not yet demanded, per issuing phase."""
        codes = np.zeros(len(PHASES) + 1, dtype=np.int64)
        for lc in self.layers:
            if lc.prefetched:
                codes += np.bincount(lc.unused, minlength=len(PHASES) + 1)
        return codes[1:].tolist()

    def _book_wasted(self, issued: np.ndarray) -> None:
        """Count unused prefetches (their `unused` codes, 1 + issuing phase; zeros ignored) as wasted."""
        for p, k in enumerate(np.bincount(issued, minlength=len(PHASES) + 1)[1:].tolist()):
            self.counts.phases[p][WASTED] += k

    def _plan_demand(self, i: int, experts: np.ndarray, counts: np.ndarray, step, phase: int) -> Plan:
        lc, pol, C = self.layers[i], self.policy, self.capacity
        tally = self.counts.phases[phase]
        pol.observe(i, experts, counts, step)
        slots = lc.slot_of[experts]
        hit = slots >= 0
        if self._demanded is not None:
            self._demanded(i, experts, counts, hit, step)
        n = len(experts)
        nh = int(np.count_nonzero(hit))
        m = n - nh
        tally[HITS] += nh
        tally[MISSES] += m
        if lc.prefetched:  # demanded prefetches are used now (CacheCounts
            lc.unused[experts] = 0  # derives prefetch hits per issuing phase)
        layer = self.moe_layers[i]
        if m == 0:
            self._touch(i, experts if self._lru_keep else self._keep_order(i, experts, counts, hit, step))
            return Plan(layer, i, experts, slots)
        tally[BYTES] += m * self.expert_bytes
        if nh:
            hit_experts, hit_slots = experts[hit], slots[hit]
        else:
            hit_experts = hit_slots = NONE
        if self._lru_keep:  # LRU keep order: hits, then misses, each ascending
            misses = experts[~hit] if nh else experts
            order = np.concatenate((hit_experts, misses)) if nh else experts
        else:
            order = self._keep_order(i, experts, counts, hit, step)
            misses = order[lc.slot_of[order] < 0] if nh else order
        if n <= C:
            load_slots, free, evicted = self._take_slots(i, lc, m, hit_slots)
            self._place(i, lc, misses, load_slots, evicted)
            plan = Plan(layer, i, hit_experts, hit_slots, misses, load_slots, free, evicted)
        else:
            plan = self._stream_through(i, lc, order, misses, hit_experts, hit_slots, layer)
        self._touch(i, order)
        return plan

    def _take_slots(self, i: int, lc: LayerCache, k: int, protected_slots: np.ndarray):
        """Slots for k copies that may start at once: free slots first, then those of residents outside
        `protected_slots` in the policy's eviction order. Returns (slots, free, evicted): the first
        `free` slots were free, the others evict `evicted`, in order."""
        filled = lc.filled
        free = min(self.capacity - filled, k)
        rest = k - free
        if rest == 0:
            return self._slots[filled : filled + k], k, NONE
        if self._victim_order is not None:  # a policy that orders candidates itself
            keep = np.ones(filled, dtype=bool)
            keep[protected_slots] = False
            evicted = self._victim_order(i, lc.expert_in[:filled][keep])[:rest]
            taken = lc.slot_of[evicted]
        else:
            residents = lc.expert_in[:filled]
            keys = self._victim_keys(i, residents)  # (filled,) by slot; a fresh array
            keys[protected_slots] = _NEVER_EVICT
            taken = np.lexsort((residents, keys))[:rest]  # slots, first victim first (victim_order)
            evicted = residents[taken]
        if free == 0:
            return taken, 0, evicted
        return np.concatenate((self._slots[filled : filled + free], taken)), free, evicted

    def _place(
        self, i: int, lc: LayerCache, experts: np.ndarray, slots: np.ndarray, evicted: np.ndarray
    ) -> None:
        """Copy `experts` into `slots` (distinct), evicting the residents `evicted` (the rest were free)."""
        if len(evicted):
            if self._evicted is not None:
                self._evicted(i, evicted)
            if lc.prefetched:
                u = lc.unused[evicted]
                if np.count_nonzero(u):
                    self._book_wasted(u)
                    lc.unused[evicted] = 0
            lc.slot_of[evicted] = EMPTY
        lc.filled += len(experts) - len(evicted)
        lc.expert_in[slots] = experts
        lc.slot_of[experts] = slots

    def _stream_through(
        self,
        i: int,
        lc: LayerCache,
        order: np.ndarray,
        misses: np.ndarray,
        hit_experts: np.ndarray,
        hit_slots: np.ndarray,
        layer: int,
    ) -> Plan:
        """A demand larger than C: its misses stream through the slots in waves; the last C of `order`
        stay resident.

        Misses are loaded in `order` (those that will not stay first). The a = C - hits slots that hold
        no demanded expert take the first a copies at once (free slots, then every non-demanded
        resident in eviction order). Every later copy reuses the slot of a demanded expert that will not
        stay, once that expert is computed: first the hits that will not stay (ascending), then the
        misses that will not stay, in the order they were loaded. So the slot sequence repeats with
        period p = a + those hits, and copy j waits for the occupant copied p places earlier. If every
        hit stays and no slot is free of demanded experts (p = 0), the hit least worth keeping gives up
        its slot to the stream."""
        C, n, m = self.capacity, len(order), len(misses)
        nh = len(hit_experts)
        if nh and self._lru_keep:  # order = hits, misses: the first n - C hits go
            going_hits = hit_experts[: n - C]
        elif nh:
            keep = self._keep
            kept = order[n - C :]
            keep[kept] = True
            going_hits = hit_experts[~keep[hit_experts]]
            keep[kept] = False
            if len(going_hits) == 0 and nh == C:  # p = 0: demote one kept hit
                going_hits = kept[lc.slot_of[kept] >= 0][:1]
        else:
            going_hits = NONE
        a = C - nh
        first, free, evicted = self._take_slots(i, lc, a, hit_slots)  # every non-demanded resident goes
        period = np.concatenate((first, lc.slot_of[going_hits])) if len(going_hits) else first
        p = len(period)
        # State afterwards: the last period of copies, j = m-p .. m-1 into period[j % p], holds the kept
        # misses; the streamed-through experts and the hits that gave up their slots are gone.
        r = (m - p) % p
        self._place(
            i,
            lc,
            misses[m - p :],
            np.concatenate((period[r:], period[:r])) if r else period,
            np.concatenate((evicted, going_hits)) if len(going_hits) else evicted,
        )
        return Plan(layer, i, hit_experts, hit_slots, misses, None, free, evicted, (period, a, going_hits))

    def _plan_prefetch(self, i: int, experts, counts, phase: int) -> Plan | None:
        """Load a prediction for layer i: `experts` ranked most wanted first, or, with `counts`, experts
        to rank by token count (most first, then id); ranking is skipped when nothing is to load.
        Default placement: make the C most wanted resident, evicting residents outside them in the
        policy's order. Conservative policies: load the non-resident predicted experts only into free
        slots and slots of residents outside the whole prediction, most wanted first (a predicted
        resident is never swapped out)."""
        lc, C, conservative = self.layers[i], self.capacity, self.policy.conservative
        if type(experts) is not np.ndarray or experts.dtype is not _INT64:
            experts = np.asarray(experts, dtype=np.int64)
        if counts is not None and (len(experts) <= C or conservative):
            # The whole prediction is the target: rank only its non-resident part (same order).
            slots = lc.slot_of[experts]
            present = slots >= 0
            resident = np.count_nonzero(present)
            if resident == len(present) or (conservative and resident == C):  # nothing to load, or no room
                return None
            absent = ~present
            wanted = experts[absent]
            wanted = wanted[(wanted - counts[absent] * self.num_experts).argsort(kind="stable")]
        else:
            if counts is not None:
                experts = experts[(experts - counts * self.num_experts).argsort(kind="stable")[:C]]
            target = experts if conservative else experts[:C]
            slots = lc.slot_of[target]
            present = slots >= 0
            wanted = target[~present]
        if conservative:  # room: free slots + residents outside the prediction
            wanted = wanted[: C - int(np.count_nonzero(present))]
        k = len(wanted)
        if k == 0:
            return None
        load_slots, free, evicted = self._take_slots(i, lc, k, slots[present])
        self._place(i, lc, wanted, load_slots, evicted)
        lc.unused[wanted] = phase + 1
        lc.prefetched = True
        tally = self.counts.phases[phase]
        tally[SPECULATIVE] += k
        tally[BYTES] += k * self.expert_bytes
        self._touch(i, wanted)
        return Plan(self.moe_layers[i], i, NONE, NONE, wanted, load_slots, free, evicted, None, True)

    # --- inspection ----------------------------------------------------------------------------
    def resident(self, layer: int) -> np.ndarray:
        """Resident experts of a model layer, ascending."""
        return np.sort(self.layers[self.index[layer]].resident())
