"""The fit of the synthetic streams' statistics (synth.py) to any trace, so a real LLaDA2 trace's statistics
can be regenerated.

`measure` measures the generator's statistics on a trace (moments under synth.py's model): mean W; the depth
slope from per-layer means; growth and first-step multiple from W relative to its layer's mean, by block step;
spread from what remains (less the generator's rounding variance); persistence from the mean squared
step-to-step change of what remains inside blocks; novelty and block-start novelty as the mean share of a
demand not in the layer's previous demand; prefill as mean prefill W over w. `fit` turns them into
SynthParams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from artifact.errors import TraceError
from artifact.model.config import PRESETS
from artifact.offload.replay.synth import DENOISE, PREFILL, SynthParams
from artifact.offload.replay.trace import Trace


def sequence_ids(trace: Trace) -> np.ndarray:
    """(N,) which generate call each demand belongs to: a call starts at the first forward, at a prefill
    after a denoising forward, and where the (block, step) of denoising forwards stops increasing."""
    f = trace.forward.astype(np.int64)
    first = np.flatnonzero(np.r_[True, f[1:] != f[:-1]])  # (F,) first row of each forward
    kind, block, step = trace.kind[first], trace.block[first].astype(np.int64), trace.block_step[first]
    start = np.ones(len(first), dtype=bool)
    if len(first) > 1:
        prev_dn, dn = kind[:-1] == DENOISE, kind[1:] == DENOISE
        back = (block[1:] < block[:-1]) | ((block[1:] == block[:-1]) & (step[1:] <= step[:-1]))
        start[1:] = (~dn & prev_dn) | (dn & prev_dn & back)
    seq = np.cumsum(start) - 1  # (F,)
    return seq[np.cumsum(np.r_[True, f[1:] != f[:-1]]) - 1]


def measure(trace: Trace) -> dict:
    """The generator's statistics measured on a trace, with notes on anything assumed."""
    notes = []
    meta, o = trace.meta, trace.offsets
    E, L = int(meta["num_experts"]), len(meta["moe_layers"])
    W = np.diff(o).astype(np.float64)  # (N,)
    dn = trace.kind == DENOISE
    if not dn.any():
        raise TraceError(f"{getattr(trace, 'path', None) or 'trace'}: no denoising demands, nothing to fit")
    top_k = _top_k(meta, notes)
    seq = sequence_ids(trace)
    pos = np.searchsorted(meta["moe_layers"], trace.layer.astype(np.int64))  # (N,) MoE layer position
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
    return {
        "layers": L,
        "experts": E,
        "top_k": top_k,
        "tokens": tokens,
        "blocks": max(1, round(blocks)),
        "steps": S,
        "sequences": int(seq.max() + 1),
        "batch_size": int(meta.get("batch_size") or max(1, round(prefills))),
        "w": w,
        "w_spread": prof.spread,
        "w_depth": depth,
        "w_growth": prof.growth,
        "w_first": prof.w_first,
        "w_persistence": nov.persistence,
        "novelty": nov.novelty,
        "block_novelty": nov.block_novelty,
        "prefill": prefill,
        "measured": {
            "w_cv_total": float(W[dn].std() / w),
            "denoise_demands": int(dn.sum()),
            "prefill_demands": int(pf.sum()),
            "novelty_pairs": int(nov.within.sum()),
            "block_start_pairs": int(nov.at_start.sum()),
            "steps_per_block_mean": float(np.mean(steps_per)),
            "blocks_per_sequence_mean": float(blocks),
            "notes": notes,
        },
    }


def _blocks_and_steps(
    trace: Trace, seq: np.ndarray, step: np.ndarray, dn: np.ndarray
) -> tuple[float, list, int]:
    """Blocks per sequence, the steps of each (sequence, block), and S: their mean, rounded (at least 1)."""
    blk = np.unique(np.stack([seq[dn], trace.block[dn]]), axis=1)  # (2, blocks)
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
    resid: np.ndarray  # (denoising demands,) W over its fitted profile, less 1
    rounding: np.ndarray  # (denoising demands,) the generator's rounding variance of each, relative
    later: np.ndarray  # (N,) denoising demands at block step >= 1
    first: np.ndarray  # (N,) denoising demands at block step 0


def _step_profile(
    W: np.ndarray, dn: np.ndarray, step: np.ndarray, S: int, m_of: np.ndarray, layers_fitted: int
) -> _Profile:
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
    fit_ratio = (alpha + beta * (y - 0.5)) * np.where(step == 0, w_first, 1.0)  # (N,)
    resid = ratio[dn] / fit_ratio[dn] - 1
    # The residuals lost one degree of freedom per fitted number (layer means, the step line, w_first).
    fitted = layers_fitted + (2 if beta else 1) + (1 if first.any() and later.any() else 0)
    dof = max(int(dn.sum()) - fitted, 1)
    # Stochastic rounding adds variance frac (1 - frac), 1/6 on average, to each W: not part of the spread.
    rounding = 1 / (6 * (m_of[dn] * fit_ratio[dn]) ** 2)
    var = float(np.sum(resid**2) / dof - np.mean(rounding))
    return _Profile(growth, w_first, math.sqrt(max(var, 0.0)), var, resid, rounding, later, first)


@dataclass(frozen=True)
class _Novelty:
    novelty: float
    block_novelty: float
    persistence: float
    within: np.ndarray  # (N,) denoising demands whose previous demand is the step before, in the block
    at_start: np.ndarray  # (N,) denoising demands at a block start with an earlier demand


def _novelty_stats(
    trace: Trace, seq: np.ndarray, step: np.ndarray, dn: np.ndarray, E: int, prof: _Profile, notes: list
) -> _Novelty:
    """Novelty: share of a demand not in its layer's previous demand of the same sequence, inside blocks and
    at block starts; persistence of the profile's residuals from step to step inside blocks."""
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
    # Persistence from the step-to-step differences of the residuals, E (e(s) - e(s-1))^2 = 2 sigma^2 (1 -
    # rho) plus both steps' rounding variance: differences are blind to the layer means the profile fitted (a
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
    same = np.r_[
        False, (trace.layer[order][1:] == trace.layer[order][:-1]) & (seq[order][1:] == seq[order][:-1])
    ]
    out = np.full(len(trace), -1, dtype=np.int64)
    out[order[same]] = order[np.flatnonzero(same) - 1]
    return out


def _new_share(trace: Trace, prev: np.ndarray, E: int) -> np.ndarray:
    """(N,) share of each demand's experts not in the demand `prev` points to (nan where prev is -1)."""
    lengths = np.diff(trace.offsets)
    demand = np.repeat(np.arange(len(trace)), lengths)  # (M,)
    experts = trace.experts.astype(np.int64)
    own = demand * E + experts  # (M,) sorted: experts ascend per demand
    ask = prev[demand] * E + experts  # the same expert in the previous demand
    at = np.clip(np.searchsorted(own, ask), 0, len(own) - 1)
    inside = (prev[demand] >= 0) & (own[at] == ask)
    shared = np.bincount(demand, weights=inside, minlength=len(trace))
    return np.where(prev >= 0, 1 - shared / np.maximum(lengths, 1), np.nan)
