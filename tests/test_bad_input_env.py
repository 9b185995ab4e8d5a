"""scripts/env.sh (sourced by run_all.sh and run_tests.sh) refuses a bad ARTIFACT_LOCK, and a lock out of date
with pyproject.toml is named in one sentence before pip runs (scripts/check_lock.py): exit 2, one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_env_sh_refuses_an_artifact_lock_that_is_not_0_or_1():
    env = {**os.environ, "ARTIFACT_LOCK": "maybe", "ARTIFACT_VENV": str(Path(sys.executable).parent.parent)}
    r = subprocess.run(
        ["bash", "-c", "set -euo pipefail; source scripts/env.sh; echo after"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "after" not in r.stdout, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ARTIFACT_LOCK=maybe: expected 1"), lines


def check_lock(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "scripts" / "check_lock.py"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_the_committed_lock_fits_pyproject():
    assert check_lock().returncode == 0


def test_a_lock_out_of_date_with_pyproject_is_named_in_one_line(tmp_path):
    text = (ROOT / "pyproject.toml").read_text()
    assert '"scipy>=1.15"' in text
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(text.replace('"scipy>=1.15"', '"scipy>=99"'))
    r = check_lock(pyproject, ROOT / "requirements.lock")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r
    assert "requirements.lock pins scipy==" in lines[0] and "scipy>=99" in lines[0]
