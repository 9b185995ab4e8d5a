"""The offloaded expert backend: executes the cache's plans on the link while the experts compute.

For each demand: the cache plans it; the engine issues the loads for the misses as one batch on the
link (the policy's speculative loads for a later layer only once every demand load of this layer is
issued, so no demand copy ever queues behind them, whatever the link priority), hands out the resident
experts as one group while those copies are in flight, then the misses in groups as they land: on a
host-timed link (emulated) whatever has landed by then, on a GPU link a whole wave at once (compute waits
for the copies on the GPU timeline, so the host never blocks). A copy into a slot whose occupant is
demanded in the same step (a wave) is issued right after the group that computed that occupant.

Groups are rows of the layer's slot tensor (C, P), viewed as stacks (see experts.ExpertGroup); a group
never holds two experts of one slot, because a slot's next copy waits for the compute of its occupant.

The host path costs little per copy, as a GPU run needs: copies are issued straight from the
plan's arrays (one gather per batch, labels made once per expert, no object per miss), and a demand's
groups are found in one pass over its queue. Without waves every copy is issued before the first group,
into distinct slots, so a group runs on while copies are ready (on a GPU link: all of them, one group);
with waves a copy's ticket is looked up when the scan reaches it, and a group stops before a slot it
already holds. tests/test_engine_golden.py pins the calls on the link and the groups to those of the
engine before this path.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

import torch

from artifact.model.experts import ExpertGroup, SlotPool, stack_views
from artifact.model.routing import Demand
from artifact.offload.backend.cache import ExpertCache
from artifact.offload.backend.plans import EMPTY, Plan
from artifact.offload.backend.store import HostStore, check_slots_fit
from artifact.offload.links.link import Link
from artifact.offload.spec import RunSpec

NUMPY_SORT = 32  # a group of at least this many experts is sorted by its slots in numpy


@dataclass
class Queue:
    """Experts of one demand in the order their groups compute them, as columns: their slots and the tickets
    of their copies still to wait on (columns, not an object per copy: the host path's budget per copy)."""

    experts: list[int]
    slots: list[int]
    tickets: list


def _pick(seq, index: list[int]) -> tuple:
    """seq[k] for k in index (at least one), gathered in C."""
    return itemgetter(*index)(seq) if len(index) > 1 else (seq[index[0]],)


def allocate_slots(
    store: HostStore, cache: ExpertCache, device: torch.device, slot_pool: SlotPool | None = None
) -> dict[int, torch.Tensor]:
    """The device slots: per MoE layer one (C, P) tensor of the experts' dtype, a row per slot, from the
    model's pool when given (a new engine then reuses the previous engine's slots, and the stages captured
    over them)."""
    P = store.packed.shape[2]
    pool = slot_pool or SlotPool()
    return {
        layer: pool.slots(layer, cache.capacity, P, store.packed.dtype, device) for layer in cache.moe_layers
    }


class OffloadEngine:
    def __init__(
        self,
        store: HostStore,
        cache: ExpertCache,
        link: Link,
        cfg,
        device: torch.device | str = "cpu",
        slot_pool: SlotPool | None = None,
    ):
        self.store, self.cache, self.link = store, cache, link
        self.device = torch.device(device)
        self.slots = allocate_slots(store, cache, self.device, slot_pool)  # (C, P) per MoE layer
        self.stacks = {layer: stack_views(s, cfg) for layer, s in self.slots.items()}  # (C, 2I, D), (C, D, I)
        # (P,) view per slot, made once
        self.slot_rows = {layer: s.unbind(0) for layer, s in self.slots.items()}
        # A copy's label names its expert (the slot is its destination): made once, so a copy costs no string.
        self.labels = {
            layer: [f"layer {layer} expert {e}" for e in range(store.num_experts)]
            for layer in cache.moe_layers
        }
        self.pending = {layer: {} for layer in cache.moe_layers}  # layer -> {slot: ticket not yet waited}
        self.freed = {layer: None for layer in cache.moe_layers}  # layer -> marker after its last compute
        self.finished = False

    def _issue(
        self, layer: int, experts: list[int], slots: list[int], after, speculative: bool = False
    ) -> list:
        """One batch of copies on the link, experts[k] into slots[k]; `after` orders them behind the compute
        that freed their slots. Returns the tickets, also kept in `pending` until waited."""
        items = list(
            zip(
                _pick(self.slot_rows[layer], slots),
                _pick(self.store.rows[layer], experts),
                _pick(self.labels[layer], experts),
            )
        )
        tickets = self.link.copy(items, after=after, speculative=speculative)
        self.pending[layer].update(zip(slots, tickets))
        return tickets

    def _issue_speculative(self, prefetch: Plan) -> None:
        """The policy's prefetches (one target layer), behind that layer's last compute."""
        self._issue(
            prefetch.layer,
            prefetch.load_experts.tolist(),
            prefetch.load_slots.tolist(),
            self.freed[prefetch.layer],
            speculative=True,
        )

    def _group(self, layer: int, experts: list[int], slots: list[int], arrays=None) -> ExpertGroup:
        """The group of experts[k] in slots[k], listed by ascending slot (the stack rows). `arrays`: the same
        as (experts, slots) int64 arrays, which sort a large group faster."""
        gate_up, down = self.stacks[layer]
        if arrays is not None and len(slots) >= NUMPY_SORT:
            order = arrays[1].argsort()
            return ExpertGroup(
                tuple(arrays[0][order].tolist()), tuple(arrays[1][order].tolist()), gate_up, down
            )
        order = sorted(range(len(slots)), key=slots.__getitem__)
        return ExpertGroup(
            tuple(map(experts.__getitem__, order)), tuple(map(slots.__getitem__, order)), gate_up, down
        )

    def groups(self, demand: Demand):
        """The demand's expert groups, in compute order (the module docstring): its resident experts in one
        group while the misses' copies are in flight, then the rest as their copies land."""
        plan, prefetch = self.cache.serve_plans(demand)
        layer, link = demand.layer, self.link
        link.pump()  # issue points: here and after each group
        pending = self.pending[layer]
        hit_e, hit_s = plan.hit_experts.tolist(), plan.hit_slots.tolist()
        if pending:  # demand priority: a demanded prefetch is demand,
            for s in hit_s:  # queued ahead of this layer's misses
                if s in pending:
                    link.promote(pending[s])
        load_e, load_s = plan.load_experts.tolist(), plan.load_slots.tolist()
        now_e, now_s, waiting = self._split_waves(plan, load_e, load_s)
        # This layer's copies wait for its last compute; speculative ones for their own layer's.
        now_t = self._issue(layer, now_e, now_s, self.freed[layer]) if now_e else []
        if not waiting and prefetch is not None:  # every demand load is issued: now the prefetches (else
            self._issue_speculative(prefetch)  # after the last wave)
            prefetch = None
        ready, queue, hits = self._partition(layer, plan, hit_e, hit_s, Queue(load_e, load_s, now_t))
        streams = bool(waiting)
        if ready.experts:
            link.wait(ready.tickets)  # landed: no stall, but ordered
            yield self._group(layer, ready.experts, ready.slots, hits)
            prefetch = self._release(layer, ready.experts, waiting, prefetch)
            link.pump()
        if streams:
            yield from self._waves(layer, queue.experts, queue.slots, waiting, prefetch)
        else:
            yield from self._stream(layer, plan, queue)
        self.freed[layer] = link.compute_done(layer)

    @staticmethod
    def _split_waves(plan: Plan, load_e: list[int], load_s: list[int]) -> tuple[list[int], list[int], dict]:
        """The demand's loads to issue now, and those whose slot's occupant is demanded too (a wave): they
        wait for its compute, as `waiting`: occupant -> (experts, slots)."""
        waiting: dict[int, tuple[list[int], list[int]]] = {}
        if not plan.streams:
            return load_e, load_s, waiting
        now_e, now_s = [], []
        for e, s, a in zip(load_e, load_s, plan.load_after.tolist()):
            if a == EMPTY:
                now_e.append(e)
                now_s.append(s)
            elif a in waiting:
                waiting[a][0].append(e)
                waiting[a][1].append(s)
            else:
                waiting[a] = ([e], [s])
        return now_e, now_s, waiting

    def _partition(self, layer: int, plan: Plan, hit_e: list[int], hit_s: list[int], loads: Queue):
        """(ready, queue, hits): the resident experts, computed first in one group (with the tickets of their
        landed prefetches, to wait on in order), and the queue behind them: hits whose prefetch copy is still
        in flight, in hit order, then the loads. `hits`: the ready group as arrays when it is every hit."""
        pending, landed = self.pending[layer], self.link.landed
        if not any(map(pending.__contains__, hit_s)):
            return Queue(hit_e, hit_s, []), loads, (plan.hit_experts, plan.hit_slots)
        ready, queue = Queue([], [], []), Queue([], [], [])
        for e, s in zip(hit_e, hit_s):
            t = pending.get(s)
            if t is None or landed(t):
                if t is not None:
                    ready.tickets.append(pending.pop(s))
                ready.experts.append(e)
                ready.slots.append(s)
            else:
                queue.experts.append(e)
                queue.slots.append(s)
                queue.tickets.append(t)
        queue.experts += loads.experts
        queue.slots += loads.slots
        queue.tickets += loads.tickets
        return ready, queue, None

    def _stream(self, layer: int, plan: Plan, queue: Queue):
        """The groups of a demand whose copies are all issued (queue.tickets), into distinct slots: a group is
        the next expert in copy order, then every following one whose copy is ready."""
        pending, link = self.pending[layer], self.link
        tickets, n, i, ready = queue.tickets, len(queue.tickets), 0, link.ready
        h = n - len(plan.load_slots)  # in-flight hits ahead of the loads
        while i < n:
            j = i + 1
            while j < n and ready(tickets[j]):
                j += 1
            if len(pending) == j - i:  # the group's copies are all that is pending
                pending.clear()
            else:
                for s in queue.slots[i:j]:
                    del pending[s]
            link.wait(tickets[i:j])
            loads = (
                (plan.load_experts[i - h : j - h], plan.load_slots[i - h : j - h])
                if i >= h and j - i >= NUMPY_SORT
                else None
            )
            yield self._group(layer, queue.experts[i:j], queue.slots[i:j], loads)
            link.pump()
            i = j

    def _waves(
        self, layer: int, queue_e: list[int], queue_s: list[int], waiting: dict, prefetch: Plan | None
    ):
        """The groups of a demand whose copies stream through the slots in waves: a wave's copy is issued
        only once the group that computed its slot's occupant is done, so its ticket is looked up when the
        scan reaches it; a group stops before a slot it already holds."""
        pending, link = self.pending[layer], self.link
        n, i, ready, get = len(queue_s), 0, link.ready, pending.get
        while i < n:
            j, held = i + 1, {queue_s[i]}
            while j < n:
                s = queue_s[j]
                t = get(s)
                if t is None or not ready(t) or s in held:
                    break
                held.add(s)
                j += 1
            members_e, members_s = queue_e[i:j], queue_s[i:j]
            link.wait([t for t in map(pending.pop, members_s, repeat(None)) if t is not None])
            yield self._group(layer, members_e, members_s)
            prefetch = self._release(layer, members_e, waiting, prefetch)
            link.pump()
            i = j
        assert not waiting, f"layer {layer}: loads never issued for {waiting}"

    def _release(
        self,
        layer: int,
        computed: list[int],
        waiting: dict[int, tuple[list[int], list[int]]],
        prefetch: Plan | None,
    ) -> Plan | None:
        """After a group's compute: issue the wave copies that waited for one of its experts; once the last
        one is issued, the held prefetch. Returns the prefetch still held."""
        if not waiting:
            return prefetch
        experts, slots = [], []
        for e in computed:
            w = waiting.pop(e, None)
            if w is not None:
                experts += w[0]
                slots += w[1]
        if experts:
            self._issue(layer, experts, slots, self.link.compute_done(layer))
        if not waiting and prefetch is not None:
            self._issue_speculative(prefetch)
            return None
        return prefetch

    def finish(self) -> dict:
        """End of run: land outstanding copies, settle link timing, count unused prefetches."""
        finished = self.cache.finish()
        counts = {**finished.as_dict(), "by_phase": finished.by_phase()}  # the phases add up to the totals
        for p in self.pending.values():  # unused prefetches: their link time is already counted
            p.clear()
        link = self.link.finish()
        self.finished = True
        return {
            **counts,
            "transfers": link.transfers,
            "link_bytes": link.bytes,
            "stall_seconds": link.stall_seconds,
            "link_busy_seconds": link.busy_seconds,
            "achieved_gbps": link.achieved_gbps,
            "cache_experts": self.cache.capacity,
        }


def build_cache(moe_layers: list[int], num_experts: int, capacity: int, policy, expert_bytes: int):
    """The one place an ExpertCache is made: the model-driven and the stream-driven engine (build_engine,
    offload), the replay simulator and the benchmarks all come here, so each runs the same cache over the
    same policy code."""
    return ExpertCache(moe_layers, num_experts, capacity, policy, expert_bytes)


def build_engine(
    spec: RunSpec,
    layout,
    store: HostStore,
    shape,
    *,
    future=None,
    clock=None,
    expert_bytes: int | None = None,
    slot_pool: SlotPool | None = None,
) -> OffloadEngine:
    """The engine of an offloaded run as `spec` says: its policy (an oracle's `future` when it needs one),
    its link (on `clock` when given), a cache
    of spec.capacity slots per MoE layer of `layout` (anything with moe_layers and num_experts: the model's
    config, a trace's Layout), over `store`, computing experts of `shape` on spec.device. Every copy stands
    for `expert_bytes` (default: the store's rows; a virtual-time run charges the modelled expert's)."""
    spec.fits(layout.num_experts)
    policy = spec.make_policy(len(layout.moe_layers), layout.num_experts, future)
    nbytes = expert_bytes or store.expert_bytes
    link = spec.make_link(nbytes, clock)
    cache = build_cache(layout.moe_layers, layout.num_experts, spec.capacity, policy, nbytes)
    return OffloadEngine(store, cache, link, shape, spec.device, slot_pool=slot_pool)


@dataclass(frozen=True)
class Layout:
    """The MoE layers and experts per layer an engine serves, when no model config is at hand (a trace's)."""

    moe_layers: tuple[int, ...]
    num_experts: int

    @classmethod
    def of_meta(cls, meta: dict) -> Layout:
        return cls(tuple(meta["moe_layers"]), int(meta["num_experts"]))


def offload(model, experts: torch.Tensor, capacity: int, policy, link: Link, device="cpu") -> OffloadEngine:
    """An offloaded engine over the packed host experts from a policy and a link already made (a test's or a
    script's; a run builds its own with build_engine), its slots from the model's slot pool. The model is left
    as it is: pass the engine in a forward's options (ForwardOptions.backend), or install it."""
    cfg = model.cfg
    check_slots_fit(cfg, capacity, experts.dtype, device, weights_loaded=True)
    store = HostStore(experts, cfg.moe_layers, pin=torch.device(device).type == "cuda")
    cache = build_cache(cfg.moe_layers, cfg.num_experts, capacity, policy, store.expert_bytes)
    return OffloadEngine(store, cache, link, cfg, device, slot_pool=model.slot_pool)


def install(model, backend):
    """Make `backend` (an offloaded engine, or resident experts) the model's own expert backend, used by every
    forward whose options name none; returns the backend it replaces, to put back (install(model,
    previous))."""
    previous, model.backend = model.backend, backend
    return previous
