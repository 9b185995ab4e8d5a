"""The registered prefetch policies (each a `Policy`, prefetch_base.py; registered by policies.py). A policy
sees the demand stream one (forward, layer) event at a time, in the order the model computes them. Layers are
MoE positions i = 0..L_moe-1 throughout.

  demand                  LRU eviction, no prefetch (the design the paper argues for)
  last_step               LRU + when layer i starts, make the C most wanted of the target layer's
                          previous demand resident (may swap out predicted residents ranked below C)
  last_step_conservative  LRU + load only predicted experts that are not resident, evicting only
                          residents outside the prediction (never swaps a predicted resident out)
  cross_layer             LRU + load layer i+1's demand as predicted at this step by layer i+1's router
                          applied to layer i's hidden states (Demand.predicted)
  oracle                  LRU + load the target layer's true next demand (a trace of the same run)
  interval_refresh        LRU, but every tau steps of a block each layer keeps the top-C experts of this
                          step by token count (TIDE-inspired; see IntervalRefresh)
  belady                  evict the expert whose next use is farthest (needs the trace; the miss floor
                          under this cache's rules)
"""

from __future__ import annotations

import numpy as np

from artifact.offload.policy.prefetch_base import Policy, Prediction, TraceFuture
from artifact.validate import check_number


class DemandPolicy(Policy):
    """LRU eviction, no prefetch: every miss loads on demand (the paper's design; the base's defaults,
    named)."""

    name = "demand"
    summary = "LRU, misses load on demand"


class LastStep(Policy):
    """Predicts D(t, target) := the target layer's most recent demand, D(t-1, target), for the target
    `lookahead` MoE layers ahead (wrapping into the next forward)."""

    name = "last_step"
    summary = "LRU + make the C most wanted of the target layer's previous demand resident"

    def __init__(self, num_layers: int, num_experts: int, lookahead: int = 1):
        super().__init__(num_layers, num_experts)
        # MoE layers
        self.lookahead = check_number(f"policy {self.name!r}: lookahead", lookahead, low=1, integer=True)
        self.last: list[tuple[np.ndarray, np.ndarray] | None] = [None] * num_layers

    def predict(self, i, experts, counts, step):
        target = (i + self.lookahead) % self.num_layers
        seen = self.last[target]
        self.last[i] = (experts, counts)
        if seen is None:
            return None
        return Prediction(target, seen[0], seen[1])


class LastStepConservative(LastStep):
    """last_step's prediction, placed conservatively: load only predicted experts that are not resident,
    evicting only residents outside the prediction, so a predicted resident is never swapped out (at
    C >= the prediction's size this is last_step)."""

    name = "last_step_conservative"
    summary = "last_step, but never evicts a predicted expert to load another"
    conservative = True


class CrossLayer(Policy):
    """Predicts D(t, i+1) from layer i+1's router applied to layer i's hidden states at the same step
    (Demand.predicted, the predictor class of Pre-gated MoE, ProMoE and HOBBIT). The last MoE layer
    has no next layer and prefetches nothing."""

    name = "cross_layer"
    summary = "LRU + load the next layer's demand predicted by its router on this layer's hidden states"
    needs_prediction = True

    def __init__(self, num_layers: int, num_experts: int, conservative: bool = False):
        super().__init__(num_layers, num_experts)
        self.conservative = conservative

    def predict(self, i, experts, counts, step):
        if i + 1 >= self.num_layers:
            return None
        if self.predicted is None:
            raise ValueError(
                "policy 'cross_layer' needs the cross-layer prediction of each demand (Demand.predicted: "
                "the next MoE layer's router on this layer's hidden states), "
                f"and demand {self.position} (MoE layer {i}) has none: "
                "run the model with the prediction switched on, "
                "or replay a trace that records it (trace schema 2)"
            )
        e, c = self.predicted
        return Prediction(i + 1, np.asarray(e, dtype=np.int64), np.asarray(c, dtype=np.int64))


class Oracle(Policy):
    """Loads the true D(t, target) of the event `lookahead` positions ahead, from a trace."""

    name = "oracle"
    summary = "LRU + prefetch the true future demand"
    needs_trace = True

    def __init__(self, num_layers: int, num_experts: int, future: TraceFuture, lookahead: int = 1):
        super().__init__(num_layers, num_experts)
        self.future = future
        # demands
        self.lookahead = check_number(f"policy {self.name!r}: lookahead", lookahead, low=1, integer=True)

    def observe(self, i, experts, counts, step):
        self.future.check(self.position, i, experts, step)

    def predict(self, i, experts, counts, step):
        ahead = self.position + self.lookahead
        f = self.future
        if ahead >= len(f.index):
            return None
        return Prediction(f.index[ahead], f.experts[ahead], f.counts[ahead])


class IntervalRefresh(Policy):
    """TIDE-inspired placement refresh. At denoising steps 0, tau, 2tau, ... of each block, each layer's
    placement becomes the top-C experts of this step by token count (only experts with tokens, and a
    placed expert is evicted only to make room for a promoted one); between refreshes misses load on
    demand with LRU eviction. Difference from TIDE's released code: there, experts outside the
    placement are computed on the CPU and the placement is fixed between refreshes; here every expert
    computes on the device, so a non-resident one is loaded (the only option for a GPU-only engine)."""

    name = "interval_refresh"
    summary = "top-C by token count every tau steps, LRU between"

    def __init__(self, num_layers: int, num_experts: int, tau: int = 4):
        super().__init__(num_layers, num_experts)
        self.tau = check_number(f"policy {self.name!r}: tau", tau, low=1, integer=True)  # denoising steps

    def refreshing(self, step) -> bool:
        return step.kind == "denoise" and step.block_step % self.tau == 0

    def keep_order(self, i, experts, counts, hit, step):
        if not self.refreshing(step):
            return self.eviction.keep_order(i, experts, counts, hit, step)
        # fewest tokens, then higher id
        return experts[(counts * self.num_experts - experts).argsort(kind="stable")]


class Belady(Policy):
    """Belady's MIN: evict (and, inside an oversized demand, stream first) the expert whose next use is
    farthest. The miss floor for demand paging under this cache's rules while no demand outgrows the cache
    (with waves its greedy keep order can lose to another policy: tests/test_bounds.py; `min` is the true
    floor). The rules: a demanded expert stays until computed; a wave evicts non-demanded residents."""

    name = "belady"
    summary = "evict the farthest next use (miss floor under this cache's rules)"
    needs_trace = True
    engine_ok = False
    owns_eviction = True

    def __init__(self, num_layers: int, num_experts: int, future: TraceFuture):
        super().__init__(num_layers, num_experts)
        self.future = future
        self.never = len(future)  # "no next use": farther than any stream position
        self._next = future.next_uses()
        # Eviction key of each expert, set when it is demanded: (never - next use) * E + id, so the
        # lowest key is the farthest next use, ties (never used again) by ascending id.
        self.key = np.zeros((num_layers, num_experts), dtype=np.int64)
        self._key_rows = list(self.key)
        self._keys_at = (-1, None)  # (position, keys of that demand's experts)

    def observe(self, i, experts, counts, step):
        self.future.check(self.position, i, experts, step)

    def _demand_keys(self) -> np.ndarray:
        p = self.position
        if self._keys_at[0] != p:
            self._keys_at = (p, (self.never - self._next[p]) * self.num_experts + self.future.experts[p])
        return self._keys_at[1]

    def victim_keys(self, i, residents):
        return self._key_rows[i][residents]

    def keep_order(self, i, experts, counts, hit, step):
        return experts[self._demand_keys().argsort(kind="stable")]  # farthest next use, then lower id

    def touch(self, i, ordered):  # no LRU stamps: keys decide
        self._key_rows[i][self.future.experts[self.position]] = self._demand_keys()


BUILT_IN = (DemandPolicy, LastStep, LastStepConservative, CrossLayer, Oracle, IntervalRefresh, Belady)
