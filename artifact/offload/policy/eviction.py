"""Eviction policies: which resident expert a layer gives up, and which C of an oversized demand it keeps.

The counterpart of a prefetch `Policy` (prefetch_base.py) for the cache's other decision, on the model of
vLLM's `Evictor` ABC and factory. Every prefetch policy owns one eviction object (`policy.eviction`,
LRU unless a spec names another: `last_step+token_lru`), and ExpertCache calls its hooks through the one
planning code path that the engine and the simulator share, so an eviction policy's counts in the engine
equal its replay (tests/test_trace_sim.py).

The cache's rules bind every eviction policy: a demanded expert stays resident until it is computed, and
the misses of a demand take free slots first, then the slots of non-demanded residents in the policy's
victim order; a demand larger than C streams through the slots, and the policy's keep order decides which
C of it stay. A policy only orders; it never places.

Hooks (experts are ascending int64 arrays, counts their token counts, hit the demanded experts that are
resident, step the model's StepInfo; i is the MoE position):

  demanded(i, experts, counts, hit, step)   every demand, once, before it is planned (update scores)
  keep_order(i, experts, counts, hit, step) the demanded experts, least worth keeping first: when the demand
                                            outgrows C the last C stay, and `touch` gets this order
  victim_keys(i, residents)                 a fresh array of keys (int64, or complex: ordered by real part,
  then
                                            imaginary part), distinct among residents; the lowest is evicted
                                            first (or override victim_order(i, candidates))
  touch(i, ordered)                         uses in order, the later the more recent (demands and prefetches)
  evicted(i, experts)                       residents that just lost their slot
  attach(capacity)                          once, by the cache: C

Registered here (`@register_eviction`), built by policies.make_policy from a spec's `+name[:k=v,...]` part:

  lru         least recently used; a demand's hits count as older than its misses (the default)
  token_lru   LRU, but within a demand the experts with more tokens count as more recent
  lfu         fewest demands since loaded (in-cache LFU; perfect=true keeps counts across evictions)
  lfu_window  fewest demands in the layer's last `steps` forwards
  lrfu        lowest token-weighted score that decays by 2**-lam per forward of the layer
  block_tokens  fewest tokens in the current diffusion block's steps so far (this artifact's own design)
  arc         ARC's recency and frequency lists with ghosts, set-aware
  s3fifo      S3-FIFO (small + main FIFO, ghost FIFO) as libCacheSim implements it, set-aware

arc, s3fifo and lfu equal libCacheSim's ARC, S3FIFO and LFU request for request where a demand is one
expert, and lru equals libCacheSim's LRU on the hits-first feed (tests/test_oracle.py).
"""

from __future__ import annotations

import decimal
from collections import deque

import numpy as np

from artifact.offload.policy.eviction_base import EVICTIONS, LRU, Eviction, register_eviction
from artifact.validate import check_number

_INT64 = np.int64

__all__ = ["EVICTIONS", "LRU", "Eviction", "register_eviction"]


@register_eviction
class TokenLRU(Eviction):
    """LRU whose order within one demand is its token counts: the expert with the most tokens becomes the
    most recent, and an oversized demand keeps its C most used experts (ties: ascending id). Source: this
    artifact, from the observation that a step's token count predicts the next step's use;
    reverse=true orders fewest tokens most recent, the control that shows what the counts carry."""

    name = "token_lru"
    summary = "LRU; within a demand the experts with more tokens count as more recent"

    def __init__(self, num_layers: int, num_experts: int, reverse: bool = False):
        super().__init__(num_layers, num_experts)
        self.reverse = reverse

    def keep_order(self, i, experts, counts, hit, step):
        key = counts * self.num_experts + experts  # distinct: ties in counts by expert id
        return experts[(-key if self.reverse else key).argsort(kind="stable")]


class _ScoredEviction(Eviction):
    """Evicts the lowest score, ties by LRU; keeps an oversized demand's highest scores (ties: LRU's order
    of hits then misses). Subclasses keep `self.score` (L, E) up to date in `demanded`, or override
    `current_row` when the score of a layer's experts is derived from it."""

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.score = np.zeros((num_layers, num_experts), dtype=np.float64)
        self._score_rows = list(self.score)  # row views, built once

    def current_row(self, i: int) -> np.ndarray:
        """(E,) the scores of layer i's experts now (a view; read only)."""
        return self._score_rows[i]

    def current(self, i: int, experts: np.ndarray) -> np.ndarray:
        return self.current_row(i)[experts]

    def keep_order(self, i, experts, counts, hit, step):
        # lowest score first; ties by LRU's keep order (hits, then misses), then by ascending expert id
        return experts[np.lexsort((experts, ~hit, self.current_row(i)[experts]))]

    def victim_keys(self, i, residents):
        # score first, then last use, as one complex key: numpy orders complex numbers by their real part,
        # then their imaginary part (np.sort), so its argsort is lexsort((stamp, score))'s; stamps are exact
        # in float64 (< 2**53), and the cache's never-evict mark (int64 max) exceeds every score
        return self.current_row(i)[residents] + self._stamp_rows[i][residents] * 1j


@register_eviction
class LFU(_ScoredEviction):
    """Least frequently used: the resident demanded in the fewest forwards since it was loaded goes first,
    ties by LRU. One demand counts once, whatever its tokens (the plain LFU that studies of expert caching
    in autoregressive MoE use as reference, e.g. arXiv 2511.05814). perfect=true keeps the counts of evicted
    experts (perfect LFU); the default forgets them on eviction, as libCacheSim's LFU does."""

    name = "lfu"
    summary = "fewest demands since loaded (perfect=true: ever), ties by LRU"

    def __init__(self, num_layers: int, num_experts: int, perfect: bool = False):
        super().__init__(num_layers, num_experts)
        self.perfect = perfect

    def demanded(self, i, experts, counts, hit, step):
        row = self._score_rows[i]
        if not self.perfect:
            row[experts[~hit]] = 0.0  # a miss is loaded now (also one that streams through)
        row[experts] += 1.0

    def evicted(self, i, experts):
        if not self.perfect:
            self._score_rows[i][experts] = 0.0


@register_eviction
class LFUWindow(_ScoredEviction):
    """Frequency over a sliding window: the resident demanded in the fewest of the layer's last `steps`
    forwards goes first, ties by LRU (window LFU, as in W-TinyLFU's window; here the window is the
    diffusion steps themselves)."""

    name = "lfu_window"
    summary = "fewest demands in the layer's last `steps` forwards, ties by LRU"

    def __init__(self, num_layers: int, num_experts: int, steps: int = 8):
        super().__init__(num_layers, num_experts)
        self.steps = check_number(f"eviction {self.name!r}: steps", steps, low=1, integer=True)  # forwards
        self.window = [deque() for _ in range(num_layers)]

    def demanded(self, i, experts, counts, hit, step):
        w, row = self.window[i], self._score_rows[i]
        w.append(experts)
        row[experts] += 1.0
        if len(w) > self.steps:
            row[w.popleft()] -= 1.0


_DECAYS: dict[float, np.ndarray] = {}  # lam -> [d] 2**(-lam d), grown on demand (decays)
_DECIMAL = decimal.Context(prec=40, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)
_UNDERFLOW = 1075  # 2**-x rounds to 0.0 in float64 for x > 1075


def decays(lam: float, n: int) -> np.ndarray:
    """(>= n + 1,) float64, [d] = 2**(-lam d), the decay of d forwards, each rounded to the nearest float64
    from 40-digit decimal arithmetic: the same bits on every machine. (numpy's exp2 rounds differently on its
    AVX-512 and baseline paths, and so may a libm with FMA variants; an ulp there decides between two equal
    scores.)"""
    t = _DECAYS.get(lam)
    if t is None or len(t) <= n:
        have = 0 if t is None else len(t)
        exponent = -decimal.Decimal(lam)  # exact: a float's decimal value
        new = [
            0.0 if lam * d > _UNDERFLOW else float(_DECIMAL.power(2, exponent * d))
            for d in range(have, max(2 * have, n + 1, 64))
        ]
        t = _DECAYS[lam] = np.concatenate((t, new)) if t is not None else np.array(new)
    return t


@register_eviction
class LRFU(_ScoredEviction):
    """LRFU (Lee et al., IEEE Trans. Computers 2001), token-weighted: each expert's score gains its token
    count at every demand and decays by a factor 2**-lam per forward of its layer (`decays`: the same float
    on every machine); the lowest score goes first, ties by LRU. lam -> 0 is token-weighted perfect LFU, a
    large lam approaches token_lru."""

    name = "lrfu"
    summary = "lowest token-weighted score decaying by 2**-lam per forward, ties by LRU"

    def __init__(self, num_layers: int, num_experts: int, lam: float = 0.5):
        super().__init__(num_layers, num_experts)
        self.lam = check_number(f"eviction {self.name!r}: lam", lam, low=0)  # the decay per forward: 2**-lam
        self.now = np.zeros(num_layers, dtype=_INT64)  # forwards seen per layer
        self.at = np.zeros((num_layers, num_experts), dtype=_INT64)  # when score was last brought up to date
        # The decayed scores of each layer at its `now`: a layer's scores change only at its own forwards, so
        # they are computed once per forward (every expert's, elementwise) and read by keep_order,
        # victim_keys and the prefetches into the layer until its next forward.
        self._now_rows = [np.zeros(num_experts) for _ in range(num_layers)]

    def current_row(self, i):
        return self._now_rows[i]

    def demanded(self, i, experts, counts, hit, step):
        self.now[i] += 1
        now, at, score = self.now[i], self.at[i], self._score_rows[i]
        row = score * decays(self.lam, int(now))[now - at]
        row[experts] += counts
        score[experts] = row[experts]
        at[experts] = now
        self._now_rows[i] = row


@register_eviction
class BlockTokens(_ScoredEviction):
    """Diffusion-aware (this artifact's own design): a block is denoised by repeated forwards over
    the same positions, so the experts that the current block's earlier steps used are the likeliest to be
    used again before the block ends. The score is the tokens an expert has served in the current block so
    far (this step included); the lowest goes first, ties by LRU. A new block (a prefill forward, or a
    denoising step 0) starts from `carry` times the last block's scores (0: from nothing, so its first
    step is token_lru with LRU ties)."""

    name = "block_tokens"
    summary = "fewest tokens in the current block's steps so far, ties by LRU"

    def __init__(self, num_layers: int, num_experts: int, carry: float = 0.0):
        super().__init__(num_layers, num_experts)
        self.carry = check_number(f"eviction {self.name!r}: carry", carry, low=0, high=1)

    def demanded(self, i, experts, counts, hit, step):
        row = self._score_rows[i]
        if step.kind == "prefill" or step.block_step == 0:
            row *= self.carry
        row[experts] += counts


# The list-based policies (arc, s3fifo) live in their own module; importing it here registers them after the
# policies above, so EVICTIONS lists every policy in the order of this module's docstring.
from artifact.offload.policy import eviction_lists  # noqa: E402, F401
