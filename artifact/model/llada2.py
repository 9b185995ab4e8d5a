"""LLaDA2-MoE forward, written from the reference facts in docs/DESIGN.md.

Legend: B batch, T tokens fed, S keys attended (cached prefix + fed), D hidden, H / Hk query / kv heads,
hd head dim, N routed tokens of a layer, k experts per token, E routed experts, I expert width.

Routed experts are not parameters of this module: they live in an ExpertBackend (all resident, or
offloaded behind a cache) that hands out the demanded experts in groups, each a set of rows of stacked
weight views (the resident packed tensor, or an offloaded layer's slot tensor). A group is computed in
one grouped call (torch._grouped_mm; expert_kernel "loop" keeps one call per expert). The combine is
the same whichever backend and kernel computed the experts, so offloading changes time, never results.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from artifact.model.config import ModelConfig


# ---------------------------------------------------------------------------------------------
# Events: one per (forward, MoE layer); the decoder sets the StepInfo, the router fills the rest.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepInfo:
    forward: int        # index of the forward in this run (the paper's denoising step t, prefill included)
    block: int          # block round of the decoder (-1 for prefill)
    block_step: int     # denoising step inside the block round (-1 for prefill)
    kind: str           # "prefill" | "denoise"


@dataclass(frozen=True)
class Demand:
    step: StepInfo
    layer: int                   # model layer index (first MoE layer is cfg.first_k_dense_replace)
    experts: tuple[int, ...]     # distinct routed experts the fed tokens selected, ascending
    counts: tuple[int, ...]      # tokens per expert, aligned with experts
    # Cross-layer prediction of the *next* MoE layer's demand at this step (experts ascending, counts):
    # that layer's router applied to this layer's routed hidden states. None unless the model was asked
    # for it (Routing.predict_next) or this is the last MoE layer.
    predicted: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    @property
    def working_set(self) -> int:
        return len(self.experts)


ExpertWeights = tuple[torch.Tensor, torch.Tensor]     # (gate_up (2I, D), down (D, I)): views of a packed expert
EXPERT_KERNELS = ("grouped", "loop")
# graphs "on": the forward runs as segments between the router syncs, each captured once and replayed as a
# CUDA graph on a CUDA device (on the CPU the same segments run eagerly); "off": the eager reference path.
GRAPH_MODES = ("off", "on")
# torch._grouped_mm exists from torch 2.8 (on CPU in 2.13); older torch computes a group with the loop kernel.
HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")


@dataclass(frozen=True)
class ExpertGroup:
    """Routed experts computed together: one grouped call over stacked weight views.

    Shape legend: G rows of the weight stacks (C slots of an offloaded layer, or E experts when resident),
    I expert width, D hidden."""
    experts: tuple[int, ...]     # routed experts of the group, listed in ascending `rows`
    rows: tuple[int, ...]        # each one's row in the stacks: its slot (offloaded) or its id (resident)
    gate_up: torch.Tensor        # (G, 2I, D) view: gate and up of every row
    down: torch.Tensor           # (G, D, I) view


class ExpertBackend(Protocol):
    def groups(self, demand: Demand) -> Iterator[ExpertGroup]:
        """Yield groups that together hold every demanded expert exactly once, in any order.
        The caller computes a group before asking for the next (so a slot it read may then be reused)."""
        ...


def pack_expert(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert as one contiguous vector [gate (I,D) | up (I,D) | down (D,I)], so a transfer is one copy."""
    return torch.cat([gate.reshape(-1), up.reshape(-1), down.reshape(-1)])


def expert_views(flat: torch.Tensor, cfg: ModelConfig) -> ExpertWeights:
    """The matrices of a packed expert, as views (made once per expert or slot, not per call)."""
    I, D = cfg.moe_intermediate_size, cfg.hidden_size
    return flat[:2 * I * D].view(2 * I, D), flat[2 * I * D:].view(D, I)


def stack_views(packed: torch.Tensor, cfg: ModelConfig) -> ExpertWeights:
    """Views of G packed experts (G, 3*I*D) as stacks: gate_up (G, 2I, D) and down (G, D, I); no copy."""
    I, D = cfg.moe_intermediate_size, cfg.hidden_size
    G = packed.shape[0]
    return packed[:, :2 * I * D].view(G, 2 * I, D), packed[:, 2 * I * D:].view(G, D, I)


def expert_ffn(x: torch.Tensor, w: ExpertWeights) -> torch.Tensor:
    gate_up, down = w
    I = down.shape[1]
    h = F.linear(x, gate_up)                                            # (n, 2I): gate and up in one matmul
    return F.linear(F.silu(h[:, :I]) * h[:, I:], down)                  # (n, D)


def grouped_ffn(xs: torch.Tensor, group: ExpertGroup, spans: list[tuple[int, int, int]], offsets: list[int],
                kernel: str) -> torch.Tensor:
    """The experts of a group on their tokens. xs (n, D) holds each member's token rows in the group's row
    order; spans[j] = (row, start, end) of member j in xs; offsets (G,) are the cumulative row counts of
    every stack row (empty rows included), as torch._grouped_mm wants them. -> (n, D).
    Both kernels compute each expert with the same matmuls on the same rows: on CPU their outputs are
    equal bit for bit (tested), so the kernel changes time, never results."""
    if kernel == "grouped" and HAS_GROUPED_MM and _grouped_mm_ok(xs):
        gate_up, down = group.gate_up, group.down
        hi = group.rows[-1] + 1                     # rows past the last member hold no tokens: not passed
        if hi < gate_up.shape[0]:
            gate_up, down = gate_up[:hi], down[:hi]
        offs = small_tensor(offsets[:hi], torch.int32, xs.device)                  # (hi,)
        I = down.shape[2]
        h = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs)                   # (n, 2I)
        return torch._grouped_mm(F.silu(h[:, :I]) * h[:, I:], down.transpose(1, 2), offs)   # (n, D)
    ys = torch.empty_like(xs)                                          # (n, D)
    for row, a, b in spans:
        ys[a:b] = expert_ffn(xs[a:b], (group.gate_up[row], group.down[row]))
    return ys


def small_tensor(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list on the device without syncing the host: a blocking H2D copy would wait for every
    queued kernel, so on CUDA the list goes through pinned memory and copies non_blocking (the caching
    host allocator keeps the pinned block until the copy is done)."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def _grouped_mm_ok(xs: torch.Tensor) -> bool:
    # CPU runs any float dtype; CUDA's grouped GEMM needs bf16 on compute capability >= 9.0 (H100/H200).
    if xs.device.type == "cpu":
        return True
    return xs.device.type == "cuda" and xs.dtype == torch.bfloat16 and _capability(xs.device.index) >= (9, 0)


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    """A device's compute capability, queried once per device (it was once per group)."""
    return torch.cuda.get_device_capability(index)


class HostCounts:
    """The router's per-expert token counts on the host, in one device-to-host copy per MoE layer.

    counts (E,) is a fixed-size device tensor (scatter_add_ of ones: no bincount, which on CUDA syncs to
    size its output from the data). On CUDA it is copied non_blocking into a pinned buffer that is reused,
    and the host waits once, on an event recorded after the copy; the expert ids are read off the counts
    on the host. On the CPU, `tolist` of the counts is the one read."""

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}       # (device, E) -> pinned (E,) int64
        self.events: dict[object, object] = {}
        self.wait_seconds = 0.0       # host time blocked in the layer syncs (CUDA), so a timer can take it out

    def read(self, counts: torch.Tensor) -> list[int]:
        if counts.device.type != "cuda":
            return counts.tolist()
        key = (counts.device, counts.shape[0])
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = torch.empty(counts.shape[0], dtype=torch.int64, pin_memory=True)
        ev = self.events.get(counts.device)
        if ev is None:
            ev = self.events[counts.device] = torch.cuda.Event()
        buf.copy_(counts, non_blocking=True)               # one D2H transfer, queued behind the router
        ev.record(torch.cuda.current_stream(counts.device))
        t0 = time.perf_counter()
        ev.synchronize()                                   # the one host sync of the layer
        self.wait_seconds += time.perf_counter() - t0
        return buf.tolist()                                # host memory: no further sync

    def wait(self, buf: torch.Tensor) -> list[int]:
        """A pinned buffer that a captured copy (graphs "on") fills on the current stream: one event, one sync."""
        ev = self.events.get(buf.device)
        if ev is None:
            ev = self.events[buf.device] = torch.cuda.Event()
        ev.record()
        t0 = time.perf_counter()
        ev.synchronize()
        self.wait_seconds += time.perf_counter() - t0
        return buf.tolist()


class ResidentExperts:
    """Default backend: every routed expert of every MoE layer lives on the compute device, one group."""

    def __init__(self, packed: torch.Tensor, cfg: ModelConfig):
        assert packed.shape == (len(cfg.moe_layers), cfg.num_experts, cfg.expert_params), packed.shape
        self.packed = packed                                            # (L_moe, E, 3*I*D)
        self.stacks = {layer: stack_views(packed[i], cfg) for i, layer in enumerate(cfg.moe_layers)}

    def groups(self, demand: Demand):
        yield ExpertGroup(demand.experts, demand.experts, *self.stacks[demand.layer])


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(pos: torch.Tensor, cfg: ModelConfig, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for positions pos (B, T) -> cos, sin (B, 1, T, rope_dim), computed in float32."""
    r = cfg.rope_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, r, 2, device=pos.device, dtype=torch.float32) / r))
    freqs = pos.float()[..., None] * inv                                # (B, T, r/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]                    # (B, 1, T, r): rotate-half layout
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]                                  # only the first r dims rotate
    x1, x2 = rot[..., : r // 2], rot[..., r // 2:]
    rot = rot * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([rot, rest], dim=-1)


class KVCache:
    """Prefix KV cache at a fixed capacity: per layer (B, Hk, capacity, hd); row b holds positions [0, lengths[b]).

    Static shapes: attention always reads the whole capacity and masks the keys past each row's length, so
    a forward's shapes do not change as the prefix grows (a captured CUDA graph stays valid). The lengths
    live twice: `lengths` on the host (the decoder's bookkeeping, never read back from the device) and
    `lens` (B,) on the device, which the mask and the commit read, so no forward copies a host list to the
    device. A commit writes each row's new keys at its own length with one indexed write (no per-row slice
    taken from a host integer) and advances `lens` in place."""

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, device, dtype):
        shape = (batch, cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.lengths = [0] * batch
        self.lens = torch.zeros(batch, dtype=torch.long, device=device)       # (B,) device copy of lengths
        self.capacity = capacity

    @property
    def max_length(self) -> int:
        return max(self.lengths, default=0)

    def key_valid(self) -> torch.Tensor:
        """(B, capacity) bool: which cached positions hold a key (device-side, no host data)."""
        return torch.arange(self.capacity, device=self.lens.device)[None] < self.lens[:, None]

    def check_commit(self, n: int) -> None:
        """Host-side check before a forward commits n keys per row (the host knows every length)."""
        for b, start in enumerate(self.lengths):
            if start + n > self.capacity:
                raise ValueError(f"KV cache overflow: row {b} needs {start + n} > capacity {self.capacity}")

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Commit k, v (B, Hk, n, hd) after each row's prefix, at the device lengths (advance moves them)."""
        B, n = k.shape[0], k.shape[2]
        at = self.lens[:, None] + torch.arange(n, device=k.device)                  # (B, n) positions
        rows = torch.arange(B, device=k.device)[:, None]                            # (B, 1)
        self.k[layer][rows, :, at] = k.transpose(1, 2)                              # (B, n, Hk, hd)
        self.v[layer][rows, :, at] = v.transpose(1, 2)

    def advance(self, n: int):
        self.lengths = [x + n for x in self.lengths]
        self.lens.add_(n)

    @classmethod
    def pooled(cls, pool: dict, layers: int, shape: tuple[int, int, int, int], device, dtype) -> "KVCache":
        """An empty cache of `layers` layers of `shape` (B, Hk, capacity, hd) whose tensors come from `pool` (a
        dict the caller keeps), allocated on first use and reused by later calls of the same shape: the same
        tensors run after run, so captured graphs that read them stay valid (segments.program_key). Stale keys
        past each length are masked, never read."""
        key = (layers, tuple(shape), torch.device(device), dtype)
        base = pool.get(key)
        if base is None:
            base = pool[key] = object.__new__(cls)
            base.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
            base.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
            base.lens = torch.zeros(shape[0], dtype=torch.long, device=device)
        out = object.__new__(cls)
        out.k, out.v, out.capacity = base.k, base.v, shape[2]
        out.lens = base.lens.zero_()
        out.lengths = [0] * shape[0]
        return out

    def row(self, b: int) -> "KVCache":
        """Row b as a cache of batch 1 over the same memory (a commit into it writes through, its device
        length too). Its host length is its own: the caller copies it back after writing."""
        out = object.__new__(KVCache)
        out.k = [t[b:b + 1] for t in self.k]
        out.v = [t[b:b + 1] for t in self.v]
        out.lens = self.lens[b:b + 1]
        out.lengths = [self.lengths[b]]
        out.capacity = self.capacity
        return out

    def select(self, rows: list[int], pool: dict | None = None) -> "KVCache":
        """The cache of `rows` (in that order): new tensors, or pooled ones when a pool is given."""
        idx = small_tensor(rows, torch.long, self.k[0].device)
        if pool is None:
            out = object.__new__(KVCache)
            out.k = [t.index_select(0, idx) for t in self.k]
            out.v = [t.index_select(0, idx) for t in self.v]
            out.lens = self.lens.index_select(0, idx)
            out.capacity = self.capacity
        else:
            shape = (len(rows),) + tuple(self.k[0].shape[1:])
            out = KVCache.pooled(pool, len(self.k), shape, self.k[0].device, self.k[0].dtype)
            assert out.k[0].data_ptr() != self.k[0].data_ptr(), "select into the cache's own tensors"
            for src, dst in zip(self.k + self.v, out.k + out.v):
                torch.index_select(src, 0, idx, out=dst)
            torch.index_select(self.lens, 0, idx, out=out.lens)
        out.lengths = [self.lengths[r] for r in rows]
        return out


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        H, Hk, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, (H + 2 * Hk) * hd, bias=cfg.use_qkv_bias)
        self.query_layernorm = RMSNorm(hd, cfg.rms_norm_eps)
        self.key_layernorm = RMSNorm(hd, cfg.rms_norm_eps)
        self.dense = nn.Linear(H * hd, cfg.hidden_size, bias=cfg.use_bias)

    def forward(self, x, cos, sin, mask, cache: KVCache | None, commit: int):
        B, T, _ = x.shape
        H, Hk, hd = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        qkv = self.query_key_value(x).view(B, T, H + 2 * Hk, hd)
        q, k, v = qkv.split([H, Hk, Hk], dim=2)
        q = self.query_layernorm(q.transpose(1, 2))                     # (B, H, T, hd)
        k = self.key_layernorm(k.transpose(1, 2))                       # (B, Hk, T, hd)
        v = v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, vals = k, v
        if cache is not None:                                           # the whole capacity, masked: S = cap + T
            keys = torch.cat([cache.k[self.layer], k], dim=2)           # (B, Hk, S, hd)
            vals = torch.cat([cache.v[self.layer], v], dim=2)
            if commit:
                cache.write(self.layer, k[:, :, :commit], v[:, :, :commit])
        rep = H // Hk
        keys = keys.repeat_interleave(rep, dim=1)                       # (B, H, S, hd)
        vals = vals.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)  # (B, H, T, hd), scale 1/sqrt(hd)
        return self.dense(out.transpose(1, 2).reshape(B, T, H * hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, width: int):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Group-limited sigmoid router: sigmoid scores in fp32; selection adds expert_bias; groups scored by
    the sum of their top-2; keep topk_group groups; top-k experts; weights are the unbiased scores of
    the chosen k, renormalised, times routed_scaling_factor."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts, dtype=torch.float32))
        self._fp32 = None                  # (key, weight in fp32): cast once, not on every call

    def weight_fp32(self) -> torch.Tensor:
        """The router weight in fp32, cast once and kept while the weight is unchanged (same storage,
        device and version: a load_state_dict or .to() makes a new cast). fp32 weights are used as they are."""
        w = self.weight
        if w.dtype == torch.float32:
            return w
        key = (w.data_ptr(), w.device, w._version)
        if self._fp32 is None or self._fp32[0] != key:
            self._fp32 = (key, w.detach().float())
        return self._fp32[1]

    def forward(self, x):                                               # x (N, D)
        c = self.cfg
        N = x.shape[0]
        scores = torch.sigmoid(F.linear(x.float(), self.weight_fp32()))   # (N, E) fp32
        biased = scores + self.expert_bias
        group = biased.view(N, c.n_group, -1).topk(2, dim=-1).values.sum(-1)          # (N, n_group)
        keep = torch.zeros_like(group).scatter_(1, group.topk(c.topk_group, dim=-1).indices, 1.0)
        allowed = keep.bool().repeat_interleave(c.num_experts // c.n_group, dim=1)     # (N, E)
        idx = biased.masked_fill(~allowed, float("-inf")).topk(c.num_experts_per_tok, dim=-1).indices  # (N, k)
        w = scores.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor
        return idx, w                                                   # (N, k) long, (N, k) fp32


def expert_counts(idx: torch.Tensor, num_experts: int, pair_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens per expert of router choices idx (N, k), as a fixed-size (E,) device tensor: a scatter_add_ of
    ones, not bincount, whose output is sized by the data (a host sync on CUDA). pair_valid (N*k,) bool, if
    given, counts only the pairs of tokens that route (the static-shape path routes every fed token)."""
    flat = idx.reshape(-1)
    ones = torch.ones_like(flat) if pair_valid is None else pair_valid.long()
    return torch.zeros(num_experts, dtype=torch.long, device=idx.device).scatter_add_(0, flat, ones)


def nonzero_counts(counts: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(experts ascending, their counts) from host counts per expert."""
    experts = tuple(e for e, n in enumerate(counts) if n)
    return experts, tuple(counts[e] for e in experts)


def predict_counts(next_router: Router, x: torch.Tensor, pair_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-layer prediction (the predictor of Pre-gated MoE, ProMoE, HOBBIT): the next MoE layer's
    router applied to this layer's MoE input x (N, D), the post-attention-norm hidden states of the
    tokens that route here. The input, not this layer's output: the prediction must exist when this
    layer's demand is served, before its experts compute, so the link can move the next layer's experts
    meanwhile. Returns the predicted tokens per expert (E,) on the device; MoE.routed reads it to the host
    in the same copy as the layer's own counts. Pure: the model's outputs do not change."""
    idx, _ = next_router(x)                                             # (N, k)
    return expert_counts(idx, next_router.cfg.num_experts, pair_valid)


def predict_demand(next_router: Router, x: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """predict_counts as (experts ascending, token counts) on the host (a host read of its own)."""
    return nonzero_counts(predict_counts(next_router, x).tolist())


class Routing:
    """What the MoE layers share: the expert backend, the current step, and who listens to demands."""

    def __init__(self, backend: ExpertBackend | None = None):
        self.backend = backend
        self.step = StepInfo(0, -1, -1, "denoise")
        self.listeners: list[Callable[[Demand], None]] = []
        # Cross-layer prediction: when predict_next is set, each MoE layer's Demand carries the next MoE
        # layer's predicted demand (predict_demand). next_router maps a MoE layer to the next one's router;
        # kept here, not on the modules, so the routers are not registered twice in the state dict.
        self.predict_next = False
        self.next_router: dict[int, Router] = {}
        self.expert_kernel = "grouped"      # "loop": one call per expert, kept to compare the two in one run
        self.host_counts = HostCounts()     # the router's counts to the host: the one sync per MoE layer
        self.graphs = "off"                 # GRAPH_MODES: "on" runs the forward as captured segments (CUDA)
        self.kv_pool: dict = {}             # KVCache.pooled: the decoder's caches, reused run after run


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, routing: Routing):
        super().__init__()
        self.cfg, self.layer, self.routing = cfg, layer, routing
        self.gate = Router(cfg)
        self.shared_experts = MLP(cfg, cfg.moe_intermediate_size * cfg.num_shared_experts) \
            if cfg.num_shared_experts else None

    def forward(self, x, rows):            # x (B, T, D); rows (B, T) bool, or (N,) long flat indices, or None
        B, T, D = x.shape
        flat = x.reshape(B * T, D)
        sel = rows if rows is None or rows.dtype == torch.long else routed_indices(rows)
        xs = flat if sel is None else flat.index_select(0, sel)         # (N, D) tokens that route
        routed = self.routed(xs)
        if sel is None:
            y = routed.view(B, T, D)
        else:
            y = torch.zeros_like(flat).index_copy_(0, sel, routed).view(B, T, D)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y

    def routed(self, x):                                                # x (N, D) -> (N, D)
        # Legend: N routed tokens, k experts per token, P = N*k (token, slot) pairs, E experts, D hidden;
        # per group: n pairs, G rows of its weight stacks.
        N, D = x.shape
        k, E = self.cfg.num_experts_per_tok, self.cfg.num_experts
        if N == 0:
            return x.new_zeros(0, D)
        idx, w = self.gate(x)                                           # (N, k) long, (N, k) fp32
        flat_idx = idx.view(-1)                                         # (P,) expert of each (token, slot)
        counts = expert_counts(idx, E)                                  # (E,) fixed size: no data-sized output
        nxt = self.routing.next_router.get(self.layer) if self.routing.predict_next else None
        if nxt is None:
            per_expert = self.routing.host_counts.read(counts)         # the one host sync per layer
            predicted = None
        else:                                                           # the prediction rides in the same copy
            both = self.routing.host_counts.read(torch.cat([counts, predict_counts(nxt, x)]))
            per_expert, predicted = both[:E], nonzero_counts(both[E:])
        experts, demanded = nonzero_counts(per_expert)
        demand = Demand(self.routing.step, self.layer, experts, demanded, predicted)
        for listener in self.routing.listeners:
            listener(demand)
        by_expert = None                                                # (P,) pairs sorted by expert, made once
        ys = torch.empty(N * k, D, dtype=x.dtype, device=x.device)     # (P, D) output of each pair
        served: set[int] = set()
        computed = 0                                                    # an expert served twice counts twice
        for group in self.routing.backend.groups(demand):
            G = group.gate_up.shape[0]
            counts = [0] * G
            spans, start = [], 0
            for e, r in zip(group.experts, group.rows):
                n = per_expert[e]
                counts[r] = n
                spans.append((r, start, start + n))
                start += n
            if group.experts == group.rows == experts:                  # resident: rows are the experts
                if by_expert is None:
                    by_expert = torch.argsort(flat_idx, stable=True)
                sel = by_expert                                         # (n,) = (P,)
            else:                                                       # pairs of the members, in row order
                key = [G] * E
                for e, r in zip(group.experts, group.rows):
                    key[e] = r
                key = small_tensor(key, torch.long, x.device)[flat_idx]   # (P,) row of each pair, G if absent
                sel = torch.argsort(key, stable=True)[:start]           # (n,)
            xs = x.index_select(0, sel // k)                            # (n, D) token row of each pair
            ys.index_copy_(0, sel, grouped_ffn(xs, group, spans, list(accumulate(counts)),
                                               self.routing.expert_kernel))
            served.update(group.experts)
            computed += len(group.experts)
        assert computed == len(experts) and served == set(experts), \
            f"layer {self.layer}: the backend served {computed} experts ({len(served)} distinct) of {len(experts)}"
        # Combine the k outputs of each token in slot order, whatever order experts were computed in.
        return (ys.view(N, k, D).float() * w.unsqueeze(-1)).sum(1).to(x.dtype)


    # --- the static-shape pieces (graphs "on", artifact/model/segments.py) ----------------------------------
    # Every fed token goes through the router (no data-sized selection); pair_valid (P,) marks the (token, slot)
    # pairs of tokens that route. Shapes depend only on B and T, so each piece can be captured once.
    def start(self, h: torch.Tensor, pair_valid: torch.Tensor):
        """h (B, T, D) -> flat (N, D), idx (N, k), w (N, k) fp32, counts (E,) or (2E,) with the next layer's
        predicted counts after this layer's, shared (B, T, D) or None. No host read."""
        B, T, D = h.shape
        flat = h.reshape(B * T, D)
        idx, w = self.gate(flat)
        counts = expert_counts(idx, self.cfg.num_experts, pair_valid)
        nxt = self.routing.next_router.get(self.layer) if self.routing.predict_next else None
        if nxt is not None:
            counts = torch.cat([counts, predict_counts(nxt, flat, pair_valid)])
        shared = self.shared_experts(h) if self.shared_experts is not None else None
        return flat, idx, w, counts, shared

    def stage(self, flat: torch.Tensor, idx: torch.Tensor, pair_valid: torch.Tensor, rowmap: torch.Tensor,
              gate_up: torch.Tensor, down: torch.Tensor, ys: torch.Tensor) -> None:
        """One expert group from a device-side plan: rowmap (E,) long holds each routed expert's row in the
        stacks gate_up (G, 2I, D) / down (G, D, I), or G when the group does not hold it. Writes the outputs of
        the group's pairs into ys (P, D) in place; other rows of ys are kept. Offsets are computed on the
        device, every shape is static: the grouped GEMM runs over all P pairs sorted by row, and the rows past
        the group's last member (garbage) are masked off by a where, never read."""
        G = gate_up.shape[0]
        k = self.cfg.num_experts_per_tok
        row = torch.where(pair_valid, rowmap[idx.view(-1)], G)                     # (P,) row of each pair
        order = torch.argsort(row, stable=True)                                    # (P,) pairs by row
        sizes = torch.zeros(G + 1, dtype=torch.long, device=ys.device).scatter_add_(0, row, torch.ones_like(row))
        offs = sizes[:G].cumsum(0).to(torch.int32)                                 # (G,)
        xs = flat.index_select(0, order // k)                                      # (P, D)
        I = down.shape[2]
        h = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs)                   # (P, 2I)
        out = torch._grouped_mm(F.silu(h[:, :I]) * h[:, I:], down.transpose(1, 2), offs)   # (P, D)
        member = (row.index_select(0, order) < G)[:, None]                         # (P, 1)
        ys.index_copy_(0, order, torch.where(member, out, ys.index_select(0, order)))

    def finish(self, x_res: torch.Tensor, ys: torch.Tensor, w: torch.Tensor, shared: torch.Tensor | None):
        """The layer's output: x_res (B, T, D) + combine of ys (P, D) in slot order + the shared expert."""
        B, T, D = x_res.shape
        k = self.cfg.num_experts_per_tok
        y = (ys.view(B * T, k, D).float() * w.unsqueeze(-1)).sum(1).to(x_res.dtype).view(B, T, D)
        if shared is not None:
            y = y + shared
        return x_res + y


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, routing: Routing):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.is_moe = layer >= cfg.first_k_dense_replace
        self.mlp = MoE(cfg, layer, routing) if self.is_moe else MLP(cfg, cfg.intermediate_size)

    def forward(self, x, cos, sin, mask, cache, commit, rows):
        x, h = self.attend(x, cos, sin, mask, cache, commit)
        return x + (self.mlp(h, rows) if self.is_moe else self.mlp(h))

    def attend(self, x, cos, sin, mask, cache, commit):
        """The attention half: -> (x after the attention residual, its post-attention norm)."""
        x = x + self.attention(self.input_layernorm(x), cos, sin, mask, cache, commit)
        return x, self.post_attention_layernorm(x)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, routing: Routing):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, routing) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        moe = cfg.moe_layers
        # For predict_demand: each MoE layer -> the next MoE layer's router.
        routing.next_router = {a: self.layers[b].mlp.gate for a, b in zip(moe, moe[1:], strict=False)}


def routed_indices(rows: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (N,) flat indices of the tokens that route. Data-sized (a host sync on CUDA), so the
    model computes it once per forward, not once per MoE layer."""
    return rows.reshape(-1).nonzero().squeeze(1)


def block_causal_mask(q_pos, k_pos, k_valid, block: int) -> torch.Tensor:
    """(B, 1, T, S) bool: query i sees key j iff j's block is not after i's block and j is a real key."""
    allowed = (k_pos[:, None, :] // block) <= (q_pos[:, :, None] // block)         # (B, T, S)
    return (allowed & k_valid[:, None, :])[:, None]


def routing_choice(name: str, choices: tuple[str, ...], what: str) -> property:
    """A model attribute kept on its Routing, refused (one line, naming the choices) unless one of `choices`."""
    def get(self) -> str:
        return getattr(self.routing, name)

    def put(self, value: str) -> None:
        if value not in choices:
            raise ValueError(f"unknown {what} {value!r}; choose one of {choices}")
        setattr(self.routing, name, value)
    return property(get, put)


class LLaDA2MoE(nn.Module):
    """The whole model. Parameter names follow the released checkpoints (model.*, lm_head)."""

    def __init__(self, cfg: ModelConfig, backend: ExpertBackend | None = None):
        super().__init__()
        self.cfg = cfg
        self.routing = Routing(backend)
        self.model = Backbone(cfg, self.routing)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def backend(self) -> ExpertBackend | None:
        return self.routing.backend

    @backend.setter
    def backend(self, value: ExpertBackend | None):
        self.routing.backend = value

    expert_kernel = routing_choice("expert_kernel", EXPERT_KERNELS, "expert_kernel")   # grouped | loop
    graphs = routing_choice("graphs", GRAPH_MODES, "graphs mode")                      # off | on

    @contextlib.contextmanager
    def listening(self, fn: Callable[[Demand], None]):
        """Call fn(demand) for every (forward, MoE layer) demand while the block runs."""
        self.routing.listeners.append(fn)
        try:
            yield fn
        finally:
            self.routing.listeners.remove(fn)

    @torch.no_grad()
    def forward(self, ids, pos, *, cache: KVCache | None = None, commit: int = 0, key_valid=None,
                rows=None, logits_rows: slice | torch.Tensor | None = None):
        """ids, pos (B, T). With a cache, keys are its prefix plus the fed tokens, and the first `commit`
        fed tokens are appended to it. key_valid (B, T) marks real fed tokens (right padding);
        rows (B, T) marks tokens whose routed experts are computed (None: all).
        logits_rows picks which fed positions get logits: a slice, or (B, n) gather indices.
        With graphs "on", a denoising forward over a cache runs as segments (artifact/model/segments.py),
        captured as CUDA graphs on a CUDA device; every other forward takes this eager path."""
        if self.backend is None:
            raise RuntimeError("model has no expert backend: load it with checkpoint.load_model")
        if cache is not None and commit:
            cache.check_commit(commit)
        if self.routing.graphs == "on" and segmented(self, cache, logits_rows, rows):
            from artifact.model.segments import run_segments
            return run_segments(self, ids, pos, cache=cache, commit=commit, key_valid=key_valid, rows=rows,
                                logits_rows=logits_rows)
        x, cos, sin, mask = self.prologue(ids, pos, cache, key_valid)
        if rows is not None and rows.dtype == torch.bool:
            rows = routed_indices(rows)                                 # once per forward, for every MoE layer
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache, commit, rows)
        if cache is not None and commit:
            cache.advance(commit)
        return self.head(x, logits_rows)

    def prologue(self, ids, pos, cache: KVCache | None, key_valid):
        """Embeddings, rotary tables and the block-causal mask over the cache's capacity plus the fed keys:
        -> x (B, T, D), cos, sin (B, 1, T, r), mask (B, 1, T, S). No host data reaches the device."""
        B, T = ids.shape
        x = self.model.word_embeddings(ids)                             # (B, T, D)
        cos, sin = rope_cos_sin(pos, self.cfg, x.dtype)
        if key_valid is None:
            key_valid = torch.ones(B, T, dtype=torch.bool, device=ids.device)
        k_pos, k_valid = pos, key_valid
        if cache is not None:
            prefix = torch.arange(cache.capacity, device=ids.device).expand(B, cache.capacity)
            k_pos = torch.cat([prefix, pos], 1)                         # cached keys sit at positions [0, len)
            k_valid = torch.cat([cache.key_valid(), key_valid], 1)      # (B, cap + T): no host list copied
        return x, cos, sin, block_causal_mask(pos, k_pos, k_valid, self.cfg.block_length)

    def head(self, x, logits_rows):
        """Final norm and lm_head on the picked positions -> (B, n, V) float32 logits."""
        if logits_rows is not None:
            if isinstance(logits_rows, slice):
                x = x[:, logits_rows]
            else:
                x = x.gather(1, logits_rows[..., None].expand(-1, -1, x.shape[-1]))
        return self.lm_head(self.model.norm(x)).float()                 # (B, n, V)


def segmented(model: LLaDA2MoE, cache: KVCache | None, logits_rows, rows) -> bool:
    """Whether graphs "on" runs this forward as segments: a denoising forward over a prefix cache with a slice
    of logits (the shapes the decoder repeats every step). Prefill and the full (uncached) mode stay eager."""
    return (cache is not None and model.routing.step.kind == "denoise"
            and (logits_rows is None or isinstance(logits_rows, slice))
            and (rows is None or rows.dtype == torch.bool))
