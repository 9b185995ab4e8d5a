"""Capturing the segmented forward's pieces as CUDA graphs, and the capture linter that checks them on the
CPU.

CudaCapture is the only place that calls the CUDA graph API (a seam: a test passes an object with the same
methods). capture() begins and ends one capture on a side stream and always leaves that stream's context,
also when the capture or its end raises, so no later work runs on the capture stream.

Linter: what CUDA stream capture forbids, or what a captured graph cannot repeat, checked where it can be:
on the CPU, where the segments run eagerly. While a segment or expert stage runs under it (artifact/model/
segments.py turns it on for every segmented forward on the CPU), it raises LintError, naming the op and the
segment or stage, on
  - a host read: aten._local_scalar_dense (item(), int(), bool() of a tensor), Tensor.tolist / numpy, a
    copy from a device tensor into host memory;
  - an op whose output size depends on the data: nonzero, masked_select, unique, bincount, indexing or
    index_put_ with a boolean mask;
  - a tensor made from host data: aten.lift_fresh (torch.tensor of a list), torch.tensor / torch.as_tensor;
  - a copy_ between shapes that differ (a broadcast into a buffer sized for other counts);
  - an op whose output shapes, or whose host values (Python numbers and sizes among its arguments: a
    scalar_tensor's number, a slice's bounds), differ from the same op's in the run that was captured (the
    program's second run: its first is the warm-up): a replay reuses the captured allocation at its size and
    the captured values.
"""

from __future__ import annotations

import torch

from artifact.model.op_watch import (
    DATA_SIZED_OPS,
    HOST_DATA_FUNCTIONS,
    HOST_READ_FUNCTIONS,
    HOST_READ_OPS,
    OpWatch,
)

aten = torch.ops.aten
FORBIDDEN = {
    **dict.fromkeys(HOST_READ_OPS, "a host read"),
    **dict.fromkeys(DATA_SIZED_OPS, "an output sized by the data"),
    aten.lift_fresh: "a tensor made from host data",
}
MASK_INDEXED = (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_)
COPIES = (aten.copy_, aten._to_copy)
FUNCTION_READS = {
    **dict.fromkeys(HOST_READ_FUNCTIONS, "a host read"),
    **dict.fromkeys(HOST_DATA_FUNCTIONS, "a tensor made from host data"),
}


class LintError(RuntimeError):
    """An op a CUDA graph could not capture or replay, named with the segment or stage it ran in."""


class CudaCapture:
    """The CUDA graph calls of the segmented forward."""

    def graph(self):
        return torch.cuda.CUDAGraph()

    def stream(self, device):
        return torch.cuda.Stream(device)

    def current_stream(self, device):
        return torch.cuda.current_stream(device)

    def use_stream(self, stream):
        """A context manager: work issued inside runs on `stream`."""
        return torch.cuda.stream(stream)

    def wait_stream(self, waiter, stream) -> None:
        waiter.wait_stream(stream)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def begin(self, graph, pool) -> None:
        graph.capture_begin(pool=pool)

    def end(self, graph) -> None:
        graph.capture_end()

    def pool(self, graph):
        return graph.pool()

    def replay(self, graph) -> None:
        graph.replay()


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def capture(api, graph, pool, stream, fn) -> str | None:
    """Capture fn() into `graph` (memory from `pool`) on the side `stream`. -> None, or why it failed (the
    first error: fn's, else the end's). The stream's context is left whatever raised."""
    api.synchronize()  # nothing queued may run into the capture
    error = None
    with api.use_stream(stream):
        try:
            api.begin(graph, pool)
        except RuntimeError as e:
            return first_line(e)
        try:
            fn()
        except RuntimeError as e:
            error = first_line(e)
        finally:
            try:
                api.end(graph)
            except RuntimeError as e:
                error = error or first_line(e)
    return error


def warm_up(api, stream, device, fn) -> None:
    """fn() eagerly on the capture stream, ordered after the work queued before it and before what follows."""
    current = api.current_stream(device)
    api.wait_stream(stream, current)
    with api.use_stream(stream):
        fn()
    api.wait_stream(current, stream)


def _op_name(func) -> str:
    return str(func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else func)


def _shapes(out) -> tuple:
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape),)
    if isinstance(out, (tuple, list)):
        return tuple(tuple(t.shape) for t in out if isinstance(t, torch.Tensor))
    return ()


def _host_values(args, kwargs) -> tuple:
    """The Python numbers (and sizes) among an op's arguments: what a captured graph bakes in."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, (bool, int, float)):
            out.append(a)
        elif isinstance(a, (list, tuple)) and all(isinstance(x, (bool, int, float)) for x in a):
            out.append(tuple(a))
    return tuple(out)


def _why(func, args, kwargs) -> str | None:
    """Why CUDA stream capture forbids this op (or a graph cannot repeat it), else None."""
    packet = func.overloadpacket
    if packet in FORBIDDEN:
        return FORBIDDEN[packet]
    if (
        packet in MASK_INDEXED
        and len(args) > 1
        and isinstance(args[1], (list, tuple))
        and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
    ):
        return "boolean-mask indexing: an output sized by the data"
    if packet in COPIES:
        src = args[1] if packet is aten.copy_ else args[0]
        dst_device = args[0].device if packet is aten.copy_ else kwargs.get("device") or src.device
        if src.device.type != "cpu" and torch.device(dst_device).type == "cpu":
            return "a copy into host memory"
        if packet is aten.copy_ and tuple(args[0].shape) != tuple(src.shape):
            return f"a copy from shape {tuple(src.shape)} into shape {tuple(args[0].shape)}"
    return None


class Linter(OpWatch):
    """with Linter(where, shapes): ... checks every op run inside (see the module docstring). `where` names
    the segment or stage; `shapes` is the list of (op, output shapes, host values) of the captured run,
    compared op by op, or None (not compared); `recorded` holds this run's. With report=True the first finding
    is kept in `found` instead of raised (to name the op of a capture that failed)."""

    def __init__(self, where: str, shapes: list | None = None, report: bool = False):
        super().__init__()
        self.where, self.shapes, self.report = where, shapes, report
        self.recorded: list[tuple[str, tuple]] = []
        self.found: str | None = None

    def fail(self, op: str, why: str) -> None:
        msg = f"{self.where}: {op} ({why}) cannot be captured in a CUDA graph"
        if self.report:
            self.found = self.found or msg
            return
        raise LintError(msg)

    def record(self, op: str, shapes: tuple, values: tuple = ()) -> None:
        i = len(self.recorded)
        self.recorded.append((op, shapes, values))
        if self.shapes is None:
            return
        if i >= len(self.shapes) or self.shapes[i][0] != op:
            want = self.shapes[i][0] if i < len(self.shapes) else "nothing"
            self.fail(op, f"op {i} of the captured run was {want}: the op sequence differs between runs")
        elif self.shapes[i][1] != shapes:
            self.fail(op, f"output shapes {shapes} differ from {self.shapes[i][1]} in the captured run")
        elif self.shapes[i][2] != values:
            self.fail(op, f"host values {values} differ from {self.shapes[i][2]} in the captured run")

    def before_op(self, func, args, kwargs) -> None:
        why = _why(func, args, kwargs)
        if why is not None:
            self.fail(_op_name(func), why)

    def after_op(self, func, args, kwargs, out) -> None:
        self.record(_op_name(func), _shapes(out), _host_values(args, kwargs))

    def function(self, func, args, kwargs) -> None:
        why = FUNCTION_READS.get(func)
        if why is not None and not (
            func in HOST_DATA_FUNCTIONS and args and isinstance(args[0], torch.Tensor)
        ):
            self.fail(getattr(func, "__name__", str(func)), why)

    def __exit__(self, exc_type, *exc) -> None:
        super().__exit__(exc_type, *exc)
        if exc_type is None and self.shapes is not None and len(self.recorded) < len(self.shapes):
            self.fail(
                f"{len(self.recorded)} ops",
                f"the captured run issued {len(self.shapes)}: the op sequence differs between runs",
            )
