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
import dataclasses
from itertools import accumulate
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from artifact.model.config import ModelConfig
from artifact.model.experts import (
    ExpertBackend,
    SlotPool,
    grouped_ffn,
    small_tensor,
)
from artifact.model.kv_cache import KVCache, KVPool
from artifact.model.options import EAGER, ForwardOptions
from artifact.model.routing import (
    FIRST_STEP,
    Demand,
    Router,
    Routing,
    StepInfo,
    expert_counts,
    nonzero_counts,
    predict_counts,
)
from artifact.model.segments import Programs, run_segments


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
    freqs = pos.float()[..., None] * inv  # (B, T, r/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, r): rotate-half layout
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]  # only the first r dims rotate
    x1, x2 = rot[..., : r // 2], rot[..., r // 2 :]
    rot = rot * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([rot, rest], dim=-1)


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
        q = self.query_layernorm(q.transpose(1, 2))  # (B, H, T, hd)
        k = self.key_layernorm(k.transpose(1, 2))  # (B, Hk, T, hd)
        v = v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, vals = k, v
        if cache is not None:  # every position, masked: S = positions + T
            keys = torch.cat([cache.k[self.layer], k], dim=2)  # (B, Hk, S, hd)
            vals = torch.cat([cache.v[self.layer], v], dim=2)
            if commit:
                cache.write(self.layer, k[:, :, :commit], v[:, :, :commit])
        rep = H // Hk
        keys = keys.repeat_interleave(rep, dim=1)  # (B, H, S, hd)
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


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, routing: Routing):
        super().__init__()
        self.cfg, self.layer, self.routing = cfg, layer, routing
        self.gate = Router(cfg)
        self.shared_experts = (
            MLP(cfg, cfg.moe_intermediate_size * cfg.num_shared_experts) if cfg.num_shared_experts else None
        )

    def forward(self, x, rows, opts: ForwardOptions, step: StepInfo):
        # x (B, T, D); rows (B, T) bool, or (N,) long flat indices, or None; opts with its backend set; the
        # forward's step (each Demand carries it)
        B, T, D = x.shape
        flat = x.reshape(B * T, D)
        sel = rows if rows is None or rows.dtype == torch.long else routed_indices(rows)
        xs = flat if sel is None else flat.index_select(0, sel)  # (N, D) tokens that route
        routed = self.routed(xs, opts, step)
        if sel is None:
            y = routed.view(B, T, D)
        else:
            y = torch.zeros_like(flat).index_copy_(0, sel, routed).view(B, T, D)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y

    def routed(self, x, opts: ForwardOptions, step: StepInfo):  # x (N, D) -> (N, D)
        # Legend: N routed tokens, k experts per token, P = N*k (token, slot) pairs, E experts, D hidden;
        # per group: n pairs, G rows of its weight stacks.
        N, D = x.shape
        k, E = self.cfg.num_experts_per_tok, self.cfg.num_experts
        if N == 0:
            return x.new_zeros(0, D)
        idx, w = self.gate(x)  # (N, k) long, (N, k) fp32
        flat_idx = idx.view(-1)  # (P,) expert of each (token, slot)
        counts = expert_counts(idx, E)  # (E,) fixed size: no data-sized output
        nxt = self.routing.next_router.get(self.layer) if opts.predict_next else None
        if nxt is None:
            per_expert = self.routing.host_counts.read(counts)  # the one host sync per layer
            predicted = None
        else:  # the prediction rides in the same copy
            both = self.routing.host_counts.read(torch.cat([counts, predict_counts(nxt, x)]))
            per_expert, predicted = both[:E], nonzero_counts(both[E:])
        experts, demanded = nonzero_counts(per_expert)
        demand = Demand(step, self.layer, experts, demanded, predicted)
        for listener in self.routing.listeners:
            listener(demand)
        by_expert = None  # (P,) pairs sorted by expert, made once
        ys = torch.empty(N * k, D, dtype=x.dtype, device=x.device)  # (P, D) output of each pair
        served: set[int] = set()
        computed = 0  # an expert served twice counts twice
        for group in opts.backend.groups(demand):
            G = group.gate_up.shape[0]
            counts = [0] * G
            spans, start = [], 0
            for e, r in zip(group.experts, group.rows):
                n = per_expert[e]
                counts[r] = n
                spans.append((r, start, start + n))
                start += n
            if group.experts == group.rows == experts:  # resident: rows are the experts
                if by_expert is None:
                    by_expert = torch.argsort(flat_idx, stable=True)
                sel = by_expert  # (n,) = (P,)
            else:  # pairs of the members, in row order
                key = [G] * E
                for e, r in zip(group.experts, group.rows):
                    key[e] = r
                key = small_tensor(key, torch.long, x.device)[flat_idx]  # (P,) row of each pair, G if absent
                sel = torch.argsort(key, stable=True)[:start]  # (n,)
            xs = x.index_select(0, sel // k)  # (n, D) token row of each pair
            ys.index_copy_(
                0, sel, grouped_ffn(xs, group, spans, list(accumulate(counts)), opts.expert_kernel)
            )
            served.update(group.experts)
            computed += len(group.experts)
        assert computed == len(experts) and served == set(experts), (
            f"layer {self.layer}: the backend served {computed} experts ({len(served)} distinct) "
            f"of {len(experts)}"
        )
        # Combine the k outputs of each token in slot order, whatever order experts were computed in.
        return (ys.view(N, k, D).float() * w.unsqueeze(-1)).sum(1).to(x.dtype)

    # --- the static-shape pieces (forward "segmented", artifact/model/segments.py)
    # ----------------------------
    # Every fed token goes through the router (no data-sized selection); pair_valid (P,) marks the (token,
    # slot) pairs of tokens that route. Shapes depend only on B and T, so each piece can be captured once.
    def start(self, h: torch.Tensor, pair_valid: torch.Tensor, predict_next: bool):
        """h (B, T, D) -> flat (N, D), idx (N, k), w (N, k) fp32, counts (E,) or (2E,) with the next layer's
        predicted counts after this layer's, shared (B, T, D) or None. No host read."""
        B, T, D = h.shape
        flat = h.reshape(B * T, D)
        idx, w = self.gate(flat)
        counts = expert_counts(idx, self.cfg.num_experts, pair_valid)
        nxt = self.routing.next_router.get(self.layer) if predict_next else None
        if nxt is not None:
            counts = torch.cat([counts, predict_counts(nxt, flat, pair_valid)])
        shared = self.shared_experts(h) if self.shared_experts is not None else None
        return flat, idx, w, counts, shared

    def stage(
        self,
        flat: torch.Tensor,
        idx: torch.Tensor,
        pair_valid: torch.Tensor,
        rowmap: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        ys: torch.Tensor,
    ) -> None:
        """One expert group from a device-side plan: rowmap (E,) long holds each routed expert's row in the
        stacks gate_up (G, 2I, D) / down (G, D, I), or G when the group does not hold it. Writes the outputs
        of the group's pairs into ys (P, D) in place; other rows of ys are kept. Offsets are computed on the
        device, every shape is static: the grouped GEMM runs over all P pairs sorted by row, and the rows past
        the group's last member (garbage) are masked off by a where, never read."""
        G = gate_up.shape[0]
        k = self.cfg.num_experts_per_tok
        row = torch.where(pair_valid, rowmap[idx.view(-1)], G)  # (P,) row of each pair
        order = torch.argsort(row, stable=True)  # (P,) pairs by row
        sizes = torch.zeros(G + 1, dtype=torch.long, device=ys.device).scatter_add_(
            0, row, torch.ones_like(row)
        )
        offs = sizes[:G].cumsum(0).to(torch.int32)  # (G,)
        xs = flat.index_select(0, order // k)  # (P, D)
        I = down.shape[2]
        h = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs)  # (P, 2I)
        out = torch._grouped_mm(F.silu(h[:, :I]) * h[:, I:], down.transpose(1, 2), offs)  # (P, D)
        member = (row.index_select(0, order) < G)[:, None]  # (P, 1)
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

    def forward(self, x, cos, sin, mask, cache, commit, rows, opts: ForwardOptions, step: StepInfo):
        x, h = self.attend(x, cos, sin, mask, cache, commit)
        return x + (self.mlp(h, rows, opts, step) if self.is_moe else self.mlp(h))

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
        # For the cross-layer prediction (predict_counts): each MoE layer -> the next MoE layer's router.
        routing.next_router = {a: self.layers[b].mlp.gate for a, b in zip(moe, moe[1:], strict=False)}


def routed_indices(rows: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (N,) flat indices of the tokens that route. Data-sized (a host sync on CUDA), so the
    model computes it once per forward, not once per MoE layer."""
    return rows.reshape(-1).nonzero().squeeze(1)


def block_causal_mask(q_pos, k_pos, k_valid, block: int) -> torch.Tensor:
    """(B, 1, T, S) bool: query i sees key j iff j's block is not after i's block and j is a real key."""
    allowed = (k_pos[:, None, :] // block) <= (q_pos[:, :, None] // block)  # (B, T, S)
    return (allowed & k_valid[:, None, :])[:, None]


class LLaDA2MoE(nn.Module):
    """The whole model. Parameter names follow the released checkpoints (model.*, lm_head)."""

    def __init__(self, cfg: ModelConfig, backend: ExpertBackend | None = None):
        super().__init__()
        self.cfg = cfg
        self.backend = backend  # the model's own experts (a forward's options may name another)
        self.routing = Routing()
        self.model = Backbone(cfg, self.routing)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Device memory kept with the model, not in its state dict, so that captured graphs stay valid run
        # after run: the decoder's KV caches, the offloaded layers' slots, the segmented forward's programs.
        self.kv_pool = KVPool()
        self.slot_pool = SlotPool()
        self.programs = Programs()

    @contextlib.contextmanager
    def listening(self, fn: Callable[[Demand], None]):
        """Call fn(demand) for every (forward, MoE layer) demand while the block runs."""
        self.routing.listeners.append(fn)
        try:
            yield fn
        finally:
            self.routing.listeners.remove(fn)

    @torch.no_grad()
    def forward(
        self,
        ids,
        pos,
        *,
        cache: KVCache | None = None,
        commit: int = 0,
        key_valid=None,
        rows=None,
        logits_rows: slice | torch.Tensor | None = None,
        options: ForwardOptions = EAGER,
        step: StepInfo = FIRST_STEP,
    ):
        """ids, pos (B, T). With a cache, keys are its prefix plus the fed tokens, and the first `commit`
        fed tokens are appended to it. key_valid (B, T) marks real fed tokens (right padding);
        rows (B, T) marks tokens whose routed experts are computed (None: all).
        logits_rows picks which fed positions get logits: a slice, or (B, n) gather indices.
        step (the decoder's StepInfo of this forward) goes into every Demand the forward makes.
        options (artifact/model/options.py) say how this forward runs: with forward "segmented", a denoising
        forward over a cache runs as segments (artifact/model/segments.py), captured as CUDA graphs on a CUDA
        device; every other forward takes this eager path."""
        opts = options if options.backend is not None else dataclasses.replace(options, backend=self.backend)
        if opts.backend is None:
            raise RuntimeError("model has no expert backend: load it with checkpoint.load_model")
        if cache is not None and commit:
            cache.check_commit(commit)
        if opts.forward == "segmented" and segmented(step, cache, logits_rows, rows):
            return run_segments(
                self,
                opts,
                step,
                ids,
                pos,
                cache=cache,
                commit=commit,
                key_valid=key_valid,
                rows=rows,
                logits_rows=logits_rows,
            )
        x, cos, sin, mask = self.prologue(ids, pos, cache, key_valid)
        if rows is not None and rows.dtype == torch.bool:
            rows = routed_indices(rows)  # once per forward, for every MoE layer
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache, commit, rows, opts, step)
        if cache is not None and commit:
            cache.advance(commit)
        return self.head(x, logits_rows)

    def prologue(self, ids, pos, cache: KVCache | None, key_valid):
        """Embeddings, rotary tables and the block-causal mask over the cache's positions plus the fed keys:
        -> x (B, T, D), cos, sin (B, 1, T, r), mask (B, 1, T, S). No host data reaches the device."""
        B, T = ids.shape
        x = self.model.word_embeddings(ids)  # (B, T, D)
        cos, sin = rope_cos_sin(pos, self.cfg, x.dtype)
        if key_valid is None:
            key_valid = torch.ones(B, T, dtype=torch.bool, device=ids.device)
        k_pos, k_valid = pos, key_valid
        if cache is not None:
            prefix = torch.arange(cache.positions, device=ids.device).expand(B, cache.positions)
            k_pos = torch.cat([prefix, pos], 1)  # cached keys sit at positions [0, len)
            k_valid = torch.cat([cache.key_valid(), key_valid], 1)  # (B, cap + T): no host list copied
        return x, cos, sin, block_causal_mask(pos, k_pos, k_valid, self.cfg.block_length)

    def head(self, x, logits_rows):
        """Final norm and lm_head on the picked positions -> (B, n, V) float32 logits."""
        if logits_rows is not None:
            if isinstance(logits_rows, slice):
                x = x[:, logits_rows]
            else:
                x = x.gather(1, logits_rows[..., None].expand(-1, -1, x.shape[-1]))
        return self.lm_head(self.model.norm(x)).float()  # (B, n, V)


def segmented(step: StepInfo, cache: KVCache | None, logits_rows, rows) -> bool:
    """Whether forward "segmented" runs this forward as segments: a denoising forward over a prefix cache with
    a slice of logits (the shapes the decoder repeats every step). Prefill and the full (uncached) mode stay
    eager."""
    return (
        cache is not None
        and step.kind == "denoise"
        and (logits_rows is None or isinstance(logits_rows, slice))
        and (rows is None or rows.dtype == torch.bool)
    )
