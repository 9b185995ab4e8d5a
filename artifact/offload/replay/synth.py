"""Synthetic routing streams with chosen working-set statistics, written as routing traces, and the fit
that measures those statistics on any trace (so a real LLaDA2 trace's statistics can be regenerated).

The generator's model. A stream is `sequences` generate calls; each is `batch_size` prefill forwards
(only if prefill > 0), then `blocks` blocks of `steps` denoising steps; every forward demands D(t, l)
from each of the `layers` MoE layers in order. For MoE layer position l (x = l / (L-1)) and block step s
(y = s / (S-1)):

    W(t, l)  = clip(round~(mu(l, s) * (1 + w_spread * z)), 1, min(E, tokens * top_k))
    z        ~ N(0, 1): fresh at a block's first step, then z(s) = rho z(s-1) + sqrt(1 - rho^2) e(s) along
               the block's steps (rho = w_persistence; the same tokens route alike, so W drifts, not jumps)
    mu(l, s) = w * depth(l) * step(s) / mean_s step(s)
    depth(l) = 1 + w_depth * (x - 1/2)                   (mean 1 over layers: W grows with depth if > 0)
    step(s)  = (1 + w_growth * (y - 1/2)) * (w_first if s == 0 else 1)

so w is the mean W over denoising demands. round~ is stochastic rounding (floor(v), plus 1 with
probability frac(v)), which keeps every mean exact. A prefill demand has W = round~(prefill * w *
depth(l) * (1 + w_spread * z)) experts drawn uniformly. A denoising demand whose layer already had a
demand P in this sequence keeps r = round~((1 - nu) * W) experts of P (a uniform choice, r clipped to
[W - (E - |P|), |P|]) and draws the other W - r uniformly from the experts not in P, with nu = novelty
within a block and nu = block_novelty at a block's first step (P is then the previous block's last
step, or the last prefill forward). Without clipping the share of D(t, l) not in P is nu on average;
clipping raises it where W grows by more than 1 / (1 - nu) in one step (iid W with a large spread).
The first demand of a layer in a sequence without prefill is uniform. Token counts: each demanded expert
gets one token, the remaining tokens * top_k - W assignments are spread uniformly (multinomial).

`fit` measures the same statistics from a trace (moments under this model): mean W; the depth slope
from per-layer means; growth and first-step multiple from W relative to its layer's mean, by block step;
spread from what remains (less the generator's rounding variance); persistence from the mean squared
step-to-step change of what remains inside blocks; novelty and block-start novelty as the mean share of a
demand not in the layer's previous demand; prefill as mean prefill W over w.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from artifact.errors import SettingError, TraceError
from artifact.model.config import PRESETS
from artifact.offload.links.link import REFERENCE_EXPERT_BYTES
from artifact.offload.replay.trace import KINDS, Trace
from artifact.validate import check_number

PREFILL, DENOISE = KINDS.index("prefill"), KINDS.index("denoise")


@dataclass(frozen=True)
class SynthParams:
    layers: int = 19              # MoE layers (LLaDA2.0-mini: 20 layers, the first dense)
    experts: int = 256            # routed experts per layer, E
    top_k: int = 8
    tokens: int = 32              # tokens fed per denoising step (one 32-token block at batch size 1)
    blocks: int = 4               # blocks per sequence
    steps: int = 32               # denoising steps per block (the decoder's maximum)
    sequences: int = 1            # generate calls, each with its own prefill and blocks
    batch_size: int = 1           # prefill forwards per sequence (the decoder prefills row by row)
    w: float = 70.0               # mean W over denoising demands (the cpu traces' mean)
    w_spread: float = 0.05        # relative sd of W around its profile (the paper's 6.7x needs ~0.055)
    w_depth: float = 0.0          # relative change of W from the first to the last MoE layer
    w_growth: float = 0.0         # relative change of W from a block's first to its last step
    w_first: float = 1.0          # W multiple at a block's first step (the decoder also commits a block there)
    w_persistence: float = 0.0    # rho: step-to-step correlation of W's noise inside a block (0: independent)
    novelty: float = 0.12         # nu: share of D(t, l) not in D(t-1, l) inside a block (cpu traces: 0.14)
    block_novelty: float = 0.5    # the same at a block's first step (a new block's tokens route anew)
    prefill: float = 0.0          # prefill W as a multiple of w; 0: no prefill forwards
    seed: int = 0

    def __post_init__(self):
        c = check_number
        c("layers", self.layers, low=1, high=4096, integer=True)
        c("experts", self.experts, low=1, high=np.iinfo(np.int16).max, integer=True)   # traces store int16
        c("top_k", self.top_k, low=1, high=self.experts, integer=True)
        for name in ("tokens", "blocks", "steps", "sequences", "batch_size"):
            c(name, getattr(self, name), low=1, high=1 << 20, integer=True)
        c("seed", self.seed, low=0, integer=True)
        wmax = min(self.experts, self.tokens * self.top_k)
        c(f"w (mean W; at most E = {self.experts} and tokens * top_k = {self.tokens * self.top_k})", self.w,
          low=1, high=wmax)
        c("w_spread (relative sd of W)", self.w_spread, low=0, high=1)
        c("w_depth (relative change over depth; W must stay positive)", self.w_depth, low=-2, high=2,
          low_open=True, high_open=True)
        c("w_growth (relative change over a block; W must stay positive)", self.w_growth, low=-2, high=2,
          low_open=True, high_open=True)
        c("w_first (W multiple at a block's first step)", self.w_first, low=0, high=16, low_open=True)
        c("w_persistence (correlation of W from step to step)", self.w_persistence, low=-1, high=1,
          low_open=True, high_open=True)
        c("novelty (share of D(t,l) not in D(t-1,l))", self.novelty, low=0, high=1)
        c("block_novelty (the same at a block's first step)", self.block_novelty, low=0, high=1)
        c("prefill (prefill W as a multiple of w; 0 = none)", self.prefill, low=0, high=self.experts)
        peak = self.w * _depth(self).max() * _step(self).max() / _step(self).mean()
        if peak > wmax:
            raise SettingError(f"the W profile peaks at {peak:.1f} experts, more than min(E, tokens * top_k) = "
                             f"{wmax}: lower w, w_depth, w_growth or w_first")
        nu = max(self.novelty, self.block_novelty)
        if peak * (1 + nu) > self.experts:
            raise SettingError(f"a step of {peak:.1f} experts with {nu:g} new ones needs {peak * (1 + nu):.1f} > "
                             f"E = {self.experts} distinct experts: lower w or the novelty")
        if self.prefill and self.prefill * self.w * _depth(self).max() > self.experts:
            raise SettingError(f"prefill W = {self.prefill:g} x w = {self.prefill * self.w:.1f} (at most "
                             f"{self.prefill * self.w * _depth(self).max():.1f} by depth) exceeds E = {self.experts}")
        accesses = self.sequences * (self.blocks * self.steps * self.w + self.batch_size * self.prefill * self.w)
        if accesses * self.layers > 1e8:          # ~0.6 GB of arrays; recorded traces hold 1e5-1e7
            raise SettingError(f"the stream would hold ~{accesses * self.layers:.3g} expert accesses; at most 1e8")

    def describe(self) -> str:
        return "\n".join(f"{f.name:>14} = {getattr(self, f.name):.4g}" for f in fields(self))


def _depth(p: SynthParams) -> np.ndarray:
    x = np.arange(p.layers) / max(p.layers - 1, 1)                       # (L,) 0 .. 1
    return 1 + p.w_depth * (x - 0.5)


def _step(p: SynthParams) -> np.ndarray:
    y = np.arange(p.steps) / max(p.steps - 1, 1)                         # (S,) 0 .. 1
    f = 1 + p.w_growth * (y - 0.5)
    f[0] *= p.w_first
    return f


def _round(rng: np.random.Generator, v: np.ndarray) -> np.ndarray:
    """Stochastic rounding: E[result] = v exactly."""
    lo = np.floor(v)
    return (lo + (rng.random(v.shape) < v - lo)).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------
def synth(p: SynthParams, expert_bytes: int = REFERENCE_EXPERT_BYTES) -> Trace:
    """A deterministic (seeded) routing stream with the statistics of `p`, as a Trace."""
    check_number("expert_bytes", expert_bytes, low=1, integer=True)
    rng = np.random.default_rng(p.seed)
    L, E, S = p.layers, p.experts, p.steps
    mu = p.w * _depth(p)[:, None] * _step(p)[None, :] / _step(p).mean()   # (L, S) mean W by layer and step
    wmax = min(E, p.tokens * p.top_k)
    prefill_tokens = p.tokens * max(1, math.ceil(p.prefill))
    rows, sets, counts = [], [], []
    forward = 0
    for _ in range(p.sequences):
        last: list[np.ndarray | None] = [None] * L                      # each layer's previous demand
        schedule = [(-1, -1)] * (p.batch_size if p.prefill > 0 else 0)
        schedule += [(b, s) for b in range(p.blocks) for s in range(S)]
        z = np.zeros(L)
        for block, s in schedule:
            fresh = rng.standard_normal(L)                               # (L,)
            z = fresh if s <= 0 else p.w_persistence * z + math.sqrt(1 - p.w_persistence ** 2) * fresh
            if block < 0:
                W = _round(rng, p.prefill * p.w * _depth(p) * (1 + p.w_spread * z))
                W = np.clip(W, 1, min(E, prefill_tokens * p.top_k))
            else:
                W = np.clip(_round(rng, mu[:, s] * (1 + p.w_spread * z)), 1, wmax)
            nu = p.novelty if s > 0 else p.block_novelty
            for i in range(L):
                prev = last[i]
                if block < 0 or prev is None:
                    d = rng.choice(E, int(W[i]), replace=False)
                else:
                    d = _follow(rng, prev, int(W[i]), nu, E)
                d = np.sort(d)
                tokens = prefill_tokens if block < 0 else p.tokens
                c = 1 + rng.multinomial(tokens * p.top_k - len(d), np.full(len(d), 1 / len(d)))
                rows.append((forward, i + 1, block, s, PREFILL if block < 0 else DENOISE))
                sets.append(d)
                counts.append(c)
                last[i] = d
            forward += 1
    return _trace(p, rows, sets, counts, expert_bytes)


def _follow(rng: np.random.Generator, prev: np.ndarray, W: int, nu: float, E: int) -> np.ndarray:
    """W experts: about (1 - nu) W of `prev`, the rest new."""
    keep = int(_round(rng, np.array([(1 - nu) * W]))[0])
    keep = min(max(keep, W - (E - len(prev))), len(prev), W)
    outside = np.ones(E, dtype=bool)
    outside[prev] = False
    return np.concatenate([rng.choice(prev, keep, replace=False),
                           rng.choice(np.flatnonzero(outside), W - keep, replace=False)])


def _trace(p: SynthParams, rows, sets, counts, expert_bytes: int) -> Trace:
    r = np.array(rows, dtype=np.int64).reshape(-1, 5)
    lengths = np.array([len(d) for d in sets], dtype=np.int64)
    digest = hashlib.sha1(json.dumps(asdict(p), sort_keys=True).encode()).hexdigest()[:12]
    meta = {"model": "synthetic", "config_hash": f"synthetic-{digest}", "task": "synthetic",
            "prompt_ids": [f"synthetic/{n}" for n in range(p.sequences * p.batch_size)],
            "batch_size": p.batch_size, "moe_layers": list(range(1, p.layers + 1)), "num_experts": p.experts,
            "top_k": p.top_k, "expert_bytes": int(expert_bytes), "synth": asdict(p)}
    t = Trace(meta=meta, forward=r[:, 0].astype(np.int32), layer=r[:, 1].astype(np.int16),
              block=r[:, 2].astype(np.int32), block_step=r[:, 3].astype(np.int32), kind=r[:, 4].astype(np.uint8),
              offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
              experts=np.concatenate(sets).astype(np.int16), counts=np.concatenate(counts).astype(np.int32))
    t.validate("synthetic stream")
    return t


# ---------------------------------------------------------------------------------------------
# Fit
# ---------------------------------------------------------------------------------------------
def sequence_ids(trace: Trace) -> np.ndarray:
    """(N,) which generate call each demand belongs to: a call starts at the first forward, at a prefill
    after a denoising forward, and where the (block, step) of denoising forwards stops increasing."""
    f = trace.forward.astype(np.int64)
    first = np.flatnonzero(np.r_[True, f[1:] != f[:-1]])                 # (F,) first row of each forward
    kind, block, step = trace.kind[first], trace.block[first].astype(np.int64), trace.block_step[first]
    start = np.ones(len(first), dtype=bool)
    if len(first) > 1:
        prev_dn, dn = kind[:-1] == DENOISE, kind[1:] == DENOISE
        back = (block[1:] < block[:-1]) | ((block[1:] == block[:-1]) & (step[1:] <= step[:-1]))
        start[1:] = (~dn & prev_dn) | (dn & prev_dn & back)
    seq = np.cumsum(start) - 1                                           # (F,)
    return seq[np.cumsum(np.r_[True, f[1:] != f[:-1]]) - 1]


def measure(trace: Trace) -> dict:
    """The generator's statistics measured on a trace, with notes on anything assumed."""
    notes = []
    meta, o = trace.meta, trace.offsets
    E, L = int(meta["num_experts"]), len(meta["moe_layers"])
    W = np.diff(o).astype(np.float64)                                    # (N,)
    dn = trace.kind == DENOISE
    if not dn.any():
        raise TraceError(f"{getattr(trace, 'path', None) or 'trace'}: no denoising demands, nothing to fit")
    top_k = _top_k(meta, notes)
    seq = sequence_ids(trace)
    pos = np.searchsorted(meta["moe_layers"], trace.layer.astype(np.int64))   # (N,) MoE layer position
    step = trace.block_step.astype(np.int64)
    w = float(W[dn].mean())
    blocks, steps_per, S = _blocks_and_steps(trace, seq, step, dn)
    depth, m_of, layers_fitted = _depth_fit(W, dn, pos, L)
    prof = _step_profile(W, dn, step, S, m_of, layers_fitted)
    nov = _novelty_stats(trace, seq, step, dn, E, prof, notes)
    pf = trace.kind == PREFILL
    prefill = float(W[pf].mean() / w) if pf.any() else 0.0
    counts_sum = np.add.reduceat(trace.counts.astype(np.int64), o[:-1]) if len(trace) else np.zeros(0)
    tokens = max(1, round(float(np.median(counts_sum[prof.later if prof.later.any() else dn])) / top_k))
    prefills = pf.sum() / max(L, 1) / (seq.max() + 1)
    return {"layers": L, "experts": E, "top_k": top_k, "tokens": tokens, "blocks": max(1, round(blocks)),
            "steps": S, "sequences": int(seq.max() + 1),
            "batch_size": int(meta.get("batch_size") or max(1, round(prefills))), "w": w, "w_spread": prof.spread,
            "w_depth": depth, "w_growth": prof.growth, "w_first": prof.w_first, "w_persistence": nov.persistence,
            "novelty": nov.novelty,
            "block_novelty": nov.block_novelty, "prefill": prefill,
            "measured": {"w_cv_total": float(W[dn].std() / w), "denoise_demands": int(dn.sum()),
                         "prefill_demands": int(pf.sum()), "novelty_pairs": int(nov.within.sum()),
                         "block_start_pairs": int(nov.at_start.sum()),
                         "steps_per_block_mean": float(np.mean(steps_per)),
                         "blocks_per_sequence_mean": float(blocks), "notes": notes}}


def _blocks_and_steps(trace: Trace, seq: np.ndarray, step: np.ndarray, dn: np.ndarray) -> tuple[float, list, int]:
    """Blocks per sequence, the steps of each (sequence, block), and S: their mean, rounded (at least 1)."""
    blk = np.unique(np.stack([seq[dn], trace.block[dn]]), axis=1)       # (2, blocks)
    blocks = blk.shape[1] / (seq.max() + 1)
    steps_per = [len(np.unique(step[dn & (seq == q) & (trace.block == b)])) for q, b in blk.T]
    return blocks, steps_per, max(1, round(float(np.mean(steps_per))))


def _depth_fit(W: np.ndarray, dn: np.ndarray, pos: np.ndarray, L: int) -> tuple[float, np.ndarray, int]:
    """Depth: per-layer means of denoising W, a line over x = l / (L - 1). Returns the slope relative to the
    mean, each demand's layer mean (N,) and how many layer means there are."""
    m = np.array([W[dn & (pos == i)].mean() if (dn & (pos == i)).any() else np.nan for i in range(L)])
    x = np.arange(L) / max(L - 1, 1)
    ok = np.isfinite(m)
    depth = 0.0
    if ok.sum() >= 2:
        b, a = np.polyfit(x[ok] - 0.5, m[ok], 1)
        depth = float(b / a)
    return depth, m[pos], int(ok.sum())


@dataclass(frozen=True)
class _Profile:
    """The step profile's fit (_step_profile) and what the novelty and persistence measures read from it."""
    growth: float
    w_first: float
    spread: float
    var: float
    resid: np.ndarray           # (denoising demands,) W over its fitted profile, less 1
    rounding: np.ndarray        # (denoising demands,) the generator's rounding variance of each, relative
    later: np.ndarray           # (N,) denoising demands at block step >= 1
    first: np.ndarray           # (N,) denoising demands at block step 0


def _step_profile(W: np.ndarray, dn: np.ndarray, step: np.ndarray, S: int, m_of: np.ndarray,
                  layers_fitted: int) -> _Profile:
    """Step profile: W relative to its layer's mean, a line over y = s / (S - 1) for s >= 1, then step 0; the
    spread is what remains."""
    ratio = W / m_of
    y = step / max(S - 1, 1)
    later, first = dn & (step >= 1), dn & (step == 0)
    alpha, beta = (float(ratio[later].mean()) if later.any() else 1.0), 0.0
    if later.any() and len(np.unique(step[later])) >= 2:
        beta, alpha = (float(v) for v in np.polyfit(y[later] - 0.5, ratio[later], 1))
    growth = beta / alpha
    at0 = alpha - beta / 2
    w_first = float(ratio[first].mean() / at0) if first.any() and later.any() else 1.0
    fit_ratio = (alpha + beta * (y - 0.5)) * np.where(step == 0, w_first, 1.0)      # (N,)
    resid = ratio[dn] / fit_ratio[dn] - 1
    # The residuals lost one degree of freedom per fitted number (layer means, the step line, w_first).
    fitted = layers_fitted + (2 if beta else 1) + (1 if first.any() and later.any() else 0)
    dof = max(int(dn.sum()) - fitted, 1)
    # Stochastic rounding adds variance frac (1 - frac), 1/6 on average, to each W: not part of the spread.
    rounding = 1 / (6 * (m_of[dn] * fit_ratio[dn]) ** 2)
    var = float(np.sum(resid ** 2) / dof - np.mean(rounding))
    return _Profile(growth, w_first, math.sqrt(max(var, 0.0)), var, resid, rounding, later, first)


@dataclass(frozen=True)
class _Novelty:
    novelty: float
    block_novelty: float
    persistence: float
    within: np.ndarray          # (N,) denoising demands whose previous demand is the step before, in the block
    at_start: np.ndarray        # (N,) denoising demands at a block start with an earlier demand


def _novelty_stats(trace: Trace, seq: np.ndarray, step: np.ndarray, dn: np.ndarray, E: int, prof: _Profile,
             notes: list) -> _Novelty:
    """Novelty: share of a demand not in its layer's previous demand of the same sequence, inside blocks and at
    block starts; persistence of the profile's residuals from step to step inside blocks."""
    prev_idx = _previous(trace, seq)
    new_share = _new_share(trace, prev_idx, E)
    prev_step = np.full(len(trace), -2)
    prev_kind = np.full(len(trace), -1)
    has = prev_idx >= 0
    prev_step[has] = step[prev_idx[has]]
    prev_kind[has] = trace.kind[prev_idx[has]]
    within = dn & has & (step >= 1) & (prev_kind == DENOISE) & (prev_step == step - 1)
    at_start = dn & has & (step == 0)
    novelty = float(new_share[within].mean()) if within.any() else 0.0
    # Persistence from the step-to-step differences of the residuals, E (e(s) - e(s-1))^2 = 2 sigma^2 (1 - rho)
    # plus both steps' rounding variance: differences are blind to the layer means the profile fitted (a
    # lag-1 covariance would lose their variance, biasing rho low by about var(mean z of a layer)).
    res_all, rnd = np.full(len(trace), np.nan), np.full(len(trace), np.nan)
    res_all[dn], rnd[dn] = prof.resid, prof.rounding
    persistence = 0.0
    if within.any() and prof.var > 0:
        a, b = np.flatnonzero(within), prev_idx[within]
        jump = float(np.mean((res_all[a] - res_all[b]) ** 2 - rnd[a] - rnd[b]))
        persistence = 1 - jump / (2 * prof.var)
    if not within.any():
        notes.append("no consecutive steps inside a block: novelty not measured (0)")
    block_novelty = float(new_share[at_start].mean()) if at_start.any() else 1.0
    if not at_start.any():
        notes.append("no block start follows an earlier demand: block_novelty not measured (1)")
    return _Novelty(novelty, block_novelty, persistence, within, at_start)


def fit(trace: Trace) -> SynthParams:
    """SynthParams whose stream has the statistics measured on `trace` (values outside the generator's
    ranges are clamped into them; `measure` gives the raw values)."""
    got = measure(trace)
    kw = {f.name: got[f.name] for f in fields(SynthParams) if f.name in got}
    kw["w_depth"] = float(np.clip(kw["w_depth"], -1.99, 1.99))
    kw["w_growth"] = float(np.clip(kw["w_growth"], -1.99, 1.99))
    kw["w_spread"] = min(kw["w_spread"], 1.0)
    kw["w_persistence"] = float(np.clip(kw["w_persistence"], -0.99, 0.99))
    kw["w"] = min(kw["w"], float(min(kw["experts"], kw["tokens"] * kw["top_k"])))
    kw["prefill"] = min(kw["prefill"], kw["experts"] / kw["w"] / (1 + abs(kw["w_depth"]) / 2))
    return SynthParams(**kw)


def _top_k(meta: dict, notes: list) -> int:
    """Routed experts per token: from the metadata, else from the preset whose architecture recorded it."""
    if meta.get("top_k"):
        return int(meta["top_k"])
    for cfg in PRESETS.values():
        if cfg.config_hash() == meta.get("config_hash"):
            return cfg.num_experts_per_tok
    notes.append("top_k not in the trace's metadata: assumed 8 (LLaDA2.0)")
    return 8


def _previous(trace: Trace, seq: np.ndarray) -> np.ndarray:
    """(N,) index of the same layer's previous demand in the same sequence, -1 if none."""
    n = np.arange(len(trace))
    order = np.lexsort((n, trace.layer, seq))
    same = np.r_[False, (trace.layer[order][1:] == trace.layer[order][:-1]) & (seq[order][1:] == seq[order][:-1])]
    out = np.full(len(trace), -1, dtype=np.int64)
    out[order[same]] = order[np.flatnonzero(same) - 1]
    return out


def _new_share(trace: Trace, prev: np.ndarray, E: int) -> np.ndarray:
    """(N,) share of each demand's experts not in the demand `prev` points to (nan where prev is -1)."""
    lengths = np.diff(trace.offsets)
    demand = np.repeat(np.arange(len(trace)), lengths)                    # (M,)
    experts = trace.experts.astype(np.int64)
    own = demand * E + experts                                            # (M,) sorted: experts ascend per demand
    ask = prev[demand] * E + experts                                      # the same expert in the previous demand
    at = np.clip(np.searchsorted(own, ask), 0, len(own) - 1)
    inside = (prev[demand] >= 0) & (own[at] == ask)
    shared = np.bincount(demand, weights=inside, minlength=len(trace))
    return np.where(prev >= 0, 1 - shared / np.maximum(lengths, 1), np.nan)


# ---------------------------------------------------------------------------------------------
# Command line: python -m artifact synth ... / fit TRACE
# ---------------------------------------------------------------------------------------------
# What each SynthParams field means, in a few words (the synth command's help).
PARAM_HELP = {"layers": "MoE layers", "experts": "routed experts per layer (E)", "top_k": "experts per token",
         "tokens": "tokens per denoising step", "blocks": "blocks per sequence", "steps": "steps per block",
         "sequences": "generate calls", "batch_size": "prefill forwards per sequence (batch rows)",
         "w": "mean working set W", "w_spread": "relative sd of W", "w_depth": "relative change of W over depth",
         "w_growth": "relative change of W over a block", "w_first": "W multiple at a block's first step",
         "w_persistence": "step-to-step correlation of W's noise in a block",
         "novelty": "share of D(t,l) not in D(t-1,l)", "block_novelty": "the same at a block's first step",
         "prefill": "prefill W / w (0: no prefill)", "seed": "random seed"}
