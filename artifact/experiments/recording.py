"""Recording the stored runs (the reading side, and what the runs mean to a verdict, is verdicts/): a new
run<k>/ whole or absent (`record_run`, after `next_run` checks the runs are whole and of this commit: the
checkout's, or the newest that changed the code the runs measure: a set recorded in parts is of one; and
`check_committed` refuses a checkout whose code differs from its commit), the
working row files moved aside during a run (`working_aside`, which puts them back if the run
fails), and `cached_rows`, which keeps a timing notebook's
rows that are not a bench grid like one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from artifact.errors import RunsError
from artifact.experiments.outputs.manifest import write_manifest
from artifact.experiments.outputs.paths import results_dir, short_path
from artifact.experiments.outputs.provenance import run_info
from artifact.experiments.outputs.stored_runs import (
    TIMED_STEMS,
    TIMED_STUDIES,
    check_stored_runs,
    row_files,
    run_meta,
    runs_root,
)
from artifact.paths import atomic_write_text, repo_root

# What a stored run's measurements depend on: the code that measures (record_runs runs the studies' `measure`,
# not the notebooks), its pinned environment and the bundled prompts. A commit that changes none of these (a
# part of a set of runs, the claims re-ruled on them, the README) leaves the runs' commit where it was.
CODE_PATHS = ("artifact", "scripts", "pyproject.toml", "requirements.lock", "environment.yml", "data/tasks")


def dirty_code_paths(root: Path | None = None) -> list[str]:
    """The paths under CODE_PATHS that differ from the commit checked out at `root` (default: the checkout's
    root), as `git status` names them (relative to the repository): modified, staged, deleted, or untracked
    and not ignored; [] where git cannot tell (no git, not a checkout: the runs then record commit
    "unknown"). A run recorded from such a tree would carry the commit's label but not its code."""
    root = Path(root) if root is not None else repo_root()
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain=v1", "-z", "--untracked-files=all", "--"]
            + list(CODE_PATHS),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    paths, entries = [], iter(out.stdout.split("\0"))
    for entry in entries:
        if entry:
            paths.append(entry[3:])  # "XY path"
            if "R" in entry[:2] or "C" in entry[:2]:
                next(entries, None)  # a rename's or copy's source path follows
    return paths


def check_committed(root: Path | None = None) -> None:
    """RunsError naming the first of dirty_code_paths, if any: stored runs are measured from committed code
    only, so the commit they record is the code that measured them."""
    dirty = dirty_code_paths(root)
    if dirty:
        more = f" (and {len(dirty) - 1} more)" if len(dirty) > 1 else ""
        raise RunsError(
            f"{dirty[0]}{more}: uncommitted change under the code the runs measure "
            f"({', '.join(CODE_PATHS)}); a stored run records the commit, so commit or stash it first"
        )


def runs_commit(head: str) -> str:
    """The commit a stored run records: the newest commit that changed CODE_PATHS, so that runs recorded in
    parts, each part committed (and re-ruled), are runs of one commit; `head` (the checkout's, with "-dirty"
    when artifact/ differs) where git cannot tell."""
    if head.endswith("-dirty") or head == "unknown":
        return head
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(repo_root()),
                "log",
                "-1",
                "--format=%h",
                "--abbrev=12",
                "HEAD",
                "--",
                *CODE_PATHS,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return head
    return out or head


def next_run(profile_name: str, reference: Path | None = None) -> tuple[Path, dict]:
    """(the folder the next stored run goes to, this checkout's run_info with runs_commit's commit), or
    RunsError when the stored runs are damaged (check_stored_runs) or of another commit than this checkout."""
    have = check_stored_runs(profile_name, reference)
    dest = runs_root(profile_name, reference) / f"run{int(have[-1].name[3:]) + 1 if have else 1}"
    info = run_info()
    info["commit"] = runs_commit(info["commit"])
    at = run_meta(have[-1]).get("commit") if have else info["commit"]
    if dest.exists() or at != info["commit"]:
        raise RunsError(
            f"{short_path(dest)}: exists already"
            if dest.exists()
            else f"{short_path(dest.parent)}: the stored runs are at commit {at}, "
            f"this checkout at {info['commit']}; "
            "a stored result is runs at one commit (move them away to record anew)"
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
            f"{results_dir(P)}: no row files of the timing notebooks ({', '.join(stems)}); "
            f"run them first (python -m artifact notebooks --only {only})"
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


@contextlib.contextmanager
def working_aside(P, stems: Sequence[str] = TIMED_STEMS, log=print):
    """Around one recorded run: this profile's working row files of `stems` (and their lock sidecars) are
    moved aside into a hidden folder beside them, so the run measures afresh; if the run fails (an error,
    Ctrl-C), the files it wrote in their place are removed and the moved ones put back, byte for byte; once it
    succeeds the moved ones are removed (its own rows replace them)."""
    where = results_dir(P)
    moved = [
        g for s in stems for f in row_files(P, s) for g in (f, f.with_name(f.name + ".lock")) if g.exists()
    ]
    aside = where / f".aside.{os.getpid()}"
    if moved:
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir()
    for g in moved:
        g.rename(aside / g.name)
    log(f"moved {len(moved)} working row files in {where} aside (into {aside.name}/)")
    try:
        yield aside
    except BaseException:
        for g in moved:
            g.unlink(missing_ok=True)  # this failed run's rows in its place
            (aside / g.name).rename(g)
        if moved:
            aside.rmdir()
            log(f"the run failed: put the {len(moved)} working row files back in {where}")
        raise
    shutil.rmtree(aside, ignore_errors=True)


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
