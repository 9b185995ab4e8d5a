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

from artifact.model.op_watch import (
    DATA_SIZED_OPS,
    HOST_DATA_FUNCTIONS,
    HOST_READ_FUNCTIONS,
    HOST_READ_OPS,
    OpWatch,
)

aten = torch.ops.aten
_SYNC_PACKETS = HOST_READ_OPS | DATA_SIZED_OPS
_COPIES = {aten.copy_, aten._to_copy, aten.to}


def _device_of(x) -> torch.device | None:
    return x.device if isinstance(x, torch.Tensor) else None


UPLOADS = ("blocking copy to device", "tensor from host data")  # the host-to-device kinds


class SyncCounter(OpWatch):
    """with SyncCounter() as c: ...; c.total, c.by_key[key], c.kinds (op name -> count).
    c.reads / c.reads_by_key: the device-to-host reads among them; c.uploads / c.uploads_by_key: the
    host-to-device kinds (UPLOADS)."""

    def __init__(self):
        super().__init__()
        self.total = 0
        self.key = None
        self.by_key: Counter = Counter()
        self.reads_by_key: Counter = Counter()  # by_key, the device-to-host reads only
        self.uploads_by_key: Counter = Counter()  # by_key, the host-to-device kinds only
        self.kinds: Counter = Counter()

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

    def after_op(self, func, args, kwargs, out) -> None:
        packet = func.overloadpacket
        if packet in _SYNC_PACKETS:
            self.note(packet.__name__)
        elif packet in _COPIES and args:
            src = _device_of(args[1]) if packet is aten.copy_ and len(args) > 1 else _device_of(args[0])
            dst = _device_of(args[0]) if packet is aten.copy_ else _device_of(out)
            if src is not None and dst is not None and src.type != "cpu" and dst.type == "cpu":
                self.note("copy to host")
            elif src is not None and dst is not None and src.type == "cpu" and dst.type != "cpu":
                pinned = args[1].is_pinned() if packet is aten.copy_ else args[0].is_pinned()
                if (
                    not (kwargs.get("non_blocking") or (packet is aten.copy_ and len(args) > 2 and args[2]))
                    or not pinned
                ):
                    self.note("blocking copy to device")

    def function(self, func, args, kwargs) -> None:
        if func in HOST_READ_FUNCTIONS and not (
            args and args[0].device.type == "cpu" and args[0].is_pinned()
        ):
            self.note(func.__name__)
        elif (
            func in HOST_DATA_FUNCTIONS
            and args
            and not isinstance(args[0], torch.Tensor)
            and not kwargs.get("pin_memory")
        ):
            self.note("tensor from host data")
