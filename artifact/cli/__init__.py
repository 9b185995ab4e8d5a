"""Command line: python -m artifact {generate,trace,simulate,bench,report,merge,notebooks,model} ...

Every argument is checked before a checkpoint's weights are read: values and flags first, then what needs
the config or the tokenizer (positions, the oracle trace's prompts, the tokenizer's fit to the vocabulary),
and every output path is probed for writability, so a bad input costs seconds, not a load or a finished
run. Errors a user can fix (artifact.errors.UserError, and a missing, existing or unwritable file) print one
line and exit 2; anything else is a bug and shows its traceback. Every command sets torch's thread count
from one setting (--threads; default: Settings.torch_threads resolved by resolve_threads)."""

from __future__ import annotations

import argparse
import sys

import torch

from artifact.cli import (
    bench,
    calibrate,
    claims,
    doctor,
    engine,
    fresh_runs,
    jobs,
    model,
    notebooks,
    rule,
    stored_runs,
    synth,
)
from artifact.cli.args import add_threads_arg, policy_modules_from_args, profile_from_args
from artifact.errors import SettingError, UserError
from artifact.experiments.bench.grid import parse_shard
from artifact.experiments.bench.results import default_out
from artifact.experiments.settings import resolve_threads
from artifact.paths import DISK_ERRORS, check_writable
from artifact.validate import check_number

# OSErrors that name a user's file: a path given wrong, not a broken machine.
USER_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


class OneLineParser(argparse.ArgumentParser):
    """A bad flag or value is one line on stderr, naming it (argparse's message), and exit 2: never the usage
    block before it."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m artifact", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    engine.add_cli(sub)
    bench.add_cli(sub)
    for name in ("bench", "report", "merge"):
        add_threads_arg(sub.choices[name], bench_like=name == "bench")
    notebooks.add_cli(sub)
    claims.add_cli(sub)
    stored_runs.add_cli(sub)
    calibrate.add_cli(sub)
    fresh_runs.add_cli(sub)
    rule.add_cli(sub)
    doctor.add_cli(sub)
    jobs.add_cli(sub)
    synth.add_cli(sub)
    model.add_cli(sub)
    for name in ("synth", "fit", "model"):
        add_threads_arg(sub.choices[name])
    return ap


def set_threads(a) -> int | None:
    """torch's intra-op thread count for this command, from --threads or the settings (resolve_threads).
    bench: --threads N is the profile key torch_threads (part of the result file's settings). notebooks run
    in their own kernels, which take it from the profile (harness.setup)."""
    if not hasattr(a, "threads"):  # notebooks, trace-all, run-jobs: kernels and jobs take the profile's key
        return None
    if a.cmd == "bench":
        if a.threads is not None:
            if any(x.partition("=")[0].strip() == "torch_threads" for x in a.set or []):
                raise SettingError("give --threads N or --set torch_threads=N, not both")
            a.set = [*(a.set or []), f"torch_threads={a.threads}"]
        n = profile_from_args(a).threads
    else:
        check_number("--threads", a.threads, low=1, high=1024, integer=True, allow_none=True)
        n = resolve_threads(a.threads, getattr(a, "model", None), getattr(a, "device", "cpu"))
    torch.set_num_threads(n)
    return n


def check_outputs(a) -> None:
    """Output paths of the commands whose runs do not go through prepare (bench, report, merge, synth),
    probed before any work."""
    if a.cmd == "bench" and not a.list:
        out = a.out or default_out(profile_from_args(a), parse_shard(a.shard))
        check_writable(out, "--out", exists_ok=True)  # an existing result file is resumed
    elif a.cmd == "report":
        check_writable(a.csv, "--csv", a.force)
    elif a.cmd == "merge":
        check_writable(a.out, "--out", a.force)
    elif a.cmd == "synth":
        check_writable(a.out, "--out", a.force)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        policy_modules_from_args(args)  # the user's policies first: every later check may name them
        set_threads(args)
        check_outputs(args)
        rc = args.fn(args)  # a command may return an exit code (notebooks: failures)
    except (UserError, *USER_OS_ERRORS) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in DISK_ERRORS:
            raise  # anything else is a bug: its traceback
        print(
            f"error: {e.filename or 'an output'}: {e.strerror}: nothing partial was kept; "
            "make room (or choose another output) and run the same command again: finished work is kept",
            file=sys.stderr,
        )
        return 2
    return int(rc or 0)
