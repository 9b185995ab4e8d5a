"""The prefix KV cache of the cached decoding mode, at a fixed number of token positions."""

from __future__ import annotations

import torch

from artifact.model.config import ModelConfig
from artifact.model.experts import small_tensor


class KVCache:
    """Prefix KV cache of a fixed number of token positions: per layer (B, Hk, positions, hd); row b holds
    positions [0, lengths[b]). (`capacity` in this artifact is the expert cache's slots; here it is
    `positions`.)

    Static shapes: attention always reads every position and masks the keys past each row's length, so
    a forward's shapes do not change as the prefix grows (a captured CUDA graph stays valid). The lengths
    live twice: `lengths` on the host (the decoder's bookkeeping, never read back from the device) and
    `lens` (B,) on the device, which the mask and the commit read, so no forward copies a host list to the
    device. A commit writes each row's new keys at its own length with one indexed write (no per-row slice
    taken from a host integer) and advances `lens` in place."""

    def __init__(self, cfg: ModelConfig, batch: int, positions: int, device, dtype):
        shape = (batch, cfg.num_key_value_heads, positions, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.lengths = [0] * batch
        self.lens = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) device copy of lengths
        self.positions = positions

    def key_valid(self) -> torch.Tensor:
        """(B, positions) bool: which cached positions hold a key (device-side, no host data)."""
        return torch.arange(self.positions, device=self.lens.device)[None] < self.lens[:, None]

    def check_commit(self, n: int) -> None:
        """Host-side check before a forward commits n keys per row (the host knows every length)."""
        for b, start in enumerate(self.lengths):
            if start + n > self.positions:
                raise ValueError(
                    f"KV cache overflow: row {b} needs {start + n} > its {self.positions} positions"
                )

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Commit k, v (B, Hk, n, hd) after each row's prefix, at the device lengths (advance moves them)."""
        B, n = k.shape[0], k.shape[2]
        at = self.lens[:, None] + torch.arange(n, device=k.device)  # (B, n) positions
        rows = torch.arange(B, device=k.device)[:, None]  # (B, 1)
        self.k[layer][rows, :, at] = k.transpose(1, 2)  # (B, n, Hk, hd)
        self.v[layer][rows, :, at] = v.transpose(1, 2)

    def advance(self, n: int):
        self.lengths = [x + n for x in self.lengths]
        self.lens.add_(n)

    def row(self, b: int) -> "KVCache":
        """Row b as a cache of batch 1 over the same memory (a commit into it writes through, its device
        length too). Its host length is its own: the caller copies it back after writing."""
        out = object.__new__(KVCache)
        out.k = [t[b : b + 1] for t in self.k]
        out.v = [t[b : b + 1] for t in self.v]
        out.lens = self.lens[b : b + 1]
        out.lengths = [self.lengths[b]]
        out.positions = self.positions
        return out

    def select(self, rows: list[int], pool: KVPool | None = None) -> KVCache:
        """The cache of `rows` (in that order): new tensors, or pooled ones when a pool is given."""
        idx = small_tensor(rows, torch.long, self.k[0].device)
        if pool is None:
            out = object.__new__(KVCache)
            out.k = [t.index_select(0, idx) for t in self.k]
            out.v = [t.index_select(0, idx) for t in self.v]
            out.lens = self.lens.index_select(0, idx)
            out.positions = self.positions
        else:
            shape = (len(rows),) + tuple(self.k[0].shape[1:])
            out = pool.cache(len(self.k), shape, self.k[0].device, self.k[0].dtype)
            assert out.k[0].data_ptr() != self.k[0].data_ptr(), "select into the cache's own tensors"
            for src, dst in zip(self.k + self.v, out.k + out.v):
                torch.index_select(src, 0, idx, out=dst)
            torch.index_select(self.lens, 0, idx, out=out.lens)
        out.lengths = [self.lengths[r] for r in rows]
        return out


class KVPool:
    """The KV cache tensors of a model, kept with it (LLaDA2MoE.kv_pool) and reused run after run: a cache of
    a shape seen before gets the same tensors, so captured graphs that read them stay valid
    (segments.program_key). Stale keys past each length are masked, never read."""

    def __init__(self):
        self.tensors: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]] = {}

    def cache(self, layers: int, shape: tuple[int, int, int, int], device, dtype) -> KVCache:
        """An empty cache of `layers` layers of `shape` (B, Hk, positions, hd): pooled tensors, allocated on
        first use of the shape."""
        key = (layers, tuple(shape), torch.device(device), dtype)
        got = self.tensors.get(key)
        if got is None:
            got = self.tensors[key] = (
                [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)],
                [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)],
                torch.zeros(shape[0], dtype=torch.long, device=device),
            )
        out = object.__new__(KVCache)
        out.k, out.v, out.positions = got[0], got[1], shape[2]
        out.lens = got[2].zero_()
        out.lengths = [0] * shape[0]
        return out
