"""forward "segmented" on the CPU: what the CUDA capture path must get right, checked without a GPU.

The host counts buffers are sized per MoE layer and the CPU goes through them; a capture that fails (injected
through a stub of the capture API, capture.CudaCapture's methods) leaves the capture stream, is recorded once
for the model and turns capture off for every shape; a forward whose options forbid capture never captures;
a new engine reuses the model's slot tensors; and the capture linter names the op and the segment of what a
CUDA graph could not capture or replay."""

from __future__ import annotations

import contextlib

import pytest
import torch

from artifact.model.capture import LintError
from artifact.model.decode import DecodeConfig, generate
from artifact.model.kv_cache import KVCache
from artifact.model.options import ForwardOptions
from artifact.model.routing import StepInfo
from artifact.model.segments import Programs, programs
from artifact.offload.backend.engine import offload
from artifact.offload.links.link_factory import make_link
from artifact.offload.policy.policies import make_policy
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

PROMPTS = [[11, 12, 13] * 5, [14, 15] * 20]
DC = DecodeConfig(gen_length=32)


class StubCapture:
    """The capture API's methods, on the CPU: graphs are never run (a stub graph replays nothing), so a test
    that uses it checks only paths where no graph is replayed. `fail` makes capture_end raise."""

    def __init__(self, fail: str | None = None):
        self.fail = fail
        self.calls: list[str] = []
        self.stream_depth = 0  # > 0 while inside use_stream

    def graph(self):
        self.calls.append("graph")
        return object()

    def stream(self, device):
        self.calls.append("stream")
        return "capture stream"

    def current_stream(self, device):
        return "current stream"

    @contextlib.contextmanager
    def use_stream(self, stream):
        assert stream == "capture stream"
        self.calls.append("enter stream")
        self.stream_depth += 1
        try:
            yield
        finally:
            self.stream_depth -= 1
            self.calls.append("exit stream")

    def wait_stream(self, waiter, stream):
        self.calls.append(f"{waiter} waits {stream}")

    def synchronize(self):
        pass

    def begin(self, graph, pool):
        self.calls.append("begin")

    def end(self, graph):
        self.calls.append("end")
        if self.fail:
            raise RuntimeError(self.fail)

    def pool(self, graph):
        return "pool"

    def replay(self, graph):
        self.calls.append("replay")


@contextlib.contextmanager
def programs_of(model, api=None, lint=None):
    """The model's programs replaced by fresh ones (with this capture API and linter setting) for the
    block."""
    saved = model.programs
    model.programs = Programs(api=api, lint=lint)
    try:
        yield model.programs
    finally:
        model.programs = saved


def test_prediction_runs_segmented_through_host_buffers_sized_per_layer(tiny):
    """A recorded run (the cross-layer prediction on) segmented equals it eager; each MoE layer's host buffer
    has its own counts' size ((2E,) with a next router, (E,) for the last MoE layer), and the CPU fills it."""
    with programs_of(tiny.model) as progs:
        eager = decode_prompts(tiny, PROMPTS, 2, RunSpec(decode=DC), record=True, record_logits=True)
        seg = decode_prompts(
            tiny, PROMPTS, 2, RunSpec(decode=DC, forward="segmented"), record=True, record_logits=True
        )
        assert seg.tokens == eager.tokens
        assert [d.predicted for d in seg.trace.demands] == [d.predicted for d in eager.trace.demands]
        (a,), (b,) = eager.generations, seg.generations
        assert all(torch.equal(a.step_logits[k], b.step_logits[k]) for k in a.step_logits)
        E = tiny.cfg.num_experts
        for prog in progs.values():
            widths = [h.shape[0] for h in prog.host]
            assert widths == [2 * E] * (len(prog.moe) - 1) + [E], widths
            for i, h in enumerate(prog.host):
                assert h.shape == prog.st[f"counts{i}"].shape and torch.equal(h, prog.st[f"counts{i}"])


def decode_steps(model, opts, n_steps: int, batch: int = 1, cache=None):
    """A prefill then n_steps denoising forwards of one block over a KV cache (one program)."""
    cfg, n = model.cfg, model.cfg.block_length
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(8, cfg.vocab_size - 8, (batch, n), generator=g)
    cache = cache or KVCache(cfg, batch, 4 * n, "cpu", torch.float32)
    model(
        ids,
        torch.arange(n).expand(batch, n),
        cache=cache,
        commit=n,
        logits_rows=slice(0, 0),
        options=opts,
        step=StepInfo(0, -1, -1, "prefill"),
    )
    out = []
    for s in range(n_steps):
        out.append(
            model(
                ids,
                torch.arange(n, 2 * n).expand(batch, n),
                cache=cache,
                logits_rows=slice(0, n),
                options=opts,
                step=StepInfo(1 + s, 0, s, "denoise"),
            )
        )
    return out


def test_a_failed_capture_leaves_the_stream_is_recorded_once_and_turns_capture_off(tiny):
    stub = StubCapture(fail="operation not permitted when stream is capturing")
    opts = ForwardOptions("segmented")
    ref = decode_steps(tiny.model, ForwardOptions(), 3)
    with (
        programs_of(tiny.model, api=stub, lint=False) as progs,
        pytest.warns(UserWarning, match="capture is off"),
    ):
        got = decode_steps(tiny.model, opts, 3)  # warm-up, failed capture, eager
        assert all(torch.equal(a, b) for a, b in zip(ref, got))
        assert stub.stream_depth == 0 and stub.calls.count("enter stream") == stub.calls.count("exit stream")
        assert stub.calls.count("begin") == stub.calls.count("end") == 1  # one capture tried, of segment 0
        assert "replay" not in stub.calls
        error = progs.counts.capture_error
        assert error.startswith("capture of segment 0 failed: RuntimeError: operation not permitted"), error
        # Another shape (batch 2: a new program) does not try again: everything runs eagerly, counted.
        before = list(stub.calls)
        eager_before = progs.counts.eager
        decode_steps(tiny.model, opts, 2, batch=2)
        assert "begin" not in stub.calls[len(before) :] and progs.counts.eager > eager_before
        assert progs.counts.capture_error == error  # recorded once
        res = decode_prompts(tiny, PROMPTS[:1], 1, RunSpec(decode=DC, forward="segmented"))
        assert res.segments.capture_error == error and res.segments.replays == 0 and not res.segments.replayed
        assert res.segments.eager > 0 and "begin" not in stub.calls[len(before) :]


def test_a_failed_capture_names_the_op_the_linter_finds(tiny, monkeypatch):
    """A host read planted in segment 0 (the linter off for the warm-up, as on CUDA): the capture's error
    names the op and the segment."""
    layer = tiny.model.model.layers[tiny.cfg.moe_layers[0]].mlp
    start = layer.start

    def reads_the_host(h, pair_valid, predict_next):
        h.abs().max().item()
        return start(h, pair_valid, predict_next)

    monkeypatch.setattr(layer, "start", reads_the_host)
    stub = StubCapture(fail="operation not permitted when stream is capturing")
    with programs_of(tiny.model, api=stub, lint=False) as progs, pytest.warns(UserWarning):
        decode_steps(tiny.model, ForwardOptions("segmented"), 2)
    assert "segment 0: _local_scalar_dense (a host read)" in progs.counts.capture_error


def test_warm_up_runs_on_the_capture_stream_and_a_no_capture_forward_never_captures(tiny):
    stub = StubCapture()
    with programs_of(tiny.model, api=stub, lint=False) as progs:
        decode_steps(tiny.model, ForwardOptions("segmented", capture=False), 3)
        assert stub.calls == [] and progs.counts.eager > 0 and progs.counts.captures == 0
        # a timed run
        res = decode_prompts(tiny, PROMPTS[:1], 1, RunSpec(decode=DC, forward="segmented", capture=False))
        assert (
            stub.calls == [] and res.segments.captures == res.segments.replays == 0 and res.segments.eager > 0
        )
    stub = StubCapture()
    with programs_of(tiny.model, api=stub, lint=False):
        decode_steps(tiny.model, ForwardOptions("segmented"), 1)  # the warm-up only
    assert "begin" not in stub.calls and stub.calls[:3] == [
        "stream",
        "capture stream waits current stream",
        "enter stream",
    ]
    assert stub.calls[-1] == "current stream waits capture stream" and stub.stream_depth == 0


def test_a_new_engine_gets_the_slot_tensors_of_the_last(tiny):
    cfg = tiny.cfg

    def engine(capacity):
        pol = make_policy("demand", len(cfg.moe_layers), cfg.num_experts, engine=True)
        return offload(tiny.model, tiny.experts, capacity, pol, make_link("emulated", bandwidth_gbps=1000.0))

    a, b = engine(6), engine(6)
    assert all(a.slots[m].data_ptr() == b.slots[m].data_ptr() for m in cfg.moe_layers)
    c = engine(8)  # another capacity: its own slots, the old ones freed
    assert all(c.slots[m].shape[0] == 8 for m in cfg.moe_layers)
    assert len(tiny.model.slot_pool.tensors) == len(cfg.moe_layers)


# --- the capture linter (on for every segmented forward on the CPU) ------------------------------------
def test_the_linter_names_a_host_read_planted_in_a_segment(tiny, monkeypatch):
    layer = tiny.model.model.layers[tiny.cfg.moe_layers[1]].mlp
    start = layer.start

    def reads_the_host(h, pair_valid, predict_next):
        h.abs().max().item()
        return start(h, pair_valid, predict_next)

    monkeypatch.setattr(layer, "start", reads_the_host)
    with (
        programs_of(tiny.model),
        pytest.raises(
            LintError,
            match=r"^segment 1: _local_scalar_dense \(a host "
            r"read\)",
        ),
    ):
        decode_steps(tiny.model, ForwardOptions("segmented"), 1)


def test_the_linter_names_a_host_buffer_of_another_size(tiny):
    """The mismatch of a (2E,) buffer for the last MoE layer's (E,) counts."""
    E, last = tiny.cfg.num_experts, len(tiny.cfg.moe_layers) - 1
    cache = KVCache(tiny.cfg, 1, 4 * tiny.cfg.block_length, "cpu", torch.float32)  # one program
    with programs_of(tiny.model) as progs:
        decode_steps(tiny.model, ForwardOptions("segmented", predict_next=True), 1, cache=cache)
        (prog,) = progs.values()
        prog.host[last] = torch.zeros(2 * E, dtype=torch.long)
        with pytest.raises(
            LintError,
            match=rf"^segment {last}: MoE layer {tiny.cfg.moe_layers[last]}'s "
            r"counts to "
            rf"the host: copy_ \(a copy from shape \({E},\) into shape "
            rf"\({2 * E},\)\)",
        ):
            decode_steps(tiny.model, ForwardOptions("segmented", predict_next=True), 1, cache=cache)


def test_the_linter_names_an_allocation_that_changes_between_runs(tiny, monkeypatch):
    layer = tiny.model.model.layers[tiny.cfg.moe_layers[0]].mlp
    finish, calls = layer.finish, []

    def grows(x_res, ys, w, shared):
        calls.append(1)
        torch.zeros(len(calls))  # sized by a host count that changes run to run
        return finish(x_res, ys, w, shared)

    monkeypatch.setattr(layer, "finish", grows)
    with (
        programs_of(tiny.model),
        pytest.raises(
            LintError,
            match=r"^segment 1: zeros \(output shapes "
            r"\(\(3,\),\) "
            r"differ from \(\(2,\),\) in the captured "
            r"run\)",
        ),
    ):
        decode_steps(tiny.model, ForwardOptions("segmented"), 3)  # run 2 is captured, run 3 replays it


def test_a_segmented_generate_runs_under_the_linter(tiny):
    """The linter is on by default on the CPU: whole decodes pass it (resident and offloaded)."""
    cfg = tiny.cfg
    pol = make_policy("last_step", len(cfg.moe_layers), cfg.num_experts, engine=True)
    engine = offload(tiny.model, tiny.experts, 12, pol, make_link("emulated", bandwidth_gbps=1000.0))
    with programs_of(tiny.model) as progs:
        assert progs.lint is None  # None: on, as the device is the CPU
        a = generate(tiny.model, PROMPTS, DC, options=ForwardOptions("segmented", backend=engine))
        b = generate(tiny.model, PROMPTS, DC, options=ForwardOptions("eager", backend=engine))
        assert a.tokens == b.tokens
        progs_run = list(programs(tiny.model).values())
        assert all(p.lint for p in progs_run) and any(p.lint_shapes for p in progs_run)
    engine.finish()
