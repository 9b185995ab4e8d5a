"""`trace-all` and `run-jobs`: the profile's traces and the notebooks' heavy stages as submitit jobs
(artifact.experiments.submit), and the command line that repeats a submission."""

from __future__ import annotations

import shlex
import sys

from artifact.cli.args import add_jobs_dir_args, add_profile_args, profile_from_args
from artifact.experiments.submit import BACKENDS, local_capacity, run_jobs, submit_traces


def command(name: str, a, extra: list[str]) -> str:
    """The command line that repeats a submission (what a user runs again after a failure)."""
    args = ["python", "-m", "artifact", name, "--profile", str(a.profile)]
    if getattr(a, "model", None) is not None:
        args += ["--model", str(a.model)]
    for s in getattr(a, "set", None) or []:
        args += ["--set", s]
    for m in getattr(a, "policy_module", None) or []:
        args += ["--policy-module", m]
    if getattr(a, "out", None) is not None:
        args += ["--out", str(a.out)]
    if getattr(a, "jobs_dir", None) is not None:
        args += ["--jobs-dir", str(a.jobs_dir)]
    return shlex.join(args + extra)


def err(s: str) -> None:
    print(s, file=sys.stderr, flush=True)


def job_options(a, name: str, extra: list[str]) -> dict:
    """What every submission takes from its command line: the jobs folder, the command that repeats it
    (`name` with `extra`), the polling interval, and progress and log on stderr."""
    return dict(
        folder=a.jobs_dir,
        rerun=command(name, a, extra),
        poll_s=a.poll_seconds,
        progress=not a.quiet,
        log=err,
    )


def cmd_trace_all(a) -> int:
    P = profile_from_args(a)
    extra = ["--submit", a.submit] + (["--jobs", str(a.jobs)] if a.jobs else []) + ["--wait"]
    submit_traces(P, a.submit, a.jobs, a.wait, **job_options(a, "trace-all", extra))
    return 0


def cmd_run_jobs(a) -> int:
    P = profile_from_args(a)
    shards = a.shards or (local_capacity(P) if a.submit == "local" else 1)
    extra = ["--submit", a.submit, "--shards", str(shards)]
    run_jobs(P, a.submit, shards, **job_options(a, "run-jobs", extra))
    return 0


def add_cli(subparsers) -> None:
    """Register `trace-all` and `run-jobs` (bench's --submit flags are registered by cli/bench.py)."""
    for name, fn, text in (
        (
            "trace-all",
            cmd_trace_all,
            "record the profile's routing traces as parallel jobs (one per task and batch size on slurm)",
        ),
        (
            "run-jobs",
            cmd_run_jobs,
            "the notebooks' heavy stages as jobs (traces, then the bench, "
            "throttling and TIDE-style grids), each waited for and merged",
        ),
    ):
        t = subparsers.add_parser(name, help=text)
        add_profile_args(t, set_example="slurm.partition=gpu")
        t.add_argument(
            "--submit", choices=BACKENDS, required=True, help="slurm (job arrays) or local (processes)"
        )
        t.add_argument("--quiet", action="store_true", help="no progress bar")
        add_jobs_dir_args(t)
        if name == "trace-all":
            t.add_argument(
                "--jobs",
                type=int,
                default=None,
                help="local: processes (default: one per GPU or core); slurm: one job per trace",
            )
            t.add_argument("--wait", action="store_true", help="wait (progress bar) and report failed jobs")
        else:
            t.add_argument(
                "--shards",
                type=int,
                default=None,
                help="jobs per bench grid (default: local: GPUs or cores; slurm: 1)",
            )
        t.set_defaults(fn=fn)
