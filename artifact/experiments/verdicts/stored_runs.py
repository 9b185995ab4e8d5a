"""The stored runs on disk: a stored (headline) result is N >= thresholds.MIN_RUNS runs of the timing
notebooks (TIMED_STUDIES) at one commit, and their raw rows are committed:

    data/results/<profile>/runs/run<k>/<stem>.csv    run k's raw rows of grid <stem>, as the bench wrote them
    data/results/<profile>/runs/run<k>/run.json      its commit, date, load average and command
    data/results/<profile>/runs/run<k>/manifest.json each row file's row count and sha256
    (outputs/manifest.py):
                                                     every reader checks the runs first (check_stored_runs)

Here they are found, checked, read (stored_rows), recorded (record_run: a new run<k>, whole or absent) and the
working row files cleared between runs (clear_working); cached_rows keeps a timing notebook's rows that are
not a bench grid like one. What the runs mean to a verdict, pooled into per-cell intervals, is
replication.py's."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from artifact.errors import RunsError
from artifact.experiments.outputs.manifest import check_runs, write_manifest
from artifact.experiments.outputs.paths import reference_data_dir, results_dir, short_path
from artifact.experiments.outputs.provenance import run_info
from artifact.paths import atomic_write_text

RUNS = "runs"


@dataclass(frozen=True)
class TimedStudy:
    """A timing notebook: its study (artifact/experiments/studies/<module>, whose `measure(P, progress)`
    writes the rows a stored run keeps and whose `stored_claims(P)` rules on the stored ones) and its raw row
    files (data/results/<profile>/<stem>.csv)."""

    notebook: str
    module: str
    stems: tuple[str, ...]


# The timing notebooks, once: scripts/record_runs.py measures them, tests/test_stored_runs.py recomputes them.
TIMED_STUDIES = (
    TimedStudy("03_bandwidth_throttling", "bandwidth_throttling", ("throttle_runs",)),
    TimedStudy("04_capacity_sweep", "capacity_sweep", ("bench",)),
    TimedStudy("05_tide_head_to_head", "tide_head_to_head", ("tide_style_runs",)),
    TimedStudy("06_beyond_the_paper", "beyond_the_paper", ("beyond-fifo", "beyond-demand")),
    TimedStudy("07_routing_map", "routing_map", ("streams",)),
    TimedStudy("08_performance_model", "performance_model", ("validation",)),
    TimedStudy("09_cache_design_space", "cache_design_space", ("cache_design_runs",)),
)
TIMED_STEMS = tuple(s for t in TIMED_STUDIES for s in t.stems)  # what a stored run keeps


def runs_root(profile_name: str, reference: Path | None = None) -> Path:
    base = (
        Path(reference) / "data" / "results" / profile_name if reference else reference_data_dir(profile_name)
    )
    return base / RUNS


def stored_runs(profile_name: str, reference: Path | None = None) -> list[Path]:
    """The stored runs of a profile, run1, run2, ... in number order, checked (check_stored_runs)."""
    return check_stored_runs(profile_name, reference)


def check_stored_runs(profile_name: str, reference: Path | None = None, ruled_on: int = 0) -> list[Path]:
    """The stored runs of a profile, each matching its manifest, numbered without a gap, at one commit, and at
    least the `ruled_on` runs the claim records were ruled on (outputs/manifest.check_runs); else RunsError,
    one line naming the run and the fault. Every reader of the stored runs goes through it before it rules."""
    root = runs_root(profile_name, reference)
    found = check_runs(root)
    if len(found) < ruled_on:
        raise RunsError(
            f"{short_path(root)}: {len(found)} stored runs "
            f"({', '.join(p.name for p in found) or 'none'})"
            f", but the claim records were ruled on {ruled_on}: a run is missing"
        )
    return found


def run_meta(run: Path) -> dict:
    try:
        return json.loads((Path(run) / "run.json").read_text())
    except (OSError, ValueError) as e:
        raise RunsError(f"{run}/run.json: unreadable ({e}); a stored run needs its run.json") from e


def row_files(P, stem: str, directory: Path | None = None) -> list[Path]:
    """The files of grid `stem` in a folder (default: this profile's working folder, results_dir): <stem>.csv
    and the <stem>-<fingerprint>.csv files harness.bench_file writes when settings changed."""
    d = Path(directory) if directory is not None else results_dir(P)
    return sorted(p for p in d.glob(f"{stem}*.csv") if p.stem == stem or p.stem.startswith(f"{stem}-"))


def stored_rows(
    P, stem: str, fingerprint: str | None = None, reference: Path | None = None, read=pd.read_csv
) -> list[tuple[str, pd.DataFrame]]:
    """[(run name, its rows of grid `stem`)] over the stored runs that hold rows made under `fingerprint`
    (every row when None or when the file has no fingerprint column)."""
    out = []
    for run in stored_runs(P.name, reference):
        frames = []
        for f in row_files(P, stem, run):
            df = read(f)
            if fingerprint is not None and "fingerprint" in df.columns:
                df = df[df.fingerprint.astype(str) == fingerprint]
            if len(df):
                frames.append(df)
        if frames:
            out.append((run.name, pd.concat(frames, ignore_index=True)))
    return out


def next_run(profile_name: str, reference: Path | None = None) -> tuple[Path, dict]:
    """(the folder the next stored run goes to, this checkout's run_info), or RunsError when the stored runs
    are damaged (check_stored_runs) or of another commit than this checkout."""
    have = stored_runs(profile_name, reference)
    dest = runs_root(profile_name, reference) / f"run{int(have[-1].name[3:]) + 1 if have else 1}"
    info = run_info()
    at = run_meta(have[-1]).get("commit") if have else info["commit"]
    if dest.exists() or at != info["commit"]:
        raise RunsError(
            f"{short_path(dest)}: exists already"
            if dest.exists()
            else f"{short_path(dest.parent)}: the stored runs are at commit {at}, this checkout at "
            f"{info['commit']}; a stored result is runs at one commit (move them away to record "
            "anew)"
        )
    return dest, info


def record_run(
    P,
    stems: Sequence[str] = TIMED_STEMS,
    reference: Path | None = None,
    seconds: float | None = None,
    command: str | None = None,
    log=print,
    rotation: int | None = None,
) -> Path:
    """Copy this profile's working row files (results_dir) of `stems` into a new stored run, runs/run<k>/ with
    k one more than the last, with its run.json and manifest.json: written into a temporary folder and
    renamed, so a run is either whole or absent; never over an existing run, nor beside damaged runs or runs
    of another commit. `rotation`: the Settings.rotation the run was measured with, kept in run.json when
    given."""
    files = [f for s in stems for f in row_files(P, s)]
    if not files:
        only = ",".join(t.notebook[:2] for t in TIMED_STUDIES)
        raise RunsError(
            f"{results_dir(P)}: no row files of the timing notebooks ({', '.join(stems)}); run "
            "them "
            f"first (python -m artifact notebooks --only {only})"
        )
    dest, info = next_run(P.name, reference)
    root, k = dest.parent, int(dest.name[3:])
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".run{k}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in files:
        shutil.copyfile(f, tmp / f.name)
    meta = {
        "run": k,
        **info,
        **({"command": command} if command else {}),
        **({"rotation": rotation} if rotation is not None else {}),
        "host": socket.gethostname(),
        "load_average": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "seconds": seconds,
        "files": sorted(f.name for f in files),
    }
    atomic_write_text(tmp / "run.json", json.dumps(meta, indent=1) + "\n")
    write_manifest(tmp)
    tmp.rename(dest)
    log(f"recorded {len(files)} row files as {dest}")
    return dest


def clear_working(P, stems: Sequence[str] = TIMED_STEMS, log=print) -> int:
    """Remove this profile's working row files of `stems` (and their lock sidecars), so the next run of the
    timing notebooks measures afresh. Stored runs and the committed reference are untouched."""
    n = 0
    for s in stems:
        for f in row_files(P, s):
            for g in (f, f.with_name(f.name + ".lock")):
                if g.exists():
                    g.unlink()
            n += 1
    log(f"cleared {n} working row files in {results_dir(P)}")
    return n


def cached_rows(
    P, stem: str, fingerprint: str, measure: Callable[[], pd.DataFrame], log=print
) -> pd.DataFrame:
    """A timing notebook's rows that are not a bench grid (07's streams, 08's validation cells), kept like a
    grid: data/results/<profile>/<stem>.csv is reused when it holds rows made under `fingerprint`, else
    `measure()` runs and its rows are written there atomically (column `fingerprint` added). Read back from
    the file either way, so
    a run compares equal to its stored copy."""
    path = results_dir(P) / f"{stem}.csv"
    if path.is_file():
        have = pd.read_csv(path)
        if "fingerprint" in have.columns and set(have.fingerprint.astype(str)) == {fingerprint}:
            log(f"{stem}: reusing {len(have)} rows of {path.name} (remove it to measure again)")
            return have
    rows = measure().assign(fingerprint=fingerprint)
    atomic_write_text(path, rows.to_csv(index=False))
    return pd.read_csv(path)
