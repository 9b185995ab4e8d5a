"""The CUDA tests step of the GPU checks (scripts/gpu_check.py step 2)."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cuda_tests(a, torch) -> dict:
    if a.skip_tests:
        return {"skipped": "--skip-tests"}
    base = [sys.executable, "-m", "pytest", "-m", "cuda", "tests", "-q", "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    try:
        c = subprocess.run(base + ["--collect-only"], cwd=ROOT, capture_output=True, text=True,
                           timeout=a.test_timeout)
    except subprocess.TimeoutExpired:
        return {"collected": None, "collection_ok": False, "ok": False, "timed_out": True}
    collected = sum(1 for ln in c.stdout.splitlines() if "::" in ln)
    if c.returncode not in (0, 5) or collected == 0:
        return {"command": " ".join(base[1:]) + " --collect-only", "returncode": c.returncode, "collected": collected,
                "collection_ok": False, "ok": False, "tail": (c.stdout + c.stderr)[-2000:]}
    cmd = base
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                           timeout=max(1, a.test_timeout - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired as e:
        tail = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"command": " ".join(cmd[1:]), "returncode": None, "timed_out": True, "ok": False,
                "collected": collected, "collection_ok": True, "seconds": time.perf_counter() - t0,
                "tail": tail[-2000:]}
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    summary = next((ln for ln in reversed(lines) if re.search(r"passed|failed|error|skipped|deselected", ln)), "")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    ran = counts.get("passed", 0) + counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    return {"command": " ".join(cmd[1:]), "returncode": p.returncode, "timed_out": False, "collected": collected,
            "collection_ok": True, "ran": ran, "counts": counts,
            # on a GPU a skipped CUDA test did not run (it skipped for a reason the report must show)
            "all_ran": ran + (0 if torch.cuda.is_available() else counts.get("skipped", 0)) >= collected,
            "ok": p.returncode == 0, "summary": summary.strip("= "), "tail": (p.stdout + p.stderr)[-2000:]}
