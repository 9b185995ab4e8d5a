"""What an ExpertCache hands the engine and what it counts: a Plan per demand (its hits, then its loads, each
Load a copy into a slot, in the order they are loaded and computed) and CacheCounts, every count kept per
phase of the demand stream (PHASES: prefill, the first denoising step of a block round, later steps). The
cache that makes them is cache.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EMPTY = -1  # no expert (a free slot), no slot (an expert not resident)
NONE = np.zeros(0, dtype=np.int64)  # an empty expert list, shared: read-only
NONE.flags.writeable = False
PHASES = ("prefill", "first", "later")
COUNTS = (
    "demand_hits",
    "demand_misses",
    "speculative_transfers",
    "prefetch_hits",
    "wasted_prefetches",
    "bytes_h2d",
)
HITS, MISSES, SPECULATIVE, PREFETCH_HITS, WASTED, BYTES = range(len(COUNTS))


def phase_of(step) -> int:
    """0 prefill, 1 first denoising step of a block round, 2 later steps (an index into PHASES)."""
    if step.kind == "prefill":
        return 0
    return 1 if step.block_step == 0 else 2


@dataclass(frozen=True)
class Load:
    layer: int  # model layer index
    expert: int
    slot: int
    victim: int  # expert evicted from the slot, EMPTY if it was free
    after: int  # demanded expert whose compute must finish before the copy starts, EMPTY: none
    speculative: bool = False

    def __str__(self) -> str:  # the copy's label: formatted only when a message needs it
        return f"layer {self.layer} expert {self.expert} -> slot {self.slot}"


class Plan:
    """What one demand (or one prefetch) asks of a layer, as arrays (int64, aligned per row):

      index                    MoE position i of the layer
      hit_experts, hit_slots   (H,) resident demanded experts and their slots, computed first
      load_experts             (M,) experts to copy, in issue and compute order
      load_slots               (M,) destination slot of each copy
      load_victims             (M,) expert evicted by each copy, EMPTY for a free slot
      load_after               (M,) demanded expert whose compute must finish before the copy may start
                               (a wave reusing its slot), EMPTY: issue at once
      speculative              True for a prefetch plan (no hits)

    The engine reads the arrays, and `streams` (some copy waits for a compute). load_slots/load_victims/
    load_after are assembled on first access from what planning produced (the simulator never reads
    them), and so are, for tests and inspection, `.hits` (list of (expert, slot)) and `.loads` (list of
    Load). `.layer` is the model layer index."""

    __slots__ = (
        "layer",
        "index",
        "hit_experts",
        "hit_slots",
        "load_experts",
        "speculative",
        "_slots",
        "_free",
        "_evicted",
        "_wave",
        "_victims",
        "_after",
        "_hits",
        "_loads",
    )

    def __init__(
        self,
        layer: int,
        index: int,
        hit_experts: np.ndarray,
        hit_slots: np.ndarray,
        load_experts: np.ndarray = NONE,
        load_slots: np.ndarray | None = NONE,
        free: int = 0,
        evicted: np.ndarray = NONE,
        wave: tuple | None = None,
        speculative: bool = False,
    ):
        """Without `wave`: copy j goes to load_slots[j]; the first `free` slots were free, the rest
        evict `evicted` in order. With wave = (period, a, going_hits): slot j = period[j % p] and copy
        j >= a waits for the slot's occupant (see ExpertCache._stream_through)."""
        self.layer, self.index, self.speculative = layer, index, speculative
        self.hit_experts, self.hit_slots, self.load_experts = hit_experts, hit_slots, load_experts
        self._slots, self._free, self._evicted, self._wave = load_slots, free, evicted, wave
        self._victims = self._after = self._hits = self._loads = None

    @property
    def load_slots(self) -> np.ndarray:
        if self._slots is None:
            period = self._wave[0]
            self._slots = period[np.arange(len(self.load_experts)) % len(period)]
        return self._slots

    @property
    def load_after(self) -> np.ndarray:
        if self._after is None:
            m = len(self.load_experts)
            if self._wave is None:
                self._after = np.full(m, EMPTY, dtype=np.int64)
            else:
                period, a, going_hits = self._wave
                self._after = np.concatenate(
                    (np.full(a, EMPTY, dtype=np.int64), going_hits, self.load_experts[: m - len(period)])
                )
        return self._after

    @property
    def load_victims(self) -> np.ndarray:
        if self._victims is None:
            parts = [np.full(self._free, EMPTY, dtype=np.int64), self._evicted]
            if self._wave is not None:
                parts.append(self.load_after[self._wave[1] :])
            self._victims = np.concatenate(parts)
        return self._victims

    @property
    def streams(self) -> bool:
        """Copies stream through the slots in waves: some wait for a demanded expert's compute (load_after);
        False: every copy may start at once (load_after is all EMPTY)."""
        return self._wave is not None

    @property
    def hits(self) -> list[tuple[int, int]]:
        if self._hits is None:
            self._hits = list(zip(self.hit_experts.tolist(), self.hit_slots.tolist()))
        return self._hits

    @property
    def loads(self) -> list[Load]:
        if self._loads is None:
            self._loads = [
                Load(self.layer, e, s, v, a, self.speculative)
                for e, s, v, a in zip(
                    self.load_experts.tolist(),
                    self.load_slots.tolist(),
                    self.load_victims.tolist(),
                    self.load_after.tolist(),
                )
            ]
        return self._loads

    def __repr__(self) -> str:
        return (
            f"Plan(layer={self.layer}, hits={self.hits}, loads={self.loads}"
            f"{', speculative' if self.speculative else ''})"
        )


class CacheCounts:
    """The counts of a run, kept per phase (PHASES) as plain ints; totals are the phases' sums.
    Every prefetch ends as exactly one of: prefetch hit, wasted prefetch, or still unused (until
    finish); so prefetch hits are not tallied on the hot path but derived per issuing phase as
    speculative_transfers - wasted_prefetches - still unused.

      demand_hits            demanded experts resident (or in flight) when their demand was planned
      demand_misses          demanded experts no load had been issued for: the compute waits on a copy
      speculative_transfers  copies a policy asked for ahead of a demand
      prefetch_hits          demand hits on a prefetched expert not used before (issuing demand's phase)
      wasted_prefetches      prefetched experts evicted, or left at the end, unused (issuing demand's phase)
      bytes_h2d              bytes copied host to device (demand and speculative copies)
    """

    FIELDS = COUNTS

    def __init__(self, unused=None):
        self.phases: list[list[int]] = [[0] * len(COUNTS) for _ in PHASES]  # PREFETCH_HITS column unused
        self._unused = unused or (lambda: [0] * len(PHASES))  # still-unused prefetches per issuing phase

    def rows(self) -> list[list[int]]:
        """Per phase, every count in COUNTS order (prefetch hits derived)."""
        out = [list(p) for p in self.phases]
        for row, pending in zip(out, self._unused()):
            row[PREFETCH_HITS] = row[SPECULATIVE] - row[WASTED] - pending
        return out

    def total(self, field: str) -> int:
        k = COUNTS.index(field)
        return sum(p[k] for p in self.rows())

    def as_dict(self) -> dict:
        rows = self.rows()
        return {f: sum(p[k] for p in rows) for k, f in enumerate(COUNTS)}

    def by_phase(self) -> dict[str, dict]:
        return {name: dict(zip(COUNTS, p)) for name, p in zip(PHASES, self.rows())}

    def __repr__(self) -> str:
        return f"CacheCounts({self.as_dict()})"


for _f in COUNTS:  # counts.demand_misses etc.: read-only totals
    setattr(CacheCounts, _f, property(lambda self, f=_f: self.total(f)))
