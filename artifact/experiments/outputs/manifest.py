"""The manifest of a stored run, and the check every reader of the stored runs makes before it rules.

A stored run (data/results/<profile>/runs/run<k>/, artifact/experiments/verdicts/pooling.py) holds its raw row
files, run.json and manifest.json: per row file its row count (CSV data rows, header excluded) and sha256, and
the sha256 of run.json. scripts/record_runs.py writes it with the run. `check_runs` refuses, with one line
naming the run and what is wrong (artifact.errors.RunsError): a run folder without run.json or manifest.json,
a row file missing, added, or whose row count or sha256 differs from the manifest, a run.json that names no
commit or whose files or load_average are not what record_run writes, a gap in the run numbers, and runs at
more than one commit. So a damaged run is never read as fewer rows or fewer runs."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

from artifact.errors import RunsError
from artifact.experiments.outputs.paths import short_path
from artifact.paths import atomic_write_text

MANIFEST = "manifest.json"
RUN_JSON = "run.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def row_count(path: Path) -> int:
    """The data rows of a CSV file (its header excluded)."""
    with io.open(path, newline="") as f:
        return max(sum(1 for _ in csv.reader(f)) - 1, 0)


def manifest_of(run: Path) -> dict:
    """What a run's manifest holds: run.json's sha256 and, per row file (*.csv), its row count and sha256."""
    run = Path(run)
    return {
        RUN_JSON: sha256(run / RUN_JSON),
        "files": {p.name: {"rows": row_count(p), "sha256": sha256(p)} for p in sorted(run.glob("*.csv"))},
    }


def write_manifest(run: Path) -> Path:
    """Write run/manifest.json (atomically) from the files the run holds now."""
    return atomic_write_text(Path(run) / MANIFEST, json.dumps(manifest_of(run), indent=1) + "\n")


def _json(path: Path, what: str) -> dict:
    name = short_path(path.parent)
    if not path.is_file():
        raise RunsError(
            f"{name}: no {path.name} ({what}); a stored run is recorded by scripts/record_runs.py"
        )
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunsError(f"{name}/{path.name}: unreadable ({e}); expected {what} as JSON") from None
    if not isinstance(doc, dict):
        raise RunsError(f"{name}/{path.name}: not a JSON object; expected {what}")
    return doc


def _check_meta(meta: dict, where: str) -> None:
    """run.json's keys a reader uses, of the types record_run writes: `commit` a non-empty string, `files` a
    list of file names, `load_average` a list of three numbers (or null where the platform has no load
    average); else RunsError naming the key."""
    bad = None
    if not isinstance(meta.get("commit"), str) or not meta["commit"].strip():
        bad = f"names no commit ({'commit' in meta and repr(meta['commit']) or 'no commit key'})"
    elif not isinstance(meta.get("files"), list) or not all(isinstance(f, str) for f in meta["files"]):
        bad = f"files is {meta.get('files')!r}, expected a list of the run's row file names"
    else:
        load = meta.get("load_average")
        if load is not None and not (
            isinstance(load, list)
            and len(load) == 3
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in load)
        ):
            bad = f"load_average is {load!r}, expected a list of three numbers (os.getloadavg()) or null"
    if bad:
        raise RunsError(f"{where}: {bad}; a stored run is recorded by scripts/record_runs.py")


def check_run(run: Path) -> dict:
    """run.json of a stored run whose files are those its manifest lists, with the same row counts and sha256;
    else RunsError naming the run and the fault."""
    run, name = Path(run), short_path(Path(run))
    meta = _json(run / RUN_JSON, "its commit, date, load average and command")
    man = _json(run / MANIFEST, "each row file's row count and sha256")
    files = man.get("files")
    if not isinstance(files, dict) or not isinstance(man.get(RUN_JSON), str):
        raise RunsError(
            f"{name}/{MANIFEST}: lacks 'files' or '{RUN_JSON}'; "
            "expected each row file's row count and sha256 and run.json's sha256"
        )
    if sha256(run / RUN_JSON) != man[RUN_JSON]:
        raise RunsError(f"{name}/{RUN_JSON}: sha256 differs from {MANIFEST} (edited after it was recorded)")
    _check_meta(meta, f"{name}/{RUN_JSON}")
    if sorted(meta["files"]) != sorted(files):
        raise RunsError(f"{name}: {RUN_JSON} lists files {sorted(meta['files'])}, {MANIFEST} {sorted(files)}")
    extra = sorted({p.name for p in run.glob("*.csv")} - set(files))
    if extra:
        raise RunsError(f"{name}/{extra[0]}: not in {MANIFEST} (added after the run was recorded)")
    for f, want in files.items():
        path = run / f
        if not path.is_file():
            raise RunsError(f"{name}/{f}: missing ({MANIFEST} lists it with {want.get('rows')} rows)")
        rows = row_count(path)
        if rows != want.get("rows"):
            raise RunsError(
                f"{name}/{f}: {rows} rows, {MANIFEST} says {want.get('rows')} (truncated or edited)"
            )
        if sha256(path) != want.get("sha256"):
            raise RunsError(f"{name}/{f}: sha256 differs from {MANIFEST}, with the same {rows} rows (edited)")
    return meta


def check_runs(root: Path) -> list[Path]:
    """The stored runs under `root` (run1, run2, ... in number order), each checked (check_run), numbered
    1..N without a gap and all at one commit; else RunsError naming the run and the fault."""
    root = Path(root)
    found = sorted(
        (p for p in root.glob("run*") if p.is_dir() and p.name[3:].isdigit()), key=lambda p: int(p.name[3:])
    )
    for k, p in enumerate(found, 1):
        if p.name != f"run{k}":
            raise RunsError(
                f"{short_path(root)}/run{k}: missing (the stored runs are "
                f"{', '.join(q.name for q in found)}; expected run1, run2, ... without a gap)"
            )
    commits: dict[str, list[str]] = {}
    for p in found:
        commits.setdefault(str(check_run(p).get("commit")), []).append(p.name)
    if len(commits) > 1:
        at = "; ".join(f"{', '.join(names)} at {c}" for c, names in commits.items())
        raise RunsError(
            f"{short_path(root)}: runs at mixed commits ({at}); a stored result is runs at one commit"
        )
    return found
