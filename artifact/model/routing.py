"""Routing: the router, its per-expert counts on the host, and the demand events it makes.

One Demand per (forward, MoE layer): the decoder passes each forward its StepInfo (LLaDA2MoE.forward(...,
step=...)), the router fills the rest. Routing is what the MoE layers of one model share (who listens to
demands, the next layer's router, the host counts); nothing of one forward or one engine is kept there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from artifact.model.config import ModelConfig


@dataclass(frozen=True)
class StepInfo:
    forward: int  # index of the forward in this run (the paper's denoising step t, prefill included)
    block: int  # block round of the decoder (-1 for prefill)
    block_step: int  # denoising step inside the block round (-1 for prefill)
    kind: str  # "prefill" | "denoise"


FIRST_STEP = StepInfo(0, -1, -1, "denoise")  # the step of a forward called without one (a lone forward)


@dataclass(frozen=True)
class Demand:
    step: StepInfo
    layer: int  # model layer index (first MoE layer is cfg.first_k_dense_replace)
    experts: tuple[int, ...]  # distinct routed experts the fed tokens selected, ascending
    counts: tuple[int, ...]  # tokens per expert, aligned with experts
    # Cross-layer prediction of the *next* MoE layer's demand at this step (experts ascending, counts):
    # that layer's router applied to this layer's routed hidden states. None unless the model was asked
    # for it (ForwardOptions.predict_next) or this is the last MoE layer.
    predicted: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    @property
    def working_set(self) -> int:
        return len(self.experts)


class HostCounts:
    """The router's per-expert token counts on the host, in one device-to-host copy per MoE layer.

    counts (E,) is a fixed-size device tensor (scatter_add_ of ones: no bincount, which on CUDA syncs to
    size its output from the data). On CUDA it is copied non_blocking into a pinned buffer that is reused,
    and the host waits once, on an event recorded after the copy; the expert ids are read off the counts
    on the host. On the CPU, `tolist` of the counts is the one read."""

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}  # (device, E) -> pinned (E,) int64
        self.events: dict[object, object] = {}
        self.wait_seconds = 0.0  # host time blocked in the layer syncs (CUDA), so a timer can take it out

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
        buf.copy_(counts, non_blocking=True)  # one D2H transfer, queued behind the router
        ev.record(torch.cuda.current_stream(counts.device))
        t0 = time.perf_counter()
        ev.synchronize()  # the one host sync of the layer
        self.wait_seconds += time.perf_counter() - t0
        return buf.tolist()  # host memory: no further sync

    def wait(self, buf: torch.Tensor) -> list[int]:
        """A pinned buffer that a copy (forward "segmented") fills on the current stream: one event, one
        sync."""
        ev = self.events.get(buf.device)
        if ev is None:
            ev = self.events[buf.device] = torch.cuda.Event()
        ev.record()
        t0 = time.perf_counter()
        ev.synchronize()
        self.wait_seconds += time.perf_counter() - t0
        return buf.tolist()


class Router(nn.Module):
    """Group-limited sigmoid router: sigmoid scores in fp32; selection adds expert_bias; groups scored by
    the sum of their top-2; keep topk_group groups; top-k experts; weights are the unbiased scores of
    the chosen k, renormalised, times routed_scaling_factor."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts, dtype=torch.float32))
        self._fp32 = None  # (key, weight in fp32): cast once, not on every call

    def weight_fp32(self) -> torch.Tensor:
        """The router weight in fp32, cast once and kept while the weight is unchanged (same storage,
        device and version: a load_state_dict or .to() makes a new cast). fp32 weights are used as they
        are."""
        w = self.weight
        if w.dtype == torch.float32:
            return w
        key = (w.data_ptr(), w.device, w._version)
        if self._fp32 is None or self._fp32[0] != key:
            self._fp32 = (key, w.detach().float())
        return self._fp32[1]

    def forward(self, x):  # x (N, D)
        c = self.cfg
        N = x.shape[0]
        scores = torch.sigmoid(F.linear(x.float(), self.weight_fp32()))  # (N, E) fp32
        biased = scores + self.expert_bias
        group = biased.view(N, c.n_group, -1).topk(2, dim=-1).values.sum(-1)  # (N, n_group)
        keep = torch.zeros_like(group).scatter_(1, group.topk(c.topk_group, dim=-1).indices, 1.0)
        allowed = keep.bool().repeat_interleave(c.num_experts // c.n_group, dim=1)  # (N, E)
        # (N, k)
        idx = biased.masked_fill(~allowed, float("-inf")).topk(c.num_experts_per_tok, dim=-1).indices
        w = scores.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor
        return idx, w  # (N, k) long, (N, k) fp32


def expert_counts(
    idx: torch.Tensor, num_experts: int, pair_valid: torch.Tensor | None = None
) -> torch.Tensor:
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


def predict_counts(
    next_router: Router, x: torch.Tensor, pair_valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-layer prediction (the predictor of Pre-gated MoE, ProMoE, HOBBIT): the next MoE layer's
    router applied to this layer's MoE input x (N, D), the post-attention-norm hidden states of the
    tokens that route here. The input, not this layer's output: the prediction must exist when this
    layer's demand is served, before its experts compute, so the link can move the next layer's experts
    meanwhile. Returns the predicted tokens per expert (E,) on the device; MoE.routed reads it to the host
    in the same copy as the layer's own counts. Pure: the model's outputs do not change."""
    idx, _ = next_router(x)  # (N, k)
    return expert_counts(idx, next_router.cfg.num_experts, pair_valid)


class Routing:
    """What the MoE layers of one model share: who listens to demands, the next MoE layer's router and the
    host counts. How a forward runs (its step, expert backend and kernel, the cross-layer prediction, the
    forward mode) is not here: the forward's step and options carry it (artifact/model/options.py)."""

    def __init__(self):
        self.listeners: list[Callable[[Demand], None]] = []
        # Cross-layer prediction (ForwardOptions.predict_next): next_router maps a MoE layer to the next one's
        # router; kept here, not on the modules, so the routers are not registered twice in the state dict.
        self.next_router: dict[int, Router] = {}
        self.host_counts = HostCounts()  # the router's counts to the host: the one sync per MoE layer
