"""The scripts and benchmarks that take run options refuse a bad value in one line, exit 2, before anything
runs (issue 60, item 6), as `python -m artifact` does: its OneLineParser, RunSpec's check naming the flag
(args.run_spec_of, args.refused_in_one_line). scripts/gpu_check.py reads and checks its flags before it
looks for a GPU, so on this machine (no GPU) a bad flag is its refusal, not the no-GPU exit 3."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def one_line(err: str, *says: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: "), err
    for s in says:
        assert s in err, (s, err)
    return err


def script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_offload_overhead_refuses_lookahead_0_in_one_line():
    """Before: a SettingError's traceback, exit 1."""
    r = script("benchmarks/offload_overhead.py", "--lookahead", "0")
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    one_line(r.stderr, "offload_overhead.py: --lookahead: lookahead must be >= 1, got 0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal before the GPU check, without a GPU")
def test_gpu_check_refuses_a_bad_run_flag_before_it_looks_for_the_gpu():
    """Before: `no CUDA GPU visible`, exit 3: the flag was read only by the engine step, on a GPU."""
    r = script("scripts/gpu_check.py", "--lookahead", "0")
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    one_line(r.stderr, "gpu_check.py: --lookahead: lookahead must be >= 1, got 0")
    assert "no CUDA GPU" not in r.stderr


def load(folder: str, name: str):
    """scripts/<name>.py or benchmarks/<name>.py as a module (its folder on sys.path: scripts import each
    other)."""
    where = ROOT / folder
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    spec = importlib.util.spec_from_file_location(f"_{folder}_{name}", where / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def refused(capsys, run, argv, *says):
    """`run(argv)` exits 2 with one line on stderr naming `says`, and prints nothing else."""
    with pytest.raises(SystemExit) as e:
        run(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "", (argv, out, err)
    one_line(err, *says)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--lookahead", "0"], ["--lookahead: lookahead must be >= 1, got 0"]),
        (["--tau", "-1"], ["--tau: tau must be >= 1"]),
        (["--forward", "bogus"], ["--forward", "unknown forward mode 'bogus'", "eager"]),
        (["--expert-kernel", "nope"], ["--expert-kernel", "grouped"]),
        (["--link-priority", "lifo"], ["--link-priority", "lifo"]),
        (["--lookahead", "x"], ["argument --lookahead: invalid int value: 'x'"]),
        (["--test-timeout", "0"], ["--test-timeout must be >= 1"]),
        (["--ratios", "0,1"], ["--ratios must be positive"]),
    ],
)
def test_gpu_check_refuses_bad_flags_in_one_line(argv, says, capsys):
    refused(capsys, load("scripts", "gpu_check").main, argv, *says)


def test_the_graphs_check_refuses_a_bad_run_flag_in_one_line(capsys):
    graphs = load("scripts", "gpu_check_graphs")
    refused(capsys, graphs.main, ["--tau", "0"], "--tau: tau must be >= 1, got 0")
    refused(capsys, graphs.main, ["--forward", "eager"], "--forward: this check runs every configuration")


BENCHMARKS = [
    ("offload_overhead", ["--gen-length", "0"], ["--gen-length: gen_length must be >= 1, got 0"]),
    ("offload_overhead", ["--batch", "9"], ["--batch must be in [1, 8], got 9"]),
    ("offload_overhead", ["--reps", "0"], ["--reps must be >= 1, got 0"]),
    ("offload_overhead", ["--forward", "bogus"], ["argument --forward: invalid choice: 'bogus'"]),
    ("step_time", ["--tau", "0"], ["--tau: tau must be >= 1, got 0"]),
    ("step_time", ["--threads", "0"], ["--threads must be in [1, 1024], got 0"]),
    ("step_time", ["--task", "nope"], ["argument --task: invalid choice: 'nope'"]),
    ("step_time", ["--forward", "segmented"], ["--forward: forward segmented needs mode cached"]),
    ("link_priority", ["--lookahead", "-1"], ["--lookahead: lookahead must be >= 1, got -1"]),
    ("link_priority", ["--ratios", "x"], ["argument --ratios: expected comma-separated numbers"]),
    ("link_priority", ["--ratios", "0,1"], ["--ratios must be > 0, got 0.0"]),
    ("link_priority", ["--n", "0"], ["--n must be in [1, "]),
    ("link_priority", ["--costs", "1,2"], ["--costs: expected three numbers"]),
    ("link_priority", ["--chunk-bytes", "0"], ["--chunk-bytes must be >= 1, got 0"]),
    ("host_overhead", ["--ratios", "-1"], ["--ratios must be > 0, got -1.0"]),
    ("host_overhead", ["--batches", "1,9"], ["--batches must be in [1, 8], got 9"]),
    ("host_overhead", ["--models", "tiny,huge"], ["--models: expected names from", "huge"]),
    ("host_overhead", ["--reps", "0"], ["--reps must be >= 1, got 0"]),
    ("replay_speed", ["--ratio", "0"], ["--ratio must be > 0, got 0.0"]),
    ("replay_speed", ["--repeat", "0"], ["--repeat must be >= 1, got 0"]),
    ("replay_speed", ["--traces", "absent.safetensors"], ["--traces: absent.safetensors: no such file"]),
]


@pytest.mark.parametrize("name, argv, says", BENCHMARKS, ids=[f"{n}{' '.join(a)}" for n, a, _ in BENCHMARKS])
def test_benchmarks_refuse_bad_values_before_any_work(name, argv, says, capsys, monkeypatch):
    """Each before a checkpoint is loaded or anything measured (either would fail this test)."""
    mod = load("benchmarks", name)

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the flags were checked")

    for attr in ("load_checkpoint", "print_engine_per_demand"):
        if hasattr(mod, attr):
            monkeypatch.setattr(mod, attr, no_work)
    refused(capsys, mod.main, argv, *says)
