"""Watching every op a piece of code runs: OpWatch, the base of the host-sync counter (syncs.SyncCounter) and
the capture linter (capture.Linter), and the lists of ops and functions both of them look for.

While an OpWatch is active (`with watch: ...`), every ATen op reaches `before_op` before it runs and
`after_op` after (a TorchDispatchMode), and every torch function reaches `function` before it runs (a
TorchFunctionMode: Tensor.tolist / numpy and torch.tensor / as_tensor are seen there, as they dispatch no ATen
op that shows them).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# The host reads a value of device data: item(), int(), bool() of a tensor.
HOST_READ_OPS = frozenset({aten._local_scalar_dense})
# An output whose size depends on the data (bincount's on its max): the host must know it to allocate.
DATA_SIZED_OPS = frozenset(
    getattr(aten, name)
    for name in (
        "nonzero",
        "masked_select",
        "unique_consecutive",
        "_unique2",
        "_unique",
        "unique_dim",
        "bincount",
    )
    if hasattr(aten, name)
)
HOST_READ_FUNCTIONS = (torch.Tensor.tolist, torch.Tensor.numpy)  # a tensor's data read to the host
HOST_DATA_FUNCTIONS = (torch.tensor, torch.as_tensor)  # a tensor made from host data


class _Dispatch(TorchDispatchMode):
    watch: OpWatch  # set by the OpWatch that holds the mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.watch.before_op(func, args, kwargs)
        out = func(*args, **kwargs)
        self.watch.after_op(func, args, kwargs, out)
        return out


class _Function(TorchFunctionMode):
    watch: OpWatch  # set by the OpWatch that holds the mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.watch.function(func, args, kwargs)
        return func(*args, **kwargs)


class OpWatch:
    """A context manager that shows a subclass every op run inside it (see the module docstring). Override
    before_op(func, args, kwargs), after_op(func, args, kwargs, out) and function(func, args, kwargs); each
    does nothing here, and one that raises stops the op."""

    def __init__(self):
        self._modes = (_Function(), _Dispatch())
        for m in self._modes:
            m.watch = self

    def before_op(self, func, args: tuple, kwargs: dict) -> None:
        """An ATen op `func` (an OpOverload: func.overloadpacket is aten.<name>) is about to run."""

    def after_op(self, func, args: tuple, kwargs: dict, out) -> None:
        """An ATen op ran and returned `out`."""

    def function(self, func, args: tuple, kwargs: dict) -> None:
        """A torch function (torch.tensor, Tensor.tolist, ...) is about to run."""

    def __enter__(self):
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)
