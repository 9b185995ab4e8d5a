"""Host expert store: every routed expert packed contiguous, so one expert is one copy.

Pinned with artifact.model.memory.pin_host (cudaHostRegister in place: no power-of-two rounding);
check_slots_fit (the device budget for the slots) is re-exported here for the offload layer's callers.
"""

from __future__ import annotations

import torch

from artifact.model.memory import check_slots_fit, non_expert_bytes, pin_host, pinned_bytes

__all__ = ["HostStore", "check_slots_fit", "non_expert_bytes", "pin_host", "pinned_bytes"]


class HostStore:
    """(L_moe, E, P) packed experts in host memory; pinned (page-locked) when the target is CUDA so
    copies run asynchronously on the DMA engine."""

    def __init__(self, packed: torch.Tensor, moe_layers: list[int], pin: bool = False):
        if packed.device.type != "cpu":
            raise ValueError(f"the host store needs experts in host memory, got device {packed.device}")
        if packed.dim() != 3 or packed.shape[0] != len(moe_layers):
            raise ValueError(
                f"packed experts must be (L_moe={len(moe_layers)}, E, P), got {tuple(packed.shape)}"
            )
        self.packed = packed.contiguous()
        if pin and not self.packed.is_pinned():  # load_checkpoint pins once for CUDA; this is the fallback
            pin_host(self.packed)
        self.index = {layer: i for i, layer in enumerate(moe_layers)}
        self.expert_bytes = packed.shape[2] * packed.element_size()
        # One view per expert, made once: the engine's copies index these instead of slicing per copy.
        self.rows = {layer: self.packed[i].unbind(0) for layer, i in self.index.items()}

    @property
    def pinned(self) -> bool:
        return self.packed.is_pinned()

    @property
    def num_experts(self) -> int:
        return self.packed.shape[1]

    def expert(self, layer: int, e: int) -> torch.Tensor:
        return self.rows[layer][e]
