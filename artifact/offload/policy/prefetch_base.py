"""The prefetch interface: the `Policy` base (no prefetch, LRU eviction), the `Prediction` a policy returns,
and the `TraceFuture` a policy with future knowledge is built from.

The policies registered on it are in prefetch.py; the registry and the one factory (`register`, `make_policy`)
in policies.py, which also exports `Policy` and `Prediction`: what a policy of your own is written against
(docs/policies.md). Imports nothing from the model or the engine: the same objects serve the live engine and
the trace simulator (offload/backend/cache.py drives them).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from artifact.errors import TraceError
from artifact.offload.policy.eviction_base import LRU, Eviction

EMPTY_EXPERTS = np.zeros(0, dtype=np.int64)


class Prediction(NamedTuple):
    """What `Policy.predict` asks the cache to make resident in layer `target`: `experts` ranked most wanted
    first, or, with `counts` (their token counts), ranked by count (most first, then id) by the cache, and
    only when something is to load. A plain (target, experts[, counts]) tuple is read the same way."""

    target: int
    experts: np.ndarray
    counts: np.ndarray | None = None


class Policy:
    """The base of every prefetch policy (registered: DemandPolicy, LastStep, ...; itself none): its defaults
    are LRU eviction and no prefetch. Per-layer state is indexed by the MoE position i.

    Hooks (override to make a policy):
      observe(i, experts, counts, step)             every demand, before it is planned
      predict(i, experts, counts, step)             a Prediction (target layer, experts[, token counts]),
                                                    or None
      advance()                                     after each demand
    Eviction hooks, defined only by a policy that decides eviction itself (belady; interval_refresh's keep
    order); otherwise its eviction policy (`self.eviction`, eviction.py) decides, and ExpertCache resolves
    each hook once, at construction (the one dispatch):
      keep_order(i, experts, counts, hit, step)     demanded experts least worth keeping first
      victim_keys(i, residents)                     eviction keys, lowest evicted first (or define
                                                    victim_order(i, candidates) to order them yourself)
      touch(i, ordered)                             record uses, the later the more recent
    `experts` are ascending int64 arrays and `counts` their token counts; `step` is the model's
    StepInfo (.forward, .block, .block_step, .kind). Subclass options are keyword parameters of
    __init__ with defaults (they become the policy's spec options).
    """

    name = ""  # the registered name (a spec's); every registered subclass sets its own
    summary = ""  # one line for the policy list
    needs_trace = False  # True: built from a recorded run of the same prompts (future knowledge)
    engine_ok = True  # False: simulator only
    needs_prediction = False  # True: reads the cross-layer prediction each demand carries (Demand.predicted)
    conservative = False  # True: a prefetch never evicts a predicted expert (see ExpertCache)
    owns_eviction = False  # True: decides eviction itself (belady); refuses a spec's `+eviction`

    def __init__(self, num_layers: int, num_experts: int):
        self.num_layers, self.num_experts = num_layers, num_experts
        self.eviction: Eviction = LRU(num_layers, num_experts)  # make_policy puts a spec's `+eviction` here
        self.position = 0  # index of the current event in the demand stream
        self.predicted = None  # the current demand's (experts, counts) prediction; set when needs_prediction

    def decides(self, hook: str) -> bool:
        """Whether this policy's class defines the eviction hook `hook` itself (else self.eviction
        decides)."""
        return hasattr(type(self), hook)

    def predict(self, i: int, experts: np.ndarray, counts: np.ndarray, step) -> Prediction | None:
        """Called when layer i's demand is known (before it computes): what to load speculatively, or None."""
        return None

    def observe(self, i: int, experts: np.ndarray, counts: np.ndarray, step) -> None:
        """Called for every demand before it is planned."""

    def advance(self) -> None:
        self.position += 1


class TraceFuture:
    """Future knowledge from a recorded run of the same prompts: the demand stream as arrays. Checks
    that the live stream is the recorded one, so a diverged run fails loudly.

    `TraceFuture(events)` takes (forward, MoE position i, experts, counts) tuples; Trace.future() builds
    one from the trace's cached arrays (`from_arrays`), which the simulator replays as they are, so the
    check is an identity test there and a comparison only for a live run."""

    def __init__(self, events: Sequence[tuple[int, int, np.ndarray, np.ndarray]] = ()):
        self.forward = [int(f) for f, _, _, _ in events]
        self.index = [int(i) for _, i, _, _ in events]
        self.experts = [np.asarray(e, dtype=np.int64) for _, _, e, _ in events]
        self.counts = [np.asarray(c, dtype=np.int64) for _, _, _, c in events]

    @classmethod
    def from_arrays(
        cls,
        forward: Sequence[int],
        index: Sequence[int],
        experts: Sequence[np.ndarray],
        counts: Sequence[np.ndarray],
    ) -> "TraceFuture":
        f = cls()
        f.forward, f.index, f.experts, f.counts = forward, index, experts, counts
        return f

    def __len__(self) -> int:
        return len(self.index)

    @property
    def events(self) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        return list(zip(self.forward, self.index, self.experts, self.counts))

    def check(self, position: int, i: int, experts: np.ndarray, step) -> None:
        if position >= len(self.index):
            raise TraceError(
                f"the run has more demands than the trace ({len(self.index)} events): "
                "the trace was recorded on other prompts or decoding settings"
            )
        te = self.experts[position]
        if experts is te:  # replaying the trace itself
            return
        if self.index[position] != i or not np.array_equal(te, experts):  # forward indices restart per batch
            raise TraceError(
                f"demand {position} (layer index {i}) "
                f"differs from the trace's (forward {self.forward[position]}, "
                f"layer index {self.index[position]}): not the same run"
            )

    def next_uses(self) -> list[np.ndarray]:
        """For each demand, the stream position of each demanded expert's next demand in that layer
        (len(self) when it is never demanded again). One backward pass over the demands."""
        n = len(self.index)
        E = 1 + max((int(e[-1]) for e in self.experts if len(e)), default=0)
        last_seen = np.full((max(self.index, default=0) + 1, E), n, dtype=np.int64)
        out: list[np.ndarray] = [EMPTY_EXPERTS] * n
        for p in range(n - 1, -1, -1):
            row, e = last_seen[self.index[p]], self.experts[p]
            out[p] = row[e]
            row[e] = p
        return out
