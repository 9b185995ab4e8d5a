"""Sweeps that outgrow one process: the bench's shards and the profile's traces as jobs, through submitit.

    python -m artifact bench --profile h200 --model DIR --submit slurm --shards 8 --wait
    python -m artifact trace-all --profile h200 --model DIR --submit slurm --wait
    python -m artifact run-jobs --profile h200 --model DIR --submit slurm     # what ./run_all.sh --submit
    runs

A bench submission runs shard i of n (`bench --shard i/n`) as one job writing its own file
<target>.shard-I-of-N.csv beside the target (data/results/<profile>/bench.csv by default).
- `slurm`: one job array, one task per shard; partition, account, time, GPUs, CPUs and memory come from the
  profile's `slurm:` section, and submitit checks the assembled sbatch parameters before anything is
  submitted.
- `local`: one process per shard on this machine (submitit's LocalExecutor): shard i sees only GPU i
  (CUDA_VISIBLE_DEVICES) on a cuda profile, or runs on core i with one torch thread on the CPU.
Cells already complete in the target are skipped by every shard, so a submission never duplicates them.
Giving the same command again submits only the shards with cells left, and each resumes per cell; a job
Slurm stops at its time limit or preempts is requeued by submitit and resumes the same way.
With --wait: a progress bar over finished cells, then every failed job with its log files and the
command that resubmits it; when all succeeded the shard files are merged into the target (and removed:
their rows are all in the target). Without --wait: the job ids and the exact merge command.
Logs and submitit's folders go to results/<profile>/jobs/ (ignored by git).

submitit moves the job's function and arguments to the job as a pickle it writes itself (in the jobs
folder); no result data passes through pickles: shards write CSVs, traces write safetensors.
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from artifact.experiments import harness
from artifact.experiments.bench import run_bench
from artifact.experiments.bench.grid import Cell, cell_keys, grid, shard_cells, shard_file
from artifact.experiments.bench.results import finished_cells, merge, read_rows
from artifact.experiments.harness import trace_current, trace_jobs
from artifact.experiments.settings import Settings
from artifact.experiments.studies import bandwidth_throttling, capacity_sweep, tide_head_to_head
from artifact.experiments.submit.jobs import (
    BACKENDS,
    POLL_S,
    Failure,
    SubmitError,
    failure_report,
    jobs_dir,
    local_capacity,
    submit_jobs,
    wait_jobs,
)

__all__ = [
    "BACKENDS",
    "POLL_S",
    "SubmitError",
    "local_capacity",
    "record_traces",
    "run_shard",
    "plan_bench",
    "submit_bench",
    "submit_traces",
    "bench_stages",
    "run_jobs",
]

# tests: a Unix socket told of each cell a shard job wrote (see _cell_written)
CELL_SOCKET = "ARTIFACT_CELL_SOCKET"


# ---------------------------------------------------------------------------------------------
# Trace recording: the one place that calls the experiments' trace functions (their module may move)
# ---------------------------------------------------------------------------------------------
def _one_trace(P: Settings, task: str, batch_size: int) -> Settings:
    return replace(P, trace_tasks=(task,), trace_batch_sizes=(batch_size,))


def record_traces(P: Settings, pairs: list[tuple[str, int]], pin_cpu: int | None = None) -> int:
    """The job of trace-all: record (or find current) the traces of these (task, batch size) pairs."""
    _pin(pin_cpu)
    for task, b in pairs:
        print(f"trace {task} b={b}", flush=True)
        harness.traces(_one_trace(P, task, b), progress=False)  # records only what is missing
    return len(pairs)


# ---------------------------------------------------------------------------------------------
# The jobs
# ---------------------------------------------------------------------------------------------
def _pin(cpu: int | None) -> None:
    """A local job on the CPU: one core and one torch thread (a profile's torch_threads still wins)."""
    if cpu is None:
        return
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)


def run_shard(
    P: Settings, shard: tuple[int, int], out: Path, skip: frozenset, pin_cpu: int | None = None
) -> int:
    """The job of one bench shard: run_bench into its own file, skipping the target's finished cells."""
    _pin(pin_cpu)
    rows = run_bench(
        P,
        out,
        shard,
        progress=False,
        skip=skip,
        log=lambda s: print(s, flush=True),
        on_cell=lambda cell: _cell_written(shard, cell),
    )
    return len(rows)


def _cell_written(shard: tuple[int, int], cell: Cell) -> None:
    """With $ARTIFACT_CELL_SOCKET set (tests only), tell that socket the cell and wait until it answers or
    hangs up."""
    path = os.environ.get(CELL_SOCKET)
    if path:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(f"shard {shard[0]}/{shard[1]}: {cell}\n".encode())
            s.recv(1)  # blocks: a test holds the shard here (e.g. to kill it after a known cell)


def _cells_in(path: Path) -> set[tuple]:
    """Cell keys in a result file (empty while it does not exist yet; it is always replaced whole)."""
    try:
        df = read_rows(path)
    except (FileNotFoundError, ValueError):
        return set()
    return set(cell_keys(df))


# ---------------------------------------------------------------------------------------------
# The bench
# ---------------------------------------------------------------------------------------------
@dataclass
class BenchPlan:
    P: Settings
    target: Path
    n: int
    skip: frozenset  # cells complete in the target
    todo: dict[int, list[Cell]]  # shard -> its cells still to run

    @property
    def files(self) -> list[Path]:
        return [shard_file(self.target, i, self.n) for i in range(self.n)]

    @property
    def pending(self) -> list[int]:
        return [i for i in range(self.n) if self.todo[i]]

    def merge_inputs(self) -> list[Path]:
        return ([self.target] if self.target.is_file() else []) + [f for f in self.files if f.is_file()]

    def merge_command(self) -> str:
        """What joins the shards once the jobs have finished: the target (when it exists) and every shard file
        that has or will have rows."""
        files = [f for i, f in enumerate(self.files) if f.is_file() or self.todo[i]]
        inputs = ([self.target] if self.target.is_file() else []) + files
        args = ["python", "-m", "artifact", "merge", *map(str, inputs), "--out", str(self.target)]
        return shlex.join(args + (["--force"] if self.target.is_file() else []))


def plan_bench(P: Settings, target: Path, n: int) -> BenchPlan:
    """What a submission of n shards into `target` has left to do; refuses files that would collide."""
    if n < 1:
        raise SubmitError(f"--shards must be >= 1, got {n}")
    cells = grid(P)
    in_target = set()
    if target.is_file():
        in_target = finished_cells(read_rows(target))
    others = [
        f
        for f in target.parent.glob(f"{target.stem}.shard-*-of-*.csv")
        if not f.name.endswith(f"-of-{n}.csv")
    ]
    if others:
        raise SubmitError(
            f"{', '.join(map(str, sorted(others)))}: shard files of another shard count; "
            f"merge them into {target} first (python -m artifact merge "
            f"{target.parent}/{target.stem}.shard-*.csv --out {target} --partial) or move them away"
        )
    todo = {}
    for i in range(n):
        mine = shard_cells(cells, (i, n))
        f = shard_file(target, i, n)
        done = finished_cells(read_rows(f)) if f.is_file() else set()
        twice = done & in_target
        if twice:
            raise SubmitError(
                f"{f} holds {len(twice)} cells that {target} already has (left over from an earlier merge?); "
                f"delete {f} or merge by hand"
            )
        todo[i] = [c for c in mine if c.key not in done and c.key not in in_target]
    return BenchPlan(P, target, n, frozenset(in_target), todo)


def submit_bench(
    P: Settings,
    target: Path,
    n: int,
    backend: str,
    wait: bool = True,
    folder: Path | None = None,
    rerun: str = "",
    poll_s: float = POLL_S,
    progress: bool = True,
    log=print,
) -> BenchPlan:
    """Submit the shards that have cells left, then (wait) watch, report failures, merge into the target."""
    plan = plan_bench(P, target, n)
    folder = Path(folder or jobs_dir(P)) / target.stem
    total = sum(len(v) for v in plan.todo.values())
    log(
        f"bench {P.name} -> {target}: {len(grid(P))} cells, {len(plan.skip)} already there, {total} to run "
        f"in {len(plan.pending)} of {n} shards ({backend}; logs in {folder})"
    )
    jobs = []
    if plan.pending:
        args = [(P, (i, n), plan.files[i], plan.skip) for i in plan.pending]
        jobs = submit_jobs(
            backend, P, folder, target.stem, run_shard, args, [f"shard {i}/{n}" for i in plan.pending]
        )
        for i, job in zip(plan.pending, jobs, strict=True):
            log(f"  shard {i}/{n}: job {job.job_id}, {len(plan.todo[i])} cells -> {plan.files[i]}")
    if not wait:
        if jobs:
            log(f"job ids: {' '.join(str(j.job_id) for j in jobs)}")
        log(f"when they have finished, join the shards:\n  {plan.merge_command()}")
        return plan
    if jobs:
        todo_keys = [{c.key for c in plan.todo[i]} for i in plan.pending]
        files = [plan.files[i] for i in plan.pending]

        def finished_cells() -> int:
            return sum(len(_cells_in(f) & keys) for f, keys in zip(files, todo_keys, strict=True))

        failures = wait_jobs(
            jobs,
            [f"shard {i}/{n}" for i in plan.pending],
            finished_cells,
            total,
            "cell",
            f"bench {P.name}",
            poll_s,
            progress,
        )
        for i, keys, job in zip(plan.pending, todo_keys, jobs, strict=True):
            missing = keys - _cells_in(plan.files[i])
            if missing and not any(f.label == f"shard {i}/{n}" for f in failures):
                failures.append(
                    Failure(
                        f"shard {i}/{n}",
                        str(job.job_id),
                        f"finished with {len(missing)} cells missing",
                        job.paths.stderr,
                        job.paths.stdout,
                    )
                )
        if failures:
            raise SubmitError(failure_report(failures, rerun or "the same command", "shards", len(jobs)))
    inputs = plan.merge_inputs()
    shards = [f for f in inputs if f != target]
    if not shards:
        log(f"{target} holds every cell of the grid; nothing to submit")
        return plan
    merge(inputs, target, force=True, log=log)  # the target is one of the inputs: extended, not replaced
    for f in shards:
        f.unlink()  # every row of it is now in the target
    log(f"removed the merged shard files {', '.join(f.name for f in shards)}")
    return plan


# ---------------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------------
def submit_traces(
    P: Settings,
    backend: str,
    jobs: int | None = None,
    wait: bool = True,
    folder: Path | None = None,
    rerun: str = "",
    poll_s: float = POLL_S,
    progress: bool = True,
    log=print,
) -> list[tuple[str, int]]:
    """Record the profile's missing traces: slurm: one job per (task, batch size); local: `jobs` processes
    (default: one per GPU or core) taking the pairs round robin. Returns the pairs that were missing."""
    todo = [j for j in trace_jobs(P) if not trace_current(P, *j)]
    folder = Path(folder or jobs_dir(P)) / "traces"
    log(
        f"traces {P.name}: {len(trace_jobs(P))} (task, batch size) pairs, "
        f"{len(trace_jobs(P)) - len(todo)} current, {len(todo)} to record ({backend}; logs in {folder})"
    )
    if not todo:
        return todo
    if backend == "slurm":
        groups = [[j] for j in todo]
    else:
        width = min(len(todo), jobs or local_capacity(P))
        groups = [todo[k::width] for k in range(width)]
    labels = [", ".join(f"trace {t} b={b}" for t, b in g) for g in groups]
    submitted = submit_jobs(backend, P, folder, "traces", record_traces, [(P, g) for g in groups], labels)
    for label, job in zip(labels, submitted, strict=True):
        log(f"  {label}: job {job.job_id}")
    if not wait:
        log(f"job ids: {' '.join(str(j.job_id) for j in submitted)}")
        return todo
    done = lambda: sum(trace_current(P, *j) for j in todo)  # noqa: E731  (traces now current)
    failures = wait_jobs(submitted, labels, done, len(todo), "trace", f"traces {P.name}", poll_s, progress)
    if failures:
        raise SubmitError(failure_report(failures, rerun or "the same command", "trace jobs", len(submitted)))
    return todo


# ---------------------------------------------------------------------------------------------
# Every heavy stage of the notebooks (./run_all.sh PROFILE --submit ...)
# ---------------------------------------------------------------------------------------------
def bench_stages(P: Settings) -> list[tuple[Settings, Path]]:
    """The grids the notebooks run (04 bench, 03 throttling, 05 TIDE-style), each with the file they read."""
    grids = [
        (P, capacity_sweep.STEM),
        (bandwidth_throttling.throttle_profile(P), bandwidth_throttling.STEM),
        (tide_head_to_head.tide_style_profile(P), tide_head_to_head.STEM),
    ]
    return [(g, harness.bench_file(g, stem)) for g, stem in grids]


def run_jobs(
    P: Settings,
    backend: str,
    shards: int,
    folder: Path | None = None,
    rerun: str = "",
    poll_s: float = POLL_S,
    progress: bool = True,
    log=print,
) -> None:
    """Traces, then each bench grid, as jobs; each waited for (and merged) before the next, so local jobs
    never share a GPU or core."""
    submit_traces(
        P, backend, None if backend == "slurm" else shards, True, folder, rerun, poll_s, progress, log
    )
    for g, target in bench_stages(P):
        n = max(1, min(shards, len(grid(g))))
        submit_bench(g, target, n, backend, True, folder, rerun, poll_s, progress, log)
