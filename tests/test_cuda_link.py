"""The lean CudaLink on the CPU: what it asks of the CUDA runtime per batch, read off a stub runtime that
records every call (offload/links/cuda_stub.StubCuda), with and without the batched copy; its tickets, demand
priority's order on the copy stream, close(), and its one-line errors for bad input. Real copies on a GPU
are in tests/test_cuda.py (skipped without one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import artifact.offload.links.cuda_link as cuda_link
import artifact.offload.links.link as link_mod
import artifact.offload.links.pacing as pacing
from artifact.offload.links.cuda_batch import NO_BATCH_ENV, probe_memcpy_batch
from artifact.offload.links.cuda_link import CudaLink
from artifact.offload.links.cuda_runtime import CudaBatch
from artifact.offload.links.cuda_stub import StubCuda, StubCudart
from artifact.offload.links.link import EmulatedLink, Link, LinkClosed, LinkTimeout


def rows(n, size=256, seed=0):
    """n source rows (float32, `size` elements) and n zeroed destination slots."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=g) for _ in range(n)], [torch.zeros(size) for _ in range(n)]


def batch_items(srcs, dsts, tag="c"):
    return [(d, s, f"{tag}{i}") for i, (d, s) in enumerate(zip(dsts, srcs))]


def records(cuda, stream="copy"):
    return [c for c in cuda.calls if c[0] == "record" and c[2] == stream]


@pytest.mark.parametrize("batched", [True, False])
def test_a_batch_costs_one_event_one_timing_pair_and_its_copies_in_order(batched):
    cuda = StubCuda(batched=batched)
    link = CudaLink("cuda", runtime=cuda)
    assert link.copy_path == ("cudaMemcpyBatchAsync" if batched else "copy_ loop")
    srcs, dsts = rows(8)
    after = link.compute_done("layer 1")
    cuda.calls.clear()
    tickets = link.copy(batch_items(srcs, dsts), after=after)
    expect = [(d.data_ptr(), s.data_ptr(), 1024) for d, s in zip(dsts, srcs)]
    kinds = [c[0] for c in cuda.calls if c[0] != "event"]
    if batched:
        assert kinds == ["wait", "record", "batch", "record", "record"]
        assert cuda.only("batch") == [("batch", "copy", tuple(expect))]
    else:
        assert kinds == ["wait", "record", "on"] + ["copy"] * 8 + ["record", "record"]
        assert [c[1:] for c in cuda.only("copy")] == expect
    assert cuda.only("wait") == [("wait", "copy", after.n)], "the copy stream waits for the compute once"
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs))
    # one ticket per copy, all the batch's: its event is the last thing recorded on the copy stream
    assert len(tickets) == 8 and all(t is tickets[0] for t in tickets) and isinstance(tickets[0], CudaBatch)
    assert records(cuda)[-1][1] == tickets[0].done.n
    assert link.stats.transfers == 8 and link.stats.bytes == 8 * 1024


def test_later_batches_reuse_the_timing_pair_and_make_one_event_each():
    cuda = StubCuda()
    link = CudaLink("cuda", runtime=cuda)
    srcs, dsts = rows(4)
    cuda.calls.clear()
    for k in range(5):
        link.copy(batch_items(srcs, dsts, f"b{k}-"))
    created = cuda.only("event")
    assert [timing for _, _, timing in created].count(False) == 5, "one (non-timing) event per batch"
    assert [timing for _, _, timing in created].count(True) == 2, "one timing pair, reused from the pool"
    assert len(records(cuda)) == 3 * 5 and len(cuda.only("batch")) == 5


def test_byte_views_are_made_once_per_tensor():
    cuda = StubCuda(batched=False)
    link = CudaLink("cuda", runtime=cuda)
    srcs, dsts = rows(3)
    link.copy(batch_items(srcs, dsts))
    views = {k: v[3] for k, v in link._views.items()}
    assert len(views) == 6
    link.copy(batch_items(srcs[::-1], dsts))
    assert {k: v[3] for k, v in link._views.items()} == views and all(
        link._views[k][3] is v for k, v in views.items()
    ), "a second batch over the same rows made new views"
    assert torch.equal(dsts[0], srcs[2])


def test_a_batch_lands_when_its_event_completes_and_compute_waits_once_per_batch():
    cuda = StubCuda()
    link = CudaLink("cuda", runtime=cuda)
    srcs, dsts = rows(4)
    cuda.stuck = True  # the copies stay in flight
    a = link.copy(batch_items(srcs[:2], dsts[:2]))
    b = link.copy(batch_items(srcs[2:], dsts[2:]))
    assert not link.landed(a[0]) and link.ready(a[0])  # ready: the GPU orders compute after it
    cuda.calls.clear()
    link.wait(a + b)
    assert [c[2] for c in cuda.only("wait")] == [a[0].done.n, b[0].done.n]
    assert {c[1] for c in cuda.only("wait")} == {"compute"}
    assert [c[2] for c in cuda.only("record")] == ["compute", "compute"], "one stall timing pair per wait"
    a[0].done.left = b[0].done.left = 0  # the copy stream catches up
    assert link.landed(a[0]) and link.landed(b[1])
    cuda.calls.clear()
    link.wait(a)  # landed: nothing to wait for
    assert cuda.calls == []


def test_a_capped_link_paces_each_chunk_and_never_batches():
    cuda = StubCuda(batched=True)
    pace = pacing.Pacing(peak_gbps=50.0, cap_gbps=25.0, spin_hz=1e9, chunk_bytes=512)
    link = CudaLink("cuda", runtime=cuda, pacing=pace)
    assert link.copy_path == "copy_ per chunk, paced"
    srcs, dsts = rows(2)  # 1024 bytes each: two chunks
    cuda.calls.clear()
    link.copy(batch_items(srcs, dsts))
    issued = [c for c in cuda.calls if c[0] in ("copy", "sleep", "batch")]
    spin = pace.spin_cycles(512)
    assert spin > 0 and [c[0] for c in issued] == ["copy", "sleep"] * 4
    assert [c[1] - d.data_ptr() for c, d in zip(issued[::2], [dsts[0], dsts[0], dsts[1], dsts[1]])] == [
        0,
        512,
    ] * 2
    assert all(c[1] == spin for c in issued[1::2])
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs))


def test_demand_copies_go_on_the_stream_before_held_speculative_ones():
    cuda = StubCuda(delay=2)
    link = CudaLink("cuda", runtime=cuda, priority="demand", chunk_bytes=512)
    (ds, xs), (dd, xd) = rows(2, seed=1), rows(2, seed=2)
    link.copy([(dd[0], ds[0], "demand 0")])
    spec = link.copy([(xd[0], xs[0], "spec 0"), (xd[1], xs[1], "spec 1")], speculative=True)
    assert all(t.held for t in spec) and not cuda.only("copy")
    cuda.calls.clear()
    link.copy([(dd[1], ds[1], "demand 1")])  # arrives while the prefetches wait on the host
    assert [c[2][0][0] for c in cuda.only("batch")] == [dd[1].data_ptr()] and not cuda.only("copy")
    for _ in range(4):
        link.pump()  # the demand batch's event completes: chunks go
    chunks = cuda.only("copy")
    assert chunks and chunks[0][1] == xd[0].data_ptr(), (
        "the held copies start once the demand copies are done"
    )
    assert len(chunks) < 4, "depth 1: at most one chunk per completed event"
    link.promote(spec[1])  # demanded: all its chunks at once, in order
    tail = [
        c[1] - xd[1].data_ptr()
        for c in cuda.only("copy")
        if xd[1].data_ptr() <= c[1] < xd[1].data_ptr() + 1024
    ]
    assert tail == [0, 512] and not spec[1].held
    link.finish()
    assert all(torch.equal(d, s) for d, s in zip(xd + dd, xs + ds))


def test_a_demand_copy_into_a_held_slot_issues_the_held_copy_first():
    cuda = StubCuda()
    cuda.stuck = True  # nothing drains: held copies stay held until forced
    link = CudaLink("cuda", runtime=cuda, priority="demand", chunk_bytes=512)
    (a, b), (slot, other) = rows(2, seed=3)
    link.copy([(other, b, "demand elsewhere")])
    (held,) = link.copy([(slot, a, "prefetch into slot")], speculative=True)
    cuda.calls.clear()
    link.copy([(slot, b, "demand into slot")])
    order = [c[0] for c in cuda.calls if c[0] in ("copy", "batch")]
    assert order == ["copy", "copy", "batch"] and not held.held
    assert torch.equal(slot, b), "the later copy's bytes are the slot's"


def test_close_refuses_later_copies_and_names_the_last_copy_when_the_stream_hangs():
    cuda = StubCuda()
    link = CudaLink("cuda", runtime=cuda, close_timeout_s=0.02)
    srcs, dsts = rows(2)
    link.copy(batch_items(srcs, dsts, "layer 3 expert "))
    cuda.stuck = True
    with pytest.raises(
        LinkTimeout,
        match=r"closing the link.*layer 3 expert 1 \(1024 bytes\), last of a "
        r"batch of 2",
    ):
        link.close()
    assert {id(t) for t in cuda_link._QUARANTINE} >= {id(d) for d in dsts}, "undrained slots are kept alive"
    cuda_link._QUARANTINE.clear()
    cuda.calls.clear()
    with pytest.raises(LinkClosed, match="copy on a closed link"):
        link.copy(batch_items(srcs, dsts))
    link.close()  # idempotent
    assert cuda.calls == [], "a closed link issues nothing"


@pytest.mark.parametrize(
    "items, error",
    [
        ([(torch.zeros(4), torch.zeros(4))], r"copy 0 of the batch is not a \(dst, src, label\) triple"),
        ([(torch.zeros(4), [0.0] * 4, "e7")], r"copy 0 \(e7\): its source is a list, not a tensor"),
        (
            [(torch.zeros(4, 4).t(), torch.zeros(16), "e8")],
            r"copy 0 \(e8\): its destination is not contiguous",
        ),
        ([(torch.zeros(3), torch.zeros(4), "e9")], r"copy e9 \(16 bytes\): its destination holds 12 bytes"),
        ([(torch.zeros(0), torch.zeros(0), "e10")], r"copy e10 \(0 bytes\): its destination holds 0 bytes"),
    ],
)
def test_bad_input_gets_a_one_line_error_that_names_it(items, error):
    cuda = StubCuda()
    link = CudaLink("cuda", runtime=cuda)
    with pytest.raises((TypeError, ValueError), match=error) as e:
        link.copy(items)
    assert "\n" not in str(e.value) and link.stats.transfers == 0 and not cuda.only("batch", "copy")


def test_bad_construction_is_refused_in_one_line():
    with pytest.raises(ValueError, match="CudaLink copies to a cuda device, got cpu"):
        CudaLink("cpu", runtime=StubCuda())
    with pytest.raises(ValueError, match="bandwidth cap must be > 0 GB/s, got -1"):
        CudaLink("cuda", runtime=StubCuda(), cap_gbps=-1)

    class NoGpu(StubCuda):
        def is_available(self):
            return False

    with pytest.raises(RuntimeError, match="--link cuda needs a CUDA GPU"):
        CudaLink("cuda", runtime=NoGpu())


def test_the_batched_copy_probe_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(NO_BATCH_ENV, "1")
    assert probe_memcpy_batch(torch.device("cuda", 0)) == (None, f"{NO_BATCH_ENV} is set")


def test_both_links_have_the_whole_protocol_and_link_py_imports_neither_cuda_link_nor_the_factory():
    for name in ("copy", "landed", "promote", "ready", "wait", "compute_done", "pump", "finish", "close"):
        assert (
            hasattr(Link, name)
            and callable(getattr(EmulatedLink, name))
            and callable(getattr(CudaLink, name))
        )
    imported = {
        n.module
        for n in ast.walk(ast.parse(Path(link_mod.__file__).read_text()))
        if isinstance(n, ast.ImportFrom)
    }
    assert not imported & {"artifact.offload.links.cuda_link", "artifact.offload.links.link_factory"}, (
        imported
    )
    for name in ("CudaLink", "wait_event", "make_link", "Pacing", "calibrate_rate"):  # no re-exports
        assert not hasattr(link_mod, name), name
    link = CudaLink("cuda", runtime=StubCuda())
    (t,) = link.copy([(torch.zeros(4), torch.ones(4), "x")])
    link.promote(t)  # a batch ticket: nothing held, nothing to do
    link.pump()
    assert link.landed(t)


def test_the_batched_copy_probe_orders_its_copies_after_the_destination_is_filled():
    """The self-test's stream waits for the current stream (where the destination was zero-filled) before
    the batch: without that wait the zero fill could land after the copies on a GPU."""
    cuda = StubCuda()
    issue, note = probe_memcpy_batch(torch.device("cpu"), lib=StubCudart(cuda), runtime=cuda)
    assert issue is not None and note == "cudaMemcpyBatchAsync (CUDA runtime 12080)"
    calls = cuda.only("wait_stream", "batch", "sync_stream")
    assert [c[0] for c in calls] == ["wait_stream", "batch", "sync_stream"]
    assert calls[0][1:] == ("copy", "compute") and calls[1][1] == "copy"


@pytest.mark.parametrize("version", [12080, 13000])
def test_a_failed_batched_copy_clears_the_runtimes_last_error(version):
    """A failed cudaMemcpyBatchAsync leaves its error as the runtime's last error, which the next unrelated
    CUDA call would report: the probe and the bound call both clear it (cudaGetLastError) before they say
    so."""
    cuda = StubCuda()
    lib = StubCudart(cuda, version=version, fail=700)
    issue, note = probe_memcpy_batch(torch.device("cpu"), lib=lib, runtime=cuda)
    assert (
        issue is None
        and "self-test failed: cudaMemcpyBatchAsync of 2 copies failed with CUDA error 700" in note
    )
    assert lib.last_error == 0 and ("last_error", 700) in cuda.calls
    lib.fail = 0
    issue, _ = probe_memcpy_batch(torch.device("cpu"), lib=lib, runtime=cuda)
    lib.fail = 1
    with pytest.raises(RuntimeError, match="of 1 copies failed with CUDA error 1"):
        issue([0], [0], [4], cuda.compute)
    assert lib.last_error == 0
