"""Cache policies: who to evict, who to keep when a demand outgrows the cache, what to prefetch.

Imports nothing from the model or the engine: the same objects serve the live engine and the trace
simulator (offload/backend/cache.py drives them). A policy sees the demand stream one (forward, layer) event
at a time, in the order the model computes them. Layers are MoE positions i = 0..L_moe-1 throughout.

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

The registry is built from the classes: `@register` reads the class attributes (name, needs_trace,
engine_ok, needs_prediction, summary) and takes the options from the constructor's keyword parameters.
`make_policy` is the one factory; it reads a policy spec `name[:key=value,...]` (e.g.
`last_step:lookahead=2`) and rejects unknown options by name. A spec may add an eviction policy after a
'+' (`last_step+token_lru`, eviction.py); without one, eviction is LRU. See docs/policies.md.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any, NamedTuple, Sequence

import numpy as np

from artifact.errors import SettingError, TraceError
from artifact.offload.policy.eviction import EVICTIONS, LRU, Eviction
from artifact.validate import check_number

EMPTY_EXPERTS = np.zeros(0, dtype=np.int64)


class Prediction(NamedTuple):
    """What `Policy.predict` asks the cache to make resident in layer `target`: `experts` ranked most wanted
    first, or, with `counts` (their token counts), ranked by count (most first, then id) by the cache, and
    only when something is to load. A plain (target, experts[, counts]) tuple is read the same way."""
    target: int
    experts: np.ndarray
    counts: np.ndarray | None = None


class Policy:
    """The base of every prefetch policy (registered: DemandPolicy, LastStep, ...; itself none): its defaults are LRU
    eviction and no prefetch. Per-layer state is indexed by the MoE position i.

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

    name = ""                  # the registered name (a spec's); every registered subclass sets its own
    summary = ""               # one line for the policy list
    needs_trace = False        # True: built from a recorded run of the same prompts (future knowledge)
    engine_ok = True           # False: simulator only
    needs_prediction = False   # True: reads the cross-layer prediction each demand carries (Demand.predicted)
    conservative = False       # True: a prefetch never evicts a predicted expert (see ExpertCache)
    owns_eviction = False      # True: decides eviction itself (belady); refuses a spec's `+eviction`

    def __init__(self, num_layers: int, num_experts: int):
        self.num_layers, self.num_experts = num_layers, num_experts
        self.eviction: Eviction = LRU(num_layers, num_experts)   # make_policy puts a spec's `+eviction` here
        self.position = 0          # index of the current event in the demand stream
        self.predicted = None      # the current demand's (experts, counts) prediction; set when needs_prediction

    def decides(self, hook: str) -> bool:
        """Whether this policy's class defines the eviction hook `hook` itself (else self.eviction decides)."""
        return hasattr(type(self), hook)

    def predict(self, i: int, experts: np.ndarray, counts: np.ndarray, step) -> Prediction | None:
        """Called when layer i's demand is known (before it computes): what to load speculatively, or None."""
        return None

    def observe(self, i: int, experts: np.ndarray, counts: np.ndarray, step) -> None:
        """Called for every demand before it is planned."""

    def advance(self) -> None:
        self.position += 1


class DemandPolicy(Policy):
    """LRU eviction, no prefetch: every miss loads on demand (the paper's design; the base's defaults, named)."""

    name = "demand"
    summary = "LRU, misses load on demand"


class LastStep(Policy):
    """Predicts D(t, target) := the target layer's most recent demand, D(t-1, target), for the target
    `lookahead` MoE layers ahead (wrapping into the next forward)."""

    name = "last_step"
    summary = "LRU + make the C most wanted of the target layer's previous demand resident"

    def __init__(self, num_layers: int, num_experts: int, lookahead: int = 1):
        super().__init__(num_layers, num_experts)
        self.lookahead = check_number(f"policy {self.name!r}: lookahead", lookahead, low=1, integer=True)   # MoE layers
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
                f"policy 'cross_layer' needs the cross-layer prediction of each demand (Demand.predicted: the "
                f"next MoE layer's router on this layer's hidden states), and demand {self.position} (MoE layer "
                f"{i}) has none: run the model with the prediction switched on, or replay a trace that records "
                "it (trace schema 2)")
        e, c = self.predicted
        return Prediction(i + 1, np.asarray(e, dtype=np.int64), np.asarray(c, dtype=np.int64))


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
    def from_arrays(cls, forward: Sequence[int], index: Sequence[int], experts: Sequence[np.ndarray],
                    counts: Sequence[np.ndarray]) -> "TraceFuture":
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
            raise TraceError(f"the run has more demands than the trace ({len(self.index)} events): "
                               "the trace was recorded on other prompts or decoding settings")
        te = self.experts[position]
        if experts is te:                                  # replaying the trace itself
            return
        if self.index[position] != i or not np.array_equal(te, experts):   # forward indices restart per batch
            raise TraceError(f"demand {position} (layer index {i}) differs from the trace's (forward "
                               f"{self.forward[position]}, layer index {self.index[position]}): not the same run")

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


class Oracle(Policy):
    """Loads the true D(t, target) of the event `lookahead` positions ahead, from a trace."""

    name = "oracle"
    summary = "LRU + prefetch the true future demand"
    needs_trace = True

    def __init__(self, num_layers: int, num_experts: int, future: TraceFuture, lookahead: int = 1):
        super().__init__(num_layers, num_experts)
        self.future = future
        self.lookahead = check_number(f"policy {self.name!r}: lookahead", lookahead, low=1, integer=True)   # demands

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
        self.tau = check_number(f"policy {self.name!r}: tau", tau, low=1, integer=True)     # denoising steps

    def refreshing(self, step) -> bool:
        return step.kind == "denoise" and step.block_step % self.tau == 0

    def keep_order(self, i, experts, counts, hit, step):
        if not self.refreshing(step):
            return self.eviction.keep_order(i, experts, counts, hit, step)
        return experts[(counts * self.num_experts - experts).argsort(kind="stable")]   # fewest tokens, then higher id


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
        self.never = len(future)                      # "no next use": farther than any stream position
        self._next = future.next_uses()
        # Eviction key of each expert, set when it is demanded: (never - next use) * E + id, so the
        # lowest key is the farthest next use, ties (never used again) by ascending id.
        self.key = np.zeros((num_layers, num_experts), dtype=np.int64)
        self._key_rows = list(self.key)
        self._keys_at = (-1, None)                   # (position, keys of that demand's experts)

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

    def touch(self, i, ordered):                                       # no LRU stamps: keys decide
        self._key_rows[i][self.future.experts[self.position]] = self._demand_keys()


# ---------------------------------------------------------------------------------------------
# The registry and the one factory
# ---------------------------------------------------------------------------------------------
POLICIES: dict[str, type[Policy]] = {}
_POSITIONAL = ("self", "num_layers", "num_experts", "future")


def options_of(cls: type[Policy]) -> dict[str, Any]:
    """A policy's options: its constructor's keyword parameters and their defaults."""
    return {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()
            if p.name not in _POSITIONAL and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: add a Policy subclass to POLICIES under its `name`. Every constructor parameter
    after (num_layers, num_experts[, future]) is an option and needs a default."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)) or cls is Policy:
        raise TypeError(f"{cls!r} is not a Policy subclass")
    if not cls.name:
        raise TypeError(f"policy class {cls.__qualname__} has no name (set the class attribute `name`)")
    params = inspect.signature(cls.__init__).parameters.values()
    bad = [p.name for p in params if p.name not in _POSITIONAL and p.default is inspect.Parameter.empty
           and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if bad:
        raise TypeError(f"policy {cls.name!r}: options {bad} need defaults (they are keyword options of the spec)")
    if cls.needs_trace != ("future" in inspect.signature(cls.__init__).parameters):
        raise TypeError(f"policy {cls.name!r}: needs_trace={cls.needs_trace} but its constructor "
                        f"{'lacks' if cls.needs_trace else 'takes'} a `future` parameter")
    old = POLICIES.get(cls.name)
    files = [getattr(sys.modules.get(c.__module__), "__file__", c.__module__) for c in (old, cls)] if old else []
    if files and files[0] != files[1]:             # a class of the same file (a module imported twice) replaces
        raise TypeError(f"policy name {cls.name!r} is taken by {old.__module__}.{old.__qualname__} ({files[0]}); "
                        f"give {cls.__qualname__} another name")
    POLICIES[cls.name] = cls
    return cls


for _cls in (DemandPolicy, LastStep, LastStepConservative, CrossLayer, Oracle, IntervalRefresh, Belady):
    register(_cls)


def _coerce(name: str, option: str, raw: str, default: Any):
    """A spec option's text as the type of its default."""
    try:
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes"):
                return True
            if raw.lower() in ("0", "false", "no"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise SettingError(f"policy {name!r}: option {option}={raw!r} is not a {type(default).__name__}") from None
    return raw


# Names the simulator replays that are bounds, not policies (sim.BOUNDS): refused here with their reason.
SIMULATOR_BOUNDS = ("min",)


def _options(kind: str, cls, spec: str, rest: str) -> dict[str, Any]:
    """The `key=value,...` text after a name's ':' as options, each checked against the class."""
    valid = options_of(cls)
    options = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if not eq or not key:
            raise SettingError(f"policy spec {spec!r}: expected key=value after ':', got {item!r}")
        if key not in valid:
            raise SettingError(f"{kind} {cls.name!r} has no option {key!r}; its options: "
                               f"{', '.join(f'{k}={v!r}' for k, v in valid.items()) or 'none'}")
        options[key] = _coerce(cls.name, key, raw, valid[key])
    return options


def split_spec(spec: str) -> tuple[str, str | None]:
    """'prefetch[:opts][+eviction[:opts]]' -> (prefetch part, eviction part or None)."""
    head, plus, tail = spec.partition("+")
    if plus and ("+" in tail or not tail.strip() or not head.strip()):
        raise SettingError(f"policy spec {spec!r}: expected 'prefetch[:opts]+eviction[:opts]' (one '+', a name "
                           f"on each side), e.g. 'last_step+token_lru'")
    return head, (tail if plus else None)


def parse_eviction(text: str, spec: str | None = None) -> tuple[type[Eviction], dict[str, Any]]:
    """`name[:key=value,...]` of an eviction policy -> (class, options)."""
    name, _, rest = text.strip().partition(":")
    cls = EVICTIONS.get(name.strip())
    if cls is None:
        raise SettingError(f"unknown eviction policy {name.strip()!r} in {spec or text!r}; choose one of "
                           f"{sorted(EVICTIONS)}")
    return cls, _options("eviction", cls, spec or text, rest)


def parse_spec(spec: str) -> tuple[type[Policy], dict[str, Any], type[Eviction], dict[str, Any]]:
    """`prefetch[:key=value,...][+eviction[:key=value,...]]` -> (policy class, options, eviction class,
    options); the eviction is LRU when none is named. Every name and option is checked."""
    if not isinstance(spec, str) or not spec.strip():
        raise SettingError(f"a policy spec is 'name[:key=value,...][+eviction[:key=value,...]]', got {spec!r}")
    head, tail = split_spec(spec.strip())
    name, _, rest = head.strip().partition(":")
    cls = POLICIES.get(name.strip())
    if cls is None and name.strip() in SIMULATOR_BOUNDS:
        raise SettingError(f"{name.strip()!r} is a bound (bounds.relaxed_min, the demand-paging floor), not a cache "
                           "policy: the engine, the bench and a profile's policy lists do not take it; the "
                           "simulator replays it (python -m artifact simulate --policies demand,belady,min; "
                           "notebook 02 adds it)")
    if cls is None and name.strip() in EVICTIONS:
        raise SettingError(f"{name.strip()!r} is an eviction policy, not a prefetch policy: combine it with one, "
                           f"e.g. 'demand+{head.strip()}' (LRU's place in the demand policy)")
    if cls is None:
        raise SettingError(f"unknown policy {name.strip()!r}; choose one of {sorted(POLICIES)} (a policy of your own: "
                           "name its module with --policy-module or the profile key policy_modules)")
    options = _options("policy", cls, spec, rest)
    if tail is None:
        return cls, options, LRU, {}
    if cls.owns_eviction:
        raise SettingError(f"policy {cls.name!r} decides eviction itself; it takes no '+eviction' (got {spec!r})")
    ev, ev_options = parse_eviction(tail, spec)
    return cls, options, ev, ev_options


def parse_policy(spec: str) -> tuple[type[Policy], dict[str, Any]]:
    """A spec -> (prefetch policy class, its options); the `+eviction` part, if any, is checked too."""
    cls, options, _, _ = parse_spec(spec)
    return cls, options


def split_policies(text: str) -> list[str]:
    """A comma-separated list of policy specs, where a spec's own options also use commas:
    'demand,last_step:lookahead=2,conservative=true,oracle' -> 3 specs (a piece with '=' and no ':'
    continues the spec before it)."""
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and ":" not in piece and out:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def check_policy(spec: str, engine: bool = False) -> type[Policy]:
    """Validate a policy spec without building it (for checking arguments before a model loads)."""
    cls, _ = parse_policy(spec)
    if engine and not cls.engine_ok:
        raise SettingError(f"policy {cls.name!r} needs the whole future and runs in the simulator only "
                         "(python -m artifact simulate); the engine takes 'oracle' for future knowledge")
    return cls


def make_policy(spec: str, num_layers: int, num_experts: int, future: TraceFuture | None = None,
                engine: bool = False, **settings) -> Policy:
    """The one factory. `spec` is a policy name with optional options, `name[:key=value,...]`, and
    optionally an eviction policy after a '+' (`last_step+token_lru`, `demand+lrfu:lam=0.25`; eviction.py;
    LRU without one); an option the policy does not take is an error naming the policy's valid options.
    `settings` are run-wide values (e.g. lookahead=, tau= from the command line or a profile) given to every
    policy that takes an option of that name; a setting no registered policy takes is an error. Spec
    options win."""
    cls, options, ev_cls, ev_options = parse_spec(spec)
    check_policy(spec, engine)
    known = {k for c in POLICIES.values() for k in options_of(c)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise SettingError(f"no policy takes the option(s) {unknown}; policy options are {sorted(known)}")
    valid = options_of(cls)
    kwargs = {k: v for k, v in settings.items() if k in valid}
    kwargs.update(options)
    if cls.needs_trace:
        if future is None:
            raise SettingError(f"policy {cls.name!r} needs a trace of an identical earlier run (--oracle-trace FILE)")
        kwargs["future"] = future
    policy = cls(num_layers, num_experts, **kwargs)
    if ev_cls is not LRU or ev_options:
        policy.eviction = ev_cls(num_layers, num_experts, **ev_options)
    return policy


def describe_evictions() -> list[dict]:
    """One row per registered eviction policy (name, options, summary)."""
    return [{"name": n, "options": options_of(c), "summary": c.summary} for n, c in EVICTIONS.items()]


def describe() -> list[dict]:
    """One row per registered policy (name, options, flags, summary), for help texts and docs."""
    return [{"name": n, "options": options_of(c), "needs_trace": c.needs_trace, "engine_ok": c.engine_ok,
             "needs_prediction": c.needs_prediction, "summary": c.summary} for n, c in POLICIES.items()]
