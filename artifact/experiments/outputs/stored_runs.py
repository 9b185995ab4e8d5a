"""The stored runs on disk: a stored (headline) result is N >= thresholds.MIN_RUNS runs of the timing
notebooks (TIMED_STUDIES) at one commit, and their raw rows are committed:

    data/results/<profile>/runs/run<k>/<stem>.csv    run k's raw rows of grid <stem>, as the bench wrote them
    data/results/<profile>/runs/run<k>/run.json      its commit, date, load average and command
    data/results/<profile>/runs/run<k>/manifest.json each row file's row count and sha256 (manifest.py)

Here they are found, checked (every reader checks them first: check_stored_runs) and read (stored_rows); what
they mean to a verdict is pooling.py's. Recording them is experiments/recording.py's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from artifact.errors import RunsError
from artifact.experiments.criteria.claims import ROW_FILES
from artifact.experiments.outputs.manifest import check_runs
from artifact.experiments.outputs.paths import reference_data_dir, results_dir, short_path

RUNS = "runs"


@dataclass(frozen=True)
class TimedStudy:
    """A timing notebook: its study (artifact/experiments/studies/<module>, whose `measure(P, progress)`
    writes the rows a stored run keeps and whose `stored_claims(P)` rules on the stored ones) and its raw row
    files (data/results/<profile>/<stem>.csv)."""

    notebook: str
    module: str
    stems: tuple[str, ...]


# The timing notebooks (criteria/claims.py ROW_FILES): scripts/record_runs.py measures them,
# tests/test_stored_runs.py recomputes them.
TIMED_STUDIES = tuple(TimedStudy(nb, module, stems) for nb, (module, stems) in ROW_FILES.items())
TIMED_STEMS = tuple(s for t in TIMED_STUDIES for s in t.stems)  # what a stored run keeps


def runs_root(profile_name: str, reference: Path | None = None) -> Path:
    base = (
        Path(reference) / "data" / "results" / profile_name if reference else reference_data_dir(profile_name)
    )
    return base / RUNS


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
    for run in check_stored_runs(P.name, reference):
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


def notebook_rows(
    P, notebook: str, folder: Path | None = None, fingerprint=None, reference: Path | None = None, read=None
) -> tuple[pd.DataFrame | None, tuple]:
    """(a run's rows of the notebook's row files (criteria/claims.py ROW_FILES) from `folder`, or None; the
    stored runs' (name, rows) made under `fingerprint`: one for every file, or {stem: fingerprint}). The
    files of a grid split by link priority (06's beyond-<priority>.csv) tag their rows with it where the rows
    lack it. The one place a verdict's rows are gathered: the studies, the calibration and the fresh runs."""

    def tagged(rows: pd.DataFrame, stem: str) -> pd.DataFrame:
        if "-" in stem and "link_priority" not in rows:
            rows = rows.assign(link_priority=stem.split("-", 1)[1])
        return rows

    by_run: dict[str, list[pd.DataFrame]] = {}
    mine = []
    for stem in ROW_FILES[notebook][1]:
        fp = fingerprint.get(stem) if isinstance(fingerprint, dict) else fingerprint
        for name, rows in stored_rows(P, stem, fp, reference, read or pd.read_csv):
            by_run.setdefault(name, []).append(tagged(rows, stem))
        if folder is not None:
            mine += [tagged(pd.read_csv(f), stem) for f in row_files(P, stem, folder)]
    stored = tuple((n, pd.concat(f, ignore_index=True)) for n, f in by_run.items())
    return (pd.concat(mine, ignore_index=True) if mine else None), stored
