"""scripts/gpu_run.sh, the one prepared GPU run, on a machine without a GPU: its budgets (the default fits 5
minutes), what it leaves under --out (what a borrowed GPU machine returns: at most 8 files, none in a
folder), the reports named after the GPU (nvidia-smi, here a PATH-shimmed script that prints a card's name),
the leftover temporary files removed, the summary; and the targets it adds, T7 and the profiled run's replay,
on synthetic rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile

import pytest
import torch
from test_gpu_check import ROOT, _run, load

RUN = ROOT / "scripts" / "gpu_run.sh"
BUDGETS = (("environment", 60), ("graphs", 140), ("cuda_tests", 60), ("summary", 15))  # the default, in order
FULL = (("environment", 60), ("graphs", 260), ("cuda_tests", 180), ("summary", 15))
KILL_S = 5
MAX_FILES = 8
no_gpu = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks what happens on a machine without a GPU"
)


def gpu_run(*args, path_dir=None, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "ARTIFACT_CACHE": os.environ.get("ARTIFACT_CACHE", str(ROOT / ".cache"))}
    if path_dir is not None:
        env["PATH"] = f"{path_dir}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        ["bash", str(RUN), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


def fake_nvidia_smi(folder, output: str, rc: int = 0):
    """A real executable named nvidia-smi that prints `output` (what `nvidia-smi --query-gpu=name
    --format=csv,noheader` prints) and exits rc; put its folder first on PATH."""
    folder.mkdir(exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf '%s' '{output}'\nexit {rc}\n")
    exe.chmod(0o755)
    return folder


def layout(out) -> tuple[list[str], list[str]]:
    """(files, folders) under out, relative, at any depth."""
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return files, sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_dir())


def steps_of(out, name: str) -> dict:
    lines = (out / f"{name}_gpu_run.steps.jsonl").read_text().splitlines()
    return {json.loads(ln)["step"]: json.loads(ln) for ln in lines}


# --- arguments and budgets -------------------------------------------------------------------------------
def test_the_default_budgets_fit_5_minutes_full_is_the_rest_and_each_is_a_flag():
    p = gpu_run("--show-budgets")
    nums = dict(BUDGETS)
    assert p.returncode == 0 and p.stdout.strip() == (
        f"gpu_run: budgets environment {nums['environment']} s, graphs {nums['graphs']} s, cuda_tests "
        f"{nums['cuda_tests']} s, summary {nums['summary']} s, {KILL_S} s of grace each: "
        f"{sum(b + KILL_S for _, b in BUDGETS)} s"
    )
    assert sum(b + KILL_S for _, b in BUDGETS) <= 300  # each budget plus timeout's kill grace
    assert nums["environment"] >= 60  # a cold `import torch` and CUDA's initialisation
    f = gpu_run("--full", "--show-budgets")
    assert f.returncode == 0 and f"{sum(b + KILL_S for _, b in FULL)} s" in f.stdout
    assert "graphs 260 s, cuda_tests 180 s" in f.stdout
    o = gpu_run(
        "--budget-environment",
        70,
        "--budget-graphs",
        100,
        "--budget-tests",
        30,
        "--budget-summary",
        9,
        "--show-budgets",
    )
    assert "environment 70 s, graphs 100 s, cuda_tests 30 s, summary 9 s" in o.stdout and "229 s" in o.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["--fast"],
            "unknown argument '--fast'; expected --out DIR, --name NAME, --dry-run, --full, --budget-STEP S",
        ),
        (["--budget-tests", "0"], "--budget-tests (seconds) must be in [1, 86400], got 0"),
        (["--budget-graphs", "2m"], "--budget-graphs needs a whole number of seconds (digits, no sign or"),
        (["--budget-summary"], "--budget-summary needs seconds"),
        (["--name", "h2 00"], "--name must be letters, digits, - or _"),
    ],
)
def test_gpu_run_refuses_bad_arguments_in_one_line(args, words):
    p = gpu_run(*args)
    assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1


# --- the GPU's name ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "device, short",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA RTX A5000", "a5000"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA B200", "b200"),
        ("cpu", ""),
    ],
)
def test_card_name_is_the_short_lower_case_name(device, short):
    assert load("gpu_run").card_name(device) == short


@no_gpu
def test_a_name_that_is_not_the_gpus_is_refused_before_anything_runs(tmp_path):
    shim = fake_nvidia_smi(tmp_path / "bin", "NVIDIA H100 80GB HBM3\n")
    out = tmp_path / "out"
    p = gpu_run("--out", out, "--name", "h200", path_dir=shim, timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "--name h200 but the GPU is h100 (nvidia-smi)" in p.stderr and "pass --name h100" in p.stderr
    assert "== step" not in p.stdout and not out.exists()


@no_gpu
@pytest.mark.slow
def test_the_reports_are_named_after_the_gpu_nvidia_smi_names(tmp_path):
    """nvidia-smi says A5000 (a PATH shim; this machine has no GPU, so the environment step then stops with
    exit 3, before it writes anything): the reports are a5000_*, never h200_*; a matching --name, in any case,
    is accepted."""
    shim = fake_nvidia_smi(tmp_path / "bin", "NVIDIA RTX A5000\n")
    for args in ([], ["--name", "A5000"]):
        out = tmp_path / f"out{len(args)}"
        p = gpu_run("--out", out, *args, path_dir=shim, timeout=120)
        assert p.returncode == 3 and "no CUDA GPU visible" in p.stderr
        assert "reports under" in p.stdout and "(prefix a5000_)" in p.stdout
        assert "refused, nothing written under" in p.stdout and not out.exists()


@no_gpu
@pytest.mark.slow
def test_gpu_run_stops_after_the_environment_without_a_gpu(tmp_path):
    """No GPU and an nvidia-smi that fails (as where no driver is loaded): the reports are named gpu_*, the
    environment step says no CUDA GPU is visible, nothing else runs and nothing is written."""
    shim = fake_nvidia_smi(tmp_path / "bin", "NVIDIA-SMI has failed because it couldn't communicate", rc=9)
    out = tmp_path / "out"
    p = gpu_run("--out", out, path_dir=shim, timeout=120)
    assert p.returncode == 3 and "no CUDA GPU visible" in p.stderr and "--dry-run runs the steps" in p.stderr
    assert "nvidia-smi gave no GPU name; the reports are named gpu_*" in p.stdout
    assert "== step 1/4 environment: budget 60 s" in p.stdout and "step 2/4" not in p.stdout
    assert len(p.stderr.strip().splitlines()) == 1 and not out.exists()


# --- the dry run: what it leaves under --out ----------------------------------------------------------
@pytest.mark.slow
def test_gpu_run_dry_run_leaves_at_most_8_files_one_archive_and_no_temporary_file(tmp_path):
    """The CPU dry run of the GPU run, graphs check first: each step's budget printed, each step's line in
    the steps file, at most 8 files under --out and no folder, one archive of the step files beside the
    summary, the temporary files of killed atomic writes (left here before the run) removed, the CUDA tests'
    log verbose, T1-T7 printed as unmeasured; nothing offered to commit."""
    out = tmp_path / "out"
    out.mkdir()
    stale = [out / ".cpu_graphs.json.k1ll3d.tmp", out / "cpu_gpu_run.steps.jsonl.tmp"]
    for f in stale:
        f.write_text("{half a fi")
    p = gpu_run("--dry-run", "--out", out, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for i, (name, budget) in enumerate(BUDGETS, 1):
        assert f"== step {i}/4 {name}: budget {budget} s" in p.stdout
    steps = steps_of(out, "cpu")
    assert list(steps) == [n for n, _ in BUDGETS]
    for name, budget in BUDGETS:
        d = steps[name]
        assert d == {**d, "step": name, "budget_s": budget, "rc": 0, "timed_out": False} and d["seconds"] >= 0
    files, folders = layout(out)
    assert folders == [] and len(files) <= MAX_FILES, files
    assert files == sorted(
        [
            "cpu_gpu_run.steps.jsonl",
            "cpu_gpu_run.tar.gz",
            "cpu_gpu_run_environment.json",
            "cpu_gpu_run_summary.json",
            "cpu_gpu_run_tests.json",
            "cpu_gpu_run_tests.log",
            "cpu_graphs.json",
        ]
    )
    assert not any(f.exists() for f in stale)
    with tarfile.open(out / "cpu_gpu_run.tar.gz") as tar:
        members = sorted(m.name for m in tar.getmembers())
    assert members == sorted(f"cpu_gpu_run/{f}" for f in files if f != "cpu_gpu_run.tar.gz")
    tests = json.loads((out / "cpu_gpu_run_tests.json").read_text())
    assert tests["collection_ok"] is True and tests["verdict"].startswith("none ran: ")
    assert tests["selection"] == "new path" and "tests/test_trace_engine.py" not in tests["command"]
    assert "-v -rA --durations=10" in tests["command"]
    log = (out / "cpu_gpu_run_tests.log").read_text()
    assert re.search(r"^tests/test_cuda.py::test_segmented_\S+ SKIPPED", log, re.M)  # -v: one line a test
    report = json.loads((out / "cpu_graphs.json").read_text())
    assert report["dry_run_on_cpu"] is True and len(report["engine"]["runs"]) == 4
    summary = p.stdout[p.stdout.index("== step 4/4 summary: budget") :]
    for name in ("T1", "T2", "T3", "T4", "T5", "T5b", "T6", "T7"):
        assert re.search(rf"^{name}: unmeasured \(dry run on the CPU", summary, re.M), name
    assert "graphs check: 4 offloaded rows, 2 of them segmented rows that did not replay" in summary
    assert "dry run on the CPU: nothing to commit" in summary and "reports to commit" not in summary
    s = json.loads((out / "cpu_gpu_run_summary.json").read_text())
    assert s["rows_not_replayed"] == 2 and all(t["status"] == "unmeasured" for t in s["targets"].values())
    assert (
        all(os.path.exists(r) for r in s["reports"]) and str(out / "cpu_gpu_run_summary.json") in s["reports"]
    )
    assert f"gpu_run: {len(files)} files of this run under {out}" in p.stdout


@pytest.mark.slow
def test_each_step_budget_is_its_flag_and_a_step_out_of_time_is_recorded(tmp_path):
    """--budget-graphs 2 and --budget-tests 1: both steps are killed at their limit (recorded as timed out,
    the run exits 1), the others run, the summary still writes its archive, and no temporary file of a
    killed write is left."""
    out = tmp_path / "out"
    p = gpu_run(
        "--dry-run",
        "--out",
        out,
        "--budget-graphs",
        2,
        "--budget-tests",
        1,
        "--budget-summary",
        30,
        timeout=300,
    )
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert "== step 2/4 graphs: budget 2 s" in p.stdout and "== step 3/4 cuda_tests: budget 1 s" in p.stdout
    steps = steps_of(out, "cpu")
    assert steps["graphs"]["timed_out"] is True and steps["graphs"]["budget_s"] == 2
    assert steps["cuda_tests"]["timed_out"] is True and steps["cuda_tests"]["budget_s"] == 1
    assert steps["summary"]["rc"] == 0 and steps["summary"]["budget_s"] == 30
    assert (
        "  graphs: timed out after its 2 s" in p.stdout
        and "  cuda_tests: timed out after its 1 s" in p.stdout
    )
    files, folders = layout(out)
    assert folders == [] and len(files) <= MAX_FILES and not [f for f in files if f.endswith(".tmp")]
    assert not list(out.glob(".*")) and (out / "cpu_gpu_run.tar.gz").exists()


# --- the summary ---------------------------------------------------------------------------------------
def test_gpu_run_summary_judges_the_rows_of_a_graphs_check_cut_short(tmp_path, capsys):
    """The graphs step killed at its limit leaves rows and no targets: the summary judges those rows (a
    segmented row that replayed is judged, one that did not is not), lists only files that exist (never
    the record of a step not yet written), packs the archive, and lists the reports to commit."""
    run = load("gpu_run")
    rows = [_run(link_busy_over_wall=0.9), _run(batch=4, replays=0)]
    (tmp_path / "h200_graphs.json").write_text(
        json.dumps({"engine": {"runs": rows}, "capped_link": {"caps": []}})
    )
    (tmp_path / "h200_gpu_run.steps.jsonl").write_text(
        json.dumps({"step": "environment", "budget_s": 60, "rc": 0, "timed_out": False, "seconds": 9.0})
        + "\n"
        + json.dumps({"step": "graphs", "budget_s": 140, "rc": 124, "timed_out": True, "seconds": 140.0})
        + "\n"
        + '{"step": "cuda_te'
    )  # a line cut short: skipped
    assert run.main(["summary", "--out", str(tmp_path), "--name", "h200"]) == 0
    out = capsys.readouterr().out
    assert "  graphs: timed out after its 140 s in 140 s" in out and "  cuda_tests: not run" in out
    assert "2 offloaded rows, 1 of them segmented rows that did not replay (the step did not finish" in out
    assert re.search(r"^T4: met \(1 rows that did not replay left out\)", out, re.M)
    assert re.search(r"^T2: not judged: 1 row did not replay \(missing: ", out, re.M)
    listed = out[out.index("reports to commit:") :]
    for f in (
        "h200_graphs.json",
        "h200_gpu_run_summary.json",
        "h200_gpu_run.tar.gz",
        "h200_gpu_run.steps.jsonl",
    ):
        assert str(tmp_path / f) in listed, f
    assert "tests" not in listed and "environment" not in listed  # never written: never listed
    s = json.loads((tmp_path / "h200_gpu_run_summary.json").read_text())
    assert s["targets"]["T4"]["status"] == "met" and s["rows_not_replayed"] == 1
    assert all(os.path.exists(r) for r in s["reports"])
    with tarfile.open(tmp_path / "h200_gpu_run.tar.gz") as tar:
        assert sorted(m.name for m in tar.getmembers()) == sorted(
            [
                "h200_gpu_run/h200_graphs.json",
                "h200_gpu_run/h200_gpu_run.steps.jsonl",
                "h200_gpu_run/h200_gpu_run_summary.json",
            ]
        )


def test_pack_keeps_at_most_8_of_this_runs_files_beside_the_archive(tmp_path, monkeypatch):
    """Over the limit, the least needed files leave the folder (they stay in the archive); the summary, the
    archive and the graphs report stay; leftover temporary files go; another run's files are not touched."""
    run = load("gpu_run")
    n = run.names(tmp_path, "h100")
    for k in ("summary", "graphs", "tests_json", "steps", "environment", "tests_log"):
        n[k].write_text("{}")
    (tmp_path / ".h100_graphs.json.x1y2.tmp").write_text("{")
    (tmp_path / "other_run.json").write_text("{}")
    monkeypatch.setattr(run, "MAX_FILES", 4)  # 7 of this run's files: 3 over
    archive, kept = run.pack(tmp_path, "h100")
    assert [p.name for p in kept] == [
        "h100_gpu_run_summary.json",
        "h100_gpu_run.tar.gz",
        "h100_graphs.json",
        "h100_gpu_run_tests.json",
    ]
    assert not (tmp_path / ".h100_graphs.json.x1y2.tmp").exists() and (tmp_path / "other_run.json").exists()
    with tarfile.open(archive) as tar:
        assert len(tar.getmembers()) == 6


# --- the targets the GPU run adds: T7, the profiled run's replay ----------------------------------------
def _t7_report(
    wall=12.0, compute=5.0, misses=800, peak=50.0, expert_bytes=6_291_456, resident_replays=40, forwards=8
):
    """A report with one C/W 1 demand segmented row at batch 1, its resident segmented row and the run's
    pinned peak: link ms per forward = misses / forwards x expert bytes / peak."""
    row = _run(wall_ms_median=wall, forwards=forwards, demand_misses_denoising=misses)
    resident = {
        "forward": "segmented",
        "batch": 1,
        "wall_ms_median": compute,
        "replays": resident_replays,
        "captures": 4,
        "capture_error": None,
    }
    return {
        "engine": {"runs": [row], "resident": [resident], "expert_bytes": expert_bytes},
        "pinned_peak": {"peak_gbps_256MiB": peak, "store_expert_copy_gbps": peak - 2, "expert_bytes": 1},
        "capped_link": {"caps": []},
    }


def test_t7_step_wall_against_the_physical_limit():
    """T7: wall ms per forward <= 1.15 x max(compute, misses per forward x expert bytes / peak pinned H2D),
    all from the same report; link ms here = 100 x 6291456 / 50e9 s = 12.58 ms."""
    mod = load("gpu_targets")
    link_ms = 1e3 * 100 * 6_291_456 / 50e9
    met = mod.judge(_t7_report(wall=1.15 * link_ms - 0.01))["T7"]
    f = met["figures"]["batch 1, C/W 1"]
    assert met["status"] == "met" and f["bound"] == "link" and f["link_ms"] == pytest.approx(link_ms)
    assert f["peak_h2d_gbps"] == 50.0 and f["compute_ms"] == 5.0 and f["misses_per_forward"] == 100
    assert "overstates the GPU's compute by the router syncs' bubbles" in met["note"]
    assert "overstates the GPU's compute by the router syncs' bubbles" in met["rule"]
    assert mod.judge(_t7_report(wall=1.15 * link_ms + 0.01))["T7"]["status"] == "not met"
    compute_bound = mod.judge(_t7_report(wall=23.0, compute=20.0))["T7"]  # 23 <= 1.15 x 20
    assert (
        compute_bound["status"] == "met" and compute_bound["figures"]["batch 1, C/W 1"]["bound"] == "compute"
    )
    assert mod.judge(_t7_report(wall=23.1, compute=20.0))["T7"]["status"] == "not met"


def test_t7_unmeasured_or_not_judged_without_same_run_figures():
    mod = load("gpu_targets")
    no_peak = _t7_report()
    no_peak["pinned_peak"] = {"skipped": "dry run on the CPU"}
    t = mod.judge(no_peak)["T7"]
    assert t["status"] == "unmeasured" and t["missing"] == ["the peak pinned H2D of this run (pinned_peak)"]
    t = mod.judge(_t7_report(resident_replays=0))["T7"]  # the compute did not replay: not read
    assert t["status"] == "unmeasured" and "a resident segmented run that replayed" in t["missing"][0]
    not_replayed = _t7_report()
    not_replayed["engine"]["runs"] = [
        _run(replays=0, wall_ms_median=10.0, forwards=8, demand_misses_denoising=8)
    ]
    t = mod.judge(not_replayed)["T7"]
    assert t["status"] == "not judged" and t["not_judged"] == "not judged: 1 row did not replay"
    dry = mod.judge({**_t7_report(), "dry_run_on_cpu": True})["T7"]
    assert dry["status"] == "unmeasured" and dry["would_be"] == "met"
    assert (
        mod.peak_h2d_gbps({"peak_gbps_256MiB": 54.8, "store_expert_copy_gbps": 53.1, "expert_bytes": 9})
        == 54.8
    )


def test_a_profiled_run_that_did_not_replay_is_not_read():
    """T2 and T3 read a profile only where the profiled runs' own segment counters show a replay."""
    mod, prof = load("gpu_targets"), load("gpu_profile")
    counts = {
        "launches_per_moe_layer": 10.0,
        "copies_per_moe_layer": 20.0,
        "aten_ops_per_moe_layer": 3.0,
        "event_syncs_per_moe_layer": 1.0,
        "stream_syncs_per_moe_layer": 0.0,
        "device_syncs_per_moe_layer": 0.0,
        "blocking_copies_per_moe_layer": 0.0,
        "device_reads_per_moe_layer": 1.0,
    }

    class Segs:
        def __init__(self, replays, eager=0, capture_error=None):
            self.replays, self.eager, self.capture_error, self.captures = replays, eager, capture_error, 0

    class Res:
        def __init__(self, segs):
            self.segments = segs

    good = prof.replay_counters(Res(Segs(40)), Res(Segs(40)))
    assert good["replayed"] is True and good["replays"] == [40, 40]
    bad = prof.replay_counters(Res(Segs(40)), Res(Segs(30, eager=3)))
    assert bad["replayed"] is False and bad["not_replayed"] == "3 pieces ran eagerly"
    assert prof.replay_counters(Res(None))["replayed"] is False
    assert mod.t2([_run(profile={**counts, **good})])["status"] == "met"
    for t in (
        mod.t2([_run(profile={**counts, **bad})]),
        mod.t3([_run(profile={**counts, **bad})], cuda=True),
    ):
        assert t["status"] == "unmeasured"
        assert (
            "whose own segment counters show a replay (1 profiled run did not: 3 pieces ran eagerly)"
            in t["missing"][0]
        )


def test_a_timed_out_test_run_names_the_tests_that_passed_before_the_limit():
    tests = load("gpu_tests")
    log = (
        "tests/test_cuda.py::test_cuda_link_copies_land_and_are_counted PASSED   [ 14%]\n"
        "tests/test_cuda.py::test_segmented_grouped_stage_is_captured_in_bf16_on_cuda FAILED [ 28%]\n"
        "tests/test_cuda.py::test_segmented_captures_and_replays_whole_recorded_runs_on_cuda[None] PASSED "
        "[ 42%]\n"
    )
    assert tests.passed_ids(log) == [
        "tests/test_cuda.py::test_cuda_link_copies_land_and_are_counted",
        "tests/test_cuda.py::test_segmented_captures_and_replays_whole_recorded_runs_on_cuda[None]",
    ]
    r = {
        "collection_ok": True,
        "timed_out": True,
        "collected": 7,
        "passed_before_the_limit": tests.passed_ids(log),
    }
    assert tests.verdict(r) == "timed out after collecting 7; 2 passed before the limit (the log names them)"
    cmd = tests.command()
    assert [c for c in cmd if "::" in c] == list(tests.NEW_PATH) and "--deselect" not in cmd
    assert all(f in tests.command(full=True) for f in tests.FILES) and "-q" in tests.collect_command(cmd)
    assert "-v" not in tests.collect_command(cmd)
