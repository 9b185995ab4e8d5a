"""Memory that fits real checkpoints: host pinning without rounding, and a device budget for the slots.

Pinning. Copies run asynchronously on the DMA engine only from page-locked memory. torch's
`pin_memory()` allocates from the caching host allocator, which rounds every block up to a power of
two (torch 2.13): LLaDA2.0-flash's 199.7 GB of experts would take 274.9 GB. `pin_host` instead
page-locks the tensor where it already is, with cudaHostRegister (torch.cuda.cudart()): exactly its
bytes, no copy, no second buffer. It is unregistered when the tensor is freed.

Capacity. `check_slots_fit` refuses a cache capacity whose slots cannot fit in free GPU memory, before
the checkpoint is read, with the numbers in the message. It lives in the model layer because the
checkpoint loader calls it; the offload layer re-exports both from offload/backend/store.py.
"""

from __future__ import annotations

import weakref

import torch

from artifact.model.config import ModelConfig

GIB = 1 << 30
DEFAULT_RESERVE_BYTES = 4 * GIB  # activations, KV cache, allocator slack and the CUDA context


_registered: dict[int, weakref.finalize] = {}
# cudaHostRegisterPortable: pinned for every CUDA context, not only the current one
HOST_REGISTER_PORTABLE = 1


def pin_host(t: torch.Tensor) -> torch.Tensor:
    """Page-lock a contiguous CPU tensor in place (cudaHostRegister, portable: usable from every device's
    context): exactly t's bytes, no rounding and no copy. Returns t. Unregistered when t is
    garbage-collected. An empty tensor has no bytes to lock (cudaHostRegister refuses a size of 0): it is
    returned as it is."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(
            f"pin_host needs a contiguous CPU tensor, got device {t.device}, contiguous={t.is_contiguous()}"
        )
    if not torch.cuda.is_available():
        raise RuntimeError("pinning host memory needs CUDA, and torch.cuda.is_available() is False")
    ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
    if nbytes == 0 or ptr in _registered or t.is_pinned():
        return t
    cudart = torch.cuda.cudart()
    torch.cuda.check_error(cudart.cudaHostRegister(ptr, nbytes, HOST_REGISTER_PORTABLE))
    _registered[ptr] = weakref.finalize(t, _unregister, ptr)
    return t


def _unregister(ptr: int) -> None:
    _registered.pop(ptr, None)
    torch.cuda.cudart().cudaHostUnregister(ptr)


def pinned_bytes(t: torch.Tensor) -> int:
    """Bytes of t that are page-locked by pin_host (what the allocator rounding would inflate)."""
    return t.numel() * t.element_size() if t.data_ptr() in _registered else 0


def non_expert_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    """Device bytes of everything but the routed experts: embeddings, LM head, attention, dense MLPs,
    shared experts, routers (fp32 bias), norms."""
    D, H, Hk, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    attn = (H + 2 * Hk) * hd * D + H * hd * D + 2 * hd + 2 * D
    dense = 3 * D * cfg.intermediate_size
    moe = cfg.num_experts * D + cfg.expert_params * cfg.num_shared_experts
    params = (
        2 * cfg.vocab_size * D
        + D
        + cfg.num_hidden_layers * attn
        + cfg.first_k_dense_replace * dense
        + len(cfg.moe_layers) * moe
    )
    return params * dtype_bytes + len(cfg.moe_layers) * cfg.num_experts * 4


def check_slots_fit(
    cfg: ModelConfig,
    capacity: int,
    dtype: torch.dtype,
    device,
    free_bytes: int | None = None,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    weights_loaded: bool = False,
) -> dict | None:
    """Refuse a capacity whose slots (capacity x expert bytes x MoE layers), plus the non-expert weights
    and a reserve, exceed the device's free memory. Call it before the checkpoint loads; once the model
    is on the device (weights_loaded) its weights are already out of the free figure. free_bytes
    overrides the measured figure (tests). Returns the budget, or None on a CPU device (host memory)."""
    device = torch.device(device)
    if device.type != "cuda" and free_bytes is None:
        return None
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    per_slot = cfg.expert_params * dtype_bytes * len(cfg.moe_layers)
    fixed = (0 if weights_loaded else non_expert_bytes(cfg, dtype_bytes)) + reserve_bytes
    need = capacity * per_slot + fixed
    max_capacity = max(0, (free_bytes - fixed) // per_slot)
    budget = {
        "capacity": capacity,
        "slot_bytes": per_slot,
        "fixed_bytes": fixed,
        "need_bytes": need,
        "free_bytes": free_bytes,
        "max_capacity": int(min(max_capacity, cfg.num_experts)),
    }
    if need > free_bytes:
        what = "reserve" if weights_loaded else "non-expert weights and reserve"
        raise ValueError(
            f"cache capacity {capacity} does not fit on {device}: "
            f"{capacity} slots x {per_slot / 1e6:.0f} MB (one expert across {len(cfg.moe_layers)} MoE "
            f"layers) = {capacity * per_slot / 1e9:.1f} GB, plus {fixed / 1e9:.1f} GB of {what}, "
            f"is {need / 1e9:.1f} GB > {free_bytes / 1e9:.1f} GB free; "
            f"the largest capacity that fits is {budget['max_capacity']}"
        )
    return budget
