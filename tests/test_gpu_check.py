"""scripts/gpu_check.sh on a machine without a GPU: the distinct exit code, and the CPU dry run of the
same pipeline (tiny shapes, emulated link) writing the JSON summary."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def load(name: str):
    """scripts/<name>.py as a module (scripts/ on sys.path: the scripts import each other)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_script():
    return load("gpu_check")


def sh(*args, timeout=120):
    env = {**os.environ, "ARTIFACT_CACHE": os.environ.get("ARTIFACT_CACHE", str(ROOT / ".cache"))}
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens on a machine without a GPU")
def test_no_gpu_exits_3_with_a_clear_message(tmp_path):
    out = tmp_path / "summary.json"
    p = sh("--out", out)
    assert p.returncode == load_script().EXIT_NO_GPU == 3
    assert "no CUDA GPU visible (torch.cuda.is_available() is False); nothing was run" in p.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "script, args, words",
    [
        ("check", ["--device", "cpu"], "--allow-cpu"),
        ("check", ["--ratios", "0.5,x"], "comma-separated"),
        ("check", ["--ratios", "0,1"], "positive"),
        ("check", ["--batches", "9"], "--batches"),
        ("check", ["--store-gb", "0"], "--store-gb"),
        ("check", ["--layers", "1"], "--layers"),
        ("graphs", ["--device", "cpu"], "--allow-cpu"),
        ("graphs", ["--ratios", "1,x"], "comma-separated"),
        ("graphs", ["--batches", "0"], "--batches"),
        ("graphs", ["--budget-s", "0"], "--budget-s"),
        ("graphs", ["--layers", "1"], "--layers"),
    ],
)
def test_bad_arguments_exit_2(script, args, words, capsys):
    """scripts/gpu_check.py and its graphs check (scripts/gpu_check_graphs.py) alike."""
    with pytest.raises(SystemExit) as e:
        (load_script() if script == "check" else load_graphs()).parse_args(args)
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_dry_run_writes_the_seven_steps_in_order(tmp_path):
    out = tmp_path / "gpu_check.json"
    p = sh(
        "--device",
        "cpu",
        "--allow-cpu",
        "--skip-tests",
        "--ratios",
        "0.83,1.0",
        "--gen-length",
        32,
        "--prompt-length",
        20,
        "--layers",
        3,
        "--out",
        out,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    d = json.loads(out.read_text())
    mod = load_script()
    assert (
        d["steps"]
        == list(mod.STEPS)
        == ["environment", "cuda_tests", "pinned_peak", "capped_link", "moe_layer", "pinned_store", "engine"]
    )
    assert "Random weights route differently" in d["note"] and d["dry_run_on_cpu"] is True
    assert d["exit_code"] == 0 and d["cuda_tests"]["skipped"] == "--skip-tests"
    assert "no pinned memory" in d["pinned_peak"]["skipped"] and "needs CUDA" in d["pinned_store"]["skipped"]
    caps = d["capped_link"]["caps"]
    assert [c["fraction"] for c in caps] == [1.0, 0.5, 0.25]
    assert all(
        c["achieved_gbps"] > 0
        and c["target_gbps"] == pytest.approx(d["capped_link"]["peak_gbps"] * c["fraction"])
        for c in caps
    )
    m = d["moe_layer"]
    assert m["equal_outputs"] is True and m["max_abs_diff"] == 0.0  # CPU fp32: bit for bit
    assert m["kernels"]["loop"]["host_ms"] > 0 and m["kernels"]["grouped"]["host_ms"] > 0
    e = d["engine"]
    runs = e["runs"]
    assert [(r["batch"], r["cache_ratio"], r["policy"]) for r in runs] == [
        (b, c, p) for b in (1, 4) for c in (0.83, 1.0) for p in ("demand", "last_step")
    ]
    assert e["all_tokens_equal_resident"] is True
    assert e["all_forwards_denoising_steps"] is True and e["decode"]["threshold"] == 1.0
    for r in runs:
        assert r["ms_per_forward"] > 0 and r["link_bytes"] > 0 and 0 < r["link_busy_over_wall"] <= 1.0
        assert r["prefill_ms"] > 0 and r["prefill_forwards"] >= 1  # prompt of 20 -> 32: a block
        assert r["denoise_forwards"] == r["forwards"] == 8 and r["all_forwards_denoising_steps"] is True
        assert r["denoise_ms_per_forward"] > 0 and 0 < r["host_ms_per_forward"] <= r["denoise_ms_per_forward"]
        assert r["sync_wait_ms_per_forward"] == 0.0  # on the CPU the counts' read blocks on nothing
        assert r["stall_seconds"] >= 0 and r["demand_misses"] > 0
    assert set(e["measures"]) >= {
        "prefill_ms",
        "denoise_ms_per_forward",
        "host_ms_per_forward",
        "sync_wait_ms_per_forward",
        "link_busy_over_wall",
    }
    steps = ("pinned_peak", "capped_link", "moe_layer", "engine")
    # every figure says what it is
    assert all("measures" in d[step] or "skipped" in d[step] for step in steps)
    assert m["within_tolerance"] is True and m["tolerance"]["rtol"] == 0.0
    assert all(r["speculative_transfers"] == 0 for r in runs if r["policy"] == "demand")
    assert sum(r["speculative_transfers"] for r in runs if r["policy"] == "last_step") > 0
    assert [x["batch"] for x in e["resident"]] == [1, 4]


def test_cuda_tests_that_cannot_be_collected_have_their_own_exit_code(monkeypatch):
    mod, tests = load_script(), load("gpu_tests")
    a = mod.parse_args(["--device", "cpu", "--allow-cpu"])

    class Done:
        def __init__(self, rc, out):
            self.returncode, self.stdout, self.stderr = rc, out, ""

    monkeypatch.setattr(
        tests.subprocess, "run", lambda *x, **k: Done(2, "ERROR tests/test_cuda.py - ImportError")
    )
    r = tests.cuda_tests(a, torch)
    assert r["collection_ok"] is False and r["ok"] is False and mod.EXIT_TESTS_NOT_RUN == 5
    runs = iter(
        [
            Done(0, "tests/test_cuda.py::a\ntests/test_cuda.py::b\ntests/test_cuda.py::c\n"),
            Done(0, "== 2 passed in 1.0s =="),
        ]
    )
    monkeypatch.setattr(tests.subprocess, "run", lambda *x, **k: next(runs))
    r = tests.cuda_tests(a, torch)
    assert r["collected"] == 3 and r["ran"] == 2 and r["all_ran"] is False
    runs = iter(
        [Done(0, "tests/test_cuda.py::a\ntests/test_cuda.py::b\n"), Done(0, "== 1 passed, 1 skipped ==")]
    )
    monkeypatch.setattr(tests.subprocess, "run", lambda *x, **k: next(runs))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # on a GPU a skipped CUDA test did not run
    assert tests.cuda_tests(a, torch)["all_ran"] is False
    runs = iter(
        [Done(0, "tests/test_cuda.py::a\ntests/test_cuda.py::b\n"), Done(0, "== 1 passed, 1 skipped ==")]
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # without one it skips with its reason
    assert tests.cuda_tests(a, torch)["all_ran"] is True


def test_a_failing_step_keeps_the_report(tmp_path):
    out = tmp_path / "gpu_check.json"
    p = sh(
        "--device",
        "cpu",
        "--allow-cpu",
        "--skip-tests",
        "--prompt-length",
        5000,
        "--layers",
        2,
        "--batches",
        "1",
        "--ratios",
        "1",
        "--out",
        out,
    )
    assert p.returncode == load_script().EXIT_ERROR == 4
    d = json.loads(out.read_text())
    assert d["exit_code"] == 4 and d["engine"]["error"]["type"] == "ValueError"
    assert "max_position_embeddings" in d["engine"]["error"]["message"]  # tiny: 4096 positions
    assert d["engine"]["runs"] == [] and d["steps"][-1] == "engine"
    assert d["moe_layer"]["equal_outputs"] is True  # earlier steps kept


# --- the graphs check (scripts/gpu_check_graphs.py, step 3 of scripts/gpu_run.sh) ----------------------
def load_graphs():
    return load("gpu_check_graphs")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens on a machine without a GPU")
def test_graphs_check_without_a_gpu_exits_3(tmp_path):
    out = tmp_path / "g.json"
    p = sh("graphs", "--out", out)
    assert p.returncode == 3 and "no CUDA GPU visible" in p.stderr and not out.exists()


@pytest.mark.slow
def test_graphs_check_dry_run_measures_both_paths_and_judges_the_targets(tmp_path):
    out = tmp_path / "g.json"
    p = sh(
        "graphs",
        "--device",
        "cpu",
        "--allow-cpu",
        "--batches",
        "1",
        "--ratios",
        "1.0",
        "--gen-length",
        32,
        "--prompt-length",
        20,
        "--layers",
        3,
        "--out",
        out,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    d = json.loads(out.read_text())
    mod = load_graphs()
    assert d["steps"] == list(mod.STEPS) and d["exit_code"] == 0 and d["dry_run_on_cpu"] is True
    assert d["environment"]["kernel"] and d["environment"]["forward_modes"] == ["eager", "segmented"]
    h = d["host_costs"]
    assert h["launch_us"] > 0 and h["copy_us"] > 0 and h["batched_copy_us"] > 0
    assert h["graph_replay_us"] is None and "CUDA" in h["graph_replay_skipped"]
    e = d["engine"]
    assert e["moe_layers"] == 2 and e["errors"] == 0 and e["skipped"] == []
    assert [(r["forward"], r["policy"]) for r in e["runs"]] == [
        (g, p) for p in ("demand", "last_step") for g in ("eager", "segmented")
    ]
    assert [(r["forward"], r["batch"]) for r in e["resident"]] == [("eager", 1), ("segmented", 1)]
    for r in e["runs"] + e["resident"]:  # on the CPU the segments run eagerly: never a replay
        if r["forward"] == "segmented":
            assert r["replayed"] is False and r["not_judged"].startswith("segments did not replay")
            assert not r["replays"]
        else:
            assert r["captures"] is r["replays"] is r["capture_error"] is None
    assert e["all_tokens_equal_resident"] is True and e["all_counts_equal_replay"] is True
    for r in e["runs"] + e["resident"]:
        assert len(r["host_ms"]) == len(r["wall_ms"]) == r["forwards"] == 8  # one block of 8 steps
        assert 0 < r["host_ms_median"] <= r["host_ms_p90"] and r["wall_ms_median"] > 0
    for r in e["runs"]:
        assert r["replay"] == {k: r[k] for k in mod.rows.COUNT_KEYS} and r["demand_misses"] > 0
        assert r["h2d_ms_per_forward"] > 0 and r["host_over_h2d"] == pytest.approx(
            r["host_ms_median"] / r["h2d_ms_per_forward"]
        )
        assert ("profile" in r) == (r["policy"] == "demand")  # C/W 1, demand only
    for r in (r for r in e["runs"] if r["policy"] == "demand"):
        prof = r["profile"]
        assert prof["forwards"] == 8 and prof["device_reads_per_moe_layer"] == 1.0  # the router's one read
        # no kernels on a CPU
        assert prof["aten_ops_per_moe_layer"] > 0 and prof["launches_per_moe_layer"] == 0
    assert d["fp32_tokens"]["skipped"].startswith("on the CPU the engine rows run in float32")
    assert e["dtype"] == "float32" and all(r["dtype"] == "float32" for r in e["runs"] + e["resident"])
    t = d["targets"]
    assert sorted(t) == ["T1", "T2", "T3", "T4", "T5", "T5b", "T6", "T7"]
    assert all(x["status"] == "unmeasured" and "dry run" in x["why"] for x in t.values())
    for name in ("T1", "T2", "T3", "T4", "T6", "T7"):  # judged on segmented rows only: none replayed
        assert (
            t[name]["would_be"] == "not judged"
            and t[name]["not_judged"] == "not judged: 2 rows did not replay"
        )
    f5 = t["T5"]["figures"]  # the eager rows, float32 on the CPU
    assert f5["runs"] == f5["counts_equal_replay"] == f5["float32_runs"] == f5["tokens_equal_resident"] == 2
    assert set(t["T5b"]["figures"]) == {"0.5x", "0.25x"}  # the emulated link's timing on a shared CPU
    assert "the peak pinned H2D of this run (pinned_peak)" in t["T7"]["missing"]
    assert (
        "T3: unmeasured (dry run on the CPU: the tiny model on the emulated link, not an H200; would be not "
        "judged: 2 rows did not replay; missing: " in p.stdout
    )


def _run(forward="segmented", batch=1, ratio=1.0, policy="demand", host=2.0, h2d=10.0, **kw):
    seg = {"captures": 4, "replays": 40, "capture_error": None} if forward == "segmented" else {}
    r = {
        "forward": forward,
        **seg,
        "batch": batch,
        "cache_ratio": ratio,
        "policy": policy,
        "cache_experts": 80,
        "num_experts": 256,
        "host_ms_median": host,
        "h2d_ms_per_forward": h2d,
        "host_over_h2d": host / h2d,
        "link_busy_over_wall": 0.9,
        "counts_equal_replay": True,
        "tokens_equal_resident": True,
    }
    return r | kw


def test_t1_host_over_h2d():
    mod = load("gpu_targets")
    runs = [_run(batch=1), _run(batch=4), _run(ratio=1.73, host=4.0)]
    assert mod.t1(runs)["status"] == "met"
    runs[2] = _run(ratio=1.73, host=6.0)  # 0.6 > 0.5 at C/W 1.73
    v = mod.t1(runs)
    assert v["status"] == "not met" and v["figures"]["batch 1, C/W 1.73"]["host_over_h2d"] == 0.6
    assert mod.t1(runs[:2])["status"] == "unmeasured"  # a figure missing: never guessed
    assert mod.t1([_run(batch=1, forward="eager"), *runs[1:]])["status"] == "unmeasured"  # eager: not judged


def _profiled(launches=10.0, event_syncs=1.0, stream_syncs=0.0, blocking=0.0):
    return _run(
        profile={
            "launches_per_moe_layer": launches,
            "copies_per_moe_layer": 20.0,
            "aten_ops_per_moe_layer": 3.0,
            "event_syncs_per_moe_layer": event_syncs,
            "stream_syncs_per_moe_layer": stream_syncs,
            "device_syncs_per_moe_layer": 0.0,
            "blocking_copies_per_moe_layer": blocking,
            "device_reads_per_moe_layer": 1.0,
        }
    )


def test_t2_launches_per_moe_layer():
    mod = load("gpu_targets")
    assert mod.t2([_profiled(12.0)])["status"] == "met"
    assert mod.t2([_profiled(12.2)])["status"] == "not met"
    assert mod.t2([_run()])["status"] == "unmeasured"


def test_t3_syncs_per_forward():
    mod = load("gpu_targets")
    assert mod.t3([_profiled()], cuda=True)["status"] == "met"
    for bad in (_profiled(event_syncs=2.0), _profiled(stream_syncs=0.2), _profiled(blocking=1.0)):
        assert mod.t3([bad], cuda=True)["status"] == "not met"
    assert mod.t3([_profiled(event_syncs=0.0)], cuda=False)["status"] == "met"  # CPU: the device reads


def test_t4_link_busy():
    mod = load("gpu_targets")
    assert mod.t4([_run(link_busy_over_wall=0.85)])["status"] == "met"
    assert mod.t4([_run(link_busy_over_wall=0.58)])["status"] == "not met"


def test_t5_counts_and_float32_tokens_t5b_the_cap():
    """T5 judges counts on every run and tokens on the float32 runs only (bf16 may diverge after the first
    step); T5b judges the capped link apart."""
    mod = load("gpu_targets")
    caps = [{"fraction": 0.5, "achieved_over_target": 1.05}, {"fraction": 0.25, "achieved_over_target": 0.95}]
    assert mod.t5([_run(), _run(forward="eager")])["status"] == "met"
    assert mod.t5([_run(), _run(counts_equal_replay=False)])["status"] == "not met"
    assert mod.t5([_run(), _run(tokens_equal_resident=False)])["status"] == "not met"
    assert mod.t5([_run(), {"forward": "segmented", "error": "RuntimeError: x"}])["status"] == "not met"
    bf16 = [_run(dtype="bfloat16", tokens_equal_resident=False), _run(dtype="bfloat16")]
    v = mod.t5(bf16, fp32=[_run(dtype="float32")])  # bf16 tokens shown, not judged
    assert v["status"] == "met" and v["figures"]["not_judged_bf16_tokens_equal_resident"] == "1 of 2"
    assert mod.t5(bf16, fp32=[_run(tokens_equal_resident=False)])["status"] == "not met"
    v = mod.t5(bf16, fp32=[])
    assert v["status"] == "unmeasured" and "float32" in v["missing"][0]
    assert mod.t5b(caps)["status"] == "met"
    assert mod.t5b([caps[0], {"fraction": 0.25, "achieved_over_target": 1.2}])["status"] == "not met"
    assert mod.t5b(caps[:1])["status"] == "unmeasured"


def test_t6_policies_host_difference():
    mod = load("gpu_targets")
    runs = [
        _run(host=2.0),
        _run(policy="last_step", host=2.9),  # |0.9| <= 0.1 x 10
        _run(ratio=1.73, host=2.0, cache_experts=256),
        _run(ratio=1.73, policy="last_step", host=9.0, cache_experts=256),
    ]
    v = mod.t6(runs)
    assert v["status"] == "met" and v["figures"]["batch 1, C/W 1.73"].startswith("excluded: C = E")
    runs[1] = _run(policy="last_step", host=3.1)
    assert mod.t6(runs)["status"] == "not met"
    assert mod.t6(runs[2:])["status"] == "unmeasured"  # only C = E cells


def test_judge_marks_a_dry_run_unmeasured_and_a_gpu_report_judged():
    mod = load("gpu_targets")
    report = {"engine": {"runs": [_run(link_busy_over_wall=0.9)]}, "capped_link": {"caps": []}}
    assert mod.judge(report)["T4"]["status"] == "met"
    dry = mod.judge({**report, "dry_run_on_cpu": True})["T4"]
    assert dry["status"] == "unmeasured" and dry["would_be"] == "met"


def test_counting_inside_forwards():
    mod, graphs = load("gpu_profile"), load_graphs()
    f = mod.FORWARD
    events = [
        (f, 0, 100),
        (f, 200, 300),
        ("aten::add", 10, 20),
        ("aten::mul", 12, 15),  # mul inside add: not top-level
        ("cudaLaunchKernel", 13, 14),
        ("cudaGraphLaunch", 210, 211),
        ("cudaEventSynchronize", 220, 230),
        ("cudaStreamSynchronize", 150, 160),  # between the forwards: the decode loop's
        ("cudaMemcpyAsync", 250, 251),
        ("cudaMemcpy", 260, 270),
        ("aten::sum", 150, 160),
    ]
    c = mod.count_in_forwards(events)
    assert c == {
        "forwards": 2,
        "launches": 2,
        "copies": 1,
        "event_syncs": 1,
        "stream_syncs": 0,
        "device_syncs": 0,
        "blocking_copies": 1,
        "aten_ops": 1,
    }
    versioned = [
        (f, 0, 100),
        ("cudaLaunchKernel_v7000", 1, 2),
        ("cudaLaunchKernelExC_v11060", 3, 4),
        ("cudaGraphLaunch_v10000", 5, 6),
        ("cudaMemcpyAsync_v3020", 7, 8),
        ("cudaMemcpy_v3020", 9, 10),
        ("cudaEventSynchronize_v3020", 11, 12),
        ("cudaStreamSynchronize_ptsz", 13, 14),
        ("cudaLaunchKernelFoo", 15, 16),
    ]  # not a runtime call this counts
    assert mod.count_in_forwards(versioned) == {
        "forwards": 1,
        "launches": 3,
        "copies": 1,
        "event_syncs": 1,
        "stream_syncs": 1,
        "device_syncs": 0,
        "blocking_copies": 1,
        "aten_ops": 0,
    }
    assert (
        graphs.rows.p90([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0]) == 9.0
        and graphs.rows.p90([]) is None
    )


def test_a_failed_replay_or_profile_leaves_its_target_unmeasured():
    mod = load("gpu_targets")
    v = mod.t5([_run(), _run(counts_equal_replay=None)])
    assert v["status"] == "unmeasured" and "the replay of segmented batch 1" in v["missing"][0]
    broken = _run(profile={"error": "RuntimeError: capture failed"})
    assert mod.t2([broken])["status"] == mod.t3([broken], cuda=True)["status"] == "unmeasured"


def test_rows_whose_segments_did_not_replay_are_not_judged():
    """A segmented row with no replay (its segments ran eagerly), a capture error, or no counters at all (a
    report's old `graphs: "on"` row) measured the eager path: no target judges it."""
    mod = load("gpu_targets")
    good = {"engine": {"runs": [_run(link_busy_over_wall=0.9)]}, "capped_link": {"caps": []}}
    assert mod.judge(good)["T4"]["status"] == "met"
    for bad in (
        _run(replays=0),
        _run(capture_error="RuntimeError: capture failed"),
        {
            k: v
            for k, v in _run(forward=None, graphs="on").items()
            if k not in ("forward", "captures", "replays", "capture_error")
        },
    ):
        t = mod.judge({"engine": {"runs": [bad]}, "capped_link": {"caps": []}})
        assert (
            t["T4"]["status"] == "not judged" and t["T4"]["not_judged"] == "not judged: 1 row did not replay"
        )
        assert mod.line("T4", t["T4"]).startswith("T4: not judged: 1 row did not replay (missing: ")
        assert t["T5"]["figures"]["runs"] == 0  # nor counted among T5's runs
    mixed = mod.judge(
        {
            "engine": {"runs": [_run(link_busy_over_wall=0.9), _run(batch=4, replays=0)]},
            "capped_link": {"caps": []},
        }
    )
    assert mixed["T4"]["status"] == "met" and mixed["T4"]["did_not_replay"] == 1
    assert "1 rows that did not replay left out" in mod.line("T4", mixed["T4"])


@pytest.mark.slow
def test_graphs_check_writes_each_engine_row_as_it_is_measured(tmp_path, monkeypatch):
    """Killed during its third configuration (here: an interrupt raised in place of it), the graphs check's
    report already holds the two rows measured before, and the step's partial state."""
    mod = load_graphs()
    real, calls = mod.rows.offloaded, []

    def offloaded(*args, **kw):
        calls.append(kw["forward"])
        if len(calls) == 3:
            raise KeyboardInterrupt("the step's time limit")
        return real(*args, **kw)

    monkeypatch.setattr(mod.rows, "offloaded", offloaded)
    out = tmp_path / "g.json"
    with pytest.raises(KeyboardInterrupt):
        mod.main(
            [
                "--device",
                "cpu",
                "--allow-cpu",
                "--batches",
                "1",
                "--ratios",
                "1.0",
                "--gen-length",
                "8",
                "--prompt-length",
                "4",
                "--layers",
                "2",
                "--out",
                str(out),
            ]
        )
    e = json.loads(out.read_text())["engine"]
    assert [(r["forward"], r["policy"]) for r in e["runs"]] == [("eager", "demand"), ("segmented", "demand")]
    assert [r["forward"] for r in e["resident"]] == ["eager", "segmented"] and all(
        "host_ms" in r for r in e["runs"]
    )


BARE_IMAGE_LACKS = (
    "transformers",
    "tokenizers",
    "pandas",
    "tqdm",
    "nbformat",
    "nbclient",
    "submitit",
    "matplotlib",
    "scipy",
    "huggingface_hub",
)


@pytest.mark.slow
def test_the_gpu_tests_collect_with_only_what_a_bare_gpu_image_has(tmp_path):
    """The CUDA tests step names its test files (never the whole tests/ folder, whose notebook and submitter
    tests import nbformat and submitit) and they collect in a python where only torch, numpy, safetensors
    and pytest are installed: here, the packages such an image lacks refuse to import."""
    tests = load("gpu_tests")
    cmd = tests.collect_command(tests.command(full=True))
    assert "tests" not in cmd and all(f in cmd for f in tests.FILES)
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class Bare:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {BARE_IMAGE_LACKS!r}:\n"
        "            raise ImportError(name + ' is not on a bare GPU image')\n"
        "sys.meta_path.insert(0, Bare())\n"
    )
    env = tests.run_env(no_tiny=True)
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path), env["PYTHONPATH"]))
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ids = [ln for ln in p.stdout.splitlines() if "::" in ln]
    # tiny: deselected
    assert ids and not any("test_offloaded_tokens_equal_resident_on_cuda" in i for i in ids)
    assert any("test_cuda_link_copies_land_and_are_counted" in i for i in ids)
    assert any("test_stream_on_the_cuda_link" in i for i in ids)
    whole = subprocess.run(
        [*cmd[:3], "tests", "-m", "cuda", "-q", "--collect-only", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert whole.returncode != 0 and "bare GPU image" in whole.stdout + whole.stderr  # the folder would not


# scripts/gpu_run.sh, its summary and T5, T5b, T7: tests/test_gpu_run.py


LINK_MODULES = ("link", "cuda_link", "cuda_runtime", "cuda_batch", "link_factory", "cuda_stub", "pacing")
LINK_AND_GPU_FILES = [
    *(ROOT / "artifact" / "offload" / "links" / f"{m}.py" for m in LINK_MODULES),
    *sorted((ROOT / "scripts").glob("gpu*")),
]


def test_the_link_modules_and_gpu_scripts_are_under_500_lines_and_say_what_is():
    """The line budget, and no text that tells history or cites what a reader cannot see, in the link's
    modules, the GPU scripts and the docs that give their figures."""
    from artifact.experiments import hardware

    for path in LINK_AND_GPU_FILES:
        n = len(path.read_text().splitlines())
        assert n <= 500, f"{path.relative_to(ROOT)} has {n} lines (> 500): split it by what it does"
    docs = [ROOT / "docs" / "host_path.md", ROOT / "docs" / "benchmarks.md"]
    for path in LINK_AND_GPU_FILES + docs:
        text = path.read_text()
        for phrase in (
            "not run yet",
            "as before",
            "no GPU was available",
            "the issue's",
            "the review's",
            "today's",
        ):
            assert phrase not in text, f"{path.relative_to(ROOT)}: {phrase!r}"
    host_path = docs[0].read_text()
    assert "52.92 GB/s in `h200_run2.json`" in host_path.replace("\n", " ").replace("54.80 and ", "")
    assert "53.05 GB/s in `h200.json`" in host_path.replace("\n", " ").replace("54.77 and ", "")
    assert not hasattr(hardware, "HOST_BOUND") and hardware.HOST_SHARE_NOT_COMPUTE == 0.5


def test_the_gpu_tests_step_names_files_and_ids_that_exist():
    """A renamed test file or test would make the CUDA step's list collect nothing or deselect nothing (and
    the step would then run past its budget): every file it names exists and every id it deselects is one
    that pytest collects."""
    tests = load("gpu_tests")
    assert all((ROOT / f).is_file() for f in tests.FILES), tests.FILES
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *tests.FILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    collected = {ln.strip() for ln in p.stdout.splitlines() if "::" in ln}
    missing = [d for d in tests.DESELECTED if d not in collected]
    assert not missing, f"deselected ids not collected: {missing}\n{p.stdout[-2000:]}{p.stderr[-2000:]}"
    missing = [t for t in tests.NEW_PATH if not any(c == t or c.startswith(t + "[") for c in collected)]
    assert not missing, f"the new path's tests not collected: {missing}"


def test_the_graphs_checks_warm_up_leaves_no_piece_of_a_timed_segmented_run_eager(tiny):
    """A program captures on its second forward, and the first step of a later block (which also commits the
    previous block) has a shape the decoder feeds once per run: after one warm-up run a timed run (capture
    off) meets it uncaptured and runs its pieces eagerly, so its row could not count as replayed. The graphs
    check's warm-up runs a segmented configuration twice, after which the timed run has no eager piece
    (the capture API stubbed on the CPU: tests/test_segments_capture.py)."""
    from functools import partial
    from types import SimpleNamespace

    from test_segments_capture import StubCapture, programs_of

    from artifact.model.decode import DecodeConfig
    from artifact.offload.runner import decode_prompts

    graphs = load("gpu_graphs_engine")
    dc = DecodeConfig(
        gen_length=2 * tiny.cfg.block_length,
        steps=tiny.cfg.block_length // 4,
        threshold=1.0,
        eos_early_stop=False,
    )
    prompt = list(range(11, 11 + 2 * tiny.cfg.block_length))  # block-aligned, as the graphs check's prompts
    a = SimpleNamespace(device="cpu")  # the script's flags: none of the run flags given (RunSpec's defaults)
    once = partial(decode_prompts, tiny, [prompt], 1, graphs.run_spec(a, dc, "segmented"))
    for warm_runs, eager in ((1, True), (2, False)):
        with programs_of(tiny.model, api=StubCapture(), lint=False):
            if warm_runs == 1:
                once()
            else:
                graphs.warm_up(once, "segmented")
            timed = decode_prompts(tiny, [prompt], 1, graphs.run_spec(a, dc, "segmented", timed=True))
        assert timed.segments.replays > 0 and (timed.segments.eager > 0) == eager, (warm_runs, timed.segments)
        assert timed.segments.replayed != eager
