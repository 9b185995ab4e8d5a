"""Paired throughput benchmark: the profile's policies side by side on identical prompts, cell by cell.

The grid is a fixed, ordered list of cells (task, batch_size, cache_ratio, bandwidth_scale): tasks,
then batch sizes, then bandwidth scales, then C/W ratios, each in the profile's order. Per cell:
  1. W, the mean per-step expert working set, from one traced run of the cell's prompts (once per
     task and batch size; resident, or offloaded at trace_capacity). It doubles as the warm-up, and
     its trace feeds the oracle policy. C = capacity_for(cache_ratio, W, E).
  2. `warmup` untimed runs of every policy.
  3. R repetitions; repetition r runs every policy once, in the listed order when r is even and
     reversed when r is odd, so neither policy always runs first. One CSV row per timed run.
After each cell the whole CSV is rewritten atomically (temp file + rename): the file only ever holds
whole cells, so a rerun resumes by skipping the cells it already has.

Sharding: `--shard i/n` (0 <= i < n) takes the cells whose grid index % n == i, so n GPUs or a job
array (Slurm: --array=0-(n-1), --shard $SLURM_ARRAY_TASK_ID/n) run one grid; each shard writes its
own file and `python -m artifact merge` joins them.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from artifact.errors import ProfileError, ResultFileError, SettingError
from artifact.experiments.settings import Profile, fingerprint, list_profiles, load_profile, parse_override
from artifact.experiments.stats import CELL_KEYS, PAIR_KEYS, format_table, paired_table, with_paper
from artifact.model.checkpoint import load_checkpoint
from artifact.model.tasks import prompts
from artifact.offload.policies import check_policy
from artifact.offload.runner import OffloadSpec, check_device, run
from artifact.offload.sim import capacity_for
from artifact.offload.trace import mean_working_set
from artifact.paths import atomic_write_text, data_dir, refuse_overwrite

# Profile keys that change what a run measures: a result file made under other values cannot be
# resumed or merged. The grid axes are not among them (a cell names its own axis values), nor is
# the model path (rows carry the model's config hash instead).
SETTINGS = ("dtype", "device", "link", "latency_us", "link_gbps", "torch_threads", "mode", "gen_length", "steps",
            "threshold", "n_prompts", "seed", "max_prompt_tokens", "policies", "repetitions", "warmup", "lookahead",
            "tau", "trace_capacity", "link_priority")
META_COLUMNS = ("profile", "fingerprint", "model", "model_hash", "dtype", "device", "link", "hardware", "grid_cells")
RUN_COLUMNS = ("policy", "rep", "order", "working_set", "cache_experts", "link_gbps")
STAT_COLUMNS = ("seconds", "tokens", "tokens_per_second", "forwards", "tokens_per_forward", "demand_hits",
                "demand_misses", "speculative_transfers", "prefetch_hits", "wasted_prefetches", "bytes_h2d",
                "stall_seconds", "link_busy_seconds", "achieved_gbps", "tokens_sha")
COLUMNS = META_COLUMNS + CELL_KEYS + RUN_COLUMNS + STAT_COLUMNS
STR_COLUMNS = ("profile", "fingerprint", "model", "model_hash", "dtype", "device", "link", "hardware", "task",
               "policy", "tokens_sha")
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
        self.meta = {"model": cfg.name, "model_hash": cfg.config_hash(), "dtype": str(self.loaded.experts.dtype)
                     .removeprefix("torch."), "device": p.device, "link": p.link, "hardware": hardware(p.device)}
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
# Result files
# ---------------------------------------------------------------------------------------------
def read_rows(path: Path | str):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: bench result file not found")
    try:
        df = pd.read_csv(path, dtype={c: str for c in STR_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ResultFileError(f"{path}: not a bench CSV: {e}") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ResultFileError(f"{path}: not a bench CSV of this version (lacks columns {missing})")
    return df[list(COLUMNS)]


def write_rows(path: Path, rows) -> None:
    atomic_write_text(path, pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False))


def _cell_key(row) -> tuple:
    return (str(row["task"]), int(row["batch_size"]), float(row["cache_ratio"]), float(row["bandwidth_scale"]))


def _finished_cells(df, p: Profile, path: Path, mine: list[Cell], cells: list[Cell]) -> set[tuple]:
    """Cells already in a result file, after checking the file is this bench's and holds whole cells."""
    if not len(df):
        return set()
    for col, want in (("fingerprint", bench_fingerprint(p)), ("profile", p.name)):
        have = sorted(set(df[col]))
        if have != [want]:
            raise ResultFileError(f"{path}: rows of {col} {have}, not this profile's {want!r} (settings "
                             f"{', '.join(SETTINGS)} must match to resume); choose another --out or move the file")
    expected = {(pol, r) for pol in p.policies for r in range(p.repetitions)}
    mine_keys, all_keys = {c.key for c in mine}, {c.key for c in cells}
    done = set()
    for key, g in df.groupby(list(CELL_KEYS), sort=False):
        key = _cell_key(dict(zip(CELL_KEYS, key)))
        runs = list(zip(g.policy, g.rep.astype(int)))
        if sorted(runs) != sorted(expected):
            raise ResultFileError(f"{path}: cell {Cell(*key)} has {len(runs)} runs, expected each of policies "
                             f"{list(p.policies)} x {p.repetitions} repetitions once; the file is damaged")
        if key in all_keys and key not in mine_keys:
            raise ResultFileError(f"{path}: holds cell {Cell(*key)} of another shard; each shard needs its own --out")
        done.add(key)
    return done


def run_bench(p: Profile, out: Path | str | None = None, shard: tuple[int, int] = (0, 1), runner=None,
              loaded=None, progress: bool = True, log=print):
    """Run (or resume) this shard of the profile's grid into `out`; returns all rows of `out`."""
    out = Path(out) if out else default_out(p, shard)
    cells = grid(p)
    mine = shard_cells(cells, shard)
    old = read_rows(out) if out.exists() else pd.DataFrame(columns=list(COLUMNS))
    done = _finished_cells(old, p, out, mine, cells)
    todo = [c for c in mine if c.key not in done]
    rows = old.to_dict("records")
    log(f"bench {p.name}: shard {shard[0]}/{shard[1]} has {len(mine)} of {len(cells)} cells; "
        f"{len(mine) - len(todo)} done in {out}, {len(todo)} to run")
    extra = len(done - {c.key for c in cells})
    if extra:
        log(f"note: {out} also holds {extra} cells outside this profile's grid; they are kept")
    if not todo:
        return old
    runner = runner or ModelRunner(p, loaded)
    meta = dict(runner.meta, profile=p.name, fingerprint=bench_fingerprint(p), grid_cells=len(cells))
    if len(old) and sorted(set(old.model_hash)) != [meta["model_hash"]]:
        raise ResultFileError(f"{out}: rows of model {sorted(set(old.model))} (config hash "
                         f"{sorted(set(old.model_hash))}), not of {meta['model']} ({meta['model_hash']})")
    P, R = list(p.policies), p.repetitions
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo) * len(P) * (R + p.warmup), unit="run", desc=f"bench {p.name}",
               disable=not progress, file=sys.stderr)
    try:
        for cell in todo:
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
            rows.extend(new)
            write_rows(out, rows)                      # whole cells only: the resume invariant
    finally:
        bar.close()
    minutes = (time.perf_counter() - t0) / 60
    note = ""
    if p.budget_minutes is not None and len(todo) == len(cells):
        note = f"; budget {p.budget_minutes:g} min: {'within' if minutes <= p.budget_minutes else 'OVER'}"
    log(f"bench {p.name}: ran {len(todo)} cells ({len(todo) * len(P) * R} timed runs) in {minutes:.2f} min{note}; "
        f"{len(rows)} rows in {out}")
    return read_rows(out)


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
    for col in ("profile", "fingerprint", "model_hash", "grid_cells"):
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
    refuse_overwrite(out, force)
    merged = df.drop(columns="_file").sort_values(list(SORT), kind="stable").reset_index(drop=True)
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
                   help="result CSV (default: data/results/PROFILE/bench.csv, or bench.shard-I-of-N.csv)")
    b.add_argument("--shard", default="0/1", help="i/n: run the cells whose index %% n == i (0 <= i < n)")
    b.add_argument("--model", default=None, help="checkpoint directory (overrides the profile's model)")
    b.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a profile key with a YAML value, e.g. --set repetitions=5 (repeatable)")
    b.add_argument("--list", action="store_true", help="print this shard's cells and exit")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
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

