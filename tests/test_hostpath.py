"""The host path of an MoE layer: grouped expert compute equal to the per-expert loop, offloaded equal
to resident for every engine policy with the grouped kernel, the pacing arithmetic of the capped link,
bounded waits, the fp32 router bias, and the capacity refusal."""

import dataclasses
import shutil

import pytest
import torch

from artifact.model.checkpoint import load_checkpoint
from artifact.model.config import get_preset
from artifact.model.decode import DecodeConfig
from artifact.model.experts import HAS_GROUPED_MM, ExpertGroup, grouped_ffn, stack_views
from artifact.model.tiny import random_model, save_checkpoint, state_tensors, tiny_checkpoint
from artifact.offload.backend.store import check_slots_fit, non_expert_bytes
from artifact.offload.links.cuda_runtime import wait_event
from artifact.offload.links.link import EmulatedLink, LinkTimeout
from artifact.offload.links.pacing import Pacing, calibrate_rate
from artifact.offload.policy.policies import POLICIES
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

DC = DecodeConfig(gen_length=32)
FAST_LINK = 1000.0  # GB/s: exactness does not depend on the link's speed, and the tests run faster


# --- grouped == loop ----------------------------------------------------------------------------
def random_group(cfg, G, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randn(G, cfg.expert_params, generator=g).to(dtype) * cfg.hidden_size**-0.5  # (G, P)
    gate_up, down = stack_views(packed, cfg)
    rows = sorted(torch.randperm(G, generator=g)[: max(1, G - 2)].tolist())
    counts = [0] * G
    for r in rows:
        counts[r] = int(torch.randint(0, 9, (1,), generator=g))  # empty members too
    spans, start = [], 0
    for r in rows:
        spans.append((r, start, start + counts[r]))
        start += counts[r]
    offsets = torch.tensor(counts).cumsum(0).tolist()
    xs = torch.randn(start, cfg.hidden_size, generator=g).to(dtype)
    return xs, ExpertGroup(tuple(rows), tuple(rows), gate_up, down), spans, offsets


@pytest.mark.skipif(
    not HAS_GROUPED_MM, reason="this torch has no torch._grouped_mm (the loop is the fallback)"
)
@pytest.mark.parametrize("shape", ["tiny", "mini-width"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_kernel_equals_the_loop_bit_for_bit(shape, dtype):
    cfg = (
        get_preset("tiny")
        if shape == "tiny"
        else dataclasses.replace(get_preset("llada2-mini"), num_hidden_layers=2, name="mini-width")
    )
    G = 24 if shape == "tiny" else 4
    for seed in range(3):
        xs, group, spans, offsets = random_group(cfg, G, seed, dtype)
        a = grouped_ffn(xs, group, spans, offsets, "grouped")
        b = grouped_ffn(xs, group, spans, offsets, "loop")
        assert a.shape == (xs.shape[0], cfg.hidden_size)
        assert torch.equal(a, b), (shape, dtype, seed, (a.float() - b.float()).abs().max())


def test_model_grouped_equals_loop_and_rejects_unknown_kernels(tiny, tiny_prompts):
    from artifact.errors import SettingError
    from artifact.model.options import ForwardOptions

    model = tiny.model
    ids = torch.tensor([tiny_prompts[4][:40], tiny_prompts[2][:40]])  # (2, 40)
    pos = torch.arange(40).expand(2, 40)
    assert ForwardOptions().expert_kernel == RunSpec().expert_kernel == "grouped"
    grouped = model(ids, pos)
    assert torch.equal(model(ids, pos, options=ForwardOptions(expert_kernel="loop")), grouped)
    assert not hasattr(model, "expert_kernel") and not hasattr(model.routing, "expert_kernel")  # options only
    with pytest.raises(
        SettingError,
        match=r"unknown expert_kernel 'fused'; choose one of \('grouped', "
        r"'loop'\)",
    ):
        ForwardOptions(expert_kernel="fused")
    with pytest.raises(SettingError, match="unknown expert_kernel 'fused'"):
        RunSpec(decode=DC, expert_kernel="fused")


# --- offloaded == resident for every engine policy, grouped kernel ---------------------------------
@pytest.fixture(scope="module")
def reference(tiny, tiny_prompts):
    return decode_prompts(tiny, tiny_prompts[:2], 2, RunSpec(decode=DC), record=True, record_logits=True)


def same_bits(a, b):
    return a.tokens == b.tokens and all(
        x.step_logits.keys() == y.step_logits.keys()
        and all(torch.equal(x.step_logits[k], y.step_logits[k]) for k in y.step_logits)
        for x, y in zip(a.generations, b.generations)
    )


@pytest.mark.parametrize("policy", [p for p, spec in POLICIES.items() if spec.engine_ok])
def test_offloaded_equals_resident_for_every_policy_and_capacity(tiny, tiny_prompts, reference, policy):
    from artifact.offload.replay.trace import mean_working_set

    W = mean_working_set(reference.trace)
    below_w = max(2, int(W * 0.5))
    for capacity in (1, below_w, tiny.cfg.num_experts):
        spec = RunSpec(decode=DC, capacity=capacity, policy=policy, link_gbps=FAST_LINK)
        off = decode_prompts(
            tiny,
            tiny_prompts[:2],
            2,
            spec,
            record_logits=True,
            oracle=reference.trace if POLICIES[policy].needs_trace else None,
        )
        assert same_bits(off, reference), (policy, capacity)
        assert off.stats.demand_misses > 0


def test_offloaded_loop_kernel_equals_resident_grouped(tiny, tiny_prompts, reference):
    """The kernel travels in the run's options (RunSpec.expert_kernel), not on the model."""
    spec = RunSpec(decode=DC, expert_kernel="loop", capacity=12, policy="demand", link_gbps=FAST_LINK)
    off = decode_prompts(tiny, tiny_prompts[:2], 2, spec, record_logits=True)
    assert same_bits(off, reference) and off.stats.demand_misses > 0


def test_engine_groups_hits_first_then_misses_as_they_land(tiny, tiny_prompts):
    """Groups never hold one slot twice, the first group is the resident hits, and every demanded
    expert is computed exactly once."""
    from artifact.offload.backend.engine import install, offload
    from artifact.offload.links.link_factory import make_link
    from artifact.offload.policy.policies import make_policy

    cfg = tiny.cfg
    seen = []
    eng = offload(
        tiny.model,
        tiny.experts,
        8,
        make_policy("demand", len(cfg.moe_layers), cfg.num_experts),
        make_link("emulated", bandwidth_gbps=FAST_LINK),
    )
    assert tiny.model.backend is not eng  # offload leaves the model as it is
    saved = install(tiny.model, eng)  # a step of its own
    try:
        inner = eng.groups

        def spy(demand):
            groups = []
            for g in inner(demand):
                groups.append(g)
                yield g
            seen.append((demand, groups))

        eng.groups = spy
        ids = torch.tensor([tiny_prompts[4][:40]])
        for _ in range(2):  # the second pass has hits
            tiny.model(ids, torch.arange(40)[None])
    finally:
        assert install(tiny.model, saved) is eng
    waves = 0
    for demand, groups in seen:
        computed = [e for g in groups for e in g.experts]
        assert sorted(computed) == list(demand.experts)
        for g in groups:
            assert len(set(g.rows)) == len(g.rows) and list(g.rows) == sorted(g.rows)
            assert all(0 <= r < 8 for r in g.rows)
        waves += len(demand.experts) > 8
    assert waves > 0


# --- pacing: GPU-timeline arithmetic, run on a simulated copy engine -----------------------------
class Timeline:
    """A copy stream simulated on the CPU: chunks copy at `peak` GB/s, spins last cycles / hz."""

    def __init__(self, peak_gbps: float, hz: float):
        self.t, self.peak, self.hz = 0.0, peak_gbps, hz

    def run(self, pacing: Pacing, nbytes: int) -> None:
        for a, b, spin in pacing.schedule(nbytes):
            self.t += (b - a) / (self.peak * 1e9) + spin / self.hz


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("chunk", [None, 1 << 20])
def test_capped_rate_holds_on_the_gpu_timeline(fraction, chunk):
    peak, hz = 50.0, 1.98e9
    tl = Timeline(peak, hz)
    pacing = Pacing(peak_gbps=peak, cap_gbps=peak * fraction, spin_hz=hz, chunk_bytes=chunk)
    nbytes = 6 * 2**20
    for _ in range(20):
        tl.run(pacing, nbytes)
    achieved = 20 * nbytes / tl.t / 1e9
    assert achieved == pytest.approx(peak * fraction, rel=1e-3)


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75, 0.9])
def test_feedback_holds_the_cap_when_calibration_was_off(fraction):
    """Expert-sized copies at 40 GB/s where calibration measured 50, and a spin clock 15% slower than
    calibrated: open-loop pacing misses the cap, the feedback from each batch's GPU time brings it back."""
    true_peak, true_hz = 40.0, 1.7e9
    pacing = Pacing(peak_gbps=50.0, cap_gbps=true_peak * fraction, spin_hz=2.0e9)
    nbytes = 8 * 6 * 2**20  # one batch: 8 mini experts
    achieved = []
    for _ in range(30):
        tl = Timeline(true_peak, true_hz)
        tl.run(pacing, nbytes)
        achieved.append(nbytes / tl.t / 1e9)
        pacing = pacing.observed(nbytes, tl.t)
    target = true_peak * fraction
    assert abs(achieved[0] / target - 1) > 0.03  # open loop: off
    assert achieved[-1] == pytest.approx(target, rel=0.01)  # closed loop: on the cap
    assert all(a == pytest.approx(target, rel=0.02) for a in achieved[-10:])


def test_the_capped_path_is_the_uncapped_path_with_pacing():
    uncapped = Pacing(peak_gbps=50.0, cap_gbps=None, spin_hz=1e9, chunk_bytes=1 << 20)
    capped = Pacing(peak_gbps=50.0, cap_gbps=12.5, spin_hz=1e9, chunk_bytes=1 << 20)
    n = 6 * 2**20 + 123
    assert [c[:2] for c in uncapped.schedule(n)] == [c[:2] for c in capped.schedule(n)]  # same copies
    assert all(spin == 0 for *_, spin in uncapped.schedule(n))
    assert all(spin > 0 for *_, spin in capped.schedule(n))
    at_peak = Pacing(peak_gbps=50.0, cap_gbps=80.0, spin_hz=1e9)  # a cap above the peak
    assert at_peak.spin_cycles(n) == 0
    with pytest.raises(ValueError, match="cap must be > 0"):
        Pacing(peak_gbps=50.0, cap_gbps=0.0)
    with pytest.raises(ValueError, match="peak > 0"):
        Pacing(peak_gbps=0.0)


def test_calibration_reads_the_rate_off_an_injected_clock():
    clock = [0.0]
    rate = 2.0e9  # units per second

    def work(units):
        clock[0] += units / rate + 1e-6 * (units == 7)  # the warm-up is never timed

    assert calibrate_rate(work, lambda: clock[0], 10_000_000) == pytest.approx(rate, rel=1e-9)
    with pytest.raises(RuntimeError, match="did not advance"):
        calibrate_rate(lambda n: None, lambda: 0.0, 10)


# --- bounded waits ----------------------------------------------------------------------------
class NeverDone:
    def query(self):
        return False


def test_a_stuck_copy_raises_a_timeout_that_names_it():
    t = [0.0]

    def sleep(dt):
        t[0] += dt

    with pytest.raises(
        LinkTimeout,
        match=r"copy layer 3 expert 17 -> slot 5 \(24576 bytes\) did not "
        r"complete "
        r"within 2 s",
    ):
        wait_event(
            NeverDone(),
            2.0,
            "copy layer 3 expert 17 -> slot 5 (24576 bytes)",
            clock=lambda: t[0],
            sleep=sleep,
        )
    assert 2.0 < t[0] < 2.01


def test_emulated_wait_past_its_timeout_raises_instead_of_sleeping():
    link = EmulatedLink(bandwidth_gbps=1e-6, latency_us=0, timeout_s=5.0)  # 1 kB/s: 400 kB take 400 s
    x = torch.zeros(100_000)
    (ticket,) = link.copy([(torch.empty_like(x), x, "layer 1 expert 2 -> slot 0")])
    with pytest.raises(LinkTimeout, match="copy layer 1 expert 2 -> slot 0 .400000 bytes. lands in"):
        link.wait([ticket])


def test_emulated_sleep_never_gets_a_negative_argument():
    now = [0.0]
    slept = []

    def sleep(dt):
        assert dt >= 0, dt
        slept.append(dt)
        now[0] += dt + 2e-4  # sleep overshoots

    link = EmulatedLink(bandwidth_gbps=0.01, latency_us=0, clock=lambda: now[0], sleep=sleep)
    x = torch.zeros(10_000)  # 40 kB at 10 MB/s: 4 ms
    link.wait(link.copy([(torch.empty_like(x), x, "a")]))
    assert slept and now[0] >= 4e-3


# --- memory that fits real checkpoints ----------------------------------------------------------
def test_expert_bias_stays_fp32_bit_for_bit_from_the_checkpoint(tiny, tmp_path):
    tensors = state_tensors(tiny.model, tiny.experts)
    g = torch.Generator().manual_seed(3)
    names = [n for n in tensors if n.endswith("expert_bias")]
    for n in names:  # values bf16 cannot hold: rounding would change their low bits
        tensors[n] = (torch.randn(tensors[n].shape, generator=g) * 0.01 + 1e-3).float()
        assert not torch.equal(tensors[n].bfloat16().float(), tensors[n])
    save_checkpoint(tmp_path, tiny.cfg, tensors)
    for f in tiny.path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tmp_path / f.name)
    loaded = load_checkpoint(tmp_path, dtype="bfloat16")
    buffers = dict(loaded.model.named_buffers())
    for n in names:
        assert buffers[n].dtype == torch.float32 and torch.equal(buffers[n], tensors[n]), n
    assert loaded.model.model.layers[1].attention.dense.weight.dtype == torch.bfloat16


def test_random_model_keeps_its_fp32_bias_in_bf16():
    cfg = dataclasses.replace(get_preset("tiny"), num_hidden_layers=2)
    a = random_model(cfg, seed=1, dtype="float32", resident=False)
    b = random_model(cfg, seed=1, dtype="bfloat16", resident=False)
    ba, bb = a.model.model.layers[1].mlp.gate.expert_bias, b.model.model.layers[1].mlp.gate.expert_bias
    assert bb.dtype == torch.float32 and torch.equal(ba, bb)


def test_a_capacity_whose_slots_do_not_fit_is_refused_with_the_numbers():
    flash = get_preset("llada2-flash")
    free = 140 * 10**9  # an H200's free memory, injected
    budget = check_slots_fit(flash, 150, torch.bfloat16, "cuda", free_bytes=free)
    assert budget["slot_bytes"] == 24 * 2**20 * 31  # 780 MB per slot across 31 layers
    assert 150 <= budget["max_capacity"] < 180
    with pytest.raises(ValueError) as e:
        check_slots_fit(flash, 200, torch.bfloat16, "cuda", free_bytes=free)
    msg = str(e.value)
    for words in (
        "cache capacity 200 does not fit",
        "200 slots x 780 MB",
        "31 MoE layers",
        "140.0 GB free",
        f"largest capacity that fits is {budget['max_capacity']}",
    ):
        assert words in msg, (words, msg)
    assert check_slots_fit(flash, 200, torch.bfloat16, "cpu") is None  # host memory: not this check's job
    loaded = check_slots_fit(
        flash, 150, torch.bfloat16, "cuda", free_bytes=free - non_expert_bytes(flash, 2), weights_loaded=True
    )  # the model already took its share
    assert loaded["max_capacity"] == budget["max_capacity"]
    assert non_expert_bytes(flash, 2) > 5 * 10**9


def test_load_checkpoint_refuses_the_capacity_before_reading_tensors(monkeypatch):
    import artifact.model.checkpoint as ck
    import artifact.model.memory as store

    monkeypatch.setattr(store.torch.cuda, "mem_get_info", lambda device=None: (2 * 10**9, 80 * 10**9))
    monkeypatch.setattr(
        ck, "TensorIndex", lambda *a, **k: pytest.fail("read the checkpoint despite the refusal")
    )
    with pytest.raises(ValueError, match=r"cache capacity 256 does not fit on cuda.* 2.0 GB free"):
        load_checkpoint(tiny_checkpoint(), device="cuda", capacity=256)
