"""scripts/gpu_run.sh on bad input and beside a finished run: nothing a user measured is lost, and a bad
argument never starts a run. Each refusal is exit 2 (3 for no GPU), one line on stderr, no traceback, and
every file that was in --out is byte-equal afterwards. Cheap: the arguments are refused before any torch
import; only the two no-GPU cases import torch (the environment step)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from test_gpu_check import ROOT, load
from test_gpu_run import fake_nvidia_smi, gpu_run

no_gpu = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks what happens on a machine without a GPU"
)


def snapshot(folder) -> dict:
    """Every file and folder under `folder` (relative path -> its bytes, or None for a folder)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


def finished_run(out, name: str = "h200"):
    """The files a real (measured) run left under `out`: its graphs report has no dry_run_on_cpu, its
    environment says dry_run false; plus a file of someone else's."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}_graphs.json").write_text(json.dumps({"engine": {"runs": [{"wall_ms_median": 11.5}]}}))
    (out / f"{name}_gpu_run_environment.json").write_text(json.dumps({"dry_run": False, "device": "H200"}))
    (out / f"{name}_gpu_run.steps.jsonl").write_text('{"step": "environment", "rc": 0}\n')
    (out / f"{name}_gpu_run_summary.json").write_text("{}")
    (out / "notes.txt").write_text("mine\n")
    return snapshot(out)


def refused(p: subprocess.CompletedProcess, rc: int = 2) -> str:
    assert p.returncode == rc, p.stdout[-2000:] + p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_run: "), p.stderr
    assert "Traceback" not in p.stderr + p.stdout and "== step 2/4" not in p.stdout
    return lines[0]


# --- bad arguments: refused before anything runs or is written ---------------------------------------------
@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["--budget-graphs", "08"],
            "--budget-graphs needs a whole number of seconds (digits, no sign or lead",
        ),
        (
            ["--budget-graphs", str(2**63 - 1)],
            "--budget-graphs (seconds) must be in [1, 86400], got a 19-digit",
        ),
        (
            ["--budget-tests", "9" * 400],
            "--budget-tests (seconds) must be in [1, 86400], got a 400-digit number",
        ),
        (["--budget-tests", "86401"], "--budget-tests (seconds) must be in [1, 86400], got 86401"),
        (["--budget-summary", "-5"], "--budget-summary needs a whole number of seconds"),
        (["--budget-environment", ""], "--budget-environment needs a whole number of seconds"),
        (["--name"], "--name needs a name"),
        (["--budget-graphs"], "--budget-graphs needs seconds"),
        (["--name", "--full"], "--name needs a name, got the flag '--full'"),
        (["--name", "x" * 33], "--name must be letters, digits, - or _ (1 to 32 of them)"),
        (["--fast"], "unknown argument '--fast'; expected --out DIR"),
        (["--name", "a", "--name", "b"], "--name given twice ('a' and 'b')"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2_and_the_folder_is_left_as_it_was(tmp_path, args, words):
    out = tmp_path / "out"
    before = finished_run(out, "cpu")
    line = refused(gpu_run("--dry-run", "--out", out, *args, timeout=60))
    assert words in line and snapshot(out) == before


def test_out_without_a_value_is_refused(tmp_path):
    for args in (["--dry-run", "--out"], ["--out", "--dry-run"]):
        assert "--out needs a folder" in refused(gpu_run(*args, timeout=60))


def test_out_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "report.json"
    f.write_text("{}")
    assert "is a file, not a folder" in refused(gpu_run("--dry-run", "--out", f, timeout=60))
    below = refused(gpu_run("--dry-run", "--out", f / "sub", timeout=60))
    assert f"{str(f)!r} is a file, not a folder" in below and f.read_text() == "{}"


def test_a_read_only_out_is_refused_in_one_line(tmp_path):
    """A folder this user cannot write in (chmod 555; root writes there anyway, so /sys stands in, which
    nobody writes files in) is refused before the run, not with a traceback at its first write."""
    ro = tmp_path / "ro"
    before = finished_run(ro, "cpu")
    ro.chmod(0o555)
    try:
        targets = [ro / "run", ro] if not os.access(ro, os.W_OK) else []
        targets.append("/sys/gpu_run_out")
        for t in targets:
            line = refused(gpu_run("--dry-run", "--out", t, timeout=60))
            assert "cannot write there" in line and "choose another folder" in line
    finally:
        ro.chmod(0o755)
    assert snapshot(ro) == before


# --- a finished run is never written over ------------------------------------------------------------------
def test_a_dry_run_never_writes_over_a_real_runs_files(tmp_path):
    """--dry-run --name h200 into a folder holding a measured h200_graphs.json is refused (one line naming
    the file), the folder byte-equal; a dry run's own files, and another name's, do not stop it."""
    out = tmp_path / "out"
    before = finished_run(out, "h200")
    p = gpu_run("--dry-run", "--name", "h200", "--out", out, timeout=600)
    assert snapshot(out) == before  # first: what the old script got wrong (it wrote the CPU figures over it)
    line = refused(p)
    assert "written by a real run: a dry run never writes over it" in line and "h200_" in line
    run = load("gpu_run")
    assert [p.name for p in run.real_run_files(out, "h200")] == sorted(
        [
            "h200_graphs.json",
            "h200_gpu_run_environment.json",
            "h200_gpu_run.steps.jsonl",
            "h200_gpu_run_summary.json",
        ],
        key=[k.name for k in run.names(out, "h200").values()].index,
    )
    assert run.real_run_files(out, "cpu") == []  # another name's files: the dry run (cpu_*) may go on
    (out / "cpu_graphs.json").write_text(json.dumps({"dry_run_on_cpu": True}))
    (out / "cpu_gpu_run_environment.json").write_text(json.dumps({"dry_run": True}))
    (out / "cpu_gpu_run.steps.jsonl").write_text("")
    assert run.real_run_files(out, "cpu") == []  # an earlier dry run's files: rerun over them
    (out / "cpu_graphs.json").write_text(json.dumps({"engine": {}}))  # no dry-run mark: measured
    assert [p.name for p in run.real_run_files(out, "cpu")] == ["cpu_graphs.json"]


@no_gpu
def test_without_a_gpu_a_folder_holding_a_finished_run_is_left_as_it_was(tmp_path):
    """No GPU visible to torch (nvidia-smi shimmed to say H200): the run stops at the environment step with
    exit 3 and one line, and writes nothing: the finished run's files are byte-equal, no file is added."""
    shim = fake_nvidia_smi(tmp_path / "bin", "NVIDIA H200\n")
    out = tmp_path / "out"
    before = finished_run(out, "h200")
    p = gpu_run("--out", out, path_dir=shim, timeout=120)
    assert snapshot(out) == before  # first: what the old script got wrong (its steps file replaced)
    line = refused(p, rc=3)
    assert "no CUDA GPU visible" in line and "nothing written under" in line


def _checkout_state() -> str:
    """What git sees changed or added in the checkout (ignored paths left out)."""
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@no_gpu
def test_without_out_nothing_is_written_into_the_checkout(tmp_path):
    """The default --out is under results/ (ignored by git): a run without --out, here one that stops for
    want of a GPU, leaves the checkout as git sees it (no data/gpu_check/gpu_* files)."""
    shim = fake_nvidia_smi(tmp_path / "bin", "NVIDIA-SMI has failed", rc=9)
    before, tracked = _checkout_state(), snapshot(ROOT / "data" / "gpu_check")
    p = gpu_run(path_dir=shim, timeout=120)
    assert (
        _checkout_state() == before and snapshot(ROOT / "data" / "gpu_check") == tracked
    )  # first: see above
    refused(p, rc=3)
    assert f"reports under {ROOT / 'results' / 'gpu_run'} " in p.stdout
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/gpu_run/h200_graphs.json"], cwd=ROOT)
    assert ignored.returncode == 0
