"""Synthetic routing streams with chosen working-set statistics, written as routing traces (fit.py measures
those statistics on any trace, so a real LLaDA2 trace's statistics can be regenerated).

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
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from artifact.errors import SettingError
from artifact.offload.links.link import REFERENCE_EXPERT_BYTES
from artifact.offload.replay.trace import KINDS, Trace, demand_columns
from artifact.validate import check_number

PREFILL, DENOISE = KINDS.index("prefill"), KINDS.index("denoise")


@dataclass(frozen=True)
class SynthParams:
    layers: int = 19  # MoE layers (LLaDA2.0-mini: 20 layers, the first dense)
    experts: int = 256  # routed experts per layer, E
    top_k: int = 8
    tokens: int = 32  # tokens fed per denoising step (one 32-token block at batch size 1)
    blocks: int = 4  # blocks per sequence
    steps: int = 32  # denoising steps per block (the decoder's maximum)
    sequences: int = 1  # generate calls, each with its own prefill and blocks
    batch_size: int = 1  # prefill forwards per sequence (the decoder prefills row by row)
    w: float = 70.0  # mean W over denoising demands (the cpu traces' mean)
    w_spread: float = 0.05  # relative sd of W around its profile (the paper's 6.7x needs ~0.055)
    w_depth: float = 0.0  # relative change of W from the first to the last MoE layer
    w_growth: float = 0.0  # relative change of W from a block's first to its last step
    w_first: float = 1.0  # W multiple at a block's first step (the decoder also commits a block there)
    w_persistence: float = 0.0  # rho: step-to-step correlation of W's noise inside a block (0: independent)
    novelty: float = 0.12  # nu: share of D(t, l) not in D(t-1, l) inside a block (cpu traces: 0.14)
    block_novelty: float = 0.5  # the same at a block's first step (a new block's tokens route anew)
    prefill: float = 0.0  # prefill W as a multiple of w; 0: no prefill forwards
    seed: int = 0

    def __post_init__(self):
        c = check_number
        c("layers", self.layers, low=1, high=4096, integer=True)
        c("experts", self.experts, low=1, high=np.iinfo(np.int16).max, integer=True)  # traces store int16
        c("top_k", self.top_k, low=1, high=self.experts, integer=True)
        for name in ("tokens", "blocks", "steps", "sequences", "batch_size"):
            c(name, getattr(self, name), low=1, high=1 << 20, integer=True)
        c("seed", self.seed, low=0, integer=True)
        wmax = min(self.experts, self.tokens * self.top_k)
        c(
            f"w (mean W; at most E = {self.experts} and tokens * top_k = {self.tokens * self.top_k})",
            self.w,
            low=1,
            high=wmax,
        )
        c("w_spread (relative sd of W)", self.w_spread, low=0, high=1)
        c(
            "w_depth (relative change over depth; W must stay positive)",
            self.w_depth,
            low=-2,
            high=2,
            low_open=True,
            high_open=True,
        )
        c(
            "w_growth (relative change over a block; W must stay positive)",
            self.w_growth,
            low=-2,
            high=2,
            low_open=True,
            high_open=True,
        )
        c("w_first (W multiple at a block's first step)", self.w_first, low=0, high=16, low_open=True)
        c(
            "w_persistence (correlation of W from step to step)",
            self.w_persistence,
            low=-1,
            high=1,
            low_open=True,
            high_open=True,
        )
        c("novelty (share of D(t,l) not in D(t-1,l))", self.novelty, low=0, high=1)
        c("block_novelty (the same at a block's first step)", self.block_novelty, low=0, high=1)
        c("prefill (prefill W as a multiple of w; 0 = none)", self.prefill, low=0, high=self.experts)
        peak = self.w * _depth(self).max() * _step(self).max() / _step(self).mean()
        if peak > wmax:
            raise SettingError(
                f"the W profile peaks at {peak:.1f} experts, more than min(E, tokens * top_k) "
                f"= {wmax}: lower w, w_depth, w_growth or w_first"
            )
        nu = max(self.novelty, self.block_novelty)
        if peak * (1 + nu) > self.experts:
            raise SettingError(
                f"a step of {peak:.1f} experts with {nu:g} new ones needs "
                f"{peak * (1 + nu):.1f} > "
                f"E = {self.experts} distinct experts: lower w or the novelty"
            )
        if self.prefill and self.prefill * self.w * _depth(self).max() > self.experts:
            raise SettingError(
                f"prefill W = {self.prefill:g} x w = {self.prefill * self.w:.1f} (at most "
                f"{self.prefill * self.w * _depth(self).max():.1f} by depth) exceeds E = {self.experts}"
            )
        accesses = self.sequences * (
            self.blocks * self.steps * self.w + self.batch_size * self.prefill * self.w
        )
        if accesses * self.layers > 1e8:  # ~0.6 GB of arrays; recorded traces hold 1e5-1e7
            raise SettingError(
                f"the stream would hold ~{accesses * self.layers:.3g} expert accesses; at most 1e8"
            )

    def describe(self) -> str:
        return "\n".join(f"{f.name:>14} = {getattr(self, f.name):.4g}" for f in fields(self))


def _depth(p: SynthParams) -> np.ndarray:
    x = np.arange(p.layers) / max(p.layers - 1, 1)  # (L,) 0 .. 1
    return 1 + p.w_depth * (x - 0.5)


def _step(p: SynthParams) -> np.ndarray:
    y = np.arange(p.steps) / max(p.steps - 1, 1)  # (S,) 0 .. 1
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
    mu = p.w * _depth(p)[:, None] * _step(p)[None, :] / _step(p).mean()  # (L, S) mean W by layer and step
    wmax = min(E, p.tokens * p.top_k)
    prefill_tokens = p.tokens * max(1, math.ceil(p.prefill))
    rows, sets, counts = [], [], []
    forward = 0
    for _ in range(p.sequences):
        last: list[np.ndarray | None] = [None] * L  # each layer's previous demand
        schedule = [(-1, -1)] * (p.batch_size if p.prefill > 0 else 0)
        schedule += [(b, s) for b in range(p.blocks) for s in range(S)]
        z = np.zeros(L)
        for block, s in schedule:
            fresh = rng.standard_normal(L)  # (L,)
            z = fresh if s <= 0 else p.w_persistence * z + math.sqrt(1 - p.w_persistence**2) * fresh
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
    return np.concatenate(
        [rng.choice(prev, keep, replace=False), rng.choice(np.flatnonzero(outside), W - keep, replace=False)]
    )


def _trace(p: SynthParams, rows, sets, counts, expert_bytes: int) -> Trace:
    digest = hashlib.sha1(json.dumps(asdict(p), sort_keys=True).encode()).hexdigest()[:12]
    meta = {
        "model": "synthetic",
        "config_hash": f"synthetic-{digest}",
        "task": "synthetic",
        "prompt_ids": [f"synthetic/{n}" for n in range(p.sequences * p.batch_size)],
        "batch_size": p.batch_size,
        "moe_layers": list(range(1, p.layers + 1)),
        "num_experts": p.experts,
        "top_k": p.top_k,
        "expert_bytes": int(expert_bytes),
        "synth": asdict(p),
    }
    t = Trace(
        meta=meta,
        **demand_columns(rows, sets),
        experts=np.concatenate(sets).astype(np.int16),
        counts=np.concatenate(counts).astype(np.int32),
    )
    t.validate("synthetic stream")
    return t


# ---------------------------------------------------------------------------------------------
# Command line: python -m artifact synth ... / fit TRACE
# ---------------------------------------------------------------------------------------------
# What each SynthParams field means, in a few words (the synth command's help).
PARAM_HELP = {
    "layers": "MoE layers",
    "experts": "routed experts per layer (E)",
    "top_k": "experts per token",
    "tokens": "tokens per denoising step",
    "blocks": "blocks per sequence",
    "steps": "steps per block",
    "sequences": "generate calls",
    "batch_size": "prefill forwards per sequence (batch rows)",
    "w": "mean working set W",
    "w_spread": "relative sd of W",
    "w_depth": "relative change of W over depth",
    "w_growth": "relative change of W over a block",
    "w_first": "W multiple at a block's first step",
    "w_persistence": "step-to-step correlation of W's noise in a block",
    "novelty": "share of D(t,l) not in D(t-1,l)",
    "block_novelty": "the same at a block's first step",
    "prefill": "prefill W / w (0: no prefill)",
    "seed": "random seed",
}
