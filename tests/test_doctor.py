"""`python -m artifact doctor`: the preflight reads the config, the safetensors headers and the tokenizer,
never a weight, and says before a run whether the profile's grid fits (device memory per batch size and C/W,
host memory, disk) or exits 2 naming what does not."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import struct
from pathlib import Path

import pytest
from test_cli import one_line_error

import artifact.experiments.doctor as doctor
import artifact.model.checkpoint as checkpoint
from artifact.cli import main
from artifact.errors import CheckpointError
from artifact.experiments.doctor import CONTEXT_BYTES, GB, DoctorError, check
from artifact.experiments.settings import load_profile
from artifact.model.checkpoint import expected_shapes
from artifact.model.config import get_preset
from artifact.model.memory import non_expert_bytes
from artifact.model.tiny import tiny_checkpoint
from artifact.offload.replay.sim import capacity_for

DTYPE_BYTES = {"BF16": 2, "F32": 4}


def write_header_only_checkpoint(
    root: Path, cfg, dtype: str = "BF16", drop: str | None = None, reshape: str | None = None
) -> Path:
    """A checkpoint of `cfg`'s shapes whose data section is a hole in a sparse file: its headers are real
    (the doctor and the loader's header check read them), its weights are zeros never written to disk."""
    root.mkdir(parents=True)
    table, offset = {}, 0
    for name, shape in sorted(expected_shapes(cfg).items()):
        if name == drop:
            continue
        if name == reshape:
            shape = tuple(shape[::-1]) if len(shape) > 1 else (shape[0] + 1,)
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        table[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(table).encode()
    head += b" " * (-len(head) % 8)
    with open(root / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.truncate(8 + len(head) + offset)  # sparse: no weight bytes on disk
    (root / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_checkpoint() / name).is_file():
            shutil.copy(tiny_checkpoint() / name, root / name)
    return root


@pytest.fixture
def mini4(tmp_path, monkeypatch):
    """LLaDA2.0-mini's shapes (hidden 2048, 256 experts of 3 x 512 x 2048, vocab 157184) with 4 layers."""
    cfg = get_preset("llada2-mini")
    cfg = dataclasses.replace(cfg, num_hidden_layers=4)
    monkeypatch.setattr(checkpoint, "safe_open", lambda *a, **k: pytest.fail("the doctor read a weight"))
    return write_header_only_checkpoint(tmp_path / "mini4", cfg), cfg


def test_the_table_adds_up_to_the_stated_parts(mini4):
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


def test_a_cell_that_does_not_fit_is_named(mini4):
    root, cfg = mini4
    P = load_profile("h200", {"model": str(root), "batch_sizes": [1, 8], "cache_ratios": [0.43, 1.73]})
    r = check(P, gpu_memory_gb=141)
    between = (r.cells[0].total + r.cells[1].total) / 2 / GB  # the small cache fits, the large one not
    with pytest.raises(DoctorError, match=r"batch 1 at C/W 1\.73 \(C = 256\) needs .* GB of device memory"):
        check(P, gpu_memory_gb=between)


@pytest.mark.parametrize(
    "damage, message", [("drop", "is missing from the checkpoint"), ("reshape", "has shape")]
)
def test_a_damaged_checkpoint_is_named_from_its_headers(tmp_path, monkeypatch, damage, message):
    cfg = get_preset("tiny")
    name = next(n for n in expected_shapes(cfg) if n.endswith("mlp.experts.3.down_proj.weight"))
    root = write_header_only_checkpoint(tmp_path / "bad", cfg, "F32", **{damage: name})
    with pytest.raises(CheckpointError, match=message):
        check(load_profile("cpu", {"model": str(root)}))


def test_the_command_prints_the_table_or_one_line(capsys):
    assert main(["doctor", "--profile", "h200", "--model", "tiny", "--gpu-memory-gb", "141"]) == 0
    out = capsys.readouterr().out
    assert "device memory: 141.00 GB" in out and "host memory: expert store" in out and "grid: " in out
    line = one_line_error(
        capsys, main(["doctor", "--profile", "h200", "--model", "tiny", "--gpu-memory-gb", "0.001"])
    )
    assert "needs" in line and "> 0.001 GB (--gpu-memory-gb)" in line


def test_the_context_line_says_what_the_totals_hold(capsys):
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
    line = one_line_error(capsys, main(["doctor", "--profile", "h200"]))
    assert "model" in line and ("model: null" in line or "got None" in line)  # the profile's check names it


ROOT = Path(__file__).resolve().parents[1]


def gpu_section() -> list[str]:
    """The README's GPU section: from its heading to the next one."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("## On a GPU")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return lines[start:end]


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """LLaDA2.0-mini's shapes whole (20 layers, 19 MoE): the time estimate depends on the real layer count."""
    cfg = get_preset("llada2-mini")
    return write_header_only_checkpoint(tmp_path_factory.mktemp("ckpt") / "mini", cfg), cfg


@pytest.fixture
def roomy_host(monkeypatch):
    """A host with room for mini's 30.6 GB expert store, whatever this machine has."""
    monkeypatch.setattr(doctor, "_host_available", lambda: 256 * 10**9)
    monkeypatch.setattr(checkpoint, "safe_open", lambda *a, **k: pytest.fail("the doctor read a weight"))


# a5000_ae: before its traces W is its upper bound and mini's grid does not fit 24 GB (docs/usage.md);
# the time does not depend on the memory planned for, so it is printed with room to spare.
AE = [("h200_ae", 141), ("a5000_ae", 48)]
RANGE = re.compile(r"about (\d+) forwards: (\d+\.\d+)-(\d+\.\d+) h on one GPU \(performance model")


@pytest.mark.parametrize("profile, gpu_gb", AE)
def test_a_reviewers_grid_fits_its_budget_and_the_readme_says_what_doctor_prints(
    mini, roomy_host, capsys, profile, gpu_gb
):
    """`python -m artifact doctor --profile NAME_ae --model DIR` on a checkpoint of mini's shapes prints the
    performance model's range, whose upper end fits the profile's budget, and names what it extrapolates;
    the README's GPU section and first screen quote the range it prints."""
    root, _ = mini
    assert main(["doctor", "--profile", profile, "--model", str(root), "--gpu-memory-gb", str(gpu_gb)]) == 0
    out = capsys.readouterr().out
    (grid,) = [line for line in out.splitlines() if line.startswith("grid: ")]
    forwards, low, high = RANGE.search(grid).groups()
    budget = load_profile(profile, {"model": str(root)}).budget_minutes
    assert float(low) < float(high) <= budget / 60, grid
    assert "extrapolated: the model's error measured with 5 MoE layers, carried to 19" in out
    assert "NO" not in out and f"profile {profile}," in out
    figure = f"{low}-{high} h"
    section = "\n".join(gpu_section())
    assert figure in section and profile in section
    assert "python -m artifact doctor --profile h200_ae --model" in section
    first = (ROOT / "README.md").read_text().split("\n## ")[0]  # the first screen: the range, as an estimate
    assert figure in first and profile in first and "estimate" in first and "performance model" in first
    assert figure in (ROOT / "docs" / "usage.md").read_text() and int(forwards) > 0


def test_the_estimate_is_the_performance_models(mini, roomy_host, monkeypatch):
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


def test_the_forward_count_is_the_benchs(mini4):
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


def test_the_readmes_gpu_section_is_short_and_links_the_rest():
    section = gpu_section()
    assert len(section) <= 25, (
        f"the README's GPU section has {len(section)} lines (> 25): move detail to docs/usage.md"
    )
    assert "(docs/usage.md)" in "\n".join(section)
