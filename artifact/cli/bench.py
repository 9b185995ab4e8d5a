"""`bench`, `report` and `merge`: the paired benchmark's commands (bench --submit hands the shards to
artifact.experiments.submit)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from artifact.cli.args import add_profile_args, add_submit_args, names, profile_from_args
from artifact.cli.jobs import job_options
from artifact.errors import ResultFileError, SettingError
from artifact.experiments.bench import run_bench
from artifact.experiments.bench.grid import grid, parse_shard
from artifact.experiments.bench.results import changed_tokens, default_out, merge, read_rows
from artifact.experiments.paired_table import CELL_KEYS, format_table, paired_table, with_paper
from artifact.experiments.submit import BACKENDS, SubmitError, submit_bench
from artifact.paths import atomic_write_text, refuse_overwrite


def cmd_bench(a):
    if a.submit or a.shards is not None or a.wait:
        return cmd_bench_submit(a)
    p = profile_from_args(a)
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


def cmd_bench_submit(a) -> int:
    """`bench --submit`: the shards as jobs (artifact.experiments.submit.submit_bench)."""
    if not a.submit or a.shards is None:
        raise SubmitError(
            f"--shards and --wait go with --submit: give --submit {'|'.join(BACKENDS)} --shards N"
        )
    if a.shard != "0/1" or a.list:
        raise SubmitError("--submit runs every shard itself: give --shards N, without --shard or --list")
    P = profile_from_args(a)
    target = Path(a.out or default_out(P))
    extra = ["--submit", a.submit, "--shards", str(a.shards), "--wait"]
    submit_bench(P, target, a.shards, a.submit, a.wait, **job_options(a, "bench", extra))
    return 0


def _warn_changed_tokens(df):
    bad = changed_tokens(df)
    if bad:
        print(
            f"warning: policies generated different tokens in {len(bad)} cells (e.g. {bad[0]}): offloading "
            "should change time, never results",
            file=sys.stderr,
        )


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


def _out_and_shard(b) -> None:
    b.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result CSV (default: data/results/PROFILE/bench.csv, or bench.shard-I-of-N.csv); "
        "shards and reruns may share one: cells are appended under a lock on OUT.lock, a second writer waits",
    )
    b.add_argument("--shard", default="0/1", help="i/n: run the cells whose index %% n == i (0 <= i < n)")


def add_cli(subparsers) -> None:
    """Register `bench`, `report` and `merge`."""
    b = subparsers.add_parser(
        "bench", help="paired throughput runs of a profile's grid (resumable, shardable)"
    )
    add_profile_args(b, after_profile=_out_and_shard)
    b.add_argument("--list", action="store_true", help="print this shard's cells and exit")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    add_submit_args(b)
    b.set_defaults(fn=cmd_bench)

    r = subparsers.add_parser(
        "report", help="paired table of two policies from bench CSVs (t and bootstrap CIs)"
    )
    r.add_argument("files", type=Path, nargs="+")
    r.add_argument("--a", default="demand", help="policy A (the table shows A over B in percent)")
    r.add_argument("--b", default="last_step", help="policy B (the per-pair baseline)")
    r.add_argument(
        "--by", type=names, default=["cache_ratio"], help=f"comma-separated, from {list(CELL_KEYS)}"
    )
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
