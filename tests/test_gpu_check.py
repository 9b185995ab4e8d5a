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
    (["--batch-size", "3", "--prompts", "2"], "--batch-size"),
])
def test_bad_arguments_exit_2(args, words, capsys):
    with pytest.raises(SystemExit) as e:
        load_script().parse_args(args)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_paired_summary_pairs_by_rep():
    rows = [{"rep": rep, "policy": p, "cache_ratio": 1.0, "cache_experts": 10, "tokens_per_second": tps,
             "demand_misses": 5} for rep, p, tps in
            [(0, "demand", 110.0), (0, "last_step", 100.0), (1, "demand", 96.0), (1, "last_step", 80.0),
             (2, "demand", 50.0)]]                                        # rep 2 has no partner
    (s,) = load_script().paired_summary(rows, [1.0])
    assert s["pairs"] == 2 and s["cache_experts"] == 10
    assert s["demand_vs_last_step_pct"] == pytest.approx(15.0)          # mean of +10% and +20%
    assert s["ci95_pct"][0] < 15.0 < s["ci95_pct"][1]
    assert s["demand_tokens_per_second"] == pytest.approx(103.0)


@pytest.mark.slow
def test_cpu_dry_run_writes_the_summary(tmp_path):
    out = tmp_path / "gpu_check.json"
    p = sh("--device", "cpu", "--allow-cpu", "--skip-tests", "--reps", 2, "--ratios", "0.5,1.5", "--gen-length", 32,
           "--prompt-length", 20, "--layers", 3, "--prompts", 1, "--out", out)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    d = json.loads(out.read_text())
    assert "Random weights route differently" in d["note"] and "Random weights" in p.stdout
    assert d["dry_run_on_cpu"] is True and d["link"] == "emulated" and d["tests"] == {"skipped": "--skip-tests"}
    assert d["model"]["moe_layers"] == 2 and d["truncated"] is False and d["exit_code"] == 0
    W = d["working_set"]
    assert 1 <= W <= 256
    runs = d["runs"]
    assert len(runs) == 2 * 2 * 2
    order = [(r["rep"], r["cache_ratio"], r["policy"]) for r in runs]
    assert order[:4] == [(0, 0.5, "demand"), (0, 0.5, "last_step"), (0, 1.5, "last_step"), (0, 1.5, "demand")]
    assert order[4:6] == [(1, 0.5, "last_step"), (1, 0.5, "demand")]    # the order alternates
    from artifact.offload.sim import capacity_for
    for r in runs:
        assert r["cache_experts"] == capacity_for(r["cache_ratio"], W, 256)
        assert r["tokens_match_resident"] is True                         # offloading changes time only
        assert r["tokens"] == 32 and r["tokens_per_second"] > 0 and r["link_bytes"] > 0
    assert all(r["speculative_transfers"] == 0 for r in runs if r["policy"] == "demand")
    assert sum(r["speculative_transfers"] for r in runs if r["policy"] == "last_step") > 0
    assert [s["pairs"] for s in d["paired"]] == [2, 2]
    assert all(len(s["ci95_pct"]) == 2 for s in d["paired"])
    h = d["h2d"]
    assert 0 < h["engine_vs_peak"] <= 1.01 and h["peak_gbps"] == runs[0]["link_bandwidth_gbps"]


def test_a_failing_measurement_keeps_the_summary(tmp_path):
    out = tmp_path / "gpu_check.json"
    p = sh("--device", "cpu", "--allow-cpu", "--skip-tests", "--prompt-length", 5000, "--layers", 2, "--out", out)
    assert p.returncode == load_script().EXIT_ERROR == 4
    d = json.loads(out.read_text())
    assert d["exit_code"] == 4 and d["error"]["type"] == "ValueError"
    assert "max_position_embeddings" in d["error"]["message"]             # tiny: 4096 positions
    assert d["model"]["layers"] == 2 and d["runs"] == [] and "Random weights" in d["note"]
