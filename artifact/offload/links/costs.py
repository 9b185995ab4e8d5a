"""The hardware model of a virtual-time run: what each action of the stream-driven engine costs.

A virtual-time run (trace_engine.run_stream with `costs`) drives the real engine, cache, policies and link
timeline; only time is modelled. The compute stream's clock advances by:

  before a demand   non-expert compute of one (forward, MoE layer): attention (q/k/v/o projections, scores
                    against the context so far), the router and the shared expert; at a forward's first MoE
                    layer also the forward's dense layers and the LM head. Each is a roofline,
                    max(FLOPs / (peak x compute efficiency), bytes / (memory bandwidth x memory efficiency)),
                    or the host's time to launch its kernels, whichever is slower. Then the host's time
                    for the layer: the one sync (the router's expert ids) and the cache's planning; the
                    sync serialises the host with the device, so this time is on the critical path.
  per copy issued   the host's Python per copy, charged before the layer's first group computes;
  per group         expert compute: tokens x 3 x D x I x 2 FLOPs per expert (gate, up, down), the group's
                    expert weights read once, or the launches of the group's kernels, whichever is slower.

Copies run on the link's CopyTimeline (latency + bytes / bandwidth, fifo or demand priority) against the
same clock, so copies overlap compute as a GPU's copy and compute streams do; a wait joins them and its
length is the stall.

A calibrated Hardware (expert_us, other_us_per_demand) replaces the rooflines by measured per-action costs
(the cpu-emulated profile: the tiny model's compute on this CPU, measured by trace_engine.calibrate).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from artifact.model.config import expert_params_of
from artifact.model.routing import Demand
from artifact.offload.links.link import emulated_bandwidth_gbps
from artifact.validate import check_number


@dataclass(frozen=True)
class Hardware:
    """A device, its host link and the host that drives it: the numbers the model charges (units in the
    names). Either the rooflines (bf16_tflops, memory_gbps) or, on a calibrated profile, measured costs per
    action (expert_us, other_us_per_demand) price the compute."""

    name: str
    h2d_gbps: float  # achieved pinned host-to-device bandwidth of expert-sized copies
    copy_latency_us: float  # per copy (chunk) setup: its first byte's delay
    launch_us: float  # host time per kernel launch (eager PyTorch issues one kernel at a time)
    sync_us: float  # one host sync (the router's ids, once per MoE layer)
    plan_us: float  # the cache's planning and the engine's bookkeeping per MoE layer (host)
    copy_host_us: float  # host time per copy issued (planning, events, the copy call)
    bf16_tflops: float | None = None  # dense bf16 peak
    memory_gbps: float | None = None  # device memory bandwidth
    # share of the peak a matmul of these sizes reaches (stated, not measured)
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8  # share of the memory bandwidth a weight read reaches (stated)
    kernels_per_layer: int = 120  # launches of one layer's non-expert forward
    kernels_per_group: int = 4  # launches of one group's expert compute: gate_up, activation, down, scatter
    expert_us: float | None = None  # calibrated: one expert's compute (gather, FFN, weighting, scatter)
    other_us_per_demand: float | None = None  # calibrated: everything else per (forward, MoE layer)
    scale_link: bool = False  # True: h2d_gbps is for a 6 MiB expert and the link scales with the
    # expert's size (the emulated link's rule, link.emulated_bandwidth_gbps)

    def __post_init__(self):
        check_number("h2d_gbps", self.h2d_gbps, low=0, low_open=True)
        for k in ("copy_latency_us", "launch_us", "sync_us", "plan_us", "copy_host_us"):
            check_number(k, getattr(self, k), low=0)
        if self.calibrated:
            check_number("expert_us", self.expert_us, low=0)
            check_number("other_us_per_demand", self.other_us_per_demand, low=0)
        else:
            for k in ("bf16_tflops", "memory_gbps", "compute_efficiency", "memory_efficiency"):
                check_number(k, getattr(self, k), low=0, low_open=True)

    @property
    def calibrated(self) -> bool:
        return self.expert_us is not None or self.other_us_per_demand is not None


@dataclass(frozen=True)
class Shape:
    """The model dimensions the costs need (from a model.config preset)."""

    hidden_size: int
    moe_intermediate_size: int
    intermediate_size: int  # the dense MLP of the first layers
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    num_shared_experts: int
    dense_layers: int
    vocab_size: int
    block_length: int
    dtype_bytes: int = 2  # bf16

    @classmethod
    def of(cls, cfg, dtype_bytes: int = 2) -> Shape:
        return cls(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.intermediate_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            cfg.num_shared_experts,
            cfg.first_k_dense_replace,
            cfg.vocab_size,
            cfg.block_length,
            dtype_bytes,
        )

    @property
    def expert_params(self) -> int:
        return expert_params_of(self.hidden_size, self.moe_intermediate_size)

    @property
    def expert_bytes(self) -> int:
        return self.expert_params * self.dtype_bytes


class Costs:
    """Seconds per action of a virtual-time stream run (the module docstring); pure and deterministic."""

    def __init__(self, hw: Hardware, shape: Shape):
        self.hw, self.shape = hw, shape
        self.expert_bytes = shape.expert_bytes
        self.per_copy = hw.copy_host_us * 1e-6

    @property
    def link_gbps(self) -> float:
        if self.hw.scale_link:
            return emulated_bandwidth_gbps(self.expert_bytes, self.hw.h2d_gbps)  # per LLaDA2.0-mini expert
        return self.hw.h2d_gbps

    def roofline(self, flops: float, nbytes: float, launches: int) -> float:
        """The slowest of the device's compute, its memory reads and the host issuing the kernels (the device
        runs each kernel as it is launched, so a host slower than the device sets the pace)."""
        hw = self.hw
        return max(
            flops / (hw.bf16_tflops * 1e12 * hw.compute_efficiency),
            nbytes / (hw.memory_gbps * 1e9 * hw.memory_efficiency),
            launches * hw.launch_us * 1e-6,
        )

    def tokens(self, d: Demand) -> int:
        """Tokens fed to the layer: each selects top_k experts."""
        return max(1, round(sum(d.counts) / self.shape.top_k))

    def _attention(self, T: int, ctx: int) -> tuple[float, float]:
        s = self.shape
        qkv = s.hidden_size * (s.num_attention_heads + 2 * s.num_key_value_heads) * s.head_dim
        o = s.num_attention_heads * s.head_dim * s.hidden_size
        flops = 2 * T * (qkv + o) + 4 * T * ctx * s.num_attention_heads * s.head_dim
        rows = max(1, T // s.block_length)  # sequences in the batch
        nbytes = (
            qkv + o
        ) * s.dtype_bytes + rows * ctx * 2 * s.num_key_value_heads * s.head_dim * s.dtype_bytes
        return flops, nbytes

    def compute(self, d: Demand, first_layer: bool) -> float:
        """Non-expert compute of demand d's (forward, MoE layer); at a forward's first MoE layer also the
        dense layers and the LM head."""
        if self.hw.calibrated:
            return self.hw.other_us_per_demand * 1e-6
        s = self.shape
        T = self.tokens(d)
        ctx = (d.step.block + 1) * s.block_length  # prefix KV cache and the block being denoised
        flops, nbytes = self._attention(T, ctx)
        flops += 2 * T * s.hidden_size * s.num_experts  # router
        shared = s.expert_params * s.num_shared_experts
        flops += 2 * T * shared
        nbytes += (s.hidden_size * s.num_experts + shared) * s.dtype_bytes
        t = self.roofline(flops, nbytes, self.hw.kernels_per_layer)
        if first_layer:
            af, ab = self._attention(T, ctx)
            mlp = 3 * s.hidden_size * s.intermediate_size
            t += s.dense_layers * self.roofline(
                af + 2 * T * mlp, ab + mlp * s.dtype_bytes, self.hw.kernels_per_layer
            )
            head = s.hidden_size * s.vocab_size
            t += self.roofline(2 * T * head, head * s.dtype_bytes, 2)
        return t

    def device_only(self) -> Costs:
        """These costs without the host's launch term: the rooflines' device compute and memory reads only,
        so a physical limit is the device's and the link's, never the host's. A calibrated profile is
        returned as it is (it measured compute as a whole, on a CPU that computes on the host)."""
        if self.hw.calibrated or self.hw.launch_us == 0:
            return self
        return Costs(dataclasses.replace(self.hw, launch_us=0.0), self.shape)

    def host(self) -> float:
        """Host time per MoE layer on the critical path: the router sync and the planning."""
        return (self.hw.sync_us + self.hw.plan_us) * 1e-6

    def group(self, tokens: list[int]) -> float:
        """Expert compute of one group: tokens[i] tokens through its i-th expert."""
        if self.hw.calibrated:
            return len(tokens) * self.hw.expert_us * 1e-6
        s = self.shape
        flops = sum(tokens) * s.expert_params * 2
        return self.roofline(flops, len(tokens) * self.expert_bytes, self.hw.kernels_per_group)

    def expert_compute(self, tokens: int) -> float:
        """One expert on `tokens` tokens, alone (the physical limit's compute counts experts this way)."""
        return self.group([tokens])
