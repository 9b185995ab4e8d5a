"""The eviction interface: the `Eviction` base (LRU, the default), the registry EVICTIONS and its decorator.

The hooks and the policies registered on it are described in eviction.py, which imports every policy module,
so `artifact.offload.policy.eviction.EVICTIONS` is the complete registry; this module alone holds only LRU.
"""

from __future__ import annotations

import numpy as np

_INT64 = np.int64


class Eviction:
    """Base, and the default: LRU. A use is stamped with a clock value (touch); the oldest stamp goes
    first. Within one demand the keep order is its hits then its misses, each ascending, so the misses
    (computed last) count as the most recent. The rule of the project's `demand` policy since it began."""

    name = "lru"
    summary = "least recently used (a demand's misses count as more recent than its hits)"

    def __init__(self, num_layers: int, num_experts: int):
        self.num_layers, self.num_experts = num_layers, num_experts
        self.stamp = np.full((num_layers, num_experts), -1, dtype=_INT64)  # last use
        self._stamp_rows = list(self.stamp)  # row views, built once
        self.clock = 0

    def attach(self, capacity: int) -> None:
        """Called once by the cache that uses this policy: C, the slots per layer."""
        self.capacity = capacity

    def demanded(self, i: int, experts: np.ndarray, counts: np.ndarray, hit: np.ndarray, step) -> None:
        """Every demand, once, before it is planned."""

    def keep_order(
        self, i: int, experts: np.ndarray, counts: np.ndarray, hit: np.ndarray, step
    ) -> np.ndarray:
        """The demanded experts least worth keeping first. LRU: hits then misses, each ascending (`experts` is
        ascending and the sort stable: ties by expert id)."""
        return experts[(~hit).argsort(kind="stable")]

    def victim_keys(self, i: int, residents: np.ndarray) -> np.ndarray:
        """Eviction keys of layer i's residents (a new array), distinct; the lowest goes first (were two
        equal, the lower expert id would go first). LRU: last use."""
        return self._stamp_rows[i][residents]

    def victim_order(self, i: int, candidates: np.ndarray) -> np.ndarray:
        """Candidates, the first to evict first (derived from victim_keys unless overridden): lowest key
        first, ties by ascending expert id, as the cache orders victim keys itself
        (ExpertCache._take_slots)."""
        return candidates[np.lexsort((candidates, self.victim_keys(i, candidates)))]

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
