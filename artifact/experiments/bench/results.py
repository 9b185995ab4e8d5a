"""Benchmark result files: their columns, the settings fingerprint, repair, reading, appending, merging.

A result file (data/results/<profile>/<grid>.csv) holds one row per timed run, whole cells only. It may be
shared by several processes (shards of one grid, or a rerun started while an earlier one still runs): they
coordinate through its locks (locks.py); "Result files" below says how an interrupted append is repaired.

A run is keyed by (cell, policy, arm, repetition). `arm` tells apart the A/A pair's two runs of demand in
one repetition (Settings.aa_pair, bench/order.py): "A" and "B", both with `policy` demand; every other row
is arm "A". A file written before the column reads as arm "A" everywhere. Tables and figures that pivot rows
by policy read `primary(rows)`, the arm-A rows; the A/A is demand's arm B against its arm A, per (cell,
repetition).
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from artifact.errors import ResultFileError
from artifact.experiments.bench.grid import CELL_KEYS, PAIR_KEYS, Cell, cell_key, cell_keys, shard_file
from artifact.experiments.bench.locks import lock_path, locked
from artifact.experiments.bench.order import ARMS, slot_run, slots
from artifact.experiments.settings import Settings, fingerprint
from artifact.offload.backend.plans import COUNTS, PHASES
from artifact.offload.spec import RunSpec
from artifact.paths import atomic_write_bytes, atomic_write_text, data_dir, fsync_dir, refuse_overwrite

# Profile keys that change what a run measures: a result file made under other values cannot be
# resumed or merged. The grid axes are not among them (a cell names its own axis values), nor is
# the model path (rows carry the model's config hash and its weights fingerprint instead).
SETTINGS = (
    "dtype",
    "device",
    "link",
    "latency_us",
    "link_gbps",
    "torch_threads",
    "mode",
    "gen_length",
    "steps",
    "threshold",
    "n_prompts",
    "seed",
    "max_prompt_tokens",
    "policies",
    "repetitions",
    "warmup",
    "lookahead",
    "tau",
    "trace_capacity",
    "link_priority",
)
META_COLUMNS = (
    "profile",
    "fingerprint",
    "model",
    "model_hash",
    "weights_fingerprint",
    "dtype",
    "device",
    "link",
    "hardware",
    "grid_cells",
)
RUN_COLUMNS = ("policy", "rep", "order", "working_set", "cache_experts", "link_gbps")
STAT_COLUMNS = (
    "seconds",
    "tokens",
    "tokens_per_second",
    "forwards",
    "tokens_per_forward",
    *COUNTS,  # the engine's counts (plans.COUNTS), in its order
    "stall_seconds",
    "link_busy_seconds",
    "achieved_gbps",
    "tokens_sha",
)
# Every engine count per phase of the demand stream (plans.PHASES: prefill, first = a block's step 0, later),
# e.g. demand_misses_prefill; each count's phases add up to its total in STAT_COLUMNS.
PHASE_COLUMNS = tuple(f"{c}_{phase}" for c in COUNTS for phase in PHASES)
# Per run, the medians over its denoising forwards of the host ms (the forward's CPU time less the time
# blocked in the router syncs) and of the wall ms (CUDA: an event pair on the compute stream): a GPU cell
# whose host time is most of its wall time timed the host, not the link (rules.rule_cell,
# thresholds.HOST_SHARE_LIMIT).
HOST_COLUMNS = ("host_ms_per_forward", "wall_ms_per_forward")
# The run's arm: "B" for the A/A pair's second run of demand in a repetition, "A" for every other run. Last,
# so a file written before it has a prefix of these columns.
ARM_COLUMNS = ("arm",)
COLUMNS = META_COLUMNS + CELL_KEYS + RUN_COLUMNS + STAT_COLUMNS + PHASE_COLUMNS + HOST_COLUMNS + ARM_COLUMNS
# A file written before rows carried their arm: read as arm A, appended to in its own columns (no A/A pair).
BEFORE_ARM = COLUMNS[: -len(ARM_COLUMNS)]
# A file written before rows carried host time: read with those columns empty, appended to in its own columns.
BEFORE_HOST = BEFORE_ARM[: -len(HOST_COLUMNS)]
STR_COLUMNS = (*(c for c in META_COLUMNS if c != "grid_cells"), "task", "policy", "tokens_sha", "arm")
# Numbers every row must hold (the other numeric columns may be empty, e.g. link_gbps of an unpaced cuda
# link).
FINITE_COLUMNS = (
    "grid_cells",
    "batch_size",
    "cache_ratio",
    "bandwidth_scale",
    "rep",
    "order",
    "working_set",
    "cache_experts",
    "seconds",
    "tokens",
    "tokens_per_second",
)
SORT = ("task", "batch_size", "bandwidth_scale", "cache_ratio", "rep", "order")


def default_out(P: Settings, shard: tuple[int, int] = (0, 1)) -> Path:
    """data/results/<profile>/bench.csv, or shard i of n's own file beside it."""
    target = data_dir() / "results" / P.name / "bench.csv"
    return target if shard[1] == 1 else shard_file(target, *shard)


def fingerprint_keys(P: Settings) -> tuple[str, ...]:
    """The settings a result file's fingerprint hashes: SETTINGS, and `forward` and `expert_kernel` each when
    not its default (eager, grouped). A segmented or loop-kernel run's rows then never resume or pool with the
    default's, while every default file, the stored runs among them, keeps the hash it was written with.
    `aa_pair` is not hashed: the stored runs measured before the A/A pair pool with later runs (their rows
    read as arm A: runs without the pair); a file's arms are checked against the profile's where it is
    resumed (load_for_append)."""
    run = RunSpec()
    return SETTINGS + tuple(k for k in ("forward", "expert_kernel") if getattr(P, k) != getattr(run, k))


def has_aa_pair(P: Settings) -> bool:
    """Whether the profile's grids run the A/A pair: aa_pair on, and demand among the policies."""
    return len(slots(P.policies, P.aa_pair)) > len(P.policies)


def bench_fingerprint(P: Settings) -> str:
    return fingerprint(P, fingerprint_keys(P))


def phase_stats(by_phase: dict[str, dict[str, int]]) -> dict:
    """An offloaded run's `by_phase` counts as the flat PHASE_COLUMNS."""
    return {f"{c}_{phase}": by_phase[phase][c] for c in COUNTS for phase in PHASES}


def changed_tokens(df) -> list[str]:
    """Cells whose runs generated different tokens (offloading must change time, never results)."""
    n = df.groupby(list(CELL_KEYS)).tokens_sha.nunique()
    return [str(Cell(*k)) for k, v in n.items() if v > 1]


def same_tokens(rows) -> tuple[int, int]:
    """(cells where every policy and repetition decoded the same tokens, cells)."""
    cells = rows.groupby(list(CELL_KEYS)).ngroups
    return cells - len(changed_tokens(rows)), cells


# ---------------------------------------------------------------------------------------------
# Result files: whole cells appended under the file's lock (locks.py), an interrupted append repaired
# ---------------------------------------------------------------------------------------------
def _parse(data: bytes, path: Path):
    if not data.strip():
        return pd.DataFrame(columns=list(COLUMNS))
    try:
        df = pd.read_csv(io.BytesIO(data), dtype={c: str for c in STR_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ResultFileError(f"{path}: not a bench CSV: {e}") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing[-len(ARM_COLUMNS) :] == list(ARM_COLUMNS):  # written before rows carried their arm: all A
        df = df.assign(arm="A")
        missing = missing[: -len(ARM_COLUMNS)]
    if missing == list(HOST_COLUMNS):  # written before rows carried host time: not measured
        df = df.assign(**{c: np.nan for c in HOST_COLUMNS})
        missing = []
    if missing == ["weights_fingerprint"]:
        raise ResultFileError(
            f"{path}: written before bench rows recorded the checkpoint's weights fingerprint, "
            "so its rows cannot be matched to a checkpoint; "
            "re-run the bench into a fresh --out (or move this file away)"
        )
    if missing and set(missing) == set(PHASE_COLUMNS):
        raise ResultFileError(
            f"{path}: written before bench rows carried per-phase counts (columns such as "
            f"{PHASE_COLUMNS[0]}); re-run the bench into a fresh --out (or move this file away)"
        )
    if missing:
        raise ResultFileError(f"{path}: not a bench CSV of this version (lacks columns {missing})")
    return df[list(COLUMNS)]


def check_rows(df, path: Path | str, expected: set[tuple[str, str, int]] | None = None) -> None:
    """Refuse damaged rows: a non-number or a missing number where one is required, an arm other than A or
    B, or a cell that does not hold each (policy, arm, repetition) exactly once. `expected` defaults to the
    file's own (policy, arm) runs x repetitions (every cell of one file was run under the same settings)."""
    for col in COLUMNS:
        if col == "arm":
            bad = ~df[col].isin(ARMS)
        elif col in STR_COLUMNS:
            bad = df[col].isna() if col in ("task", "policy") else pd.Series(False, index=df.index)
        else:
            num = pd.to_numeric(df[col], errors="coerce")
            bad = num.isna() & df[col].notna()
            if col in FINITE_COLUMNS:
                bad |= ~np.isfinite(num.astype(float))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            v = df[col].iloc[i]
            shown = "empty or nan" if pd.isna(v) else repr(v) if isinstance(v, str) else str(v)
            raise ResultFileError(
                f"{path}: line {i + 2}, column {col}: {shown} is not a "
                f"{'arm (A or B)' if col == 'arm' else 'name' if col in STR_COLUMNS else 'finite number'}; "
                "the file is damaged"
            )
    if not len(df):
        return
    if expected is None:
        arms = set(zip(df.policy, df.arm))
        expected = {(pol, arm, r) for pol, arm in arms for r in range(int(df.rep.max()) + 1)}
    for key, g in df.groupby(list(CELL_KEYS), sort=False):
        runs = sorted(zip(g.policy, g.arm, g.rep.astype(int)))
        if runs != sorted(expected):
            pols = sorted({pol if arm == "A" else f"{pol} (arm {arm})" for pol, arm, _ in expected})
            reps = len({r for _, _, r in expected})
            raise ResultFileError(
                f"{path}: cell {Cell(*cell_key(dict(zip(CELL_KEYS, key))))} has {len(runs)} runs, expected "
                f"each of policies {pols} x {reps} repetitions once; the file is damaged"
            )


def read_rows(path: Path | str):
    """A bench result file's rows, checked (columns, numbers, whole cells). Takes the shared lock where a
    lock file exists, so a file being appended to is read between two appends."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: bench result file not found")
    if lock_path(path).exists():
        try:
            with locked(path, shared=True, log=lambda s: print(s, file=sys.stderr)):
                data = path.read_bytes()
        except PermissionError:  # a read-only copy: nobody can be writing it
            data = path.read_bytes()
    else:
        data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise ResultFileError(
            f"{path}: the last line is torn (an interrupted write); "
            "rerun `bench` on this file to repair it, then read it"
        )
    df = _parse(data, path)
    check_rows(df, path)
    return df


def write_rows(path: Path, rows) -> None:
    """Replace a whole result file atomically (merge); `append_rows` adds a cell."""
    atomic_write_text(path, pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False))


def _file_columns(path: Path, new: bool) -> tuple[str, ...]:
    """The columns rows are appended in: COLUMNS, or the file's own for a file written before the arm
    (BEFORE_ARM) or host time (BEFORE_HOST)."""
    if new:
        return COLUMNS
    with open(path, "rb") as f:
        header = f.readline().decode(errors="replace").strip()
    return next((c for c in (BEFORE_HOST, BEFORE_ARM) if header == ",".join(c)), COLUMNS)


def append_rows(path: Path, rows) -> None:
    """Append rows (one finished cell) in one write, then fsync. Call it holding `locked(path)`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        new = size == 0
        columns = _file_columns(path, new)
        if "arm" not in columns and any(r.get("arm", "A") != "A" for r in rows):
            raise ResultFileError(f"{path}: written before rows carried their arm; a B arm's row can't go in")
        view = memoryview(pd.DataFrame(rows, columns=list(columns)).to_csv(index=False, header=new).encode())
        try:
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as e:  # disk full, quota, read-only: the file goes back to its whole cells
            os.ftruncate(fd, size)
            if not existed:
                path.unlink(missing_ok=True)
            raise OSError(
                e.errno,
                f"{e.strerror} while appending a cell (the file keeps its whole cells; the cell runs again)",
                str(path),
            ) from None
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)


def expected_runs(P: Settings) -> set[tuple[str, str, int]]:
    """(policy, arm, repetition) of every run of one of the profile's cells (the A/A pair's B arm too)."""
    return {(*slot_run(s), r) for s in slots(P.policies, P.aa_pair) for r in range(P.repetitions)}


def load_for_append(path: Path, P: Settings, log=print):
    """The rows of `path` (held under `locked(path)`), checked to be this profile's, after repairing what
    an interrupted append leaves: a torn last line, and the incomplete cell at the end of the file.
    Both are cut off (with a note) by an atomic rewrite of the intact prefix; that cell runs again."""
    if not path.exists():
        return pd.DataFrame(columns=list(COLUMNS))
    data = path.read_bytes()
    keep, notes = len(data), []
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        notes.append(f"a torn last line ({len(data) - keep} bytes)")
    header = data[:keep].split(b"\n", 1)[0].decode(errors="replace").strip()
    if header and header not in (",".join(COLUMNS), ",".join(BEFORE_ARM), ",".join(BEFORE_HOST)):
        _parse(data[:keep], path)  # names an old version's or a foreign file's columns first
        raise ResultFileError(
            f"{path}: its columns are not in this version's order ({', '.join(COLUMNS)}), "
            "so rows cannot be appended to it; re-run into a fresh --out (merge rewrites files in order)"
        )
    df = _parse(data[:keep], path)
    lines = data[:keep].splitlines(keepends=True)[1:]
    if len(lines) != len(df):
        raise ResultFileError(f"{path}: {len(lines)} lines hold {len(df)} rows; the file is damaged")
    for col, want in (("fingerprint", bench_fingerprint(P)), ("profile", P.name)):
        have = sorted(set(df[col]))
        if have and have != [want]:
            raise ResultFileError(
                f"{path}: rows of {col} {have}, not this profile's {want!r} (settings "
                f"{', '.join(fingerprint_keys(P))} must match to resume); "
                "choose another --out or move the file"
            )
    if header and "arm" not in header.split(",") and has_aa_pair(P):
        raise ResultFileError(
            f"{path}: written before bench rows carried their arm (column arm), so it has no A/A pair, and "
            "this profile's grid runs one (aa_pair); re-run into a fresh --out (or move this file away), or "
            "resume it without the pair (aa_pair: false)"
        )
    if (df.arm == "B").any() and not has_aa_pair(P):
        raise ResultFileError(
            f"{path}: its rows hold the A/A pair (arm B), and this profile's grid runs none (aa_pair off, or "
            "no demand among the policies); resume it with aa_pair: true, or choose another --out"
        )
    if len(df):
        keys = cell_keys(df)
        k = next((i for i, key in enumerate(reversed(keys)) if key != keys[-1]), len(keys))
        tail = df.iloc[len(df) - k :]
        if keys[-1] not in keys[:-k] and sorted(zip(tail.policy, tail.arm, tail.rep.astype(int))) != sorted(
            expected_runs(P)
        ):
            keep -= sum(len(line) for line in lines[len(lines) - k :])
            df = df.iloc[: len(df) - k]
            notes.append(f"the incomplete last cell {Cell(*keys[-1])} ({k} of {len(expected_runs(P))} runs)")
    if notes:
        atomic_write_bytes(path, data[:keep])
        log(
            f"note: {path}: dropped {' and '.join(notes)}, left by an interrupted append; "
            "that cell runs again"
        )
    check_rows(df, path, expected_runs(P))
    return df.reset_index(drop=True)


def finished_cells(df) -> set[tuple]:
    """Cells in rows checked by `load_for_append` (every one whole). They may be any shard's: shards can
    share a file, and a cell is skipped whoever ran it."""
    return set(cell_keys(df))


def check_same_model(df, meta: dict, path: Path) -> None:
    """Rows of a result file must come from this model config and these very weights."""
    for col, what in (
        ("model_hash", "model config hash"),
        ("weights_fingerprint", "checkpoint weights fingerprint"),
    ):
        have = sorted(set(df[col]))
        if have and have != [meta[col]]:
            raise ResultFileError(
                f"{path}: rows of model {sorted(set(df.model))} with {what} {have}, "
                f"not this run's {meta['model']} ({meta[col]}); "
                "results of different checkpoints are never mixed: choose a fresh --out or move the file"
            )


def merge(
    inputs: list[Path | str],
    out: Path | str | None = None,
    force: bool = False,
    partial: bool = False,
    log=print,
):
    """Join shard files into one, refusing duplicates, mixed profiles or settings, and (unless
    `partial`) an incomplete grid. Never overwrites `out` unless `force`."""
    if not inputs:
        raise ResultFileError("merge needs at least one shard file")
    frames = [read_rows(f).assign(_file=str(f)) for f in inputs]
    df = pd.concat(frames, ignore_index=True)
    if not len(df):
        raise ResultFileError(f"no rows in {[str(f) for f in inputs]}")
    for col in ("profile", "fingerprint", "model_hash", "weights_fingerprint", "grid_cells"):
        vals = df.groupby(col)._file.unique()
        if len(vals) > 1:
            detail = "; ".join(f"{v!r} in {sorted(fs)}" for v, fs in vals.items())
            raise ResultFileError(f"shards disagree on {col}: {detail}; they are not one grid's shards")
    run_key = list(PAIR_KEYS) + ["policy", "arm"]
    dup = df[df.duplicated(run_key, keep=False)]
    if len(dup):
        first = dup.iloc[0]
        files = sorted(dup[(dup[run_key] == first[run_key]).all(axis=1)]._file)
        raise ResultFileError(
            f"run {dict(first[run_key])} appears twice (in {files}); a cell belongs to one shard"
        )
    n_cells = df.groupby(list(CELL_KEYS)).ngroups
    want = int(df.grid_cells.iloc[0])
    if n_cells < want and not partial:
        raise ResultFileError(
            f"the shards hold {n_cells} of the grid's {want} cells; run the missing shards "
            "(or pass --partial to merge what there is)"
        )
    hw = sorted(set(df.hardware))
    if len(hw) > 1:
        log(f"note: the shards ran on different hardware: {hw}")
    out = Path(out) if out else data_dir() / "results" / str(df.profile.iloc[0]) / "bench.csv"
    merged = df.drop(columns="_file").sort_values(list(SORT), kind="stable").reset_index(drop=True)
    with locked(out, log=log):  # not while a bench appends to the same file
        refuse_overwrite(out, force)
        write_rows(out, merged)
    log(f"merged {len(inputs)} files: {n_cells} of {want} cells, {len(merged)} rows -> {out}")
    return merged
