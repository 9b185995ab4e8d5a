"""Routed experts: how they are packed and viewed, the backends that hand them out in groups, and the
grouped compute of a group.

A backend (ExpertBackend) hands out the demanded experts in groups, each a set of rows of stacked weight views
(the resident packed tensor, or an offloaded layer's slot tensor). A group is computed in one grouped call
(torch._grouped_mm; expert_kernel "loop" keeps one call per expert).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch
import torch.nn.functional as F

from artifact.model.config import ModelConfig
from artifact.model.routing import Demand

ExpertWeights = tuple[torch.Tensor, torch.Tensor]  # (gate_up (2I, D), down (D, I)): views of a packed expert
EXPERT_KERNELS = ("grouped", "loop")
# torch._grouped_mm exists from torch 2.8 (on CPU in 2.13); older torch computes a group with the loop kernel.
HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")


@dataclass(frozen=True)
class ExpertGroup:
    """Routed experts computed together: one grouped call over stacked weight views.

    Shape legend: G rows of the weight stacks (C slots of an offloaded layer, or E experts when resident),
    I expert width, D hidden."""

    experts: tuple[int, ...]  # routed experts of the group, listed in ascending `rows`
    rows: tuple[int, ...]  # each one's row in the stacks: its slot (offloaded) or its id (resident)
    gate_up: torch.Tensor  # (G, 2I, D) view: gate and up of every row
    down: torch.Tensor  # (G, D, I) view


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
    return flat[: 2 * I * D].view(2 * I, D), flat[2 * I * D :].view(D, I)


def stack_views(packed: torch.Tensor, cfg: ModelConfig) -> ExpertWeights:
    """Views of G packed experts (G, 3*I*D) as stacks: gate_up (G, 2I, D) and down (G, D, I); no copy."""
    I, D = cfg.moe_intermediate_size, cfg.hidden_size
    G = packed.shape[0]
    return packed[:, : 2 * I * D].view(G, 2 * I, D), packed[:, 2 * I * D :].view(G, D, I)


def expert_ffn(x: torch.Tensor, w: ExpertWeights) -> torch.Tensor:
    gate_up, down = w
    I = down.shape[1]
    h = F.linear(x, gate_up)  # (n, 2I): gate and up in one matmul
    return F.linear(F.silu(h[:, :I]) * h[:, I:], down)  # (n, D)


def grouped_ffn(
    xs: torch.Tensor, group: ExpertGroup, spans: list[tuple[int, int, int]], offsets: list[int], kernel: str
) -> torch.Tensor:
    """The experts of a group on their tokens. xs (n, D) holds each member's token rows in the group's row
    order; spans[j] = (row, start, end) of member j in xs; offsets (G,) are the cumulative row counts of
    every stack row (empty rows included), as torch._grouped_mm wants them. -> (n, D).
    Both kernels compute each expert with the same matmuls on the same rows: on CPU their outputs are
    equal bit for bit (tested), so the kernel changes time, never results."""
    if kernel == "grouped" and HAS_GROUPED_MM and grouped_mm_ok(xs):
        gate_up, down = group.gate_up, group.down
        hi = group.rows[-1] + 1  # rows past the last member hold no tokens: not passed
        if hi < gate_up.shape[0]:
            gate_up, down = gate_up[:hi], down[:hi]
        offs = small_tensor(offsets[:hi], torch.int32, xs.device)  # (hi,)
        I = down.shape[2]
        h = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs)  # (n, 2I)
        return torch._grouped_mm(F.silu(h[:, :I]) * h[:, I:], down.transpose(1, 2), offs)  # (n, D)
    ys = torch.empty_like(xs)  # (n, D)
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


def grouped_mm_ok(xs: torch.Tensor) -> bool:
    # CPU runs any float dtype; CUDA's grouped GEMM needs bf16 on compute capability >= 9.0 (H100/H200).
    if xs.device.type == "cpu":
        return True
    return xs.device.type == "cuda" and xs.dtype == torch.bfloat16 and _capability(xs.device.index) >= (9, 0)


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    """A device's compute capability, queried once per device (it was once per group)."""
    return torch.cuda.get_device_capability(index)


class ResidentExperts:
    """Default backend: every routed expert of every MoE layer lives on the compute device, one group."""

    def __init__(self, packed: torch.Tensor, cfg: ModelConfig):
        assert packed.shape == (len(cfg.moe_layers), cfg.num_experts, cfg.expert_params), packed.shape
        self.packed = packed  # (L_moe, E, 3*I*D)
        self.stacks = {layer: stack_views(packed[i], cfg) for i, layer in enumerate(cfg.moe_layers)}

    def groups(self, demand: Demand):
        yield ExpertGroup(demand.experts, demand.experts, *self.stacks[demand.layer])


class SlotPool:
    """The slot tensors of offloaded layers, kept with the model (LLaDA2MoE.slot_pool) and handed to each new
    engine: a run's engine gets the tensors of the previous run's engine of the same capacity, so the expert
    stages captured over them (artifact/model/segments.py) stay valid. One capacity per layer is kept: asking
    for another frees the old one. One engine uses the slots at a time (a run's; its link is drained before
    the next run makes its engine)."""

    def __init__(self):
        self.tensors: dict[tuple, tuple[tuple, torch.Tensor]] = {}

    def slots(self, layer: int, capacity: int, width: int, dtype: torch.dtype, device) -> torch.Tensor:
        """(capacity, width) slots of `layer`: the pooled tensor of this (layer, capacity, dtype), else
        new."""
        where = (layer, torch.device(device))
        key = (capacity, width, dtype)
        got = self.tensors.get(where)
        if got is None or got[0] != key:
            self.tensors.pop(where, None)  # the old capacity's memory goes first
            got = self.tensors[where] = (key, torch.zeros(capacity, width, dtype=dtype, device=device))
        return got[1]
