"""Eviction policies: which resident expert a layer gives up, and which C of an oversized demand it keeps.

The counterpart of a prefetch `Policy` (policies.py) for the cache's other decision, on the model of
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
  victim_keys(i, residents)                 a fresh int64 array of keys, distinct among residents; the lowest
                                            is evicted first (or override victim_order(i, candidates))
  touch(i, ordered)                         uses in order, the later the more recent (demands and prefetches)
  evicted(i, experts)                       experts that just lost their slot

Registered here (`@register_eviction`), built by policies.make_policy from a spec's `+name[:k=v,...]` part:

  lru         least recently used; a demand's hits count as older than its misses (the default)
  token_lru   LRU, but within a demand the experts with more tokens count as more recent
  lfu         fewest demands since loaded (in-cache LFU; perfect=true keeps counts across evictions)
  lfu_window  fewest demands in the layer's last `steps` forwards
  lrfu        lowest token-weighted score that decays by 2**-lam per forward of the layer
  block_tokens  fewest tokens in the current diffusion block's steps so far (this artifact's own design)
"""
from __future__ import annotations

from collections import deque

import numpy as np

from artifact.errors import SettingError

_INT64 = np.int64


def ranks(*keys: np.ndarray) -> np.ndarray:
    """Distinct int64 keys from a lexicographic order (the last key is the primary one, as np.lexsort)."""
    order = np.lexsort(keys)
    out = np.empty(len(order), dtype=_INT64)
    out[order] = np.arange(len(order), dtype=_INT64)
    return out


class Eviction:
    """Base, and the default: LRU. A use is stamped with a clock value (touch); the oldest stamp goes
    first. Within one demand the keep order is its hits then its misses, each ascending, so the misses
    (computed last) count as the most recent. The rule of the project's `demand` policy since it began."""

    name = "lru"
    summary = "least recently used (a demand's misses count as more recent than its hits)"

    def __init__(self, num_layers: int, num_experts: int):
        self.num_layers, self.num_experts = num_layers, num_experts
        self.stamp = np.full((num_layers, num_experts), -1, dtype=_INT64)   # last use
        self._stamp_rows = list(self.stamp)                                 # row views, built once
        self.clock = 0

    def demanded(self, i: int, experts: np.ndarray, counts: np.ndarray, hit: np.ndarray, step) -> None:
        """Every demand, once, before it is planned."""

    def keep_order(self, i: int, experts: np.ndarray, counts: np.ndarray, hit: np.ndarray, step) -> np.ndarray:
        """The demanded experts least worth keeping first. LRU: hits then misses, each ascending."""
        return experts[(~hit).argsort(kind="stable")]

    def victim_keys(self, i: int, residents: np.ndarray) -> np.ndarray:
        """Eviction keys of layer i's residents (a new array), distinct; the lowest goes first. LRU: last use."""
        return self._stamp_rows[i][residents]

    def victim_order(self, i: int, candidates: np.ndarray) -> np.ndarray:
        """Candidates, the first to evict first (derived from victim_keys unless overridden)."""
        return candidates[self.victim_keys(i, candidates).argsort(kind="stable")]

    def touch(self, i: int, ordered: np.ndarray) -> None:
        """Record uses in order (the later, the more recent)."""
        n = len(ordered)
        self._stamp_rows[i][ordered] = np.arange(self.clock, self.clock + n)
        self.clock += n

    def evicted(self, i: int, experts: np.ndarray) -> None:
        """Experts of layer i that just lost their slot."""


LRU = Eviction
EVICTIONS: dict[str, type[Eviction]] = {}


def register_eviction(cls: type[Eviction]) -> type[Eviction]:
    """Class decorator: add an Eviction subclass to EVICTIONS under its `name` (options are the keyword
    parameters of __init__ after num_layers and num_experts, each with a default; policies.make_policy
    checks them)."""
    if not (isinstance(cls, type) and issubclass(cls, Eviction)):
        raise TypeError(f"{cls!r} is not an Eviction subclass")
    EVICTIONS[cls.name] = cls
    return cls


register_eviction(Eviction)


@register_eviction
class TokenLRU(Eviction):
    """LRU whose order within one demand is its token counts: the expert with the most tokens becomes the
    most recent, and an oversized demand keeps its C most used experts (ties: ascending id). Source: this
    artifact (issue 25), from the observation that a step's token count predicts the next step's use;
    reverse=true orders fewest tokens most recent, the control that shows what the counts carry."""

    name = "token_lru"
    summary = "LRU; within a demand the experts with more tokens count as more recent"

    def __init__(self, num_layers: int, num_experts: int, reverse: bool = False):
        super().__init__(num_layers, num_experts)
        self.reverse = reverse

    def keep_order(self, i, experts, counts, hit, step):
        key = counts * self.num_experts + experts
        return experts[(-key if self.reverse else key).argsort()]


class _ScoredEviction(Eviction):
    """Evicts the lowest score, ties by LRU; keeps an oversized demand's highest scores (ties: LRU's order
    of hits then misses). Subclasses keep `self.score` (L, E) up to date in `demanded`."""

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.score = np.zeros((num_layers, num_experts), dtype=np.float64)

    def current(self, i: int, experts: np.ndarray) -> np.ndarray:
        return self.score[i, experts]

    def keep_order(self, i, experts, counts, hit, step):
        lru = super().keep_order(i, experts, counts, hit, step)
        return lru[np.argsort(self.current(i, lru), kind="stable")]

    def victim_keys(self, i, residents):
        return ranks(self._stamp_rows[i][residents], self.current(i, residents))


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
        row = self.score[i]
        if not self.perfect:
            row[experts[~hit]] = 0.0          # a miss is loaded now (also one that streams through)
        row[experts] += 1.0

    def evicted(self, i, experts):
        if not self.perfect:
            self.score[i, experts] = 0.0


@register_eviction
class LFUWindow(_ScoredEviction):
    """Frequency over a sliding window: the resident demanded in the fewest of the layer's last `steps`
    forwards goes first, ties by LRU (window LFU, as in W-TinyLFU's window; here the window is the
    diffusion steps themselves)."""

    name = "lfu_window"
    summary = "fewest demands in the layer's last `steps` forwards, ties by LRU"

    def __init__(self, num_layers: int, num_experts: int, steps: int = 8):
        super().__init__(num_layers, num_experts)
        if steps < 1:
            raise SettingError(f"eviction 'lfu_window': steps must be >= 1 forwards, got {steps}")
        self.steps = steps
        self.window = [deque() for _ in range(num_layers)]

    def demanded(self, i, experts, counts, hit, step):
        w, row = self.window[i], self.score[i]
        w.append(experts)
        row[experts] += 1.0
        if len(w) > self.steps:
            row[w.popleft()] -= 1.0


@register_eviction
class LRFU(_ScoredEviction):
    """LRFU (Lee et al., IEEE Trans. Computers 2001), token-weighted: each expert's score gains its token
    count at every demand and decays by a factor 2**-lam per forward of its layer; the lowest score goes
    first, ties by LRU. lam -> 0 is token-weighted perfect LFU, a large lam approaches token_lru."""

    name = "lrfu"
    summary = "lowest token-weighted score decaying by 2**-lam per forward, ties by LRU"

    def __init__(self, num_layers: int, num_experts: int, lam: float = 0.5):
        super().__init__(num_layers, num_experts)
        if not lam >= 0:
            raise SettingError(f"eviction 'lrfu': lam must be >= 0 (decay per forward), got {lam}")
        self.lam = lam
        self.now = np.zeros(num_layers, dtype=_INT64)                     # forwards seen per layer
        self.at = np.zeros((num_layers, num_experts), dtype=_INT64)       # when score was last brought up to date

    def current(self, i, experts):
        return self.score[i, experts] * np.exp2(-self.lam * (self.now[i] - self.at[i, experts]))

    def demanded(self, i, experts, counts, hit, step):
        self.now[i] += 1
        self.score[i, experts] = self.current(i, experts) + counts
        self.at[i, experts] = self.now[i]


@register_eviction
class BlockTokens(_ScoredEviction):
    """Diffusion-aware (this artifact's own design, issue 25): a block is denoised by repeated forwards over
    the same positions, so the experts that the current block's earlier steps used are the likeliest to be
    used again before the block ends. The score is the tokens an expert has served in the current block so
    far (this step included); the lowest goes first, ties by LRU. A new block (a prefill forward, or a
    denoising step 0) starts from `carry` times the last block's scores (0: from nothing, so its first
    step is token_lru with LRU ties)."""

    name = "block_tokens"
    summary = "fewest tokens in the current block's steps so far, ties by LRU"

    def __init__(self, num_layers: int, num_experts: int, carry: float = 0.0):
        super().__init__(num_layers, num_experts)
        if not 0 <= carry <= 1:
            raise SettingError(f"eviction 'block_tokens': carry must be in [0, 1], got {carry}")
        self.carry = carry

    def demanded(self, i, experts, counts, hit, step):
        row = self.score[i]
        if step.kind == "prefill" or step.block_step == 0:
            row *= self.carry
        row[experts] += counts
