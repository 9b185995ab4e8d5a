"""A full disk (ENOSPC, injected where the storage reports it: at fsync), a quota or a read-only file system
on an output: one line naming the file and what happened, exit 2, no traceback, no partial or empty file
left, and the same command completes once there is room."""

from __future__ import annotations

import errno
import os

import pytest
from test_bench import FakeRunner, fake_profile, quiet
from test_cli import one_line_error

from artifact.cli import main
from artifact.experiments.bench import run as bench
from artifact.experiments.bench import run_bench
from artifact.experiments.bench.results import read_rows
from artifact.model.routing import Demand, StepInfo
from artifact.offload.replay.trace import TraceRecorder
from artifact.paths import DISK_ERRORS

REAL_FSYNC = os.fsync


def fail_fsync(monkeypatch, code: int = errno.ENOSPC):
    """Every fsync of a regular file fails with `code` as the storage reports it (directories still sync)."""

    def fsync(fd):
        import stat

        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        return REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return monkeypatch


@pytest.fixture
def full_disk(monkeypatch):
    return fail_fsync(monkeypatch)


@pytest.fixture
def hand_trace(tmp_path):
    """A hand-made 2-layer trace over 16 experts (no model run)."""
    rec = TraceRecorder()
    for t, d in enumerate([{1, 2, 3}, {2, 3, 4}, {2, 3, 5}]):
        for layer in (1, 2):
            exp = tuple(sorted(d))
            rec(Demand(StepInfo(t, 0, t, "denoise"), layer, exp, (1,) * len(exp)))
    return rec.trace(
        {
            "moe_layers": [1, 2],
            "num_experts": 16,
            "config_hash": "x",
            "task": "hand",
            "batch_size": 1,
            "expert_bytes": 4,
        }
    ).save(tmp_path / "hand.safetensors")


def _leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def test_simulate_csv_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, hand_trace, full_disk):
    out = tmp_path / "out" / "sim.csv"
    line = one_line_error(
        capsys,
        main(
            [
                "simulate",
                "--trace",
                str(hand_trace),
                "--cache-experts",
                "4",
                "--policies",
                "demand",
                "--csv",
                str(out),
            ]
        ),
    )
    assert str(out) in line and os.strerror(errno.ENOSPC) in line and "run the same command again" in line
    assert not out.exists() and _leftovers(out.parent) == []  # no partial file, no temporary file
    full_disk.undo()
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(hand_trace),
                "--cache-experts",
                "4",
                "--policies",
                "demand",
                "--csv",
                str(out),
            ]
        )
        == 0
        and out.is_file()
    )


def test_synth_out_on_a_full_disk_is_one_line(tmp_path, capsys, full_disk):
    out = tmp_path / "s.safetensors"
    line = one_line_error(capsys, main(["synth", "--out", str(out), "--sequences", "1", "--blocks", "1"]))
    assert str(out) in line and not out.exists() and _leftovers(tmp_path) == []


def test_a_bench_append_on_a_full_disk_leaves_no_empty_file_and_resumes(tmp_path, full_disk):
    p = fake_profile(tasks=["gsm8k"], batch_sizes=[1], cache_ratios=[0.43, 1.0])
    out = tmp_path / "b.csv"
    with pytest.raises(OSError) as e:
        run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(out)
    assert not out.exists()  # no empty result file
    full_disk.undo()
    run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
    # cells x runs of a repetition (2 policies and demand's B arm: the A/A pair) x repetitions
    assert len(read_rows(out)) == 2 * 3 * 2


@pytest.mark.parametrize("code", [c for c in DISK_ERRORS if c != errno.EFBIG], ids=errno.errorcode.get)
def test_bench_out_through_the_command_line_is_one_line_and_resumes(tmp_path, capsys, monkeypatch, code):
    """`python -m artifact bench --out` on a full disk, a quota or a read-only file system (the model stands
    in: FakeRunner): one line naming the file, exit 2, no traceback, no empty result file; then it resumes."""
    monkeypatch.setattr(bench, "ModelRunner", lambda p, loaded=None: FakeRunner())
    out = tmp_path / "b.csv"
    argv = [
        "bench",
        "--profile",
        "cpu",
        "--set",
        "tasks=[gsm8k]",
        "--set",
        "batch_sizes=[1]",
        "--set",
        "cache_ratios=[0.43]",
        "--set",
        "repetitions=1",
        "--set",
        "warmup=0",
        "--out",
        str(out),
        "--quiet",
    ]
    fail_fsync(monkeypatch, code)
    rc, err = main(argv), capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]  # bench's status line, then the error
    assert (
        rc == 2 and "Traceback" not in err and [ln for ln in lines if ln.startswith("error: ")] == lines[-1:]
    ), err
    line = lines[-1]
    assert str(out) in line and os.strerror(code) in line and "run the same command again" in line
    assert not out.exists() and _leftovers(tmp_path) == []  # no result file, no temporary file
    monkeypatch.setattr(os, "fsync", REAL_FSYNC)
    # 1 cell x 4 runs (the default 3 policies and demand's B arm: the A/A pair) x 1 rep
    assert main(argv) == 0 and len(read_rows(out)) == 4


def test_a_failed_append_to_an_existing_file_keeps_its_whole_cells(tmp_path, monkeypatch):
    p = fake_profile(tasks=["gsm8k"], batch_sizes=[1], cache_ratios=[0.43, 1.0])
    out = tmp_path / "b.csv"
    run_bench(
        p.__class__(**{**p.__dict__, "cache_ratios": (0.43,)}),
        out,
        runner=FakeRunner(),
        progress=False,
        log=quiet,
    )
    before = out.read_bytes()
    real_write = os.write

    def half_then_full(fd, data):  # half the cell lands, then the disk is full
        if os.fstat(fd).st_size > 0 and len(data) > 10:
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="keeps its whole cells"):
        run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
    assert out.read_bytes() == before  # truncated back: no torn line


@pytest.mark.slow
def test_trace_out_on_a_full_disk_is_one_line_after_the_run(tmp_path, capsys, full_disk):
    out = tmp_path / "gsm8k.safetensors"
    line = one_line_error(
        capsys, main(["trace", "--task", "gsm8k", "--n", "1", "--gen-length", "32", "--out", str(out)])
    )
    assert str(out) in line and os.strerror(errno.ENOSPC) in line
    assert not out.exists() and _leftovers(tmp_path) == []
