"""submitit jobs, whatever they run: the executor of a backend (Slurm job arrays, pinned local processes),
the manifest of a submission (so a second one refuses while its jobs run), waiting with a progress bar, and
the report of failed jobs with their logs. What the jobs are (bench shards, traces) is the package's __init__.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import submitit
import torch
from tqdm.auto import tqdm

from artifact.errors import UserError
from artifact.experiments.bench.model_runner import usable_core_ids, usable_cores
from artifact.experiments.settings import Settings
from artifact.paths import atomic_write_text, repo_root

BACKENDS = ("local", "slurm")
POLL_S = 5.0  # how often --wait looks at the shard files and the jobs
RESULT_GRACE_S = 15  # a cluster's shared file system may show a finished job's result file late
# a local job has no scheduler limit; submitit's default (2 min) would kill it
LOCAL_TIMEOUT_MIN = 7 * 24 * 60


class SubmitError(UserError):
    """A submission that cannot go ahead, or jobs that failed (the message says which and what to do)."""


def jobs_dir(P: Settings) -> Path:
    return repo_root() / "results" / P.name / "jobs"


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
        raise SubmitError(
            f"--submit slurm needs Slurm's commands (srun, sbatch, sacct) on PATH, as on a "
            f"cluster's login node ({e}); on one machine use --submit local"
        ) from None
    try:
        ex.update_parameters(**slurm_parameters(P, count, name))
    except ValueError as e:
        raise SubmitError(f"profile {P.name!r}: submitit refused the slurm parameters: {e}") from None
    return ex


def slurm_parameters(P: Settings, count: int, name: str) -> dict:
    """sbatch parameters (submitit's names) of a `count`-task job array, from the profile's slurm section."""
    s = P.slurm
    params = {
        "job_name": f"artifact-{P.name}-{name}",
        "time": s.time_minutes,
        "cpus_per_task": s.cpus_per_task,
        "array_parallelism": min(count, s.array_parallelism or count),
        # the requeue signal comes this long before the time limit (submitit's 90 s, less for short limits)
        "signal_delay_s": min(90, 15 * s.time_minutes),
    }
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key) is not None:
            params[key] = getattr(s, key)
    if s.gpus_per_task:
        params["gpus_per_task"] = s.gpus_per_task
    if s.mem_gb is not None:
        params["mem"] = f"{max(1, round(s.mem_gb * 1024))}MB"  # sbatch takes whole units
    if s.setup:
        params["setup"] = list(s.setup)
    return params


def local_slots(P: Settings, count: int) -> list[dict]:
    """Per local job: the GPU it sees (cuda profiles) or the core it is pinned to (cpu). One GPU or core each,
    since jobs sharing one would distort each other's timings."""
    if P.device.startswith("cuda"):
        if P.device not in ("cuda", "cuda:0"):
            raise SubmitError(
                f"local jobs choose their GPU themselves (job i sees GPU i as cuda:0); "
                f"set device: cuda, not {P.device!r}"
            )
        gpus = torch.cuda.device_count()
        if count > gpus:
            raise SubmitError(
                f"{count} local jobs need {count} GPUs (one each); this machine has {gpus}: "
                f"pass --shards {max(gpus, 1)} or fewer"
            )
        return [{"gpu": i, "cpu": None} for i in range(count)]
    cores = usable_core_ids()
    if count > len(cores):
        raise SubmitError(
            f"{count} local jobs need {count} CPU cores (one each); this process may use "
            f"{len(cores)}: pass --shards {len(cores)} or fewer"
        )
    return [{"gpu": None, "cpu": cores[i]} for i in range(count)]


def submit_jobs(
    backend: str, P: Settings, folder: Path, name: str, fn, arglists: list[tuple], labels: list[str]
) -> list:
    """One job per argument tuple: a job array on slurm, pinned processes locally. A local job's
    arguments end with its pin_cpu (None on a GPU)."""
    check_not_running(folder)
    ex = make_executor(backend, P, folder / "%j", len(arglists), name)  # one subfolder per job
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
    entries = [
        {"label": lb, "backend": backend, "job_id": str(j.job_id)} for lb, j in zip(labels, jobs, strict=True)
    ]
    atomic_write_text(folder / MANIFEST, json.dumps(entries, indent=1))


def _running(entry: dict) -> bool:
    if entry["backend"] == "local":  # the job id is the pid of submitit's controller process
        try:
            cmd = Path(f"/proc/{int(entry['job_id'])}/cmdline").read_bytes()
        except (OSError, ValueError):
            return False
        return b"submitit.local._local" in cmd
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", entry["job_id"]], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False  # no Slurm here: nothing of it can be running
    return out.returncode == 0 and bool(out.stdout.strip())


def check_not_running(folder: Path) -> None:
    """Refuse while a job of the last submission into this folder still runs: its cells would run twice."""
    path = folder / MANIFEST
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    busy = [
        e for e in entries if isinstance(e, dict) and {"label", "backend", "job_id"} <= set(e) and _running(e)
    ]
    if busy:
        ids = " ".join(e["job_id"] for e in busy)
        stop = f"scancel {ids}" if busy[0]["backend"] == "slurm" else f"kill -INT {ids}"
        which = ", ".join(f"{e['label']}: job {e['job_id']}" for e in busy)
        raise SubmitError(
            f"jobs of the last submission are still running ({which}, recorded in {path}); "
            f"wait for them or stop them ({stop}), then submit again"
        )


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
        return [
            f"{self.label} (job {self.job_id}) failed: {self.error}",
            f"  log: {self.stderr}",
            f"  stdout: {self.stdout}",
        ]


def _last_error_line(err: Exception) -> str:
    """The exception line of a job's traceback (submitit wraps it in a long message)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if "----------------------" in lines:
        body = lines[lines.index("----------------------") + 1 :]
        body = body[: body.index("----------------------")] if "----------------------" in body else body
        if body:
            return body[-1]
    return lines[0] if lines else type(err).__name__


def wait_jobs(
    jobs: list,
    labels: list[str],
    count_done,
    total: int,
    unit: str,
    desc: str,
    poll_s: float = POLL_S,
    progress: bool = True,
) -> list[Failure]:
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
            msg = (
                f"it ended without a result (state {job.state}): killed, cancelled, "
                "out of memory or out of time"
            )
            failures.append(Failure(label, str(job.job_id), msg, job.paths.stderr, job.paths.stdout))
        elif err is not None:
            failures.append(
                Failure(label, str(job.job_id), _last_error_line(err), job.paths.stderr, job.paths.stdout)
            )
    return failures


def _done(job) -> bool:
    """submitit's answer, except that a Slurm job submitit cannot see (sacct fails where accounting is off,
    e.g. a single-node Slurm) is done once squeue no longer lists it, so a killed job is not waited on
    forever."""
    if job.done():
        return True
    if isinstance(job, submitit.SlurmJob) and job.state == "UNKNOWN":
        try:
            out = subprocess.run(
                ["squeue", "-h", "-j", str(job.job_id)], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return (out.returncode == 0 and not out.stdout.strip()) or "Invalid job id" in out.stderr
    return False


def _outcome(job) -> Exception | None:
    """The job's error, None if it succeeded. A job that ended without a result file (killed, timed out)
    is an UncompletedJobError; asked directly, submitit would wait for it as long as sacct cannot say it
    ended."""
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


def local_capacity(P: Settings) -> int:
    """How many local jobs this machine runs side by side: its GPUs (cuda profiles) or cores."""
    if P.device.startswith("cuda"):
        return max(1, torch.cuda.device_count())
    return usable_cores()
