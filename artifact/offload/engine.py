"""The offloaded expert backend: executes the cache's plans on the link while the experts compute.

For each demand: the cache plans it; the engine issues the loads for the misses, hands out the
resident experts while those copies are in flight, then each missed expert as soon as its copy lands.
A copy into a slot whose occupant is demanded in the same step is issued right after that occupant has
been computed. The policy's speculative loads for a later layer are issued only after every demand load
of this layer, so no demand copy ever queues behind them on the link (whatever the link priority).
"""
from __future__ import annotations

from collections import defaultdict

import torch

from artifact.model.llada2 import Demand, expert_views
from artifact.offload.cache import EMPTY, ExpertCache, Load
from artifact.offload.store import HostStore


class OffloadEngine:
    def __init__(self, store: HostStore, cache: ExpertCache, link, cfg, device: torch.device | str = "cpu"):
        self.store, self.cache, self.link = store, cache, link
        self.device = torch.device(device)
        P = store.packed.shape[2]
        self.slots = {layer: torch.zeros(cache.capacity, P, dtype=store.packed.dtype, device=self.device)
                      for layer in cache.moe_layers}                      # (C, P) per MoE layer
        self.views = {layer: [expert_views(s[c], cfg) for c in range(cache.capacity)]
                      for layer, s in self.slots.items()}
        self.pending = {layer: {} for layer in cache.moe_layers}        # layer -> {slot: ticket not yet waited}
        self.freed = {layer: {} for layer in cache.moe_layers}          # layer -> {slot: event after last read}
        self.events = link.kind == "cuda"                               # CPU compute is synchronous: no events
        self.finished = False

    def _issue(self, ld: Load):
        dst = self.slots[ld.layer][ld.slot]
        after = self.freed[ld.layer].get(ld.slot)
        self.pending[ld.layer][ld.slot] = self.link.copy(dst, self.store.expert(ld.layer, ld.expert), after=after,
                                                         speculative=ld.speculative)

    def experts(self, demand: Demand):
        plan, speculative = self.cache.serve(demand)
        layer = demand.layer
        pending, freed, views = self.pending[layer], self.freed[layer], self.views[layer]
        waiting: dict[int, list[Load]] = defaultdict(list)              # occupant -> loads into its slot
        promote = getattr(self.link, "promote", None)       # demand priority: a demanded prefetch is demand,
        if pending and promote is not None:                 # queued ahead of this layer's misses
            for _, slot in plan.hits:
                if slot in pending:
                    promote(pending[slot])
        for ld in plan.loads:
            if ld.after == EMPTY:
                self._issue(ld)
            else:
                waiting[ld.after].append(ld)
        # Issue order (issue 13): speculative loads only once all of this layer's demand loads are
        # issued, i.e. now if no load waits for a compute, else right after the last waiting one.
        if not waiting:
            for ld in speculative:
                self._issue(ld)
        hits = plan.hits
        if pending:      # resident experts first; those whose (prefetch) copy is still in flight go last
            hits = sorted(hits, key=lambda es: (es[1] in pending and not self.link.ready(pending[es[1]]), es[0]))
        for e, slot in hits + [(ld.expert, ld.slot) for ld in plan.loads]:
            ticket = pending.pop(slot, None)
            if ticket is not None:
                self.link.wait(ticket)
            yield e, views[slot]
            if self.events:
                freed[slot] = self.link.compute_done(self.slots[layer][slot])
            if waiting:
                for ld in waiting.pop(e, ()):
                    self._issue(ld)
                if not waiting:                                 # the last demand load is issued
                    for ld in speculative:
                        self._issue(ld)
        assert not waiting, f"layer {layer}: loads never issued for {dict(waiting)}"

    def finish(self) -> dict:
        """End of run: land outstanding copies, settle link timing, count unused prefetches."""
        counts = self.cache.finish().as_dict()
        for p in self.pending.values():          # unused prefetches: their link time is already counted
            p.clear()
        link = self.link.finish()
        self.finished = True
        return {**counts, "transfers": link.transfers, "link_bytes": link.bytes,
                "stall_seconds": link.stall_seconds, "link_busy_seconds": link.busy_seconds,
                "achieved_gbps": link.achieved_gbps, "cache_experts": self.cache.capacity}


def offload(model, experts: torch.Tensor, capacity: int, policy, link, device="cpu") -> OffloadEngine:
    """Replace `model`'s expert backend by an offloaded engine over the packed host experts."""
    cfg = model.cfg
    store = HostStore(experts, cfg.moe_layers, pin=torch.device(device).type == "cuda")
    cache = ExpertCache(cfg.moe_layers, cfg.num_experts, capacity, policy, store.expert_bytes)
    engine = OffloadEngine(store, cache, link, cfg, device)
    model.backend = engine
    return engine
