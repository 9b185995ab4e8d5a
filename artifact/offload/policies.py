"""Cache policies: who to evict, who to keep when a demand outgrows the cache, what to prefetch.

Imports nothing from the model or the engine: the same objects serve the live engine and the trace
simulator (offload/cache.py drives them). A policy sees the demand stream one (forward, layer) event
at a time, in the order the model computes them.

  demand            LRU eviction, no prefetch (the design the paper argues for)
  last_step         LRU + when layer l starts, load what the target layer demanded last time
  oracle            LRU + when layer l starts, load what the target layer will truly demand (a trace)
  interval_refresh  LRU, but every tau steps of a block each layer keeps the top-C experts of this step
                    by token count (TIDE-inspired; see IntervalRefresh)
  belady            evict the expert whose next use is farthest (needs the trace; the miss floor)

Adding a policy: subclass Policy, override `keep_order` / `victim_order` (eviction) or `predict`
(prefetch), and register a factory in POLICIES.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


class Policy:
    """Base: LRU eviction, no prefetch. Per-layer state is indexed by the MoE layer's position i."""

    name = "demand"
    needs_trace = False      # True: built from a recorded run (future knowledge)
    engine_ok = True         # False: simulator only

    def __init__(self, num_layers: int, num_experts: int):
        self.num_layers, self.num_experts = num_layers, num_experts
        self.stamp = np.full((num_layers, num_experts), -1, dtype=np.int64)   # last use, for LRU
        self.clock = 0
        self.position = 0    # index of the current event in the demand stream

    # --- eviction ------------------------------------------------------------------------------
    def victim_order(self, i: int, candidates: np.ndarray) -> np.ndarray:
        """Non-demanded resident experts of layer i, the first to evict first (LRU: oldest use)."""
        return candidates[np.lexsort((candidates, self.stamp[i, candidates]))]

    def keep_order(self, i: int, experts: np.ndarray, counts: np.ndarray, hit: np.ndarray, step) -> np.ndarray:
        """The demanded experts ordered least-worth-keeping first; when the demand outgrows the cache,
        the last C stay resident. LRU: hits then misses, each ascending (the last computed stay)."""
        return np.concatenate([experts[hit], experts[~hit]])

    def touch(self, i: int, ordered: np.ndarray) -> None:
        """Record uses in order (the later, the more recent)."""
        n = len(ordered)
        self.stamp[i, ordered] = np.arange(self.clock, self.clock + n)
        self.clock += n

    # --- prefetch ------------------------------------------------------------------------------
    def predict(self, i: int, experts: np.ndarray, counts: np.ndarray, step) -> tuple[int, np.ndarray] | None:
        """Called when layer i's demand is known (before it computes). Return (target layer, experts
        ranked most-wanted first) to load speculatively, or None."""
        return None

    def observe(self, i: int, experts: np.ndarray, counts: np.ndarray, step) -> None:
        """Called for every demand before it is planned."""

    def advance(self) -> None:
        self.position += 1


class LastStep(Policy):
    """Predicts D(t, target) := the target layer's most recent demand, D(t-1, target)."""

    name = "last_step"

    def __init__(self, num_layers: int, num_experts: int, lookahead: int = 1):
        super().__init__(num_layers, num_experts)
        if lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        self.lookahead = lookahead
        self.last: list[tuple[np.ndarray, np.ndarray] | None] = [None] * num_layers

    def predict(self, i, experts, counts, step):
        target = (i + self.lookahead) % self.num_layers
        seen = self.last[target]
        self.last[i] = (experts, counts)
        if seen is None:
            return None
        e, c = seen
        return target, e[np.lexsort((e, -c))]                         # most tokens first


class TraceFuture:
    """Future knowledge from a recorded run of the same prompts: the flat (layer, experts, counts)
    stream. Checks that the live stream is the recorded one, so a diverged run fails loudly."""

    def __init__(self, events: Sequence[tuple[int, int, np.ndarray, np.ndarray]]):
        self.events = events     # (forward, layer index i, experts, counts), in stream order

    def check(self, position: int, i: int, experts: np.ndarray, step) -> None:
        if position >= len(self.events):
            raise RuntimeError(f"the run has more demands than the trace ({len(self.events)} events): "
                               "the trace was recorded on other prompts or decoding settings")
        f, ti, te, _ = self.events[position]
        if ti != i or not np.array_equal(te, experts):       # forward indices restart per batch: not compared
            raise RuntimeError(f"demand {position} (layer index {i}) differs from the trace's (forward {f}, "
                               f"layer index {ti}): not the same run")


class Oracle(Policy):
    """Loads the true D(t, target) of the event `lookahead` positions ahead, from a trace."""

    name = "oracle"
    needs_trace = True

    def __init__(self, num_layers: int, num_experts: int, future: TraceFuture, lookahead: int = 1):
        super().__init__(num_layers, num_experts)
        self.future, self.lookahead = future, lookahead

    def observe(self, i, experts, counts, step):
        self.future.check(self.position, i, experts, step)

    def predict(self, i, experts, counts, step):
        ahead = self.position + self.lookahead
        if ahead >= len(self.future.events):
            return None
        _, target, e, c = self.future.events[ahead]
        return target, e[np.lexsort((e, -c))]


class IntervalRefresh(Policy):
    """TIDE-inspired placement refresh. At denoising steps 0, tau, 2tau, ... of each block, each layer's
    placement becomes the top-C experts of this step by token count (only experts with tokens, and a
    placed expert is evicted only to make room for a promoted one); between refreshes misses load on
    demand with LRU eviction. Difference from TIDE's released code: there, experts outside the
    placement are computed on the CPU and the placement is fixed between refreshes; here every expert
    computes on the device, so a non-resident one is loaded (the only option for a GPU-only engine)."""

    name = "interval_refresh"

    def __init__(self, num_layers: int, num_experts: int, tau: int = 4):
        super().__init__(num_layers, num_experts)
        if tau < 1:
            raise ValueError(f"tau must be >= 1, got {tau}")
        self.tau = tau

    def refreshing(self, step) -> bool:
        return step.kind == "denoise" and step.block_step % self.tau == 0

    def keep_order(self, i, experts, counts, hit, step):
        if not self.refreshing(step):
            return super().keep_order(i, experts, counts, hit, step)
        return experts[np.lexsort((-experts, counts))]                 # fewest tokens first: top-C by count stay


class Belady(Policy):
    """Belady's MIN: evict (and, inside an oversized demand, stream first) the expert whose next use is
    farthest. With demand paging this is the minimum number of misses for capacity C."""

    name = "belady"
    needs_trace = True
    engine_ok = False

    def __init__(self, num_layers: int, num_experts: int, future: TraceFuture):
        super().__init__(num_layers, num_experts)
        self.future = future
        self.next_use = np.full((num_layers, num_experts), np.iinfo(np.int64).max, dtype=np.int64)
        # For each event, the stream position of each demanded expert's next demand in that layer.
        last_seen: dict[tuple[int, int], int] = {}
        self._next: list[np.ndarray] = [None] * len(future.events)     # type: ignore[list-item]
        for p in range(len(future.events) - 1, -1, -1):
            _, i, e, _ = future.events[p]
            nxt = np.array([last_seen.get((i, int(x)), np.iinfo(np.int64).max) for x in e], dtype=np.int64)
            self._next[p] = nxt
            for x in e:
                last_seen[(i, int(x))] = p

    def observe(self, i, experts, counts, step):
        self.future.check(self.position, i, experts, step)

    def victim_order(self, i, candidates):
        return candidates[np.lexsort((candidates, -self.next_use[i, candidates]))]

    def keep_order(self, i, experts, counts, hit, step):
        nxt = self._next[self.position]
        return experts[np.lexsort((experts, -nxt))]                    # farthest next use first

    def touch(self, i, ordered):
        super().touch(i, ordered)
        _, _, e, _ = self.future.events[self.position]
        self.next_use[i, e] = self._next[self.position]


@dataclass(frozen=True)
class PolicySpec:
    name: str
    factory: Callable[..., Policy]
    needs_trace: bool
    engine_ok: bool
    summary: str


POLICIES: dict[str, PolicySpec] = {
    "demand": PolicySpec("demand", lambda L, E, future=None, **kw: Policy(L, E), False, True,
                         "LRU, misses load on demand"),
    "last_step": PolicySpec("last_step", lambda L, E, future=None, lookahead=1, **kw: LastStep(L, E, lookahead),
                            False, True, "LRU + prefetch the target layer's previous demand"),
    "oracle": PolicySpec("oracle", lambda L, E, future=None, lookahead=1, **kw: Oracle(L, E, future, lookahead),
                         True, True, "LRU + prefetch the true future demand"),
    "interval_refresh": PolicySpec("interval_refresh",
                                   lambda L, E, future=None, tau=4, **kw: IntervalRefresh(L, E, tau),
                                   False, True, "top-C by token count every tau steps, LRU between"),
    "belady": PolicySpec("belady", lambda L, E, future=None, **kw: Belady(L, E, future), True, False,
                         "evict the farthest next use (miss floor)"),
}


def make_policy(name: str, num_layers: int, num_experts: int, future: TraceFuture | None = None,
                engine: bool = False, **options) -> Policy:
    spec = POLICIES.get(name)
    if spec is None:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}")
    if engine and not spec.engine_ok:
        raise ValueError(f"policy {name!r} needs the whole future and runs in the simulator only "
                         "(python -m artifact simulate); the engine takes 'oracle' for future knowledge")
    if spec.needs_trace and future is None:
        raise ValueError(f"policy {name!r} needs a trace of an identical earlier run (--oracle-trace FILE)")
    return spec.factory(num_layers, num_experts, future=future, **options)
