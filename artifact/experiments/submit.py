"""Sweeps that outgrow one process: the bench's shards and the profile's traces as jobs, through submitit.

    python -m artifact bench --profile h200 --model DIR --submit slurm --shards 8 --wait
    python -m artifact trace-all --profile h200 --model DIR --submit slurm --wait
    python -m artifact run-jobs --profile h200 --model DIR --submit slurm     # what ./run_all.sh --submit runs

A bench submission runs shard i of n (`bench --shard i/n`) as one job writing its own file
<target>.shard-I-of-N.csv beside the target (data/results/<profile>/bench.csv by default).
- `slurm`: one job array, one task per shard; partition, account, time, GPUs, CPUs and memory come from the
  profile's `slurm:` section, and submitit checks the assembled sbatch parameters before anything is submitted.
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

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import submitit
import torch
from tqdm.auto import tqdm

from artifact.errors import UserError
from artifact.experiments import harness
from artifact.experiments.bench import run_bench
from artifact.experiments.bench.grid import Cell, cell_keys, grid, shard_cells, shard_file
from artifact.experiments.bench.model_runner import usable_core_ids, usable_cores
from artifact.experiments.bench.results import finished_cells, merge, read_rows
from artifact.experiments.harness import trace_current, trace_jobs
from artifact.experiments.settings import Settings
from artifact.experiments.studies import bandwidth_throttling, capacity_sweep, tide_head_to_head
from artifact.paths import atomic_write_text, repo_root

BACKENDS = ("local", "slurm")
POLL_S = 5.0                       # how often --wait looks at the shard files and the jobs
RESULT_GRACE_S = 15               # a cluster's shared file system may show a finished job's result file late
LOCAL_TIMEOUT_MIN = 7 * 24 * 60    # a local job has no scheduler limit; submitit's default (2 min) would kill it
CELL_SOCKET = "ARTIFACT_CELL_SOCKET"  # tests: a Unix socket told of each cell a shard job wrote (see _cell_written)


class SubmitError(UserError):
    """A submission that cannot go ahead, or jobs that failed (the message says which and what to do)."""


def jobs_dir(P: Settings) -> Path:
    return repo_root() / "results" / P.name / "jobs"


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
        harness.traces(_one_trace(P, task, b), progress=False)      # records only what is missing
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


def run_shard(P: Settings, shard: tuple[int, int], out: Path, skip: frozenset, pin_cpu: int | None = None) -> int:
    """The job of one bench shard: run_bench into its own file, skipping the target's finished cells."""
    _pin(pin_cpu)
    rows = run_bench(P, out, shard, progress=False, skip=skip, log=lambda s: print(s, flush=True),
                     on_cell=lambda cell: _cell_written(shard, cell))
    return len(rows)


def _cell_written(shard: tuple[int, int], cell: Cell) -> None:
    """With $ARTIFACT_CELL_SOCKET set (tests only), tell that socket the cell and wait until it answers or hangs up."""
    path = os.environ.get(CELL_SOCKET)
    if path:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(f"shard {shard[0]}/{shard[1]}: {cell}\n".encode())
            s.recv(1)                  # blocks: a test holds the shard here (e.g. to kill it after a known cell)


class Resumable(submitit.helpers.Checkpointable):
    """A job that Slurm may stop early (time limit, preemption): submitit requeues it (at most 3 times, with
    the same arguments) and, since shards and traces keep their finished work, it resumes where it stopped."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


def make_executor(backend: str, P: Settings, folder: Path, count: int, name: str):
    """A submitit executor for `count` jobs, its parameters checked by submitit."""
    if backend == "local":
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN)
        return ex
    if backend != "slurm":
        raise SubmitError(f"--submit must be one of {BACKENDS}, got {backend!r}")
    try:
        ex = submitit.SlurmExecutor(folder=folder)
    except RuntimeError as e:
        raise SubmitError(f"--submit slurm needs Slurm's commands (srun, sbatch, sacct) on PATH, as on a "
                          f"cluster's login node ({e}); on one machine use --submit local") from None
    try:
        ex.update_parameters(**slurm_parameters(P, count, name))
    except ValueError as e:
        raise SubmitError(f"profile {P.name!r}: submitit refused the slurm parameters: {e}") from None
    return ex


def slurm_parameters(P: Settings, count: int, name: str) -> dict:
    """sbatch parameters (submitit's names) of a `count`-task job array, from the profile's slurm section."""
    s = P.slurm
    params = {"job_name": f"artifact-{P.name}-{name}", "time": s.time_minutes, "cpus_per_task": s.cpus_per_task,
              "array_parallelism": min(count, s.array_parallelism or count),
              # the requeue signal comes this long before the time limit (submitit's 90 s, less for short limits)
              "signal_delay_s": min(90, 15 * s.time_minutes)}
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key) is not None:
            params[key] = getattr(s, key)
    if s.gpus_per_task:
        params["gpus_per_task"] = s.gpus_per_task
    if s.mem_gb is not None:
        params["mem"] = f"{max(1, round(s.mem_gb * 1024))}MB"        # sbatch takes whole units
    if s.setup:
        params["setup"] = list(s.setup)
    return params


def local_slots(P: Settings, count: int) -> list[dict]:
    """Per local job: the GPU it sees (cuda profiles) or the core it is pinned to (cpu). One GPU or core each,
    since jobs sharing one would distort each other's timings."""
    if P.device.startswith("cuda"):
        if P.device not in ("cuda", "cuda:0"):
            raise SubmitError(f"local jobs choose their GPU themselves (job i sees GPU i as cuda:0); "
                              f"set device: cuda, not {P.device!r}")
        gpus = torch.cuda.device_count()
        if count > gpus:
            raise SubmitError(f"{count} local jobs need {count} GPUs (one each); this machine has {gpus}: "
                              f"pass --shards {max(gpus, 1)} or fewer")
        return [{"gpu": i, "cpu": None} for i in range(count)]
    cores = usable_core_ids()
    if count > len(cores):
        raise SubmitError(f"{count} local jobs need {count} CPU cores (one each); this process may use "
                          f"{len(cores)}: pass --shards {len(cores)} or fewer")
    return [{"gpu": None, "cpu": cores[i]} for i in range(count)]


def _submit(backend: str, P: Settings, folder: Path, name: str, fn, arglists: list[tuple], labels: list[str]) -> list:
    """One job per argument tuple: a job array on slurm, pinned processes locally. A local job's
    arguments end with its pin_cpu (None on a GPU)."""
    check_not_running(folder)
    ex = make_executor(backend, P, folder / "%j", len(arglists), name)      # one subfolder per job
    if backend == "slurm":
        with ex.batch():
            jobs = [ex.submit(Resumable(fn), *args, None) for args in arglists]
    else:
        jobs = []
        for args, slot in zip(arglists, local_slots(P, len(arglists)), strict=True):
            gpus = [slot["gpu"]] if slot["gpu"] is not None else []
            ex.update_parameters(gpus_per_node=len(gpus), visible_gpus=gpus)
            jobs.append(ex.submit(Resumable(fn), *args, slot["cpu"]))
    _record(folder, backend, labels, jobs)
    return jobs


# ---------------------------------------------------------------------------------------------
# Jobs still running from an earlier submission (a second submission must not run their cells again)
# ---------------------------------------------------------------------------------------------
MANIFEST = "submitted.json"


def _record(folder: Path, backend: str, labels: list[str], jobs: list) -> None:
    entries = [{"label": lb, "backend": backend, "job_id": str(j.job_id)} for lb, j in zip(labels, jobs, strict=True)]
    atomic_write_text(folder / MANIFEST, json.dumps(entries, indent=1))


def _running(entry: dict) -> bool:
    if entry["backend"] == "local":               # the job id is the pid of submitit's controller process
        try:
            cmd = Path(f"/proc/{int(entry['job_id'])}/cmdline").read_bytes()
        except (OSError, ValueError):
            return False
        return b"submitit.local._local" in cmd
    try:
        out = subprocess.run(["squeue", "-h", "-j", entry["job_id"]], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False                              # no Slurm here: nothing of it can be running
    return out.returncode == 0 and bool(out.stdout.strip())


def check_not_running(folder: Path) -> None:
    """Refuse while a job of the last submission into this folder still runs: its cells would run twice."""
    path = folder / MANIFEST
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    busy = [e for e in entries if isinstance(e, dict) and {"label", "backend", "job_id"} <= set(e) and _running(e)]
    if busy:
        ids = " ".join(e["job_id"] for e in busy)
        stop = f"scancel {ids}" if busy[0]["backend"] == "slurm" else f"kill -INT {ids}"
        which = ", ".join(f"{e['label']}: job {e['job_id']}" for e in busy)
        raise SubmitError(f"jobs of the last submission are still running ({which}, recorded in {path}); "
                          f"wait for them or stop them ({stop}), then submit again")


# ---------------------------------------------------------------------------------------------
# Waiting and reporting
# ---------------------------------------------------------------------------------------------
@dataclass
class Failure:
    label: str
    job_id: str
    error: str
    stderr: Path
    stdout: Path

    def lines(self) -> list[str]:
        return [f"{self.label} (job {self.job_id}) failed: {self.error}",
                f"  log: {self.stderr}", f"  stdout: {self.stdout}"]


def _last_error_line(err: Exception) -> str:
    """The exception line of a job's traceback (submitit wraps it in a long message)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if "----------------------" in lines:
        body = lines[lines.index("----------------------") + 1:]
        body = body[:body.index("----------------------")] if "----------------------" in body else body
        if body:
            return body[-1]
    return lines[0] if lines else type(err).__name__


def wait_jobs(jobs: list, labels: list[str], count_done, total: int, unit: str, desc: str, poll_s: float = POLL_S,
              progress: bool = True) -> list[Failure]:
    """Wait for every job, a tqdm bar over count_done() (finished cells or traces); the failed jobs."""
    bar = tqdm(total=total, unit=unit, desc=desc, disable=not progress, file=sys.stderr)
    try:
        while True:
            finished = all(_done(j) for j in jobs)
            bar.update(max(0, count_done() - bar.n))
            if finished:
                break
            time.sleep(poll_s)
    finally:
        bar.close()
    failures = []
    for label, job in zip(labels, jobs, strict=True):
        err = _outcome(job)
        if isinstance(err, submitit.core.utils.UncompletedJobError):
            msg = f"it ended without a result (state {job.state}): killed, cancelled, out of memory or out of time"
            failures.append(Failure(label, str(job.job_id), msg, job.paths.stderr, job.paths.stdout))
        elif err is not None:
            failures.append(Failure(label, str(job.job_id), _last_error_line(err), job.paths.stderr, job.paths.stdout))
    return failures


def _done(job) -> bool:
    """submitit's answer, except that a Slurm job submitit cannot see (sacct fails where accounting is off,
    e.g. a single-node Slurm) is done once squeue no longer lists it, so a killed job is not waited on forever."""
    if job.done():
        return True
    if isinstance(job, submitit.SlurmJob) and job.state == "UNKNOWN":
        try:
            out = subprocess.run(["squeue", "-h", "-j", str(job.job_id)], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return (out.returncode == 0 and not out.stdout.strip()) or "Invalid job id" in out.stderr
    return False


def _outcome(job) -> Exception | None:
    """The job's error, None if it succeeded. A job that ended without a result file (killed, timed out)
    is an UncompletedJobError; asked directly, submitit would wait for it as long as sacct cannot say it ended."""
    grace = 0 if isinstance(job, submitit.LocalJob) else RESULT_GRACE_S
    deadline = time.time() + grace
    while not job.paths.result_pickle.exists() and time.time() < deadline:
        time.sleep(1)
    if not job.paths.result_pickle.exists():
        return submitit.core.utils.UncompletedJobError(f"job {job.job_id} ended without a result")
    return job.exception()


def failure_report(failures: list[Failure], rerun: str, what: str, total: int) -> str:
    lines = [f"{len(failures)} of {total} {what} failed:"]
    for f in failures:
        lines += f.lines()
    lines += ["resubmit them (finished work is kept and each job resumes where it stopped):", f"  {rerun}"]
    return "\n".join(lines)


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
    skip: frozenset                      # cells complete in the target
    todo: dict[int, list[Cell]]          # shard -> its cells still to run

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
    others = [f for f in target.parent.glob(f"{target.stem}.shard-*-of-*.csv")
              if not f.name.endswith(f"-of-{n}.csv")]
    if others:
        raise SubmitError(f"{', '.join(map(str, sorted(others)))}: shard files of another shard count; merge them "
                          f"into {target} first (python -m artifact merge {target.parent}/{target.stem}.shard-*.csv "
                          f"--out {target} --partial) or move them away")
    todo = {}
    for i in range(n):
        mine = shard_cells(cells, (i, n))
        f = shard_file(target, i, n)
        done = finished_cells(read_rows(f)) if f.is_file() else set()
        twice = done & in_target
        if twice:
            raise SubmitError(f"{f} holds {len(twice)} cells that {target} already has (left over from an earlier "
                              f"merge?); delete {f} or merge by hand")
        todo[i] = [c for c in mine if c.key not in done and c.key not in in_target]
    return BenchPlan(P, target, n, frozenset(in_target), todo)


def submit_bench(P: Settings, target: Path, n: int, backend: str, wait: bool = True, folder: Path | None = None,
                 rerun: str = "", poll_s: float = POLL_S, progress: bool = True, log=print) -> BenchPlan:
    """Submit the shards that have cells left, then (wait) watch, report failures, merge into the target."""
    plan = plan_bench(P, target, n)
    folder = Path(folder or jobs_dir(P)) / target.stem
    total = sum(len(v) for v in plan.todo.values())
    log(f"bench {P.name} -> {target}: {len(grid(P))} cells, {len(plan.skip)} already there, {total} to run "
        f"in {len(plan.pending)} of {n} shards ({backend}; logs in {folder})")
    jobs = []
    if plan.pending:
        args = [(P, (i, n), plan.files[i], plan.skip) for i in plan.pending]
        jobs = _submit(backend, P, folder, target.stem, run_shard, args, [f"shard {i}/{n}" for i in plan.pending])
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

        failures = wait_jobs(jobs, [f"shard {i}/{n}" for i in plan.pending], finished_cells, total, "cell",
                             f"bench {P.name}", poll_s, progress)
        for i, keys, job in zip(plan.pending, todo_keys, jobs, strict=True):
            missing = keys - _cells_in(plan.files[i])
            if missing and not any(f.label == f"shard {i}/{n}" for f in failures):
                failures.append(Failure(f"shard {i}/{n}", str(job.job_id), f"finished with {len(missing)} cells "
                                        "missing", job.paths.stderr, job.paths.stdout))
        if failures:
            raise SubmitError(failure_report(failures, rerun or "the same command", "shards", len(jobs)))
    inputs = plan.merge_inputs()
    shards = [f for f in inputs if f != target]
    if not shards:
        log(f"{target} holds every cell of the grid; nothing to submit")
        return plan
    merge(inputs, target, force=True, log=log)        # the target is one of the inputs: extended, not replaced
    for f in shards:
        f.unlink()                                    # every row of it is now in the target
    log(f"removed the merged shard files {', '.join(f.name for f in shards)}")
    return plan


# ---------------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------------
def submit_traces(P: Settings, backend: str, jobs: int | None = None, wait: bool = True, folder: Path | None = None,
                  rerun: str = "", poll_s: float = POLL_S, progress: bool = True, log=print) -> list[tuple[str, int]]:
    """Record the profile's missing traces: slurm: one job per (task, batch size); local: `jobs` processes
    (default: one per GPU or core) taking the pairs round robin. Returns the pairs that were missing."""
    todo = [j for j in trace_jobs(P) if not trace_current(P, *j)]
    folder = Path(folder or jobs_dir(P)) / "traces"
    log(f"traces {P.name}: {len(trace_jobs(P))} (task, batch size) pairs, {len(trace_jobs(P)) - len(todo)} current, "
        f"{len(todo)} to record ({backend}; logs in {folder})")
    if not todo:
        return todo
    if backend == "slurm":
        groups = [[j] for j in todo]
    else:
        width = min(len(todo), jobs or local_capacity(P))
        groups = [todo[k::width] for k in range(width)]
    labels = [", ".join(f"trace {t} b={b}" for t, b in g) for g in groups]
    submitted = _submit(backend, P, folder, "traces", record_traces, [(P, g) for g in groups], labels)
    for label, job in zip(labels, submitted, strict=True):
        log(f"  {label}: job {job.job_id}")
    if not wait:
        log(f"job ids: {' '.join(str(j.job_id) for j in submitted)}")
        return todo
    done = lambda: sum(trace_current(P, *j) for j in todo)     # noqa: E731  (traces now current)
    failures = wait_jobs(submitted, labels, done, len(todo), "trace", f"traces {P.name}", poll_s, progress)
    if failures:
        raise SubmitError(failure_report(failures, rerun or "the same command", "trace jobs", len(submitted)))
    return todo


def local_capacity(P: Settings) -> int:
    """How many local jobs this machine runs side by side: its GPUs (cuda profiles) or cores."""
    if P.device.startswith("cuda"):
        return max(1, torch.cuda.device_count())
    return usable_cores()


# ---------------------------------------------------------------------------------------------
# Every heavy stage of the notebooks (./run_all.sh PROFILE --submit ...)
# ---------------------------------------------------------------------------------------------
def bench_stages(P: Settings) -> list[tuple[Settings, Path]]:
    """The grids the notebooks run (04 bench, 03 throttling, 05 TIDE-style), each with the file they read."""
    grids = [(P, capacity_sweep.STEM), (bandwidth_throttling.throttle_profile(P), bandwidth_throttling.STEM),
             (tide_head_to_head.tide_style_profile(P), tide_head_to_head.STEM)]
    return [(g, harness.bench_file(g, stem)) for g, stem in grids]


def run_jobs(P: Settings, backend: str, shards: int, folder: Path | None = None, rerun: str = "",
             poll_s: float = POLL_S, progress: bool = True, log=print) -> None:
    """Traces, then each bench grid, as jobs; each waited for (and merged) before the next, so local jobs
    never share a GPU or core."""
    submit_traces(P, backend, None if backend == "slurm" else shards, True, folder, rerun, poll_s, progress, log)
    for g, target in bench_stages(P):
        n = max(1, min(shards, len(grid(g))))
        submit_bench(g, target, n, backend, True, folder, rerun, poll_s, progress, log)
