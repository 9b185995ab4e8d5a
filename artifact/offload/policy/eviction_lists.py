"""The list-based adaptive eviction policies, ARC and S3-FIFO, made set-aware (registered in EVICTIONS; the
interface and every policy's summary: eviction.py)."""

from __future__ import annotations

import numpy as np

from artifact.offload.policy.eviction_base import Eviction, register_eviction

_INT64 = np.int64


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
        for lst, ghost in (
            ((T1, self.B1[i]), (T2, self.B2[i])) if first_t1 else ((T2, self.B2[i]), (T1, self.B1[i]))
        ):
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
        if hits:  # the hits move to T2's most recent end, in order
            moved = set(hits)  # (T1 and T2 rebuilt: one pass, not a pop per hit)
            if not moved.isdisjoint(T1):
                T1 = self.T1[i] = {e: True for e in T1 if e not in moved}
            T2 = self.T2[i] = {e: True for e in T2 if e not in moved}
            T2.update(dict.fromkeys(hits, True))
        misses = experts[~hit].tolist()
        self._victims = None
        if len(experts) > C:  # a wave: LRU's last C stay (the misses come last);
            loaded = set(misses)  # the cache reports the residents it evicts
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
        # id -> uses; oldest first
        self.small, self.main, self.ghost = ([{} for _ in range(L)] for _ in range(3))
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
        order = (
            (self._evict_main, self._evict_small)
            if len(main) > self.main_size or not small
            else (self._evict_small, self._evict_main)
        )
        for how in order:
            v = how(i, demand)
            if v is not None:
                return v
        raise AssertionError("no non-demanded resident to evict")

    def _insert(self, i, e, ghost_hit: bool):
        if ghost_hit:
            self.main[i][e] = 0
        elif self.small_size == 0:
            self.main[i][e] = 0  # libCacheSim would not admit it (size 1 >= small size 0); a cache must
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
        if len(experts) > C:  # a wave: LRU's last C stay (the misses come last)
            ghost, size = self.ghost[i], self.ghost_size  # (_ghost_add and _insert inlined: a wave is most
            for e in misses[:-C]:  # of a demand's misses)
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
            ghost_hit = self.ghost[i].pop(x, None) is not None  # looked up before evicting, as libCacheSim
            if len(small) + len(main) >= C:
                victims.append(self._evict(i, demand))
            self._insert(i, x, ghost_hit)
        self._victims = (i, victims)

    def evicted(self, i, experts):
        small, main, ghost, size = self.small[i], self.main[i], self.ghost[i], self.ghost_size
        for e in experts.tolist():
            if small.pop(e, None) is not None:
                if size > 0 and e not in ghost:  # _ghost_add, inlined: a wave evicts many
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
