"""Count the host reads of device data that a forward makes (each a device-to-host sync on CUDA).

SyncCounter counts, while it is active:
  - ops whose result the host must read or whose output size depends on the data (on CUDA each one waits
    for the queued kernels): aten._local_scalar_dense (item(), int(), bool() of a tensor), nonzero,
    unique, bincount (its output is sized by the data's max), masked_select;
  - copies from a device tensor into host memory (aten.copy_ / _to_copy with a CPU destination and a
    non-CPU source);
  - Tensor.tolist() and Tensor.numpy(), which dispatch no ATen op (seen through a TorchFunctionMode),
    except of pinned host memory: that is the end of a device-to-host copy, counted as the copy.
and blocking copies the other way, host to device:
  - copies from host memory into a device tensor that are not non_blocking from pinned memory (on CUDA the
    host waits for the copy, and the copy for every kernel queued before it);
  - torch.tensor / torch.as_tensor of host data (a list, a number, a numpy array) unless staged in pinned
    memory (pin_memory=True): on the compute device that is a blocking upload. On the CPU it is counted
    too, so a CPU test sees every host list a CUDA forward would upload.
On the CPU nothing really syncs, but the same calls are counted, so a test on the CPU counts what a
CUDA run would wait for. `by_key` splits the count by whatever `key` was set to when each one happened
(the benchmark and the tests set it to the MoE layer running, with forward hooks).
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_SYNC_PACKETS = {aten._local_scalar_dense, aten.nonzero, aten.unique_consecutive, aten._unique2, aten._unique,
                 aten.unique_dim, aten.bincount, aten.masked_select}
_COPIES = {aten.copy_, aten._to_copy, aten.to}
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy}
_HOST_DATA = {torch.tensor, torch.as_tensor}


def _device_of(x) -> torch.device | None:
    return x.device if isinstance(x, torch.Tensor) else None


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner: SyncCounter):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        out = func(*args, **kwargs)
        if packet in _SYNC_PACKETS:
            self.owner.note(packet.__name__)
        elif packet in _COPIES and args:
            src = _device_of(args[1]) if packet is aten.copy_ and len(args) > 1 else _device_of(args[0])
            dst = _device_of(args[0]) if packet is aten.copy_ else _device_of(out)
            if src is not None and dst is not None and src.type != "cpu" and dst.type == "cpu":
                self.owner.note("copy to host")
            elif src is not None and dst is not None and src.type == "cpu" and dst.type != "cpu":
                pinned = args[1].is_pinned() if packet is aten.copy_ else args[0].is_pinned()
                if not (kwargs.get("non_blocking") or (packet is aten.copy_ and len(args) > 2 and args[2])) \
                        or not pinned:
                    self.owner.note("blocking copy to device")
        return out


class _Function(TorchFunctionMode):
    def __init__(self, owner: SyncCounter):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS and not (args and args[0].device.type == "cpu" and args[0].is_pinned()):
            self.owner.note(func.__name__)
        elif func in _HOST_DATA and args and not isinstance(args[0], torch.Tensor) \
                and not kwargs.get("pin_memory"):
            self.owner.note("tensor from host data")
        return func(*args, **kwargs)


UPLOADS = ("blocking copy to device", "tensor from host data")     # the host-to-device kinds


class SyncCounter:
    """with SyncCounter() as c: ...; c.total, c.by_key[key], c.kinds (op name -> count).
    c.reads / c.reads_by_key: the device-to-host reads among them; c.uploads / c.uploads_by_key: the
    host-to-device kinds (UPLOADS)."""

    def __init__(self):
        self.total = 0
        self.key = None
        self.by_key: Counter = Counter()
        self.reads_by_key: Counter = Counter()       # by_key, the device-to-host reads only
        self.uploads_by_key: Counter = Counter()     # by_key, the host-to-device kinds only
        self.kinds: Counter = Counter()
        self._modes = (_Function(self), _Dispatch(self))

    def note(self, kind: str) -> None:
        self.total += 1
        self.by_key[self.key] += 1
        self.kinds[kind] += 1
        (self.uploads_by_key if kind in UPLOADS else self.reads_by_key)[self.key] += 1

    @property
    def uploads(self) -> int:
        return sum(self.kinds[k] for k in UPLOADS)

    @property
    def reads(self) -> int:
        return self.total - self.uploads

    def __enter__(self) -> SyncCounter:
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)
