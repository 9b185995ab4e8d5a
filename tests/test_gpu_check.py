"""scripts/gpu_check.sh on a machine without a GPU: the distinct exit code, and the CPU dry run of the
same pipeline (tiny shapes, emulated link) writing the JSON summary."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sh(*args, timeout=120):
    env = {**os.environ, "ARTIFACT_CACHE": os.environ.get("ARTIFACT_CACHE", str(ROOT / ".cache"))}
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens on a machine without a GPU")
def test_no_gpu_exits_3_with_a_clear_message(tmp_path):
    out = tmp_path / "summary.json"
    p = sh("--out", out)
    assert p.returncode == load_script().EXIT_NO_GPU == 3
    assert "no CUDA GPU visible (torch.cuda.is_available() is False); nothing was run" in p.stderr
    assert not out.exists()


@pytest.mark.parametrize("args, words", [
    (["--device", "cpu"], "--allow-cpu"),
    (["--ratios", "0.5,x"], "comma-separated"),
    (["--ratios", "0,1"], "positive"),
    (["--batches", "9"], "--batches"),
    (["--store-gb", "0"], "--store-gb"),
    (["--layers", "1"], "--layers"),
])
def test_bad_arguments_exit_2(args, words, capsys):
    with pytest.raises(SystemExit) as e:
        load_script().parse_args(args)
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_dry_run_writes_the_seven_steps_in_order(tmp_path):
    out = tmp_path / "gpu_check.json"
    p = sh("--device", "cpu", "--allow-cpu", "--skip-tests", "--ratios", "0.83,1.0", "--gen-length", 32,
           "--prompt-length", 20, "--layers", 3, "--out", out)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    d = json.loads(out.read_text())
    mod = load_script()
    assert d["steps"] == list(mod.STEPS) == ["environment", "cuda_tests", "pinned_peak", "capped_link",
                                             "moe_layer", "pinned_store", "engine"]
    assert "Random weights route differently" in d["note"] and d["dry_run_on_cpu"] is True
    assert d["exit_code"] == 0 and d["cuda_tests"]["skipped"] == "--skip-tests"
    assert "no pinned memory" in d["pinned_peak"]["skipped"] and "needs CUDA" in d["pinned_store"]["skipped"]
    caps = d["capped_link"]["caps"]
    assert [c["fraction"] for c in caps] == [1.0, 0.5, 0.25]
    assert all(c["achieved_gbps"] > 0 and c["target_gbps"] == pytest.approx(d["capped_link"]["peak_gbps"] *
                                                                            c["fraction"]) for c in caps)
    m = d["moe_layer"]
    assert m["equal_outputs"] is True and m["max_abs_diff"] == 0.0                  # CPU fp32: bit for bit
    assert m["kernels"]["loop"]["host_ms"] > 0 and m["kernels"]["grouped"]["host_ms"] > 0
    e = d["engine"]
    runs = e["runs"]
    assert [(r["batch"], r["cache_ratio"], r["policy"]) for r in runs] == [
        (b, c, p) for b in (1, 4) for c in (0.83, 1.0) for p in ("demand", "last_step")]
    assert e["all_tokens_equal_resident"] is True
    assert e["all_forwards_denoising_steps"] is True and e["decode"]["threshold"] == 1.0
    for r in runs:
        assert r["ms_per_forward"] > 0 and r["link_bytes"] > 0 and 0 < r["link_busy_over_wall"] <= 1.0
        assert r["prefill_ms"] > 0 and r["prefill_forwards"] >= 1                  # prompt of 20 -> 32: a block
        assert r["denoise_forwards"] == r["forwards"] == 8 and r["all_forwards_denoising_steps"] is True
        assert r["denoise_ms_per_forward"] > 0 and 0 < r["host_ms_per_forward"] <= r["denoise_ms_per_forward"]
        assert r["sync_wait_ms_per_forward"] == 0.0          # on the CPU the counts' read blocks on nothing
        assert r["stall_seconds"] >= 0 and r["demand_misses"] > 0
    assert set(e["measures"]) >= {"prefill_ms", "denoise_ms_per_forward", "host_ms_per_forward",
                                  "sync_wait_ms_per_forward", "link_busy_over_wall"}
    steps = ("pinned_peak", "capped_link", "moe_layer", "engine")
    assert all("measures" in d[step] or "skipped" in d[step] for step in steps)     # every figure says what it is
    assert m["within_tolerance"] is True and m["tolerance"]["rtol"] == 0.0
    assert all(r["speculative_transfers"] == 0 for r in runs if r["policy"] == "demand")
    assert sum(r["speculative_transfers"] for r in runs if r["policy"] == "last_step") > 0
    assert [x["batch"] for x in e["resident"]] == [1, 4]


def test_cuda_tests_that_cannot_be_collected_have_their_own_exit_code(monkeypatch):
    mod = load_script()
    a = mod.parse_args(["--device", "cpu", "--allow-cpu"])

    class Done:
        def __init__(self, rc, out):
            self.returncode, self.stdout, self.stderr = rc, out, ""

    monkeypatch.setattr(mod.subprocess, "run", lambda *x, **k: Done(2, "ERROR tests/test_cuda.py - ImportError"))
    r = mod.cuda_tests(a, torch)
    assert r["collection_ok"] is False and r["ok"] is False and mod.EXIT_TESTS_NOT_RUN == 5
    runs = iter([Done(0, "tests/test_cuda.py::a\ntests/test_cuda.py::b\ntests/test_cuda.py::c\n"),
                 Done(0, "== 2 passed in 1.0s ==")])
    monkeypatch.setattr(mod.subprocess, "run", lambda *x, **k: next(runs))
    r = mod.cuda_tests(a, torch)
    assert r["collected"] == 3 and r["ran"] == 2 and r["all_ran"] is False
    runs = iter([Done(0, "tests/test_cuda.py::a\ntests/test_cuda.py::b\n"), Done(0, "== 1 passed, 1 skipped ==")])
    monkeypatch.setattr(mod.subprocess, "run", lambda *x, **k: next(runs))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)      # on a GPU a skipped CUDA test did not run
    assert mod.cuda_tests(a, torch)["all_ran"] is False
    runs = iter([Done(0, "tests/test_cuda.py::a\ntests/test_cuda.py::b\n"), Done(0, "== 1 passed, 1 skipped ==")])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)     # without one it skips with its reason
    assert mod.cuda_tests(a, torch)["all_ran"] is True


def test_a_failing_step_keeps_the_report(tmp_path):
    out = tmp_path / "gpu_check.json"
    p = sh("--device", "cpu", "--allow-cpu", "--skip-tests", "--prompt-length", 5000, "--layers", 2,
           "--batches", "1", "--ratios", "1", "--out", out)
    assert p.returncode == load_script().EXIT_ERROR == 4
    d = json.loads(out.read_text())
    assert d["exit_code"] == 4 and d["engine"]["error"]["type"] == "ValueError"
    assert "max_position_embeddings" in d["engine"]["error"]["message"]            # tiny: 4096 positions
    assert d["engine"]["runs"] == [] and d["steps"][-1] == "engine"
    assert d["moe_layer"]["equal_outputs"] is True                                   # earlier steps kept
