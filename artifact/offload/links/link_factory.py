"""make_link: a host-to-device link by name, EmulatedLink (link.py) or CudaLink (cuda_link.py)."""

from __future__ import annotations

import math

import torch

from artifact.offload.links.cuda_link import CudaLink
from artifact.offload.links.link import LINKS, PCIE_LATENCY_US, EmulatedLink, emulated_bandwidth_gbps
from artifact.offload.links.timeline import PRIORITIES, REFERENCE_CHUNK_BYTES


def make_link(
    kind: str,
    *,
    device="cpu",
    bandwidth_gbps: float | None = None,
    latency_us: float = PCIE_LATENCY_US,
    cap_gbps: float | None = None,
    expert_bytes: int | None = None,
    priority: str = "fifo",
    chunk_bytes: int | None = None,
    clock=None,
    runtime=None,
):
    """Build a link by name. The emulated link's default bandwidth is scaled to the model (see
    emulated_bandwidth_gbps); its default speculative chunk under demand priority is one expert; on CUDA the
    bandwidth is the hardware's, and bandwidth_gbps, if given, acts as the cap. runtime: the CUDA calls of a
    CudaLink (None: torch.cuda; cuda_stub.StubCuda runs it on the CPU)."""
    if kind not in LINKS:
        raise ValueError(f"unknown link {kind!r}; choose one of {LINKS}")
    if priority not in PRIORITIES:
        raise ValueError(f"unknown link priority {priority!r}; choose one of {PRIORITIES}")
    if kind == "cuda":
        if torch.device(device).type != "cuda":
            raise ValueError("--link cuda needs --device cuda")
        caps = [c for c in (cap_gbps, bandwidth_gbps) if c]
        if chunk_bytes is None and priority == "demand":  # as on the emulated link: one expert per chunk
            chunk_bytes = expert_bytes if expert_bytes else REFERENCE_CHUNK_BYTES
        return CudaLink(
            device,
            cap_gbps=min(caps) if caps else None,
            priority=priority,
            chunk_bytes=chunk_bytes if priority == "demand" else None,
            runtime=runtime,
        )
    if bandwidth_gbps is None:
        if expert_bytes is None:
            raise ValueError("the emulated link needs bandwidth_gbps or expert_bytes to scale its default")
        bandwidth_gbps = emulated_bandwidth_gbps(expert_bytes)
    if chunk_bytes is None and priority == "demand":
        # One expert per chunk: a demand copy waits for at most one speculative expert copy. Smaller chunks
        # pay the per-copy latency again each (measured: 1/6-expert chunks made demand priority slower than
        # fifo).
        chunk_bytes = expert_bytes if expert_bytes else REFERENCE_CHUNK_BYTES
    if clock is not None:  # virtual time (timeline.VirtualClock): copies of `expert_bytes` each
        return EmulatedLink(
            bandwidth_gbps,
            latency_us,
            cap_gbps,
            clock=clock,
            sleep=clock.sleep,
            priority=priority,
            chunk_bytes=chunk_bytes,
            timeout_s=math.inf,
            copy_bytes=expert_bytes,
        )
    return EmulatedLink(bandwidth_gbps, latency_us, cap_gbps, priority=priority, chunk_bytes=chunk_bytes)
