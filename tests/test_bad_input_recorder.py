"""Nothing a user measured is lost, and a bad argument never starts a run (issue 55): scripts/record_runs.py
checks every argument, the profile, the model and its folders before it touches a working row file;
`stored-runs` refuses a damaged stored run and `claims --this-run` another profile's records. Each case:
rc 2, exactly one line on stderr (`error: ...`), no traceback, and every file that was there before is
byte-equal afterwards."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from artifact.cli import main
from artifact.experiments.outputs.manifest import write_manifest
from artifact.model.tiny import checkpoint_dir

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "data" / "results" / "cpu"
N_RUNS = len(list((COMMITTED / "runs").glob("run*")))  # the committed stored runs


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> its bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def unchanged(folder: Path, before: dict[str, bytes]) -> None:
    """Every file of `before` is still under `folder`, byte for byte."""
    after = snapshot(folder)
    lost = sorted(k for k in before if k not in after)
    changed = sorted(k for k in before if k in after and after[k] != before[k])
    assert not lost and not changed, (lost, changed)


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: "), err
    return err


@pytest.fixture
def working(tmp_path, monkeypatch):
    """A data folder whose cpu working folder holds a finished run's row files (bench.csv and its lock
    sidecar, streams.csv), as ARTIFACT_DATA."""
    cpu = tmp_path / "data" / "results" / "cpu"
    cpu.mkdir(parents=True)
    for name in ("bench.csv", "streams.csv"):
        shutil.copy(COMMITTED / "runs" / "run1" / name, cpu / name)
    (cpu / "bench.csv.lock").write_text("12345\n")
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    return cpu


def record_runs_script(*args: str, data: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_runs.py"), *args],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "ARTIFACT_DATA": str(data)},
    )


def test_a_model_folder_without_config_json_keeps_the_working_rows(working, tmp_path):
    """The data-loss case: before the fix the working bench.csv was removed first and the model failed
    after; now the model is refused first and every working file stays as it was."""
    no_config = tmp_path / "typo"
    no_config.mkdir()
    before = snapshot(working)
    r = record_runs_script(
        "--profile", "cpu", "--runs", "1", "--model", str(no_config), data=working.parent.parent
    )
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert "no config.json" in one_line(r.stderr)
    unchanged(working, before)
    assert (working / "bench.csv").read_bytes() == before["bench.csv"]


@pytest.fixture(scope="module")
def record_runs():
    """scripts/record_runs.py's main, in this process (argparse's exit becomes its return code)."""
    spec = importlib.util.spec_from_file_location("record_runs", ROOT / "scripts" / "record_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run(*argv: str) -> int:
        try:
            return mod.main(list(argv))
        except SystemExit as e:
            return e.code

    return run


@pytest.fixture(scope="module")
def tiny() -> Path:
    """The tiny checkpoint, built (if need be) from the checkout's data before a test moves ARTIFACT_DATA."""
    return checkpoint_dir("tiny")


def damaged_checkpoints(tiny: Path, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Copies of the tiny checkpoint, each damaged one way: {case: (folder, what the line says)}."""
    out = {}

    def copy(name: str) -> Path:
        d = tmp_path / name
        shutil.copytree(tiny, d)
        return d

    d = copy("truncated")
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    out["truncated"] = (d, "the file is truncated")
    d = copy("short_header")
    (d / "model.safetensors").write_bytes(b"\x40\x00\x00")
    out["short_header"] = (d, "not a complete safetensors file")
    d = copy("list_config")
    (d / "config.json").write_text("[1, 2]")
    out["list_config"] = (d, "not a JSON object of config keys (got a list)")
    d = copy("text_hidden_size")
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] = "64"
    (d / "config.json").write_text(json.dumps(cfg))
    out["text_hidden_size"] = (d, "hidden_size is '64', expected an integer")
    return out


def test_record_runs_refuses_bad_arguments_before_touching_anything(
    tiny, working, tmp_path, record_runs, capsys
):
    before = snapshot(working)
    cases = [
        (["--runs", "0"], "--runs: 0: give at least 1"),
        (["--runs", "abc"], "'abc' is not a whole number"),
        (["--runs", str(2**63)], f"{2**63}: give at most 1000"),
        (["--runs", "1", "--profile", "nope"], "unknown profile 'nope'"),
        (["--runs", "1", "--model"], "--model: expected one argument"),
        (["--runs", "1", "--model", str(tmp_path / "absent")], "checkpoint directory not found"),
        (["--runs", "1", "--profile", "h200_ae"], "has model: null: pass --model DIR"),
        (["--runs", "1", "--only", "02"], "--only: '02' is not a timing notebook; expected some of 03"),
        (["--runs", "1", "--only"], "--only: expected at least one argument"),
    ]
    cases += [
        (["--runs", "1", "--model", str(d)], says) for d, says in damaged_checkpoints(tiny, tmp_path).values()
    ]
    for argv, says in cases:
        assert record_runs(*argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and says in one_line(err), (argv, err)
        unchanged(working, before)


def test_a_failed_run_puts_the_working_rows_back(working, record_runs, capsys, monkeypatch):
    """A run that fails while measuring (here: Ctrl-C in the first study) leaves the working rows as they
    were, not cleared, and stores no run."""
    from artifact.experiments import recording
    from artifact.experiments.studies import bandwidth_throttling

    # this test measures: the checkout's own uncommitted edits (tests/test_record_runs_dirty_tree.py) aside
    monkeypatch.setattr(recording, "check_committed", lambda root=None: None)

    def interrupted(P, progress=True):
        (working / "bench.csv").write_text("half a run\n")  # what the failed run wrote in its place
        raise KeyboardInterrupt

    monkeypatch.setattr(bandwidth_throttling, "measure", interrupted)
    before = snapshot(working)
    with pytest.raises(KeyboardInterrupt):
        record_runs("--runs", "1")
    unchanged(working, before)
    assert sorted(p.name for p in working.iterdir()) == sorted(before)  # no aside folder, no stored run
    capsys.readouterr()


def damaged_copy(tmp_path: Path, monkeypatch, damage) -> Path:
    """A copy of the committed cpu results as ARTIFACT_DATA, run1 damaged by `damage(run1)` and its manifest
    rewritten, so the damage gets past the manifest's sha256 check."""
    cpu = tmp_path / "data" / "results" / "cpu"
    shutil.copytree(COMMITTED, cpu)
    run1 = cpu / "runs" / "run1"
    damage(run1)
    write_manifest(run1)
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    return cpu


def edit_meta(**change):
    def damage(run: Path) -> None:
        meta = json.loads((run / "run.json").read_text())
        meta.update(change)
        for k in [k for k, v in change.items() if v is None]:
            del meta[k]
        (run / "run.json").write_text(json.dumps(meta))

    return damage


def edit_bench(edit):
    def damage(run: Path) -> None:
        edit(pd.read_csv(run / "bench.csv")).to_csv(run / "bench.csv", index=False)

    return damage


def rename_policy(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(policy=rows.policy.replace({"last_step": "no_such_policy"}))


@pytest.mark.parametrize(
    "damage, says",
    [
        (edit_meta(load_average="high"), "run1/run.json: load_average is 'high', expected a list of three"),
        (edit_meta(files=3), "run1/run.json: files is 3, expected a list of the run's row file names"),
        (edit_meta(commit=None), "run1/run.json: names no commit"),
        (edit_meta(commit=""), "run1/run.json: names no commit"),
        (
            edit_bench(lambda rows: rows.drop(columns=["tokens_per_second"])),
            f"run1/bench.csv: lacks columns ['tokens_per_second'], unlike {N_RUNS - 1} of the {N_RUNS}",
        ),
        (edit_bench(rename_policy), "run1/bench.csv: lacks policies ['last_step']; has policies ['no_such"),
    ],
    ids=["load_average_text", "files_a_number", "no_commit", "empty_commit", "no_metric", "unknown_policy"],
)
def test_stored_runs_refuses_a_damaged_stored_run(tmp_path, monkeypatch, capsys, damage, says):
    cpu = damaged_copy(tmp_path, monkeypatch, damage)
    before = snapshot(cpu)
    assert main(["stored-runs", "--profile", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and says in one_line(err), err
    unchanged(cpu, before)


def test_claims_this_run_refuses_another_profiles_records_and_a_folder_without_records(tmp_path, capsys):
    mine = tmp_path / "h200_run"
    mine.mkdir()
    for f in sorted(COMMITTED.glob("*.claims.json"))[:2]:
        rec = json.loads(f.read_text())
        rec["profile"] = "h200_ae"
        (mine / f.name).write_text(json.dumps(rec))
    empty = tmp_path / "empty"
    empty.mkdir()
    cpu_records = tmp_path / "cpu_run"
    cpu_records.mkdir()
    for f in sorted(COMMITTED.glob("*.claims.json"))[:2]:
        shutil.copy(f, cpu_records / f.name)
    before = snapshot(tmp_path)
    for argv, says in (
        (["--profile", "cpu", "--this-run", str(mine)], "records of profile h200_ae, not of cpu"),
        (["--profile", "h200_ae", "--this-run", str(cpu_records)], "records of profile cpu, not of h200_ae"),
        (["--profile", "cpu", "--this-run", str(empty)], "no claim records"),
        (["--profile", "cpu", "--this-run", str(tmp_path / "absent")], "no such directory"),
    ):
        assert main(["claims", *argv]) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and says in one_line(err), (argv, err)
    unchanged(tmp_path, before)


def test_only_measures_the_named_timing_notebooks():
    """--only 04: a GPU reviewer grid's stored runs hold notebook 04's bench grid alone (doctor prices it)."""
    import importlib.util as u

    spec = u.spec_from_file_location("record_runs_mod", ROOT / "scripts" / "record_runs.py")
    m = u.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert [t.notebook for t in m.studies(["04"])] == ["04_capacity_sweep"]
    assert [t.stems for t in m.studies(["04", "09"])] == [("bench",), ("cache_design_runs",)]
    assert len(m.studies(None)) == 7
