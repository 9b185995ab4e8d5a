"""Nothing lost, nothing silently wrong: concurrent bench writers, interrupted appends, checkpoint
fingerprints, damaged checkpoints, traces and result files, durable atomic writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import save as save_numpy
from safetensors.torch import load_file, save_file
from test_bench import FakeRunner, fake_profile, quiet

import artifact.experiments.bench.locks as locks
import artifact.model.checkpoint as ckpt
import artifact.paths as paths
from artifact.cli import main
from artifact.experiments.bench import run_bench
from artifact.experiments.bench.grid import grid
from artifact.experiments.bench.locks import CellClaims, locked
from artifact.experiments.bench.results import COLUMNS, merge, read_rows
from artifact.experiments.settings import load_profile
from artifact.model.checkpoint import (
    CheckpointError,
    load_checkpoint,
    weights_fingerprint,
)
from artifact.model.tiny import init_random_weights, save_checkpoint, state_tensors, tiny_checkpoint
from artifact.offload.replay.trace import Trace, TraceError

RUN_KEYS = ["task", "batch_size", "cache_ratio", "bandwidth_scale", "policy", "arm", "rep"]
REAL_GRID = {
    "tasks": ["gsm8k"],
    "batch_sizes": [1],
    "cache_ratios": [0.83, 1.0, 1.3, 1.73],
    "repetitions": 1,
    "n_prompts": 1,
    "gen_length": 32,
    "max_prompt_tokens": 32,
    "policies": ["demand", "last_step"],
}


def runs(df) -> list[tuple]:
    return sorted(map(tuple, df[RUN_KEYS].itertuples(index=False)))


def expected_runs(p) -> list[tuple]:
    """Every run of the grid, keyed like `runs`: each policy's (arm A) and, with the A/A pair (the default),
    demand's second run (arm B), per cell and repetition."""
    arms = [(pol, "A") for pol in p.policies]
    if p.aa_pair and "demand" in p.policies:
        arms.append(("demand", "B"))
    return sorted(
        (c.task, c.batch_size, c.cache_ratio, c.bandwidth_scale, pol, arm, r)
        for c in grid(p)
        for pol, arm in arms
        for r in range(p.repetitions)
    )


# ---------------------------------------------------------------------------------------------
# Concurrent writers
# ---------------------------------------------------------------------------------------------
def _bench_cmd(out, shard):
    sets = [x for k, v in REAL_GRID.items() for x in ("--set", f"{k}={json.dumps(v)}")]
    return [
        sys.executable,
        "-m",
        "artifact",
        "bench",
        "--profile",
        "cpu",
        *sets,
        "--out",
        str(out),
        "--shard",
        shard,
        "--quiet",
    ]


def _wait_for(files, text, timeout=300):
    t0 = time.monotonic()
    while not all(text in f.read_text() for f in files):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"no {text!r} in {[f.read_text() for f in files]}")
        time.sleep(0.2)


@pytest.mark.slow  # runs the tiny model end to end (subprocesses): not in the --fast tier
@pytest.mark.parametrize("shards", [("0/1", "0/1"), ("0/2", "1/2")], ids=["same-shard", "two-shards"])
def test_two_bench_processes_on_one_output_keep_every_row_once(tiny, tmp_path, shards):
    """Real `python -m artifact bench` processes. The test holds the output's lock while both start, so
    both wait on it (and name this process as the holder), then race from the same moment."""
    out = tmp_path / "bench.csv"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    logs = [tmp_path / f"err{i}.txt" for i in range(2)]
    procs = []
    with locked(out):
        for shard, log in zip(shards, logs, strict=True):
            with open(log, "w") as f:
                procs.append(
                    subprocess.Popen(_bench_cmd(out, shard), stdout=subprocess.DEVNULL, stderr=f, env=env)
                )
        _wait_for(logs, f"waiting for PID {os.getpid()}, which is writing {out}")
    for proc in procs:
        assert proc.wait(timeout=600) == 0, [f.read_text() for f in logs]
    ran = [int(re.search(r"ran (\d+) cells", f.read_text()).group(1)) for f in logs]
    assert sum(ran) == 4  # claims split the work: no cell computed twice
    df = read_rows(out)
    p = load_profile("cpu", REAL_GRID)
    assert runs(df) == expected_runs(p)  # every run present, none twice
    assert not df.duplicated(RUN_KEYS).any() and df.groupby("cache_ratio").tokens_sha.nunique().eq(1).all()
    assert "Traceback" not in "".join(f.read_text() for f in logs)


@pytest.mark.slow  # runs the tiny model end to end (subprocesses): not in the --fast tier
def test_a_waiting_writer_names_the_holder_and_then_appends(tmp_path):
    out = tmp_path / "b.csv"
    p = fake_profile(tasks=["gsm8k"], batch_sizes=[1], cache_ratios=[1.0, 1.73])
    said, result = [], {}
    with locked(out):
        t = threading.Thread(
            target=lambda: result.update(
                df=run_bench(p, out, runner=FakeRunner(), progress=False, log=said.append)
            )
        )
        t.start()
        t.join(timeout=locks.QUIET_WAIT_S + 1.0)
        assert t.is_alive() and not out.exists()  # it waits, it does not refuse or write
        assert (tmp_path / "b.csv.lock").read_text().strip() == str(os.getpid())
        assert any(f"waiting for PID {os.getpid()}" in s for s in said)
    t.join(timeout=60)
    assert runs(result["df"]) == expected_runs(p)


def test_a_process_skips_or_drops_cells_another_one_appended(tmp_path):
    """Same shard twice: the second runner finds cell 1 done before it starts it, and its cell 0 already
    appended when it finishes it; neither is written twice."""
    out, p = tmp_path / "b.csv", fake_profile(tasks=["gsm8k"], batch_sizes=[1], cache_ratios=[1.0, 1.73])
    said = []

    class Racing(FakeRunner):
        """Lets another bench process the whole grid while this one runs its first cell."""

        def working_set(self, task, batch_size):
            if not out.exists():
                run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
            return super().working_set(task, batch_size)

    df = run_bench(p, out, runner=Racing(), progress=False, log=said.append)
    assert runs(df) == expected_runs(p) and len(df) == len(expected_runs(p))
    assert any("finished" in s and "first; this run's rows are dropped" in s for s in said)
    assert any("was finished meanwhile" in s and "C/W=1.73" in s for s in said)


CLAIMER = """
import sys
from pathlib import Path
from artifact.experiments.bench.grid import Cell
from artifact.experiments.bench.locks import CellClaims
with CellClaims(Path(sys.argv[1])) as claims:
    assert claims.take(Cell("gsm8k", 1, 1.0, 1.0), wait=False)
    print("claimed", flush=True)
    sys.stdin.read()                                 # holds the claim until the test closes stdin, then dies
"""


@pytest.mark.slow  # runs the tiny model end to end (subprocesses): not in the --fast tier
def test_a_cell_claimed_by_another_process_runs_last_and_here_if_that_process_dies(tmp_path):
    out = tmp_path / "b.csv"
    p = fake_profile(tasks=["gsm8k"], batch_sizes=[1], cache_ratios=[1.0, 1.73])
    other = subprocess.Popen(
        [sys.executable, "-c", CLAIMER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert other.stdout.readline().strip() == "claimed"
    said, runner = [], FakeRunner()

    def log(s):
        said.append(s)
        if "were being run by another process" in s:
            other.stdin.close()  # the claimant dies without finishing its cell

    df = run_bench(p, out, runner=runner, progress=False, log=log)
    assert other.wait(timeout=60) == 0
    assert [c.cache_ratio for c in runner.cells] == [1.73, 1.0]  # the unclaimed cell first
    assert any("1 cells (e.g. gsm8k b=1 C/W=1 bw=1x) were being run by another process" in s for s in said)
    assert runs(df) == expected_runs(p)
    with CellClaims(out) as claims:  # held here, so another process cannot take them
        assert all(claims.take(c, wait=False) for c in grid(p))
        probe = (
            "import sys; from pathlib import Path; from artifact.experiments.bench.grid import Cell\n"
            "from artifact.experiments.bench.locks import CellClaims\n"
            "with CellClaims(Path(sys.argv[1])) as c: print(c.take(Cell('gsm8k', 1, 1.0, 1.0), "
            "wait=False))"
        )
        held = subprocess.run(
            [sys.executable, "-c", probe, str(out)], capture_output=True, text=True, check=True
        )
        assert held.stdout.strip() == "False"
    free = subprocess.run([sys.executable, "-c", probe, str(out)], capture_output=True, text=True, check=True)
    assert free.stdout.strip() == "True"  # released with the file


# ---------------------------------------------------------------------------------------------
# Interrupted appends
# ---------------------------------------------------------------------------------------------
def test_a_torn_last_line_is_refused_by_readers_and_repaired_by_the_next_bench(tmp_path):
    out, p = tmp_path / "b.csv", fake_profile()
    full = run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:-2]) + lines[-2][:30])  # a kill 30 bytes into the cell's fifth row
    with pytest.raises(ValueError, match="last line is torn"):
        read_rows(out)
    assert main(["report", str(out)]) == 2
    said, runner = [], FakeRunner()
    again = run_bench(p, out, runner=runner, progress=False, log=said.append)
    assert len(runner.cells) == 1 and runner.cells[0] == grid(p)[-1]  # only the torn cell ran again
    assert runs(again) == runs(full) and not again.duplicated(RUN_KEYS).any()
    note = next(s for s in said if s.startswith("note:"))
    assert (
        "torn last line (30 bytes)" in note
        and "incomplete last cell mbpp b=4 C/W=1.73 bw=1x (4 of 6 runs)" in note
    )


def test_whole_rows_of_an_unfinished_last_cell_are_dropped_too(tmp_path):
    out, p = tmp_path / "b.csv", fake_profile()
    run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:-2]))  # the append died on a line boundary
    said = []
    df = run_bench(p, out, runner=FakeRunner(), progress=False, log=said.append)
    assert runs(df) == expected_runs(p)
    assert any("incomplete last cell" in s and "4 of 6 runs" in s for s in said)


# ---------------------------------------------------------------------------------------------
# Damaged result files
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "col,value,shown",
    [
        ("seconds", "abc", "'abc'"),
        ("seconds", "nan", "empty or nan"),
        ("cache_ratio", "inf", "inf"),
        ("tokens", "", "empty or nan"),
        ("policy", "", "empty or nan"),
    ],
)
def test_report_refuses_a_damaged_value_like_bench(tmp_path, capsys, col, value, shown):
    out = tmp_path / "b.csv"
    run_bench(fake_profile(), out, runner=FakeRunner(), progress=False, log=quiet)
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    df.loc[5, col] = value
    df.to_csv(out, index=False)
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"line 7, column {col}: {shown} is not a" in err and "Traceback" not in err
    with pytest.raises(ValueError, match=f"column {col}"):
        run_bench(fake_profile(), out, runner=FakeRunner(), progress=False, log=quiet)


def test_files_without_the_weights_fingerprint_are_refused_with_what_to_do(tmp_path, capsys):
    out = tmp_path / "old.csv"
    run_bench(fake_profile(), out, runner=FakeRunner(), progress=False, log=quiet)
    pd.read_csv(out).drop(columns="weights_fingerprint").to_csv(out, index=False)
    for argv in (["report", str(out)], ["merge", str(out), "--out", str(tmp_path / "m.csv")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "weights fingerprint" in err and "fresh --out" in err
    with pytest.raises(ValueError, match="re-run the bench into a fresh --out"):
        run_bench(fake_profile(), out, runner=FakeRunner(), progress=False, log=quiet)


# ---------------------------------------------------------------------------------------------
# Checkpoint fingerprints
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def other_weights(tiny, tmp_path_factory):
    """The tiny checkpoint's shapes, config and tokenizer with other (seed 1) weights."""
    root = tmp_path_factory.mktemp("other")
    for f in tiny.path.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, root / f.name)
    save_checkpoint(root, tiny.cfg, state_tensors(*init_random_weights(tiny.cfg, seed=1)))
    return root


def test_fingerprint_follows_the_weights_not_the_copy(tiny, other_weights, tmp_path, monkeypatch):
    fp = weights_fingerprint(tiny.path)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in tiny.path.iterdir():
        shutil.copy(f, copy / f.name)  # new modification times
    os.utime(copy / "model.safetensors", (1, 1))
    assert weights_fingerprint(copy) == fp == weights_fingerprint(tiny_checkpoint())
    assert weights_fingerprint(other_weights) != fp
    # large files: the header plus the first bytes of every tensor
    monkeypatch.setattr(ckpt, "FULL_HASH_BYTES", 0)
    sampled = weights_fingerprint(copy)
    assert sampled != fp
    t = load_file(copy / "model.safetensors")
    t["model.layers.3.mlp.experts.7.up_proj.weight"][0, 0] += 1.0  # a changed tensor's first bytes
    save_file(t, copy / "model.safetensors", metadata={"format": "pt"})
    assert weights_fingerprint(copy) != sampled


@pytest.mark.slow  # runs the tiny model end to end (subprocesses): not in the --fast tier
def test_resume_and_merge_refuse_a_checkpoint_with_other_weights(tiny, other_weights, tmp_path, capsys):
    p = load_profile("cpu", dict(REAL_GRID, cache_ratios=[1.0, 1.73]))
    first = tmp_path / "b.csv"
    run_bench(p, first, shard=(0, 2), loaded=tiny, progress=False, log=quiet)
    other = load_checkpoint(other_weights)
    assert other.cfg.config_hash() == tiny.cfg.config_hash()  # same shapes: only weights differ
    with pytest.raises(ValueError, match="checkpoint weights fingerprint"):
        run_bench(p, first, shard=(1, 2), loaded=other, progress=False, log=quiet)
    assert len(read_rows(first)) == 3  # shard 0's cell (demand A and B, last_step): nothing appended
    second = tmp_path / "b1.csv"
    run_bench(p, second, shard=(1, 2), loaded=other, progress=False, log=quiet)
    with pytest.raises(ValueError, match="shards disagree on weights_fingerprint"):
        merge([first, second], tmp_path / "m.csv", log=quiet)
    assert main(["merge", str(first), str(second), "--out", str(tmp_path / "m.csv")]) == 2
    assert "disagree on weights_fingerprint" in capsys.readouterr().err and not (tmp_path / "m.csv").exists()


# ---------------------------------------------------------------------------------------------
# Damaged checkpoints and traces: one clear error, no traceback
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sharded(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    save_checkpoint(root, tiny.cfg, state_tensors(tiny.model, tiny.experts), shards=3)
    for f in tiny.path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, root / f.name)
    return root


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _edit_index(root, fn):
    index = root / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    fn(data["weight_map"])
    index.write_text(json.dumps(data))


def _refused_by_cli(root, capsys, match):
    assert main(["generate", "--model", str(root), "--prompt", "hi", "--gen-length", "32"]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err, err


@pytest.mark.parametrize("cut", [4, 100, -1000])
def test_truncated_safetensors_is_named(tiny, tmp_path, capsys, cut):
    root = _copy(tiny.path, tmp_path)
    f = root / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:cut])
    with pytest.raises(CheckpointError, match=r"model.safetensors: .*(truncated|not a complete)"):
        load_checkpoint(root)
    _refused_by_cli(root, capsys, "model.safetensors")


def test_index_naming_a_tensor_its_shard_lacks(sharded, tmp_path, capsys):
    root = _copy(sharded, tmp_path)
    name = "model.layers.3.mlp.experts.17.up_proj.weight"
    _edit_index(root, lambda m: m.update({name: next(s for s in set(m.values()) if s != m[name])}))
    with pytest.raises(
        CheckpointError,
        match=r"names 1 tensors in model-0000\d-of-00003.safetensors that "
        r"the "
        rf"shard lacks \(e.g. {name}\)",
    ):
        load_checkpoint(root)
    _refused_by_cli(root, capsys, "the index and the shard files disagree")


@pytest.mark.parametrize("shard", ["../model-00001-of-00003.safetensors", "/etc/passwd", "", 3])
def test_index_shard_names_outside_the_directory_are_refused(sharded, tmp_path, capsys, shard):
    root = _copy(sharded, tmp_path)
    _edit_index(root, lambda m: m.update({"lm_head.weight": shard}))
    with pytest.raises(CheckpointError, match="is not a file name inside"):
        load_checkpoint(root)
    _refused_by_cli(root, capsys, "would read outside the checkpoint directory")


def _trace_file(path, meta="{}", experts=None):
    experts = np.array([1, 2], np.int16) if experts is None else experts
    arrays = {
        "forward": np.zeros(1, np.int32),
        "layer": np.ones(1, np.int16),
        "block": np.zeros(1, np.int32),
        "block_step": np.zeros(1, np.int32),
        "kind": np.ones(1, np.uint8),
        "offsets": np.array([0, 2]),
        "experts": experts,
        "counts": np.ones(2, np.int32),
    }
    path.write_bytes(
        save_numpy(arrays, metadata={"format": "artifact-routing-trace", "schema": "1", "meta": meta})
    )
    return path


def test_trace_inputs(tmp_path, capsys):
    good = json.dumps({"num_experts": 8, "moe_layers": [1]})
    assert len(Trace.load(_trace_file(tmp_path / "ok.safetensors", good))) == 1
    cases = [
        (_trace_file(tmp_path / "meta.safetensors", "{not json"), "trace metadata is not JSON"),
        (_trace_file(tmp_path / "list.safetensors", "[1, 2]"), "expected a JSON object"),
        (
            _trace_file(tmp_path / "float.safetensors", good, np.array([1.0, 2.5], np.float32)),
            "'experts': 'float32'.*expected integers",
        ),
        (
            _trace_file(tmp_path / "E.safetensors", json.dumps({"num_experts": 8.5, "moe_layers": [1]})),
            "num_experts \\(an integer\\)",
        ),
    ]
    for path, match in cases:
        with pytest.raises(TraceError, match=f"{path}: .*{match}"):
            Trace.load(path)
        assert main(["simulate", "--trace", str(path)]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Durable atomic writes
# ---------------------------------------------------------------------------------------------
def test_atomic_write_fsyncs_the_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(
            ("fsync", os.path.isdir(f"/proc/self/fd/{fd}") or os.path.realpath(f"/proc/self/fd/{fd}"))
        )
        real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(b)))
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "x.bin"
    paths.atomic_write_bytes(target, b"data")
    assert target.read_bytes() == b"data" and [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert events[0][1].startswith(str(tmp_path / ".x.bin.")) and events[2][1] is True  # temp file, then dir
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


def test_appended_rows_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: synced.append(os.path.realpath(f"/proc/self/fd/{fd}")) or real(fd)
    )
    out = tmp_path / "b.csv"
    run_bench(
        fake_profile(tasks=["gsm8k"], batch_sizes=[1], cache_ratios=[1.0]),
        out,
        runner=FakeRunner(),
        progress=False,
        log=quiet,
    )
    assert str(out) in synced
    assert list(pd.read_csv(out).columns) == list(COLUMNS)


def test_a_header_the_reader_rejects_is_named(tiny, tmp_path, capsys):
    root = _copy(tiny.path, tmp_path)
    f = root / "model.safetensors"
    data = bytearray(f.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + n].replace(b'"F32"', b'"X32"', 1)  # an unknown dtype, same length
    f.write_bytes(bytes(data[:8] + header + data[8 + n :]))
    with pytest.raises(CheckpointError, match="model.safetensors: cannot read tensor"):
        load_checkpoint(root)
    _refused_by_cli(root, capsys, "the file is damaged")


def test_bench_appends_only_to_files_in_this_versions_column_order(tmp_path, capsys):
    out, p = tmp_path / "b.csv", fake_profile()
    run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet, shard=(0, 2))
    df = read_rows(out)
    df[list(COLUMNS)[::-1]].to_csv(out, index=False)  # readable, but appends would misalign
    assert len(read_rows(out)) == len(df)
    with pytest.raises(ValueError, match="not in this version's order"):
        run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet, shard=(1, 2))
    fixed = tmp_path / "fixed.csv"
    assert main(["merge", str(out), "--partial", "--out", str(fixed)]) == 0
    both = run_bench(p, fixed, runner=FakeRunner(), progress=False, log=quiet, shard=(1, 2))
    assert runs(both) == expected_runs(p)
