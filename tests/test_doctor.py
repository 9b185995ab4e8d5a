"""`python -m artifact doctor`: the preflight reads the config, the safetensors headers and the tokenizer,
never a weight, and says before a run what a verdict costs (its first line), which cells will be host-bound,
how likely the design is to decide, and whether the profile's grid fits (device memory per batch size and C/W,
host memory, disk), or exits 2 naming what does not. `--shape` prices a published model with nothing
downloaded."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import statistics
from pathlib import Path

import pandas as pd
import pytest
from test_cli import one_line_error

import artifact.experiments.doctor as doctor
import artifact.model.checkpoint as checkpoint
from artifact.cli import main
from artifact.errors import CheckpointError
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.doctor import CONTEXT_BYTES, GB, DoctorError, check
from artifact.experiments.doctor.shapes import header_only_checkpoint
from artifact.experiments.settings import PROFILE_DIR, load_profile
from artifact.model.checkpoint import expected_shapes
from artifact.model.config import get_preset
from artifact.model.memory import non_expert_bytes
from artifact.offload.replay.sim import capacity_for

ROOT = Path(__file__).resolve().parents[1]
AE = ("h200_ae", "a5000_ae")
HEADLINE = re.compile(
    r"^a verdict: (\d+) runs x \((\d+\.\d+)-(\d+\.\d+) h\) = (\d+\.\d+)-(\d+\.\d+) GPU-hours"
)


@pytest.fixture
def quick(monkeypatch):
    """check() without the host-bound and power sections (each tested on its own below)."""
    monkeypatch.setattr(doctor, "host_shares", lambda *a: ([], []))
    monkeypatch.setattr(doctor, "power_lines", lambda *a: [])


@pytest.fixture
def mini4(tmp_path, monkeypatch):
    """LLaDA2.0-mini's shapes (hidden 2048, 256 experts of 3 x 512 x 2048, vocab 157184) with 4 layers."""
    cfg = dataclasses.replace(get_preset("llada2-mini"), num_hidden_layers=4)
    monkeypatch.setattr(checkpoint, "safe_open", lambda *a, **k: pytest.fail("the doctor read a weight"))
    return header_only_checkpoint(tmp_path / "mini4", cfg), cfg


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """LLaDA2.0-mini's shapes whole (20 layers, 19 MoE): the time estimate depends on the real layer count."""
    cfg = get_preset("llada2-mini")
    return header_only_checkpoint(tmp_path_factory.mktemp("ckpt") / "mini", cfg), cfg


@pytest.fixture
def roomy_host(monkeypatch):
    """A host with room for mini's 30.6 GB expert store, whatever this machine has."""
    monkeypatch.setattr(doctor, "_host_available", lambda: 256 * 10**9)
    monkeypatch.setattr(checkpoint, "safe_open", lambda *a, **k: pytest.fail("the doctor read a weight"))


@pytest.fixture(scope="module")
def ae_output() -> dict[str, str]:
    """What `python -m artifact doctor --profile NAME --shape llada2-mini` prints for each reviewer's profile
    on this machine, with nothing downloaded (each run once for the module)."""
    out = {}
    for profile in AE:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["doctor", "--profile", profile, "--shape", "llada2-mini"]) == 0
        out[profile] = buf.getvalue()
    return out


# --- the headline: what a verdict costs ---------------------------------------------------------------------
@pytest.mark.parametrize("profile", AE)
def test_a_reviewers_verdict_fits_two_gpu_hours_and_the_docs_say_what_doctor_prints(ae_output, profile):
    """The first line is the verdict's total: thresholds.MIN_RUNS runs x one run's range, whose upper end is
    within 2 GPU-hours; the profile's comment, the README's first screen and docs/usage.md quote it."""
    text = ae_output[profile]
    first = text.splitlines()[0]
    runs, lo, hi, total_lo, total_hi = HEADLINE.match(first).groups()
    assert int(runs) == thresholds.MIN_RUNS
    for one, total in ((lo, total_lo), (hi, total_hi)):  # each printed to 0.01 h
        assert abs(int(runs) * float(one) - float(total)) <= 0.005 * (int(runs) + 1)
    assert float(total_lo) < float(total_hi) <= 2.0, first
    assert "budget 3 x 24 min = 1.20 h: within" in first
    fit = next(x for x in text.splitlines() if x.startswith("5 runs fit 2 GPU-hours at the upper end"))
    assert 5 * float(hi) <= 2.0 and "04-faster at +4.9%" in fit, fit  # the runs the profile says to record
    assert "32.51 GB of tensors in the checkpoint" in text
    assert "llada2-mini (its public shapes: a header-only checkpoint, no weights)" in text
    assert "extrapolated: the model's error measured with 5 MoE layers, carried to 19" in text
    figure = f"{total_lo}-{total_hi} GPU-hours"
    assert figure in (PROFILE_DIR / f"{profile}.yaml").read_text(), "the profile's comment quotes doctor"
    screen = (ROOT / "README.md").read_text().split("\n## ")[0]
    assert f"{total_lo}-{total_hi}" in screen and profile in screen
    assert "python -m artifact doctor --profile h200_ae --shape llada2-mini" in screen
    assert figure in (ROOT / "docs" / "usage.md").read_text()


def test_the_reviewers_grids_keep_what_decides_04(ae_output):
    """C/W 0.43 (04-equal) and both ends of 0.83-1.73 (04-faster), at least MIN_PAIRS pairs per cell, and a
    run's budget that makes the 5 runs the profiles say to record 2 h."""
    for profile in AE:
        P = load_profile(profile)
        assert P.cache_ratios == (paper.AT_LOW.cache_ratio, *paper.FASTER_RANGE)
        assert P.repetitions >= thresholds.MIN_PAIRS and P.budget_minutes * 5 == 120
        assert "--runs 5 --only 04" in (PROFILE_DIR / f"{profile}.yaml").read_text()


def test_the_headline_counts_the_runs_asked_for(mini4, quick):
    root, _ = mini4
    P = load_profile("h200_ae", {"model": str(root)})
    one = check(P, gpu_memory_gb=141, runs=1)
    five = check(P, gpu_memory_gb=141, runs=5)
    assert five.verdict_hours == (5 * one.hours[0], 5 * one.hours[1]) and one.hours == five.hours
    assert "no stored verdict" in one.headline() and "no stored verdict" not in five.headline()
    assert "budget 5 x 24 min = 2.00 h" in five.headline()
    assert five.table().splitlines()[0] == five.headline()


# --- --shape: nothing downloaded ----------------------------------------------------------------------------
def test_a_bad_shape_and_shape_with_model_are_one_line(capsys):
    line = one_line_error(capsys, main(["doctor", "--profile", "h200_ae", "--shape", "llada2-huge"]))
    assert "llada2-huge" in line and "llada2-mini" in line and "llada2-flash" in line
    line = one_line_error(
        capsys, main(["doctor", "--profile", "h200_ae", "--shape", "llada2-mini", "--model", "tiny"])
    )
    assert "--shape" in line and "--model" in line
    line = one_line_error(capsys, main(["doctor", "--profile", "h200_ae"]))
    assert "model: null" in line and "--shape" in line


def test_the_header_only_checkpoint_has_the_models_shapes_and_no_weights(tmp_path):
    cfg = get_preset("llada2-mini")
    root = header_only_checkpoint(tmp_path / "m", cfg)
    f = root / "model.safetensors"
    shapes = expected_shapes(cfg)
    data = 2 * sum(int(pd.Series(s).prod()) for s in shapes.values())
    assert f.stat().st_size > data > 32e9  # the apparent size holds every tensor (32.5 GB)
    assert f.stat().st_blocks * 512 < 1e9  # but no weight is on disk (a sparse file)
    from artifact.offload.prepare import checked_checkpoint

    read, index = checked_checkpoint(str(root))  # the loader's header check passes
    assert read.hidden_size == 2048 and sum(len(t) for t in index.tables.values()) == len(shapes)


# --- memory -------------------------------------------------------------------------------------------------
def test_the_table_adds_up_to_the_stated_parts(mini4, quick):
    root, cfg = mini4
    P = load_profile("h200", {"model": str(root), "batch_sizes": [1, 8], "cache_ratios": [0.43, 1.73]})
    r = check(P, gpu_memory_gb=141)
    per_slot = cfg.expert_params * 2 * len(cfg.moe_layers)
    assert r.weights == non_expert_bytes(cfg, 2) and r.expert_store == per_slot * cfg.num_experts
    assert [(c.batch_size, c.cache_ratio) for c in r.cells] == [(1, 0.43), (1, 1.73), (8, 0.43), (8, 1.73)]
    for c in r.cells:
        assert not c.measured_w and c.working_set == min(256, c.batch_size * 32 * 8)  # the stated bound
        assert (
            c.capacity == capacity_for(c.cache_ratio, c.working_set, 256) and c.slots == c.capacity * per_slot
        )
        assert c.total == r.weights + c.slots + c.kv + c.activations + CONTEXT_BYTES
    b1, b8 = r.cells[0], r.cells[2]
    assert b8.kv == 8 * b1.kv and b8.activations > b1.activations  # the KV cache grows with the batch
    text = r.table()
    assert "141.00 GB (--gpu-memory-gb)" in text and "NO" not in text and "upper bound" in text


def test_a_cell_that_does_not_fit_is_named_or_in_a_plan_noted(mini4, quick):
    root, cfg = mini4
    P = load_profile("h200", {"model": str(root), "batch_sizes": [1, 8], "cache_ratios": [0.43, 1.73]})
    r = check(P, gpu_memory_gb=141)
    between = (r.cells[0].total + r.cells[1].total) / 2 / GB  # the small cache fits, the large one not
    with pytest.raises(DoctorError, match=r"batch 1 at C/W 1\.73 \(C = 256\) needs .* GB of device memory"):
        check(P, gpu_memory_gb=between)
    plan = check(P, gpu_memory_gb=between, shape="llada2-mini")  # W is only its bound: a note in a plan
    assert any("at W's upper bound" in n and "C/W 1.73" in n for n in plan.notes) and " NO" in plan.table()


@pytest.mark.parametrize(
    "damage, message", [("drop", "is missing from the checkpoint"), ("reshape", "has shape")]
)
def test_a_damaged_checkpoint_is_named_from_its_headers(tmp_path, damage, message):
    cfg = get_preset("tiny")
    shapes = expected_shapes(cfg)
    name = next(n for n in shapes if n.endswith("mlp.experts.3.down_proj.weight"))
    if damage == "drop":
        del shapes[name]
    else:
        shapes[name] = tuple(shapes[name][::-1])
    root = header_only_checkpoint(tmp_path / "bad", cfg, "F32", shapes)
    with pytest.raises(CheckpointError, match=message):
        check(load_profile("cpu", {"model": str(root)}))


def test_the_command_prints_the_table_or_one_line(capsys, quick):
    assert main(["doctor", "--profile", "h200", "--model", "tiny", "--gpu-memory-gb", "141"]) == 0
    out = capsys.readouterr().out
    assert "device memory: 141.00 GB" in out and "host memory: expert store" in out and "grid: " in out
    assert out.startswith("a verdict: 3 runs x (")
    line = one_line_error(
        capsys, main(["doctor", "--profile", "h200", "--model", "tiny", "--gpu-memory-gb", "0.001"])
    )
    assert "needs" in line and "> 0.001 GB (--gpu-memory-gb)" in line


def test_the_context_line_says_what_the_totals_hold(capsys, quick):
    """The CUDA context is added only where the totals are device memory; on the cpu profile they are not."""
    assert main(["doctor", "--profile", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "totals add no CUDA context" in out and "GB of CUDA context" not in out
    assert main(["doctor", "--profile", "cpu", "--gpu-memory-gb", "141"]) == 0
    assert f"totals add {CONTEXT_BYTES / GB:.2f} GB of CUDA context" in capsys.readouterr().out


def test_a_gpu_profile_without_a_gpu_or_a_stated_memory_is_refused(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the profile can run here")
    line = one_line_error(capsys, main(["doctor", "--profile", "h200", "--model", "tiny"]))
    assert "no CUDA GPU" in line and "--gpu-memory-gb" in line


# --- time ---------------------------------------------------------------------------------------------------
def test_the_estimate_is_the_performance_models(mini, roomy_host, quick, monkeypatch):
    """The time comes from the model: dearer host launches, or twice the layers, give a larger estimate; the
    range is the model's figure times the measured/modelled ratios of the committed H200 runs."""
    import artifact.experiments.studies.performance_model.estimate as est
    from artifact.experiments.hardware import HARDWARE

    root, cfg = mini
    P = load_profile("h200_ae", {"model": str(root), "cache_ratios": [0.43, 1.73], "repetitions": 4})
    base = check(P, gpu_memory_gb=141)
    lo, hi, runs = est.error_ratios()
    assert runs == 24 and lo < 1 < hi
    e = est.estimate(P, cfg, 2, {})
    assert (e.low_hours, e.high_hours) == base.hours == (e.model_hours * lo, e.model_hours * hi)
    assert e.forwards == base.forwards and f"{e.low_hours:.2f}-{e.high_hours:.2f} h" in base.table()
    deep = dataclasses.replace(cfg, num_hidden_layers=2 * cfg.num_hidden_layers)
    assert est.estimate(P, deep, 2, {}).model_hours > 1.5 * e.model_hours
    slow = dataclasses.replace(HARDWARE["h200"], launch_us=2 * HARDWARE["h200"].launch_us)
    monkeypatch.setitem(est.HARDWARE, "h200", slow)
    assert est.estimate(P, cfg, 2, {}).model_hours > 1.3 * e.model_hours
    assert check(P, gpu_memory_gb=141).hours[1] > base.hours[1]
    seg = check(dataclasses.replace(P, forward="segmented"), gpu_memory_gb=141)  # priced eager, and said so
    assert seg.hours == check(P, gpu_memory_gb=141).hours
    assert "priced with the eager forward's host costs" in seg.table()


def test_the_forward_count_is_the_benchs(mini4, quick):
    """Per cell `warmup` runs of every policy and R repetitions of every slot (the A/A arm one of them), plus
    one traced run per (task, batch size): 3 + 4 x 5 = 23 runs of a cell for the default policies."""
    root, _ = mini4
    P = load_profile(
        "cpu",
        {
            "model": str(root),
            "batch_sizes": [1, 4],
            "cache_ratios": [1.0],
            "n_prompts": 4,
            "repetitions": 5,
            "warmup": 1,
        },
    )
    r = check(P)
    per_prompt = (P.gen_length // 32) * P.steps + 1
    assert r.runs == 2 * 23 and r.forwards == (4 + 1) * per_prompt * (23 + 1)
    assert r.hours[0] == r.hours[1] and "at a stated 0.02 s per forward (cpu" in r.table()


def test_the_cpu_estimate_is_the_stored_runs_measured_time(quick):
    """On the cpu profile the time per forward is the stored runs' (bench.csv's seconds over forwards, the
    median over runs), not a stated constant, and one run's estimate is within a factor 1.5 of what a stored
    run measured: its bench rows' seconds added up (the warm-ups and the traced run are not rows)."""
    r = check(load_profile("cpu"))
    runs = sorted((ROOT / "data/results/cpu/runs").glob("run*/bench.csv"))
    assert len(runs) >= thresholds.MIN_RUNS
    frames = [pd.read_csv(f) for f in runs]
    per_forward = statistics.median(d.seconds.sum() / d.forwards.sum() for d in frames)
    measured = statistics.median(d.seconds.sum() for d in frames)
    assert f"at {per_forward:.4f} s per forward (the median over {len(runs)} stored runs" in r.time_basis
    estimate = 3600 * r.hours[0]
    assert measured / 1.5 <= estimate <= 1.5 * measured, (estimate, measured)
    assert f"{doctor.CPU_SECONDS_PER_FORWARD} s per forward" not in r.table()
    assert r.table().splitlines()[0].startswith(f"a verdict: 3 runs x ({r.hours[0]:.2f} h)")
    assert "a whole stored run of every timing notebook took" in r.headline()


# --- host-bound cells in advance ----------------------------------------------------------------------------
def test_host_bound_cells_are_predicted_with_what_to_do(mini4, monkeypatch):
    """With the eager forward's measured host costs every cell of mini's shapes is host-bound, so the
    segmented forward is priced and offered; with the host's launches and copies made nearly free, no cell
    is, and nothing is offered."""
    from artifact.experiments.doctor import host
    from artifact.experiments.hardware import HARDWARE

    root, cfg = mini4
    P = load_profile("h200_ae", {"model": str(root), "cache_ratios": [0.43, 1.73], "repetitions": 4})
    cells = [doctor.Cell(1, r, 80.0, True, capacity_for(r, 80.0, 256), 0, 0, 0, 0) for r in P.cache_ratios]
    out, basis = host.host_shares(P, cfg, 2, cells)
    limit = thresholds.HOST_SHARE_LIMIT
    assert [(h.batch_size, h.cache_ratio) for h in out] == [(1, 0.43), (1, 1.73)]
    assert all(h.over("eager") and set(h.share) == {"eager", "segmented"} for h in out)
    assert all(0 < lo <= hi <= 1 for h in out for lo, hi in h.share.values())
    assert all(h.share["segmented"][1] < h.share["eager"][1] for h in out)
    assert any("assumed" in b or "measured" in b for b in basis if b.startswith("segmented"))
    report = doctor.Report("h200_ae", "m", "bfloat16", "cuda", 1, "s", 0, 0, 0, 0, "", 0, 0, [], 2, 1, 1,
                           (0.1, 0.2), "", gpu=True, host=out)  # fmt: skip
    assert (
        "2 of 2 cells predicted over" in report.host_line()
        and "--set forward=segmented" in report.host_line()
    )
    seg, _ = host.host_shares(dataclasses.replace(P, forward="segmented"), cfg, 2, cells)
    assert all(set(h.share) == {"segmented"} for h in seg)
    cheap = dataclasses.replace(HARDWARE["h200"], launch_us=0.01, copy_host_us=0.01)
    monkeypatch.setitem(host.HARDWARE, "h200", cheap)
    free, _ = host.host_shares(P, cfg, 2, cells)
    assert all(h.share["eager"][1] <= limit and set(h.share) == {"eager"} for h in free)


def test_the_reviewers_host_line_is_printed_second(ae_output):
    for profile in AE:
        second = ae_output[profile].splitlines()[1]
        assert second.startswith("host-bound (a GPU cell over 50% host time per forward is inconclusive)")
        assert "with the profile's forward eager" in second and "--set forward=segmented" in second
    cpu = doctor.Report(
        "cpu", "tiny", "float32", "cpu", None, "", 0, 0, 0, 0, "", 0, 0, [], 1, 1, 1, (0.1, 0.1), ""
    )
    assert cpu.host_line() == "host-bound: not ruled on a CPU device (the CPU computes on the host)"


# --- power under assumed noise ------------------------------------------------------------------------------
def test_power_is_the_calibration_harness_on_the_profiles_cells(monkeypatch):
    """Both claims get a power from the harness on the grid's cells; a grid without C/W 0.43 cannot decide
    04-equal; planted noise 100 times smaller gives (nearly) certain power."""
    from artifact.experiments.doctor import power
    from artifact.experiments.verdicts import calibration

    P = load_profile("h200_ae", {"model": "tiny"})
    base = power.power(P, 3)
    assert set(base) == {"04-faster", "04-equal"} and all(0 <= p <= 100 for p in base.values())
    no_low = power.power(dataclasses.replace(P, cache_ratios=(0.83, 1.73)), 3)
    assert no_low["04-equal"] is None and no_low["04-faster"] == base["04-faster"]
    real = calibration.noise

    def quiet(P, c):
        cn = real(P, c)
        shrink = {k: dataclasses.replace(z, sd=z.sd / 100, tau=z.tau / 100) for k, z in cn.cells.items()}
        aa = {k: dataclasses.replace(z, sd=z.sd / 100, tau=z.tau / 100) for k, z in cn.aa.items()}
        return dataclasses.replace(cn, cells=shrink, aa=aa)

    monkeypatch.setattr(calibration, "noise", quiet)
    planted = power.power(P, 3)
    assert planted["04-faster"] >= 95 and planted["04-faster"] > base["04-faster"]
    line = power.power_lines(P, 3)[0]
    assert "GPU noise unmeasured; assumed" in line and "04-faster at +4.9%" in line


def test_the_readmes_gpu_section_is_short_and_links_the_rest():
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("## On a GPU")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    section = lines[start:end]
    assert len(section) <= 25, (
        f"the README's GPU section has {len(section)} lines (> 25): move detail to docs"
    )
    assert "(docs/usage.md)" in "\n".join(section)
    assert all(len(line) < 300 for line in lines if line.startswith("| the reviewer's grid"))
