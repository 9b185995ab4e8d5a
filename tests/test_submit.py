"""Sweeps as submitit jobs: local shards reproduce a single-process bench exactly, a slurm submission
writes the job array's sbatch script from the profile (submitted to a stub `sbatch` that records it),
and a shard that dies is reported with its log and completed by resubmitting.

The local tests run the tiny model for real in submitit's LocalExecutor processes."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading

import pytest

from artifact.cli import main as main_for_tests
from artifact.experiments import submit
from artifact.experiments.bench.grid import grid, shard_file
from artifact.experiments.bench.results import read_rows, write_rows
from artifact.experiments.harness import trace_current
from artifact.experiments.paired_table import CELL_KEYS
from artifact.experiments.settings import ProfileError, load_profile, parse_override
from artifact.experiments.submit import jobs as job_machinery

# A reduced cpu grid: one task, batch 1, one prompt, 32 tokens, one repetition of demand and last_step.
SMALL = [
    "tasks=[gsm8k]",
    "batch_sizes=[1]",
    "repetitions=1",
    "gen_length=32",
    "n_prompts=1",
    "warmup=0",
    "policies=[demand,last_step]",
]  # the mechanics of shards and jobs: two policies
EXACT = [
    "demand_hits",
    "demand_misses",
    "speculative_transfers",
    "prefetch_hits",
    "wasted_prefetches",
    "bytes_h2d",
    "tokens",
    "tokens_sha",
    "working_set",
    "cache_experts",
]
RUN_KEY = list(CELL_KEYS) + ["policy", "arm", "rep"]  # arm: the A/A pair runs demand twice


def sets(*extra: str) -> list[str]:
    return [a for s in SMALL + list(extra) for a in ("--set", s)]


def profile(*extra: str):
    return load_profile("cpu", dict(parse_override(s) for s in SMALL + list(extra)))


def quiet(*a, **k):
    pass


def two_cores():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPU cores for 2 local shards (one core each); this process may use 1")


@pytest.mark.slow
def test_local_shards_equal_a_single_process_run(tmp_path, capsys):
    two_cores()
    grid_sets = sets("cache_ratios=[0.83, 1.3]")
    single = tmp_path / "single.csv"
    assert main_for_tests(["bench", "--profile", "cpu", *grid_sets, "--out", str(single), "--quiet"]) == 0
    target = tmp_path / "sharded" / "bench.csv"
    rc = main_for_tests(
        [
            "bench",
            "--profile",
            "cpu",
            *grid_sets,
            "--out",
            str(target),
            "--submit",
            "local",
            "--shards",
            "2",
            "--wait",
            "--jobs-dir",
            str(tmp_path / "jobs"),
            "--poll-seconds",
            "0.5",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "shard 0/2: job" in err and "shard 1/2: job" in err
    a, b = read_rows(single), read_rows(target)
    assert not b.duplicated(RUN_KEY).any()
    cells = lambda df: sorted(set(map(tuple, df[list(CELL_KEYS)].astype(str).values)))  # noqa: E731
    assert (
        cells(a) == cells(b) and len(cells(b)) == 2 and len(a) == len(b) == 6
    )  # 2 cells x (demand A, B, last_step)
    a, b = a.set_index(RUN_KEY).sort_index(), b.set_index(RUN_KEY).sort_index()
    assert (a[EXACT] == b[EXACT]).all().all(), "sharded runs must count exactly what a single process counts"
    assert not list(target.parent.glob("*.shard-*.csv")), "merged shard files are removed"
    logs = sorted((tmp_path / "jobs" / "bench").glob("*/*_log.out"))
    assert len(logs) == 2 and all("bench cpu: shard" in p.read_text() for p in logs)


WAIT_S = 600  # a failure guard only: an event that never comes fails the test instead of hanging it


@contextlib.contextmanager
def cell_events(monkeypatch, on_event):
    """Shard jobs submitted inside tell each cell they wrote to a Unix socket and wait for its answer
    (submit._cell_written): on_event(line) runs for each, in a thread; True lets the shard go on, False holds
    it until the block ends. on_event's errors are raised at the end (and the shard is let go)."""
    folder = tempfile.mkdtemp(prefix="cells-")  # short: a Unix socket's path has at most 107 bytes
    path = os.path.join(folder, "socket")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    held, errors = [], []

    def serve():
        while True:
            conn, _ = server.accept()  # blocks until a shard (or the end below) connects
            conn.settimeout(WAIT_S)
            try:
                event = conn.makefile().readline()
                if event == "end\n":
                    conn.close()
                    return
                go = on_event(event)
            except BaseException as e:  # raised below; the shard must not wait forever
                errors.append(e)
                go = True
            if go:
                conn.close()  # the shard's recv returns: it goes on
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv(submit.CELL_SOCKET, path)  # submitit's local jobs inherit this environment
    try:
        yield
    finally:
        monkeypatch.delenv(submit.CELL_SOCKET)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b"end\n")
        thread.join(WAIT_S)
        for conn in held:
            conn.close()
        server.close()
        shutil.rmtree(folder)
        if errors:
            raise errors[0]


@pytest.mark.slow
def test_a_killed_shard_is_reported_and_resubmitting_completes_the_file(tmp_path, monkeypatch):
    two_cores()
    P = profile("cache_ratios=[0.5, 0.9, 1.3, 1.7]")  # 4 cells: 2 per shard
    target, jobs = tmp_path / "bench.csv", tmp_path / "jobs"
    shard1 = shard_file(target, 1, 2)
    lines: list[str] = []
    refused: list[str] = []
    cells_at_kill: list[int] = []
    unstopped: list[int] = []
    guards: list[threading.Timer] = []
    submitted = threading.Event()  # the submission has logged shard 1's job id

    def log(line: str) -> None:
        lines.append(line)
        if "shard 1/2: job" in line:
            submitted.set()

    def kill_shard_1_after_its_first_cell(event: str) -> bool:
        if not event.startswith("shard 1/2:"):
            return True  # shard 0 goes on
        assert submitted.wait(WAIT_S), f"no job id of shard 1 logged in {WAIT_S} s: {lines}"
        cells_at_kill.append(len(submit._cells_in(shard1)))
        try:  # a second submission while the jobs run is refused
            job_machinery.check_not_running(jobs / "bench")
        except submit.SubmitError as e:
            refused.append(str(e))
        job = int(re.search(r"shard 1/2: job (\d+)", "\n".join(lines)).group(1))
        os.kill(job, signal.SIGINT)  # the local job's controller: what job.cancel() sends
        guard = threading.Timer(WAIT_S, lambda: unstopped.append(job) or os.kill(job, signal.SIGKILL))
        guard.daemon = True  # a failure guard: a controller that outlives SIGINT
        guard.start()  # by WAIT_S is killed, and the test fails below
        guards.append(guard)
        return False  # held: shard 1 dies before its second cell

    # The jobs inherit this process's SIGINT disposition: under a shell that started the tests in the
    # background it
    # is "ignored", and a job controller that ignores SIGINT never stops. Python's handler resets to the
    # default on
    # exec, so the jobs start with SIGINT live wherever the tests run.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with (
            cell_events(monkeypatch, kill_shard_1_after_its_first_cell),
            pytest.raises(submit.SubmitError) as e,
        ):
            submit.submit_bench(
                P, target, 2, "local", folder=jobs, rerun="RERUN-COMMAND", poll_s=0.2, progress=False, log=log
            )
    finally:
        signal.signal(signal.SIGINT, before)
    for g in guards:
        g.cancel()
    assert not unstopped, f"SIGINT did not stop shard 1's job controller {unstopped} in {WAIT_S} s"
    assert cells_at_kill == [1], "shard 1 was stopped right after writing its first cell"
    assert refused and "still running" in refused[0] and "shard 1/2: job" in refused[0]
    report = str(e.value)
    assert "1 of 2 shards failed" in report and "shard 1/2 (job" in report and "shard 0/2" not in report
    log = re.search(r"log: (\S+)", report).group(1)
    assert log.endswith("_log.err") and os.path.isfile(log) and str(jobs) in log
    assert "RERUN-COMMAND" in report
    kept = read_rows(shard1)
    assert kept.groupby(list(CELL_KEYS)).ngroups == 1, "the shard died part way, keeping whole cells"
    assert not target.exists(), "nothing is merged while a shard is missing"

    lines.clear()
    submit.submit_bench(P, target, 2, "local", folder=jobs, poll_s=0.2, progress=False, log=lines.append)
    assert any("in 1 of 2 shards" in ln for ln in lines), lines  # only the unfinished shard is resubmitted
    done = read_rows(target)
    assert (
        done.groupby(list(CELL_KEYS)).ngroups == 4 and len(done) == 12 and not done.duplicated(RUN_KEY).any()
    )
    first = done.merge(kept, on=RUN_KEY, suffixes=("", "_kept"))
    assert len(first) == len(kept) and (first.seconds == first.seconds_kept).all(), (
        "finished cells were not rerun"
    )

    # A target with a cell missing: a new submission runs that cell only and never repeats the others.
    drop = grid(P)[3].key
    keep = done[[tuple(r) != drop for r in done[list(CELL_KEYS)].itertuples(index=False)]]
    write_rows(target, keep.to_dict("records"))
    plan = submit.plan_bench(P, target, 2)
    assert [c.key for i in plan.pending for c in plan.todo[i]] == [drop] and len(plan.skip) == 3
    submit.submit_bench(P, target, 2, "local", folder=jobs, poll_s=0.2, progress=False, log=quiet)
    again = read_rows(target)
    assert again.groupby(list(CELL_KEYS)).ngroups == 4 and not again.duplicated(RUN_KEY).any()
    same = again.merge(keep, on=RUN_KEY, suffixes=("", "_old"))
    assert len(same) == len(keep) and (same.seconds == same.seconds_old).all()


# ---------------------------------------------------------------------------------------------
# Slurm, without a cluster: stub commands on PATH; submitit writes the real sbatch script
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """`sbatch` records the script it is given and answers like Slurm; `srun` only has to exist."""
    bin_dir, record = tmp_path / "bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    record.mkdir()
    scripts = {
        "sbatch": f'#!/bin/sh\nn=$(ls "{record}" | wc -l)\ncp "$1" "{record}/call-$n.sh"\n'
        'echo "Submitted batch job 4242"\n',
        "srun": "#!/bin/sh\nexit 1\n",
        "sacct": "#!/bin/sh\nexit 0\n",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def test_slurm_array_from_the_profile(tmp_path, fake_slurm, capsys):
    target = tmp_path / "bench.csv"
    args = [
        "bench",
        "--profile",
        "h200",
        "--model",
        str(tmp_path / "ckpt"),
        "--out",
        str(target),
        "--set",
        "slurm.partition=gpu",
        "--set",
        "slurm.account=lab",
        "--set",
        "slurm.time_minutes=90",
        "--set",
        "slurm.cpus_per_task=8",
        "--set",
        "slurm.mem_gb=64",
        "--set",
        "slurm.array_parallelism=2",
        "--set",
        "slurm.setup=['module load cuda']",
        "--submit",
        "slurm",
        "--shards",
        "3",
        "--jobs-dir",
        str(tmp_path / "jobs"),
    ]
    assert main_for_tests(args) == 0, capsys.readouterr().err
    calls = sorted(fake_slurm.iterdir())
    assert len(calls) == 1, "one job array for all shards"
    script = calls[0].read_text()
    flags = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, re.M))
    assert flags["array"] == "0-2%2"
    assert (flags["partition"], flags["account"], flags["time"]) == ("gpu", "lab", "90")
    assert (flags["gpus-per-task"], flags["cpus-per-task"], flags["mem"]) == ("1", "8", "65536MB")
    assert flags["job-name"] == "artifact-h200-bench"
    assert flags["output"].startswith(str(tmp_path / "jobs" / "bench")) and flags["output"].endswith(
        "_log.out"
    )
    assert "module load cuda" in script and "-m submitit.core._submit" in script
    err = capsys.readouterr().err
    assert "job ids: 4242_0 4242_1 4242_2" in err
    merge = re.search(r"python -m artifact merge .*", err).group(0)
    assert (
        "bench.shard-0-of-3.csv" in merge and "bench.shard-2-of-3.csv" in merge and f"--out {target}" in merge
    )
    pickles = sorted((tmp_path / "jobs" / "bench").glob("4242_*/*_submitted.pkl"))
    assert len(pickles) == 3


def test_slurm_parameters_follow_the_profile_and_submitit_checks_them(tmp_path, fake_slurm):
    P = load_profile("cpu", {"slurm.partition": "short"})
    params = job_machinery.slurm_parameters(P, 5, "bench")
    assert params["partition"] == "short" and "gpus_per_task" not in params  # cpu.yaml: gpus_per_task 0
    assert (params["cpus_per_task"], params["time"], params["array_parallelism"]) == (1, 30, 5)
    ex = job_machinery.make_executor("slurm", P, tmp_path / "jobs", 5, "bench")
    assert ex.parameters["partition"] == "short"
    with pytest.raises(ValueError, match="Unavailable parameter"):  # submitit's own check of sbatch keys
        ex.update_parameters(partitoin="x")


def test_slurm_needs_slurm_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(submit.SubmitError, match="needs Slurm's commands"):
        job_machinery.make_executor("slurm", load_profile("cpu"), tmp_path, 1, "bench")


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("slurm.partion=x", r"unknown key 'slurm.partion' \(did you mean 'partition'\?\)"),
        ("slurm.time_minutes=0", r"slurm.time_minutes must be >= 1"),
        ("slurm.gpus_per_task=1.5", r"slurm.gpus_per_task must be an integer"),
        ("slurm.mem_gb=-2", r"slurm.mem_gb must be a finite number > 0"),
        ("slurm.partition=a b", r"slurm.partition must be a name without spaces"),
        ("slurm.setup=module load x", r"slurm.setup must be a list of shell lines"),
        ("slurm=4", r"slurm must be a mapping"),
    ],
)
def test_slurm_keys_are_validated(text, pattern):
    with pytest.raises(ProfileError, match=pattern):
        k, v = parse_override(text)
        load_profile("cpu", {k: v})


def test_slurm_section_layers_key_by_key(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("slurm:\n  partition: a100\n")
    P = load_profile(path, {"slurm.account": "lab"})
    # base keeps the rest
    assert (P.slurm.partition, P.slurm.account, P.slurm.time_minutes) == ("a100", "lab", 240)
    bad = tmp_path / "bad.yaml"
    bad.write_text("slurm:\n  gpus: 2\n")
    with pytest.raises(ProfileError, match=r"bad.yaml: unknown key slurm.gpus; slurm keys: partition"):
        load_profile(bad)


def test_submission_refuses_clashing_files(tmp_path):
    P = profile("cache_ratios=[0.83, 1.3]")
    target = tmp_path / "bench.csv"
    stray = shard_file(target, 0, 3)
    stray.write_text("x")
    with pytest.raises(submit.SubmitError, match="shard files of another shard count"):
        submit.plan_bench(P, target, 2)
    with pytest.raises(submit.SubmitError, match="--shards must be >= 1"):
        submit.plan_bench(P, target, 0)


def test_cli_flag_combinations(capsys):
    assert main_for_tests(["bench", "--profile", "cpu", "--shards", "2"]) == 2
    assert "go with --submit" in capsys.readouterr().err
    assert (
        main_for_tests(["bench", "--profile", "cpu", "--submit", "local", "--shards", "2", "--shard", "0/2"])
        == 2
    )
    assert "without --shard" in capsys.readouterr().err


def test_local_jobs_get_one_core_each():
    P = load_profile("cpu")
    cores = sorted(os.sched_getaffinity(0))
    slots = job_machinery.local_slots(P, len(cores))
    assert [s["cpu"] for s in slots] == cores and all(s["gpu"] is None for s in slots)
    with pytest.raises(submit.SubmitError, match=f"need {len(cores) + 1} CPU cores"):
        job_machinery.local_slots(P, len(cores) + 1)


def test_trace_progress_counts_only_the_traces_now_current(tmp_path, monkeypatch):
    P = profile("trace_tasks=[gsm8k, mbpp]", "trace_batch_sizes=[1, 2]")
    current = set()  # nothing recorded yet: 4 to record
    monkeypatch.setattr(submit, "trace_current", lambda P, task, b: (task, b) in current)
    monkeypatch.setattr(
        submit, "submit_jobs", lambda *a: [type("Job", (), {"job_id": i})() for i in range(len(a[5]))]
    )
    seen = []

    def wait(jobs, labels, count_done, total, *a):
        seen.append((count_done(), total))
        current.add(("mbpp", 2))  # one job finishes its trace
        seen.append((count_done(), total))
        return []

    monkeypatch.setattr(submit, "wait_jobs", wait)
    submit.submit_traces(P, "local", jobs=1, folder=tmp_path, progress=False, log=quiet)
    assert seen == [(0, 4), (1, 4)]


@pytest.mark.slow
def test_trace_all_records_what_is_missing_as_local_jobs(tmp_path, monkeypatch, capsys):
    import shutil

    from artifact.experiments import harness
    from artifact.offload.replay.trace import Trace, mean_working_set
    from artifact.paths import data_dir

    data = tmp_path / "data"
    shutil.copytree(data_dir() / "tasks", data / "tasks")
    monkeypatch.setenv("ARTIFACT_DATA", str(data))  # the job processes inherit it
    args = [
        "trace-all",
        "--profile",
        "cpu",
        "--set",
        "trace_tasks=[gsm8k, mbpp]",
        "--set",
        "trace_batch_sizes=[1]",
        "--set",
        "trace_n_prompts=1",
        "--set",
        "gen_length=32",
        "--submit",
        "local",
        "--wait",
        "--jobs-dir",
        str(tmp_path / "jobs"),
        "--poll-seconds",
        "0.5",
        "--quiet",
    ]
    assert main_for_tests(args) == 0, capsys.readouterr().err
    assert "2 to record" in capsys.readouterr().err
    P = load_profile(
        "cpu",
        {"trace_tasks": ["gsm8k", "mbpp"], "trace_batch_sizes": [1], "trace_n_prompts": 1, "gen_length": 32},
    )
    assert all(trace_current(P, t, 1) for t in ("gsm8k", "mbpp"))
    recorded = Trace.load(harness.trace_path(P, "mbpp", 1))
    here = harness.record_trace(P, "mbpp", 1)  # the same trace, recorded in this process
    assert len(recorded) == len(here) and mean_working_set(recorded) == mean_working_set(here)
    assert main_for_tests(args) == 0
    assert "2 current, 0 to record" in capsys.readouterr().err


def test_local_jobs_get_one_gpu_each_on_a_cuda_profile():
    import torch

    P = load_profile("a5000", {"model": "/ckpt"})  # device: cuda
    gpus = torch.cuda.device_count()
    if gpus:
        assert [s["gpu"] for s in job_machinery.local_slots(P, gpus)] == list(range(gpus))
    with pytest.raises(submit.SubmitError, match=f"{gpus + 1} local jobs need {gpus + 1} GPUs .* has {gpus}"):
        job_machinery.local_slots(P, gpus + 1)
    with pytest.raises(submit.SubmitError, match="set device: cuda, not 'cuda:1'"):
        job_machinery.local_slots(load_profile("a5000", {"model": "/ckpt", "device": "cuda:1"}), 1)
