"""scripts/env.sh (issue 60, item 6): ARTIFACT_TORCH that is not a pip requirement for torch is refused in one
line, exit 2 (return 2 when sourced), before the environment is created; and the install stamp is written
only when every install step succeeded, so a failed torch install is tried again next time rather than
marked installed. The install steps run against a fake python whose pip fails where a test says."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def source_env(venv: Path, **env: str) -> subprocess.CompletedProcess:
    """`source scripts/env.sh` without `set -e` (as a user's shell does), then its return code."""
    return subprocess.run(
        ["bash", "-c", "source scripts/env.sh; echo rc=$?"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ARTIFACT_VENV": str(venv), **env},
    )


@pytest.mark.parametrize("torch", ["torch==", "not a req!", "numpy==2.0", "torch==2.13.0 --index-url x"])
def test_a_bad_artifact_torch_is_refused_before_the_venv_is_made(tmp_path, torch):
    venv = tmp_path / "nowhere" / "venv"
    r = source_env(venv, ARTIFACT_TORCH=torch)
    assert r.stdout.strip() == "rc=2", r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: ARTIFACT_TORCH='{torch}': expected one pip requirement for torch")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    "torch", ["torch", "torch==2.13.0", "torch==2.13.0+cu126", "torch>=2.5,<2.14", "torch @ https://h/t.whl"]
)
def test_a_torch_requirement_passes_the_check(tmp_path, torch):
    """Past the check, the environment's creation is the next step (here it fails: PYTHON=false)."""
    r = source_env(tmp_path / "venv", ARTIFACT_TORCH=torch, PYTHON="false")
    assert r.stdout.strip().endswith("rc=1") and "ARTIFACT_TORCH" not in r.stderr, r
    assert "could not create the environment" in r.stderr


FAKE_PYTHON = """#!/bin/bash
# a venv's python: records its calls; `import torch` fails (torch missing); pip fails on FAIL_ON
echo "$*" >> "$(dirname "$0")/../calls"
case "$*" in
  "-c import torch") exit 1 ;;
  *"pip install"*"$FAIL_ON"*) echo "ERROR: fake pip cannot install this" >&2; exit 1 ;;
esac
exit 0
"""


def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(FAKE_PYTHON)
    py.chmod(0o755)
    return venv


@pytest.mark.parametrize("step", ["--upgrade pip", "torch==2.13.0", "-e "])
def test_a_failed_install_step_writes_no_stamp(tmp_path, step):
    venv = fake_venv(tmp_path)
    r = source_env(venv, ARTIFACT_LOCK="0", FAIL_ON=step, ARTIFACT_TORCH="")
    assert r.stdout.strip().endswith("rc=1"), r
    assert r.stderr.strip().splitlines()[-1].startswith("error: [env] "), r.stderr
    assert "not marked installed" in r.stderr
    assert not (venv / ".artifact-installed").exists()
    assert "ipykernel" not in (venv / "calls").read_text()  # nothing after the failed step ran


def test_every_step_succeeding_writes_the_stamp(tmp_path):
    """The control: the same fake, with nothing failing, installs torch and the project and stamps it."""
    venv = fake_venv(tmp_path)
    r = source_env(venv, ARTIFACT_LOCK="0", FAIL_ON="nothing fails", ARTIFACT_TORCH="")
    assert r.stdout.strip().endswith("rc=0"), r
    calls = (venv / "calls").read_text()
    assert "-m pip install -q --disable-pip-version-check torch==2.13.0" in calls and " -e " in calls
    assert (venv / ".artifact-installed").read_text().strip().endswith("-0")
