"""Paired throughput benchmark: the profile's policies side by side on identical prompts, cell by cell.

The grid is a fixed, ordered list of cells (task, batch_size, cache_ratio, bandwidth_scale): tasks,
then batch sizes, then bandwidth scales, then C/W ratios, each in the profile's order. Per cell:
  1. W, the mean per-step expert working set, from one traced run of the cell's prompts (once per
     task and batch size; resident, or offloaded at trace_capacity). It doubles as the warm-up, and
     its trace feeds the oracle policy. C = capacity_for(cache_ratio, W, E).
  2. `warmup` untimed runs of every policy.
  3. R repetitions; repetition r runs every policy once, in the listed order when r is even and
     reversed when r is odd, so neither policy always runs first. One CSV row per timed run.
After each cell its rows are appended to the CSV in one write and fsynced, under an exclusive lock on
the sidecar `<out>.lock`, so the file only ever holds whole cells and a rerun resumes by skipping the
cells it already has (see "Result files" below for concurrent writers and interrupted appends).

Sharding: `--shard i/n` (0 <= i < n) takes the cells whose grid index % n == i, so n GPUs or a job
array (Slurm: --array=0-(n-1), --shard $SLURM_ARRAY_TASK_ID/n) run one grid; each shard writes its
own file by default and `python -m artifact merge` joins them. Shards may also share one --out.
`--submit slurm|local --shards n` (submit.py) submits the n shards as jobs through submitit, waits and merges.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import platform
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from artifact.errors import ProfileError, ResultFileError, SettingError
from artifact.experiments.settings import Profile, fingerprint, list_profiles, load_profile, parse_override
from artifact.experiments.stats import CELL_KEYS, PAIR_KEYS, format_table, paired_table, with_paper
from artifact.model.checkpoint import load_checkpoint, weights_fingerprint
from artifact.model.tasks import prompts
from artifact.offload.policies import check_policy
from artifact.offload.runner import OffloadSpec, check_device, run
from artifact.offload.sim import capacity_for
from artifact.offload.trace import mean_working_set
from artifact.paths import atomic_write_bytes, atomic_write_text, data_dir, fsync_dir, refuse_overwrite

# Profile keys that change what a run measures: a result file made under other values cannot be
# resumed or merged. The grid axes are not among them (a cell names its own axis values), nor is
# the model path (rows carry the model's config hash and its weights fingerprint instead).
SETTINGS = ("dtype", "device", "link", "latency_us", "link_gbps", "torch_threads", "mode", "gen_length", "steps",
            "threshold", "n_prompts", "seed", "max_prompt_tokens", "policies", "repetitions", "warmup", "lookahead",
            "tau", "trace_capacity")
META_COLUMNS = ("profile", "fingerprint", "model", "model_hash", "weights_fingerprint", "dtype", "device", "link",
                "hardware", "grid_cells")
RUN_COLUMNS = ("policy", "rep", "order", "working_set", "cache_experts", "link_gbps")
STAT_COLUMNS = ("seconds", "tokens", "tokens_per_second", "forwards", "tokens_per_forward", "demand_hits",
                "demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches", "bytes_h2d",
                "stall_seconds", "link_busy_seconds", "achieved_gbps", "tokens_sha")
COLUMNS = META_COLUMNS + CELL_KEYS + RUN_COLUMNS + STAT_COLUMNS
STR_COLUMNS = ("profile", "fingerprint", "model", "model_hash", "weights_fingerprint", "dtype", "device", "link",
               "hardware", "task", "policy", "tokens_sha")
# Numbers every row must hold (the other numeric columns may be empty, e.g. link_gbps of an unpaced cuda link).
FINITE_COLUMNS = ("grid_cells", "batch_size", "cache_ratio", "bandwidth_scale", "rep", "order", "working_set",
                  "cache_experts", "seconds", "tokens", "tokens_per_second")
SORT = ("task", "batch_size", "bandwidth_scale", "cache_ratio", "rep", "order")


@dataclass(frozen=True)
class Cell:
    task: str
    batch_size: int
    cache_ratio: float
    bandwidth_scale: float

    @property
    def key(self) -> tuple:
        return (self.task, self.batch_size, self.cache_ratio, self.bandwidth_scale)

    def __str__(self) -> str:
        return f"{self.task} b={self.batch_size} C/W={self.cache_ratio:g} bw={self.bandwidth_scale:g}x"


def grid(p: Profile) -> list[Cell]:
    return [Cell(t, b, r, s) for t in p.tasks for b in p.batch_sizes for s in p.bandwidth_scales
            for r in p.cache_ratios]


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n) with 0 <= i < n."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise SettingError(f"--shard must be i/n with integers, e.g. 0/4, got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise SettingError(f"--shard i/n needs n >= 1 and 0 <= i < n (shards are numbered from 0), got {text!r}")
    return i, n


def shard_cells(cells: list[Cell], shard: tuple[int, int]) -> list[Cell]:
    i, n = shard
    return [c for k, c in enumerate(cells) if k % n == i]


def default_out(p: Profile, shard: tuple[int, int] = (0, 1)) -> Path:
    name = "bench.csv" if shard[1] == 1 else f"bench.shard-{shard[0]}-of-{shard[1]}.csv"
    return data_dir() / "results" / p.name / name


def bench_fingerprint(p: Profile) -> str:
    return fingerprint(p, SETTINGS)


def hardware(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.machine()} cpu x{os.cpu_count()}"


def measure_h2d_gbps(device: str, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Host-to-device bandwidth of pinned copies (the cuda link's unthrottled rate)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    return repeats * nbytes / (time.perf_counter() - t0) / 1e9


class ModelRunner:
    """Runs a profile's cells on a model. Tests may substitute an object with the same `meta`,
    `num_experts`, `working_set` and `run`."""

    def __init__(self, p: Profile, loaded=None):
        if p.model is None:
            raise ProfileError(f"profile {p.name!r} needs a checkpoint directory: pass --model DIR")
        check_device(p.device)
        if p.torch_threads is not None:
            torch.set_num_threads(p.torch_threads)
        self.p = p
        self.loaded = loaded or load_checkpoint(p.model, p.torch_dtype, p.device,
                                                resident=p.trace_capacity is None)
        if p.device.startswith("cuda") and not self.loaded.experts.is_pinned():
            self.loaded.experts = self.loaded.experts.pin_memory()   # once, not in every run's HostStore
        cfg = self.loaded.cfg
        self.num_experts = cfg.num_experts
        self.expert_bytes = cfg.expert_params * self.loaded.experts.element_size()
        self.dc = p.decode_config()
        self.meta = {"model": cfg.name, "model_hash": cfg.config_hash(),
                     "weights_fingerprint": weights_fingerprint(self.loaded.path) if self.loaded.path else "none",
                     "dtype": str(self.loaded.experts.dtype).removeprefix("torch."), "device": p.device,
                     "link": p.link, "hardware": hardware(p.device)}
        self._group = None           # (task, batch size) -> (W, ids, prompts, trace): the last one only
        self._nominal = None

    def _measure(self) -> float:
        """The cuda link's unthrottled rate, measured once (only a scale < 1 without link_gbps needs it)."""
        if self._nominal is None:
            self._nominal = measure_h2d_gbps(self.p.device)
        return self._nominal

    def spec(self, capacity: int, policy: str = "demand", bandwidth_scale: float = 1.0) -> OffloadSpec:
        return OffloadSpec.from_settings(self.p, capacity, policy, expert_bytes=self.expert_bytes,
                                         bandwidth_scale=bandwidth_scale, measure=self._measure)

    def _prompts(self, task: str, batch_size: int):
        if self._group is None or self._group[0] != (task, batch_size):
            p = self.p
            ids, ps = prompts(self.loaded.tokenizer, task, p.n_prompts, p.seed, p.max_prompt_tokens)
            spec = None
            if p.trace_capacity is not None:
                spec = self.spec(min(p.trace_capacity, self.num_experts))
            res = run(self.loaded, ps, batch_size, self.dc, spec=spec, device=p.device, record=True,
                      prompt_ids=ids, task=task)
            self._group = ((task, batch_size), mean_working_set(res.trace), ids, ps, res.trace)
        return self._group

    def working_set(self, task: str, batch_size: int) -> float:
        return self._prompts(task, batch_size)[1]

    def run(self, cell: Cell, policy: str, capacity: int) -> dict:
        p = self.p
        _, _, ids, ps, trace = self._prompts(cell.task, cell.batch_size)
        spec = self.spec(capacity, policy, cell.bandwidth_scale)
        oracle = trace if check_policy(policy).needs_trace else None
        res = run(self.loaded, ps, cell.batch_size, self.dc, spec=spec, device=p.device, oracle=oracle,
                  prompt_ids=ids, task=cell.task)
        out = {k: res.stats.get(k) for k in STAT_COLUMNS}
        out["tokens"] = res.stats["tokens_generated"]
        out["link_gbps"] = spec.link_gbps
        out["tokens_sha"] = hashlib.sha1(json.dumps(res.tokens).encode()).hexdigest()[:12]
        return out


# ---------------------------------------------------------------------------------------------
# Result files: one writer at a time, whole cells appended, an interrupted append repaired
# ---------------------------------------------------------------------------------------------
# A result file may be shared by several processes (shards of one grid, or a rerun started while an
# earlier one still runs). They coordinate through an exclusive fcntl.flock on the sidecar `<out>.lock`,
# which a writer holds only while it reads the file and appends one finished cell (milliseconds, never
# while a cell runs). A second process therefore WAITS for the lock, saying once which PID holds it;
# it never refuses. Under the lock a writer re-reads the file, so a cell that another process finished
# meanwhile is skipped (before it runs) or its rows are dropped (if both ran it): every run is in the
# file once. Processes on the same shard also split the work: a cell being run is claimed (CellClaims),
# others run unclaimed cells first and then wait for the claimed ones, running one only if its claimant
# died before finishing it.
# The lock file stays in place (removing it would let two processes lock different files); flock is
# released by the kernel when its holder exits or is killed, so a crash leaves no stale lock.
def lock_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".lock")


QUIET_WAIT_S = 2.0       # a wait for the result file's lock is logged after this long


def _try_flock(fd: int, mode: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


@contextmanager
def locked(path: Path | str, shared: bool = False, log=print):
    """Hold `<path>.lock`: exclusive (a writer; its PID is written into the lock file) or shared (a reader).
    Waits while another process holds it, logging the holder's PID once the wait passes QUIET_WAIT_S."""
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        if not _try_flock(fd, mode, QUIET_WAIT_S):     # appends take milliseconds: only a longer wait is news
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            log(f"waiting for PID {holder}, which is writing {path} (lock file {lock})" if holder else
                f"waiting for another process reading {path} (lock file {lock})")
            fcntl.flock(fd, mode)
        if not shared:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            if not shared:
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)                                   # releases the flock


class CellClaims:
    """Which process is running which cell of a result file, so that processes on the same shard split
    the work instead of computing every cell twice. A claim is a POSIX byte-range lock (fcntl.lockf) on
    one byte of the sidecar `<out>.cells.lock`, at an offset hashed from the cell key: the kernel drops
    it when its holder exits or dies, so a crash leaves no stale claim. A claim only saves work; the
    file lock and the re-read before each append keep the file right even without one (a hash collision
    or a claim lost to another close of the file in this process merely lets a cell run twice, and the
    second copy is dropped). Record locks never conflict within one process."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".cells.lock")

    def __enter__(self) -> "CellClaims":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)                              # releases every claim still held

    @staticmethod
    def _offset(cell: Cell) -> int:
        return int.from_bytes(hashlib.sha1(repr(cell.key).encode()).digest()[:4], "little")

    def take(self, cell: Cell, wait: bool) -> bool:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB), 1, self._offset(cell))
        except (BlockingIOError, PermissionError):     # held by another process (EAGAIN or EACCES)
            return False
        return True

    def release(self, cell: Cell) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, self._offset(cell))


def _parse(data: bytes, path: Path):
    if not data.strip():
        return pd.DataFrame(columns=list(COLUMNS))
    try:
        df = pd.read_csv(io.BytesIO(data), dtype={c: str for c in STR_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ResultFileError(f"{path}: not a bench CSV: {e}") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing == ["weights_fingerprint"]:
        raise ResultFileError(f"{path}: written before bench rows recorded the checkpoint's weights fingerprint, so "
                              "its rows cannot be matched to a checkpoint; re-run the bench into a fresh --out "
                              "(or move this file away)")
    if missing:
        raise ResultFileError(f"{path}: not a bench CSV of this version (lacks columns {missing})")
    return df[list(COLUMNS)]


def check_rows(df, path: Path | str, expected: set[tuple[str, int]] | None = None) -> None:
    """Refuse damaged rows: a non-number or a missing number where one is required, or a cell that does
    not hold each (policy, repetition) exactly once. `expected` defaults to the file's own policies x
    repetitions (every cell of one file was run under the same settings)."""
    for col in COLUMNS:
        if col in STR_COLUMNS:
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
            raise ResultFileError(f"{path}: line {i + 2}, column {col}: {shown} is not a "
                                  f"{'name' if col in STR_COLUMNS else 'finite number'}; the file is damaged")
    if not len(df):
        return
    if expected is None:
        expected = {(pol, r) for pol in set(df.policy) for r in range(int(df.rep.max()) + 1)}
    for key, g in df.groupby(list(CELL_KEYS), sort=False):
        runs = sorted(zip(g.policy, g.rep.astype(int)))
        if runs != sorted(expected):
            pols = sorted({pol for pol, _ in expected})
            reps = len({r for _, r in expected})
            raise ResultFileError(f"{path}: cell {Cell(*_cell_key(dict(zip(CELL_KEYS, key))))} has {len(runs)} "
                                  f"runs, expected each of policies {pols} x {reps} repetitions once; the file is "
                                  "damaged")


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
        except PermissionError:                        # a read-only copy: nobody can be writing it
            data = path.read_bytes()
    else:
        data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise ResultFileError(f"{path}: the last line is torn (an interrupted write); rerun `bench` on this file "
                              "to repair it, then read it")
    df = _parse(data, path)
    check_rows(df, path)
    return df


def write_rows(path: Path, rows) -> None:
    """Replace a whole result file atomically (merge); `append_rows` adds a cell."""
    atomic_write_text(path, pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False))


def append_rows(path: Path, rows) -> None:
    """Append rows (one finished cell) in one write, then fsync. Call it holding `locked(path)`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        new = os.fstat(fd).st_size == 0
        view = memoryview(pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False, header=new).encode())
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)


def _cell_key(row) -> tuple:
    return (str(row["task"]), int(row["batch_size"]), float(row["cache_ratio"]), float(row["bandwidth_scale"]))


def _expected_runs(p: Profile) -> set[tuple[str, int]]:
    return {(pol, r) for pol in p.policies for r in range(p.repetitions)}


def _load_for_append(path: Path, p: Profile, log=print):
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
    if header and header != ",".join(COLUMNS):
        _parse(data[:keep], path)                  # names an old version's or a foreign file's columns first
        raise ResultFileError(f"{path}: its columns are not in this version's order ({', '.join(COLUMNS)}), so rows "
                              "cannot be appended to it; re-run into a fresh --out (merge rewrites files in order)")
    df = _parse(data[:keep], path)
    lines = data[:keep].splitlines(keepends=True)[1:]
    if len(lines) != len(df):
        raise ResultFileError(f"{path}: {len(lines)} lines hold {len(df)} rows; the file is damaged")
    for col, want in (("fingerprint", bench_fingerprint(p)), ("profile", p.name)):
        have = sorted(set(df[col]))
        if have and have != [want]:
            raise ResultFileError(f"{path}: rows of {col} {have}, not this profile's {want!r} (settings "
                                  f"{', '.join(SETTINGS)} must match to resume); choose another --out or move the "
                                  "file")
    if len(df):
        keys = [_cell_key(r) for r in df[list(CELL_KEYS)].to_dict("records")]
        k = next((i for i, key in enumerate(reversed(keys)) if key != keys[-1]), len(keys))
        tail = df.iloc[len(df) - k:]
        if keys[-1] not in keys[:-k] and sorted(zip(tail.policy, tail.rep.astype(int))) != sorted(_expected_runs(p)):
            keep -= sum(len(line) for line in lines[len(lines) - k:])
            df = df.iloc[:len(df) - k]
            notes.append(f"the incomplete last cell {Cell(*keys[-1])} ({k} of {len(_expected_runs(p))} runs)")
    if notes:
        atomic_write_bytes(path, data[:keep])
        log(f"note: {path}: dropped {' and '.join(notes)}, left by an interrupted append; that cell runs again")
    check_rows(df, path, _expected_runs(p))
    return df.reset_index(drop=True)


def _finished_cells(df) -> set[tuple]:
    """Cells in rows checked by `_load_for_append` (every one whole). They may be any shard's: shards can
    share a file, and a cell is skipped whoever ran it."""
    return {_cell_key(r) for r in df[list(CELL_KEYS)].drop_duplicates().to_dict("records")}


def _check_same_model(df, meta: dict, path: Path) -> None:
    """Rows of a result file must come from this model config and these very weights."""
    for col, what in (("model_hash", "model config hash"), ("weights_fingerprint", "checkpoint weights fingerprint")):
        have = sorted(set(df[col]))
        if have and have != [meta[col]]:
            raise ResultFileError(f"{path}: rows of model {sorted(set(df.model))} with {what} {have}, not this "
                                  f"run's {meta['model']} ({meta[col]}); results of different checkpoints are never "
                                  "mixed: choose a fresh --out or move the file")


def run_bench(p: Profile, out: Path | str | None = None, shard: tuple[int, int] = (0, 1), runner=None,
              loaded=None, progress: bool = True, log=print, skip=frozenset()):
    """Run (or resume) this shard of the profile's grid into `out`; returns all rows of `out`.
    Safe to run concurrently with other shards or reruns on the same `out` (see "Result files").
    `skip`: keys of cells that are complete elsewhere (a submission's merged target file), not run here."""
    out = Path(out) if out else default_out(p, shard)
    cells = grid(p)
    mine = shard_cells(cells, shard)
    with locked(out, log=log):
        old = _load_for_append(out, p, log)
    done = _finished_cells(old)
    todo = [c for c in mine if c.key not in done and c.key not in skip]
    elsewhere = sum(c.key in skip and c.key not in done for c in mine)
    log(f"bench {p.name}: shard {shard[0]}/{shard[1]} has {len(mine)} of {len(cells)} cells; "
        f"{len(mine) - len(todo) - elsewhere} done in {out}, " + (f"{elsewhere} done elsewhere, " if elsewhere else "")
        + f"{len(todo)} to run")
    extra = len(done - {c.key for c in cells})
    if extra:
        log(f"note: {out} also holds {extra} cells outside this profile's grid; they are kept")
    if not todo:
        return old
    runner = runner or ModelRunner(p, loaded)
    meta = dict(runner.meta, profile=p.name, fingerprint=bench_fingerprint(p), grid_cells=len(cells))
    _check_same_model(old, meta, out)
    P, R = list(p.policies), p.repetitions
    t0, ran = time.perf_counter(), 0
    bar = tqdm(total=len(todo) * len(P) * (R + p.warmup), unit="run", desc=f"bench {p.name}",
               disable=not progress, file=sys.stderr)

    def run_cell(cell: Cell) -> bool:
        """Run one cell and append its rows; False when another process had finished it."""
        with locked(out, log=log):
            if cell.key in _finished_cells(_load_for_append(out, p, log)):
                log(f"note: {cell} was finished meanwhile by another process writing {out}; skipped")
                bar.update(len(P) * (R + p.warmup))
                return False
        bar.set_postfix_str(str(cell))
        W = runner.working_set(cell.task, cell.batch_size)
        C = capacity_for(cell.cache_ratio, W, runner.num_experts)
        for _ in range(p.warmup):
            for pol in P:
                runner.run(cell, pol, C)
                bar.update()
        new = []
        for r in range(R):
            for pos, pol in enumerate(P if r % 2 == 0 else P[::-1]):
                s = runner.run(cell, pol, C)
                new.append({**meta, "task": cell.task, "batch_size": cell.batch_size,
                            "cache_ratio": cell.cache_ratio, "bandwidth_scale": cell.bandwidth_scale,
                            "policy": pol, "rep": r, "order": pos, "working_set": W, "cache_experts": C, **s})
                bar.update()
        with locked(out, log=log):                       # re-read: another process may have appended meanwhile
            now = _load_for_append(out, p, log)
            _check_same_model(now, meta, out)
            if cell.key in _finished_cells(now):
                log(f"note: another process writing {out} finished {cell} first; this run's rows are dropped "
                    "so that no run is in the file twice")
                return False
            append_rows(out, new)                        # whole cells only: the resume invariant
        return True

    try:
        with CellClaims(out) as claims:
            later = []
            for cell in todo:                            # cells nobody else is running, first
                if not claims.take(cell, wait=False):
                    later.append(cell)
                    continue
                try:
                    ran += run_cell(cell)
                finally:
                    claims.release(cell)
            if later:
                log(f"note: {len(later)} cells (e.g. {later[0]}) were being run by another process writing {out}; "
                    "waiting for each, then running it here only if that process did not finish it")
            for cell in later:
                claims.take(cell, wait=True)             # returns when the other process finished it or died
                try:
                    ran += run_cell(cell)
                finally:
                    claims.release(cell)
    finally:
        bar.close()
    minutes = (time.perf_counter() - t0) / 60
    note = ""
    if p.budget_minutes is not None and ran == len(cells):
        note = f"; budget {p.budget_minutes:g} min: {'within' if minutes <= p.budget_minutes else 'OVER'}"
    rows = read_rows(out)
    log(f"bench {p.name}: ran {ran} cells ({ran * len(P) * R} timed runs) in {minutes:.2f} min{note}; "
        f"{len(rows)} rows in {out}")
    return rows


def changed_tokens(df) -> list[str]:
    """Cells whose runs generated different tokens (offloading must change time, never results)."""
    n = df.groupby(list(CELL_KEYS)).tokens_sha.nunique()
    return [str(Cell(*k)) for k, v in n.items() if v > 1]


def merge(inputs: list[Path | str], out: Path | str | None = None, force: bool = False, partial: bool = False,
          log=print):
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
    run_key = list(PAIR_KEYS) + ["policy"]
    dup = df[df.duplicated(run_key, keep=False)]
    if len(dup):
        first = dup.iloc[0]
        files = sorted(dup[(dup[run_key] == first[run_key]).all(axis=1)]._file)
        raise ResultFileError(f"run {dict(first[run_key])} appears twice (in {files}); a cell belongs to one shard")
    n_cells = df.groupby(list(CELL_KEYS)).ngroups
    want = int(df.grid_cells.iloc[0])
    if n_cells < want and not partial:
        raise ResultFileError(f"the shards hold {n_cells} of the grid's {want} cells; run the missing shards "
                         "(or pass --partial to merge what there is)")
    hw = sorted(set(df.hardware))
    if len(hw) > 1:
        log(f"note: the shards ran on different hardware: {hw}")
    out = Path(out) if out else data_dir() / "results" / str(df.profile.iloc[0]) / "bench.csv"
    merged = df.drop(columns="_file").sort_values(list(SORT), kind="stable").reset_index(drop=True)
    with locked(out, log=log):                     # not while a bench appends to the same file
        refuse_overwrite(out, force)
        write_rows(out, merged)
    log(f"merged {len(inputs)} files: {n_cells} of {want} cells, {len(merged)} rows -> {out}")
    return merged


# ---------------------------------------------------------------------------------------------
# Command line (registered by artifact/cli.py)
# ---------------------------------------------------------------------------------------------
def _profile_from_args(a) -> Profile:
    overrides = dict(parse_override(s) for s in a.set or [])
    if a.model is not None:
        overrides["model"] = a.model
    return load_profile(a.profile, overrides)


def cmd_bench(a):
    if a.submit or a.shards is not None or a.wait:
        from artifact.experiments.submit import cmd_bench_submit  # submit imports this module
        return cmd_bench_submit(a)
    p = _profile_from_args(a)
    shard = parse_shard(a.shard)
    if a.list:
        cells = grid(p)
        for k, c in enumerate(cells):
            if k % shard[1] == shard[0]:
                print(f"{k:5d}  {c}")
        return
    out = a.out or default_out(p, shard)
    df = run_bench(p, out, shard, progress=not a.quiet, log=lambda s: print(s, file=sys.stderr))
    _warn_changed_tokens(df)
    if shard[1] == 1 and {"demand", "last_step"} <= set(p.policies) and len(df):
        _print_report(df, "demand", "last_step", ["cache_ratio"])


def _warn_changed_tokens(df):
    bad = changed_tokens(df)
    if bad:
        print(f"warning: policies generated different tokens in {len(bad)} cells (e.g. {bad[0]}): offloading "
              "should change time, never results", file=sys.stderr)


def _print_report(df, a: str, b: str, by: list[str]):
    print(format_table(with_paper(paired_table(df, a, b, by))))


def cmd_report(a):
    df = pd.concat([read_rows(f) for f in a.files], ignore_index=True)
    have = sorted(df.policy.unique())
    for pol in (a.a, a.b):
        if pol not in have:
            raise ResultFileError(f"policy {pol!r} is not in these rows; they hold {have}")
    if a.a == a.b:
        raise SettingError(f"compare two different policies, got {a.a!r} twice")
    bad = [k for k in a.by if k not in CELL_KEYS]
    if bad:
        raise SettingError(f"--by: cannot group by {bad}; choose from {list(CELL_KEYS)}")
    if a.csv:
        refuse_overwrite(a.csv, a.force)
    _warn_changed_tokens(df)
    table = with_paper(paired_table(df, a.a, a.b, a.by))
    if a.csv:
        atomic_write_text(a.csv, table.to_csv(index=False))
        print(f"wrote {len(table)} rows to {a.csv}", file=sys.stderr)
    if a.json:
        print(table.to_json(orient="records"))
    else:
        print(format_table(table))


def cmd_merge(a):
    merge(a.files, a.out, force=a.force, partial=a.partial, log=lambda s: print(s, file=sys.stderr))


def _by(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def add_cli(subparsers) -> None:
    """Register `bench`, `report` and `merge` on an argparse subparsers object."""
    b = subparsers.add_parser("bench", help="paired throughput runs of a profile's grid (resumable, shardable)")
    b.add_argument("--profile", default="cpu", help=f"one of {list_profiles()} or a path to a .yaml file")
    b.add_argument("--out", type=Path, default=None,
                   help="result CSV (default: data/results/PROFILE/bench.csv, or bench.shard-I-of-N.csv); shards and "
                        "reruns may share one: cells are appended under a lock on OUT.lock, a second writer waits")
    b.add_argument("--shard", default="0/1", help="i/n: run the cells whose index %% n == i (0 <= i < n)")
    b.add_argument("--model", default=None, help="checkpoint directory (overrides the profile's model)")
    b.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a profile key with a YAML value, e.g. --set repetitions=5 (repeatable)")
    b.add_argument("--list", action="store_true", help="print this shard's cells and exit")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    from artifact.experiments.submit import add_submit_args  # submit imports this module
    add_submit_args(b)
    b.set_defaults(fn=cmd_bench)

    r = subparsers.add_parser("report", help="paired table of two policies from bench CSVs (t and bootstrap CIs)")
    r.add_argument("files", type=Path, nargs="+")
    r.add_argument("--a", default="demand", help="policy A (the table shows A over B in percent)")
    r.add_argument("--b", default="last_step", help="policy B (the per-pair baseline)")
    r.add_argument("--by", type=_by, default=["cache_ratio"], help=f"comma-separated, from {list(CELL_KEYS)}")
    r.add_argument("--csv", type=Path, default=None, help="also write the table as CSV")
    r.add_argument("--force", action="store_true", help="replace an existing --csv")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_report)

    m = subparsers.add_parser("merge", help="join shard CSVs of one grid into one file")
    m.add_argument("files", type=Path, nargs="+")
    m.add_argument("--out", type=Path, default=None, help="default: data/results/PROFILE/bench.csv")
    m.add_argument("--force", action="store_true", help="replace an existing --out")
    m.add_argument("--partial", action="store_true", help="merge even if cells of the grid are missing")
    m.set_defaults(fn=cmd_merge)

