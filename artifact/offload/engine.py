"""The offloaded expert backend: executes the cache's plans on the link while the experts compute.

For each demand: the cache plans it; the engine issues the loads for the misses as one batch on the
link (the policy's speculative loads for a later layer only once every demand load of this layer is
issued, so no demand copy ever queues behind them, whatever the link priority), hands out the resident
experts as one
group while those copies are in flight, then the misses in groups as they land: on a host-timed link
(emulated) whatever has landed by then, on a GPU link a whole wave at once (compute waits for the copies
on the GPU timeline, so the host never blocks). A copy into a slot whose occupant is demanded in the same
step (a wave) is issued right after the group that computed that occupant.

Groups are rows of the layer's slot tensor (C, P), viewed as stacks (see llada2.ExpertGroup); a group
never holds two experts of one slot, because a slot's next copy waits for the compute of its occupant.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from artifact.model.llada2 import EXPERT_KERNELS, Demand, ExpertGroup, stack_views
from artifact.offload.cache import EMPTY, ExpertCache, Load
from artifact.offload.link import Link
from artifact.offload.store import HostStore, check_slots_fit


class OffloadEngine:
    def __init__(self, store: HostStore, cache: ExpertCache, link: Link, cfg, device: torch.device | str = "cpu"):
        self.store, self.cache, self.link = store, cache, link
        self.device = torch.device(device)
        P = store.packed.shape[2]
        self.slots = {layer: torch.zeros(cache.capacity, P, dtype=store.packed.dtype, device=self.device)
                      for layer in cache.moe_layers}                      # (C, P) per MoE layer
        self.stacks = {layer: stack_views(s, cfg) for layer, s in self.slots.items()}   # (C, 2I, D), (C, D, I)
        self.slot_rows = {layer: s.unbind(0) for layer, s in self.slots.items()}    # (P,) view per slot, made once
        self.pump = getattr(link, "pump", None) or (lambda: None)       # an issue point for a holding link
        self.pending = {layer: {} for layer in cache.moe_layers}        # layer -> {slot: ticket not yet waited}
        self.freed = {layer: None for layer in cache.moe_layers}        # layer -> marker after its last compute
        self.finished = False

    def _issue(self, loads: list[Load], after, speculative: bool = False) -> None:
        """One batch of copies on the link; `after` orders them behind the compute that freed their slots."""
        if not loads:
            return
        slots, rows = self.slot_rows, self.store.rows
        items = [(slots[ld.layer][ld.slot], rows[ld.layer][ld.expert], ld) for ld in loads]   # str(ld): the label
        for ld, ticket in zip(loads, self.link.copy(items, after=after, speculative=speculative)):
            self.pending[ld.layer][ld.slot] = ticket

    def _issue_speculative(self, speculative: list[Load]) -> None:
        """The policy's prefetches, per target layer, each behind its own layer's last compute."""
        for target in dict.fromkeys(ld.layer for ld in speculative):
            self._issue([ld for ld in speculative if ld.layer == target], self.freed[target], speculative=True)

    def _group(self, layer: int, members: list[tuple[int, int]]) -> ExpertGroup:
        members = sorted(members, key=lambda es: es[1])                 # ascending slots: the stack rows
        gate_up, down = self.stacks[layer]
        return ExpertGroup(tuple(e for e, _ in members), tuple(s for _, s in members), gate_up, down)

    def groups(self, demand: Demand):
        plan, speculative = self.cache.serve(demand)
        layer, link = demand.layer, self.link
        self.pump()                                         # issue points: here and after each group
        pending = self.pending[layer]
        waiting: dict[int, list[Load]] = defaultdict(list)              # occupant -> loads into its slot
        promote = getattr(link, "promote", None)            # demand priority: a demanded prefetch is demand,
        if pending and promote is not None:                 # queued ahead of this layer's misses
            for _, slot in plan.hits:
                if slot in pending:
                    promote(pending[slot])
        now = []
        for ld in plan.loads:
            (now if ld.after == EMPTY else waiting[ld.after]).append(ld)
        # This layer's copies wait for its last compute; speculative ones for their own layer's.
        self._issue(now, self.freed[layer])
        if not waiting:                 # every demand load is issued: now the prefetches (else after the last wave)
            self._issue_speculative(speculative)
            speculative = []
        # Resident experts first, in one group; hits whose (prefetch) copy is still in flight queue up
        # in front of the misses, in the order their copies were issued.
        ready, queue, landed = [], [], []
        for e, slot in plan.hits:
            t = pending.get(slot)
            if t is None or link.landed(t):
                if t is not None:
                    landed.append(pending.pop(slot))
                ready.append((e, slot))
            else:
                queue.append((e, slot))
        queue += [(ld.expert, ld.slot) for ld in plan.loads]
        if ready:
            link.wait(landed)                                           # landed: no stall, but ordered
            yield self._group(layer, ready)
            speculative = self._release(layer, ready, waiting, speculative)
            self.pump()
        i = 0
        while i < len(queue):
            # The next expert in copy order, then every following one whose copy is issued and ready.
            j = i + 1
            while j < len(queue) and queue[j][1] in pending and link.ready(pending[queue[j][1]]):
                if any(s == queue[j][1] for _, s in queue[i:j]):
                    break
                j += 1
            members = queue[i:j]
            link.wait([pending.pop(s) for _, s in members if s in pending])
            yield self._group(layer, members)
            speculative = self._release(layer, members, waiting, speculative)
            self.pump()
            i = j
        assert not waiting, f"layer {layer}: loads never issued for {dict(waiting)}"
        self.freed[layer] = link.compute_done(layer)

    def _release(self, layer: int, computed: list[tuple[int, int]], waiting: dict[int, list[Load]],
                 speculative: list[Load]) -> list[Load]:
        """After a group's compute: issue the wave loads that waited for one of its experts; once the last
        one is issued, the held prefetches. Returns the prefetches still held."""
        if not waiting:
            return speculative
        loads = [ld for e, _ in computed for ld in waiting.pop(e, ())]
        if loads:
            self._issue(loads, self.link.compute_done(layer))
        if not waiting and speculative:
            self._issue_speculative(speculative)
            return []
        return speculative

    def finish(self) -> dict:
        """End of run: land outstanding copies, settle link timing, count unused prefetches."""
        finished = self.cache.finish()
        counts = {**finished.as_dict(), "by_phase": finished.by_phase()}     # the phases add up to the totals
        for p in self.pending.values():          # unused prefetches: their link time is already counted
            p.clear()
        link = self.link.finish()
        self.finished = True
        return {**counts, "transfers": link.transfers, "link_bytes": link.bytes,
                "stall_seconds": link.stall_seconds, "link_busy_seconds": link.busy_seconds,
                "achieved_gbps": link.achieved_gbps, "cache_experts": self.cache.capacity}


def offload(model, experts: torch.Tensor, capacity: int, policy, link: Link, device="cpu",
            expert_kernel: str | None = None) -> OffloadEngine:
    """Replace `model`'s expert backend by an offloaded engine over the packed host experts.
    expert_kernel ("grouped" | "loop"), if given, sets how the model computes a group."""
    cfg = model.cfg
    if expert_kernel is not None:
        if expert_kernel not in EXPERT_KERNELS:
            raise ValueError(f"unknown expert_kernel {expert_kernel!r}; choose one of {EXPERT_KERNELS}")
        model.expert_kernel = expert_kernel
    check_slots_fit(cfg, capacity, experts.dtype, device, weights_loaded=True)
    store = HostStore(experts, cfg.moe_layers, pin=torch.device(device).type == "cuda")
    cache = ExpertCache(cfg.moe_layers, cfg.num_experts, capacity, policy, store.expert_bytes)
    engine = OffloadEngine(store, cache, link, cfg, device)
    model.backend = engine
    return engine
