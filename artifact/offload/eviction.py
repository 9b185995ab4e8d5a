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
  victim_keys(i, residents)                 a fresh array of keys (int64, or complex: ordered by real part, then
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

from collections import deque

import numpy as np

from artifact.errors import SettingError

_INT64 = np.int64


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

    def attach(self, capacity: int) -> None:
        """Called once by the cache that uses this policy: C, the slots per layer."""
        self.capacity = capacity

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
    artifact, from the observation that a step's token count predicts the next step's use;
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
    of hits then misses). Subclasses keep `self.score` (L, E) up to date in `demanded`, or override
    `current_row` when the score of a layer's experts is derived from it."""

    def __init__(self, num_layers: int, num_experts: int):
        super().__init__(num_layers, num_experts)
        self.score = np.zeros((num_layers, num_experts), dtype=np.float64)
        self._score_rows = list(self.score)                                # row views, built once

    def current_row(self, i: int) -> np.ndarray:
        """(E,) the scores of layer i's experts now (a view; read only)."""
        return self._score_rows[i]

    def current(self, i: int, experts: np.ndarray) -> np.ndarray:
        return self.current_row(i)[experts]

    def keep_order(self, i, experts, counts, hit, step):
        # lowest score first; ties by LRU's keep order (hits, then misses, each ascending: experts is ascending
        # and lexsort is stable)
        return experts[np.lexsort((~hit, self.current_row(i)[experts]))]

    def victim_keys(self, i, residents):
        # score first, then last use, as one complex key: numpy orders complex numbers by their real part, then
        # their imaginary part (np.sort), so its argsort is lexsort((stamp, score))'s; stamps are exact in
        # float64 (< 2**53), and the cache's never-evict mark (int64 max) exceeds every score
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
            row[experts[~hit]] = 0.0          # a miss is loaded now (also one that streams through)
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
        if steps < 1:
            raise SettingError(f"eviction 'lfu_window': steps must be >= 1 forwards, got {steps}")
        self.steps = steps
        self.window = [deque() for _ in range(num_layers)]

    def demanded(self, i, experts, counts, hit, step):
        w, row = self.window[i], self._score_rows[i]
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
        # The decayed scores of each layer at its `now`: a layer's scores change only at its own forwards, so
        # they are computed once per forward (every expert's, elementwise as before) and read by keep_order,
        # victim_keys and the prefetches into the layer until its next forward.
        self._now_rows = [np.zeros(num_experts) for _ in range(num_layers)]

    def current_row(self, i):
        return self._now_rows[i]

    def demanded(self, i, experts, counts, hit, step):
        self.now[i] += 1
        now, at, score = self.now[i], self.at[i], self._score_rows[i]
        row = score * np.exp2(-self.lam * (now - at))
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
        if not 0 <= carry <= 1:
            raise SettingError(f"eviction 'block_tokens': carry must be in [0, 1], got {carry}")
        self.carry = carry

    def demanded(self, i, experts, counts, hit, step):
        row = self._score_rows[i]
        if step.kind == "prefill" or step.block_step == 0:
            row *= self.carry
        row[experts] += counts


class _ListEviction(Eviction):
    """Base of the list-based adaptive policies (ARC, S3-FIFO), made set-aware: they run their own
    request-level algorithm on the demand's hits first (ascending), then its misses (ascending), the feed
    under which a request-level simulator sees what this cache sees; a victim is never an expert of the
    current demand (the list's oldest non-demanded resident goes instead). The victims of a demand are
    decided in `demanded` and handed to the cache in `victim_order`; evictions a prefetch causes take the
    algorithm's preferred list first. A demand larger than C keeps LRU's last C (this cache's wave rule)."""

    def attach(self, capacity: int) -> None:
        super().attach(capacity)
        self._victims: tuple[int, list[int]] | None = None
        self._demanding = False

    def victim_order(self, i, candidates):
        if self._victims is not None and self._victims[0] == i:
            victims, self._victims = self._victims[1], None
            return np.asarray(victims, dtype=_INT64)
        return self.prefetch_victims(i, candidates)

    def touch(self, i, ordered):
        super().touch(i, ordered)
        if self._demanding:
            self._demanding = False
        else:
            self.prefetched(i, ordered)

    @staticmethod
    def _oldest(lst: dict, demand: set) -> int | None:
        return next((e for e in lst if e not in demand), None)


@register_eviction
class ARC(_ListEviction):
    """ARC (Megiddo and Modha, FAST 2003), per layer: T1 (seen once recently) and T2 (seen at least twice)
    hold the residents, ghosts B1 and B2 remember recent victims, and the target size p of T1 adapts on a
    ghost hit. REPLACE evicts T1's oldest when |T1| > p (or = p on a B2 hit), else T2's. Set-aware (see
    _ListEviction): an expert of the current demand is never the victim."""

    name = "arc"
    summary = "adaptive replacement cache (recency + frequency lists, ghosts), set-aware"

    def attach(self, capacity):
        super().attach(capacity)
        L = self.num_layers
        self.T1, self.T2, self.B1, self.B2 = ([{} for _ in range(L)] for _ in range(4))
        self.p = [0.0] * L

    def _replace(self, i, demand: set, in_b2: bool) -> int:
        T1, T2 = self.T1[i], self.T2[i]
        first_t1 = len(T1) >= 1 and (len(T1) > self.p[i] or (in_b2 and len(T1) == self.p[i]))
        for lst, ghost in ((T1, self.B1[i]), (T2, self.B2[i])) if first_t1 else ((T2, self.B2[i]), (T1, self.B1[i])):
            v = self._oldest(lst, demand)
            if v is not None:
                del lst[v]
                ghost[v] = True
                return v
        raise AssertionError("no non-demanded resident to evict")

    def _trim(self, i):
        C, B1, B2 = self.capacity, self.B1[i], self.B2[i]
        while B1 and len(self.T1[i]) + len(B1) > C:
            del B1[next(iter(B1))]
        while B2 and len(self.T1[i]) + len(self.T2[i]) + len(B1) + len(B2) > 2 * C:
            del B2[next(iter(B2))]

    def demanded(self, i, experts, counts, hit, step):
        C, T1, T2, B1, B2 = self.capacity, self.T1[i], self.T2[i], self.B1[i], self.B2[i]
        self._demanding = True
        demand = set(experts.tolist())
        hits = experts[hit].tolist()
        if hits:                                           # the hits move to T2's most recent end, in order
            moved = set(hits)                              # (T1 and T2 rebuilt: one pass, not a pop per hit)
            if not moved.isdisjoint(T1):
                T1 = self.T1[i] = {e: True for e in T1 if e not in moved}
            T2 = self.T2[i] = {e: True for e in T2 if e not in moved}
            T2.update(dict.fromkeys(hits, True))
        misses = experts[~hit].tolist()
        self._victims = None
        if len(experts) > C:                               # a wave: LRU's last C stay (the misses come last);
            loaded = set(misses)                           # the cache reports the residents it evicts
            if not loaded.isdisjoint(B1):
                B1 = self.B1[i] = {e: True for e in B1 if e not in loaded}
            if not loaded.isdisjoint(B2):
                B2 = self.B2[i] = {e: True for e in B2 if e not in loaded}
            B1.update(dict.fromkeys(misses[:-C], True))
            T1.update(dict.fromkeys(misses[-C:], True))
            self._trim(i)
            return
        victims = []
        for x in misses:
            if x in B1:
                self.p[i] = min(C, self.p[i] + max(len(B2) / len(B1), 1))
                victims.append(self._replace(i, demand, False))
                del B1[x]
                T2[x] = True
                continue
            if x in B2:
                self.p[i] = max(0.0, self.p[i] - max(len(B1) / len(B2), 1))
                victims.append(self._replace(i, demand, True))
                del B2[x]
                T2[x] = True
                continue
            if len(T1) + len(B1) == C:
                if len(T1) < C:
                    del B1[next(iter(B1))]
                    victims.append(self._replace(i, demand, False))
                else:
                    v = self._oldest(T1, demand)
                    del T1[v]
                    victims.append(v)
            elif len(T1) + len(T2) + len(B1) + len(B2) >= C:
                if len(T1) + len(T2) + len(B1) + len(B2) == 2 * C:
                    del B2[next(iter(B2))]
                if len(T1) + len(T2) >= C:
                    victims.append(self._replace(i, demand, False))
            T1[x] = True
        self._victims = (i, victims)

    def evicted(self, i, experts):
        for e in experts.tolist():
            if e in self.T1[i]:
                del self.T1[i][e]
                self.B1[i][e] = True
            elif e in self.T2[i]:
                del self.T2[i][e]
                self.B2[i][e] = True
        self._trim(i)

    def prefetch_victims(self, i, candidates):
        cand = set(candidates.tolist())
        t1 = [e for e in self.T1[i] if e in cand]
        t2 = [e for e in self.T2[i] if e in cand]
        return np.asarray(t1 + t2 if len(self.T1[i]) > self.p[i] else t2 + t1, dtype=_INT64)

    def prefetched(self, i, experts):
        for e in experts.tolist():
            if e not in self.T1[i] and e not in self.T2[i]:
                self.B1[i].pop(e, None)
                self.B2[i].pop(e, None)
                self.T1[i][e] = True
        self._trim(i)


@register_eviction
class S3FIFO(_ListEviction):
    """S3-FIFO (Yang et al., SOSP 2023), per layer, with libCacheSim's rules (S3FIFO.c): a small FIFO of
    int(0.1 C) slots, a main FIFO with a 2-bit clock, and a ghost FIFO of int(0.9 C) ids. A miss goes to
    main when its id is a ghost (or the small FIFO is full before the first eviction), else to small. To
    evict: from main when main is over its size or small is empty, else from small, where an expert used
    twice since insertion moves to main and the first one that was not becomes a ghost and is evicted; in
    main a used expert is reinserted with one use less, the first unused one is evicted. Set-aware (see
    _ListEviction): the experts of the current demand are passed over; a list with none to evict defers
    to the other."""

    name = "s3fifo"
    summary = "small + main FIFO with a ghost FIFO (S3-FIFO, libCacheSim's variant), set-aware"
    SMALL, GHOST, THRESHOLD = 0.1, 0.9, 2

    def attach(self, capacity):
        super().attach(capacity)
        L = self.num_layers
        self.small_size = int(capacity * self.SMALL)
        self.main_size = capacity - self.small_size
        self.ghost_size = int(capacity * self.GHOST)
        self.small, self.main, self.ghost = ([{} for _ in range(L)] for _ in range(3))   # id -> uses; oldest first
        self.has_evicted = [False] * L

    def _ghost_add(self, i, e):
        g = self.ghost[i]
        if self.ghost_size > 0 and e not in g:
            if len(g) >= self.ghost_size:
                del g[next(iter(g))]
            g[e] = True

    def _evict_small(self, i, demand) -> int | None:
        small, main = self.small[i], self.main[i]
        for e in [x for x in small if x not in demand]:
            uses = small.pop(e)
            if uses >= self.THRESHOLD:
                main[e] = 0
            else:
                self._ghost_add(i, e)
                return e
        return None

    def _evict_main(self, i, demand) -> int | None:
        main = self.main[i]
        while True:
            e = next((x for x in main if x not in demand), None)
            if e is None:
                return None
            uses = main.pop(e)
            if uses < 1:
                return e
            main[e] = min(uses, 3) - 1

    def _evict(self, i, demand) -> int:
        self.has_evicted[i] = True
        small, main = self.small[i], self.main[i]
        order = (self._evict_main, self._evict_small) if len(main) > self.main_size or not small else \
            (self._evict_small, self._evict_main)
        for how in order:
            v = how(i, demand)
            if v is not None:
                return v
        raise AssertionError("no non-demanded resident to evict")

    def _insert(self, i, e, ghost_hit: bool):
        if ghost_hit:
            self.main[i][e] = 0
        elif self.small_size == 0:
            self.main[i][e] = 0           # libCacheSim would not admit it (size 1 >= small size 0); a cache must
        elif not self.has_evicted[i] and len(self.small[i]) >= self.small_size:
            self.main[i][e] = 0
        else:
            self.small[i][e] = 0

    def demanded(self, i, experts, counts, hit, step):
        self._demanding = True
        self._victims = None
        small, main = self.small[i], self.main[i]
        for e in experts[hit].tolist():
            if e in small:
                small[e] += 1
            else:
                main[e] += 1
        misses = experts[~hit].tolist()
        C = self.capacity
        if len(experts) > C:                               # a wave: LRU's last C stay (the misses come last)
            ghost, size = self.ghost[i], self.ghost_size   # (_ghost_add and _insert inlined: a wave is most
            for e in misses[:-C]:                          # of a demand's misses)
                ghost.pop(e, None)
                if size > 0:
                    if len(ghost) >= size:
                        del ghost[next(iter(ghost))]
                    ghost[e] = True
            small_size, fresh = self.small_size, not self.has_evicted[i]
            for e in misses[-C:]:
                if ghost.pop(e, None) is not None or small_size == 0 or (fresh and len(small) >= small_size):
                    main[e] = 0
                else:
                    small[e] = 0
            return
        demand = set(experts.tolist())
        victims = []
        for x in misses:
            ghost_hit = self.ghost[i].pop(x, None) is not None     # looked up before evicting, as libCacheSim
            if len(small) + len(main) >= C:
                victims.append(self._evict(i, demand))
            self._insert(i, x, ghost_hit)
        self._victims = (i, victims)

    def evicted(self, i, experts):
        small, main, ghost, size = self.small[i], self.main[i], self.ghost[i], self.ghost_size
        for e in experts.tolist():
            if small.pop(e, None) is not None:
                if size > 0 and e not in ghost:           # _ghost_add, inlined: a wave evicts many
                    if len(ghost) >= size:
                        del ghost[next(iter(ghost))]
                    ghost[e] = True
            else:
                main.pop(e, None)

    def prefetch_victims(self, i, candidates):
        cand = set(candidates.tolist())
        s = [e for e in self.small[i] if e in cand]
        m = [e for e in self.main[i] if e in cand]
        return np.asarray(m + s if len(self.main[i]) > self.main_size or not s else s + m, dtype=_INT64)

    def prefetched(self, i, experts):
        for e in experts.tolist():
            if e not in self.small[i] and e not in self.main[i]:
                self._insert(i, e, self.ghost[i].pop(e, None) is not None)
