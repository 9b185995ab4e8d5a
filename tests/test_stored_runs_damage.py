"""Damaged stored data is refused, never ruled on: every reader of the stored runs (`claims`, `stored-runs`,
the stored-claims recomputation, a notebook's replicas) checks them first (stored_runs.check_stored_runs,
against each run's manifest.json) and says in one line which run and what is wrong, rc 2. One test per fault
class, each on a
copy of the committed data (ARTIFACT_DATA); the committed data is never edited."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from artifact.cli import main
from artifact.errors import ResultFileError, RunsError
from artifact.experiments import recording
from artifact.experiments.claims_table import records
from artifact.experiments.criteria import thresholds
from artifact.experiments.outputs import stored_runs
from artifact.experiments.outputs.manifest import MANIFEST, write_manifest
from artifact.experiments.settings import load_profile
from artifact.experiments.studies import capacity_sweep

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "data" / "results" / "cpu"


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A copy of the committed cpu results (claim records and stored runs) as the data folder."""
    shutil.copytree(COMMITTED, tmp_path / "data" / "results" / "cpu")
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    return tmp_path / "data" / "results" / "cpu"


def one_line(text: str) -> str:
    text = text.strip()
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def refused_everywhere(capsys, *fragments: str) -> None:
    """Every reader refuses: the CLI's claims views and stored-runs print one line naming `fragments`, rc 2
    and nothing on stdout; the stored-claims recomputation and a notebook's replicas raise RunsError with that
    line."""
    for argv in (
        ["claims", "--profile", "cpu", "--agreement"],
        ["claims", "--profile", "cpu"],
        ["claims", "--profile", "cpu", "--full"],
        ["stored-runs", "--profile", "cpu"],
    ):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        line = one_line(err)
        assert out == "" and line.startswith("error: ") and all(f in line for f in fragments), (argv, line)
    P = load_profile("cpu")
    rows = pd.read_csv(COMMITTED / "runs" / "run1" / "bench.csv")
    for rule in (lambda: capacity_sweep.stored_claims(P), lambda: capacity_sweep.replicas(P, rows)):
        with pytest.raises(RunsError) as e:
            rule()
        assert all(f in one_line(str(e.value)) for f in fragments), str(e.value)


def stored_names() -> list[str]:
    """The committed stored runs' names, run1, run2, ... in order."""
    return [p.name for p in stored_runs.check_stored_runs("cpu", ROOT)]


def test_the_committed_stored_runs_match_their_manifests():
    runs = stored_runs.check_stored_runs("cpu", ROOT, ruled_on=thresholds.MIN_RUNS)
    assert [p.name for p in runs] == [f"run{k}" for k in range(1, len(runs) + 1)]
    assert all((p / MANIFEST).is_file() for p in runs)


def test_a_truncated_row_file_is_refused(data, capsys):
    f = data / "runs" / "run2" / "bench.csv"
    lines = f.read_text().splitlines(keepends=True)
    rows = len(lines) - 1  # less the header
    f.write_text("".join(lines[:-5]))
    refused_everywhere(
        capsys, f"run2/bench.csv: {rows - 5} rows, manifest.json says {rows} (truncated or edited)"
    )


def test_a_row_file_edited_with_the_same_row_count_is_refused(data, capsys):
    f = data / "runs" / "run1" / "bench.csv"
    lines = f.read_text().splitlines(keepends=True)
    last = lines[-1]
    i = max(k for k, ch in enumerate(last) if ch.isdigit() and k < len(last) - 2)
    lines[-1] = last[:i] + str((int(last[i]) + 1) % 10) + last[i + 1 :]
    f.write_text("".join(lines))
    refused_everywhere(
        capsys,
        f"run1/bench.csv: sha256 differs from manifest.json, with the same {len(lines) - 1} rows (edited)",
    )


def test_a_run_without_its_run_json_is_refused(data, capsys):
    (data / "runs" / "run2" / "run.json").unlink()
    refused_everywhere(capsys, "run2: no run.json")


def test_a_run_without_its_manifest_is_refused(data, capsys):
    (data / "runs" / "run3" / MANIFEST).unlink()
    refused_everywhere(capsys, "run3: no manifest.json")


def test_runs_at_two_commits_are_refused(data, capsys):
    run3 = data / "runs" / "run3"
    meta = json.loads((run3 / "run.json").read_text())
    (run3 / "run.json").write_text(json.dumps({**meta, "commit": "0123456789ab"}, indent=1) + "\n")
    write_manifest(run3)  # a whole run, but of another commit
    others = ", ".join(n for n in stored_names() if n != "run3")
    refused_everywhere(capsys, f"runs at mixed commits ({others} at {meta['commit']}; run3 at 0123456789ab)")


def test_an_edited_run_json_is_refused(data, capsys):
    run3 = data / "runs" / "run3"
    meta = json.loads((run3 / "run.json").read_text())
    (run3 / "run.json").write_text(json.dumps({**meta, "commit": "0123456789ab"}, indent=1) + "\n")
    refused_everywhere(capsys, "run3/run.json: sha256 differs from manifest.json")


def test_a_missing_run_is_refused(data, capsys):
    shutil.rmtree(data / "runs" / "run2")  # a gap in the run numbers
    left = ", ".join(n for n in stored_names() if n != "run2")
    refused_everywhere(
        capsys, f"run2: missing (the stored runs are {left}; expected run1, run2, ... without a gap)"
    )


def test_a_missing_last_run_is_refused(data, capsys):
    names = stored_names()
    n = len(names)
    shutil.rmtree(data / "runs" / names[-1])  # the records were ruled on n runs; n - 1 are left
    for argv in (["claims", "--profile", "cpu", "--agreement"], ["claims", "--profile", "cpu"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and (
            f"{n - 1} stored runs ({', '.join(names[:-1])}), but the claim records were "
            "ruled on "
            f"{n}: a run is missing"
        ) in one_line(err)
    for name in names[2:-1]:  # two left: too few for a pooled verdict
        shutil.rmtree(data / "runs" / name)
    with pytest.raises(
        RunsError,
        match="2 stored runs hold this grid's rows .run1, run2.: a pooled verdict "
        "needs "
        f"thresholds.MIN_RUNS = {thresholds.MIN_RUNS}",
    ):
        capacity_sweep.stored_claims(load_profile("cpu"))


def test_this_run_on_a_folder_without_claim_records_is_refused(data, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["claims", "--profile", "cpu", "--this-run", str(empty)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{empty}: no claim records (NN_*.claims.json)" in one_line(err)


def test_a_damaged_claim_record_is_refused(data, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(data / "04_capacity_sweep.claims.json", mine)
    broken = mine / "04_capacity_sweep.claims.json"
    broken.write_text(broken.read_text()[:200])  # cut short: not JSON
    assert main(["claims", "--profile", "cpu", "--this-run", str(mine)]) == 2
    out, err = capsys.readouterr()
    assert (
        out == "" and f"{broken}: unreadable (" in one_line(err) and "expected a claim cell's record" in err
    )
    rec = json.loads((data / "05_tide_head_to_head.claims.json").read_text())
    del rec["claims"][0]["verdict"]  # parses, but a claim lacks its verdict
    (data / "05_tide_head_to_head.claims.json").write_text(json.dumps(rec))
    assert main(["claims", "--profile", "cpu", "--agreement"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "05_tide_head_to_head.claims.json: claim 1 lacks verdict" in one_line(err)
    with pytest.raises(ResultFileError, match="claim 1 lacks verdict"):
        records("cpu")


def record_runs(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_runs.py"), *args],
        cwd=ROOT,
        text=True,
        # PYTHONPATH=. as documented: this checkout's code
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_record_runs_refuses_a_bad_profile_in_one_line():
    r = record_runs("--profile", "nope")
    assert r.returncode == 2 and r.stdout == ""
    assert one_line(r.stderr).startswith("error: unknown profile 'nope'; choose one of")
    r = record_runs("--runs", "0")
    assert r.returncode == 2
    assert one_line(r.stderr) == "error: argument --runs: 0: give at least 1 (see --help)"
    r = record_runs("--profile", "h200_ae", "--runs", "1")  # a GPU profile names no checkpoint
    assert r.returncode == 2 and r.stdout == "" and "has model: null: pass --model DIR" in one_line(r.stderr)


def test_record_runs_refuses_damaged_stored_runs_before_measuring(tmp_path):
    shutil.copytree(COMMITTED / "runs", tmp_path / "data" / "results" / "cpu" / "runs")
    (tmp_path / "data" / "results" / "cpu" / "runs" / "run1" / MANIFEST).unlink()
    r = record_runs("--profile", "cpu", "--runs", "1", env={"ARTIFACT_DATA": str(tmp_path / "data")})
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert "run1: no manifest.json" in one_line(r.stderr)
    assert sorted(p.name for p in (tmp_path / "data" / "results" / "cpu" / "runs").iterdir()) == sorted(
        stored_names()
    )


def test_recording_beside_runs_of_another_commit_is_refused(data):
    shutil.copy(COMMITTED / "runs" / "run1" / "bench.csv", data / "bench.csv")  # a working row file
    at = "0123456789ab"  # every stored run, whole, but of a commit this checkout is not at
    for run in (data / "runs").glob("run*"):
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**meta, "commit": at}, indent=1) + "\n")
        write_manifest(run)
    with pytest.raises(RunsError, match=rf"runs: the stored runs are at commit {at}, this checkout at \w+"):
        recording.record_run(load_profile("cpu"), log=lambda s: None)
    assert sorted(p.name for p in (data / "runs").iterdir()) == sorted(stored_names())
