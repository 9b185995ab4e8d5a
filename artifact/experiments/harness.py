"""What the claim modules run on: the profile with a notebook's overrides, its model (loaded once per
process), routing traces (recorded once per (task, batch size) and reused), and benchmark grids (one
resumable CSV per grid that never mixes settings).

    P = setup("cpu", {"gen_length": 64})          # a notebook's `profile` and `overrides`
    ts = traces(P)                                # 01, 02
    rows = run_grid(P, "bench")                   # 03, 04, 05
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from artifact.experiments.bench import run_bench
from artifact.experiments.bench.grid import cell_keys, grid
from artifact.experiments.bench.results import bench_fingerprint, has_aa_pair, read_rows
from artifact.experiments.outputs.paths import reference_traces_dir, results_dir, traces_dir
from artifact.experiments.settings import Settings, fingerprint, load_profile
from artifact.model.checkpoint import Loaded
from artifact.model.tasks import prompts, select
from artifact.offload.prepare import prepare
from artifact.offload.replay.trace import Trace, TraceError
from artifact.offload.runner import decode_prompts
from artifact.paths import atomic_write_bytes


def setup(profile: str, overrides: dict | None = None) -> Settings:
    """The profile with `overrides` laid over it (a bad key or value fails here, naming it), and torch's
    thread count set from it."""
    P = load_profile(profile, overrides)
    if P.torch_threads is not None:
        torch.set_num_threads(P.torch_threads)
    return P


# ---------------------------------------------------------------------------------------------
# Model and run spec
# ---------------------------------------------------------------------------------------------
_LOADED: dict[tuple, Loaded] = {}  # (model, dtype, device, resident) -> the model; the last two


def load_model(P: Settings, resident: bool | None = None) -> Loaded:
    """The profile's checkpoint, loaded once per process and residency (experts resident unless traces are
    offloaded, or as `resident` says). Every call first runs the checks that need no weights
    (artifact.offload.prepare, as generate, trace and the bench's ModelRunner do)."""
    if P.model is None:
        raise ValueError(
            f"profile {P.name!r} has model: null; set it to a checkpoint directory "
            "(overrides = {'model': DIR} in the notebook, or --model DIR)"
        )
    prepared = prepare(P.run_spec())
    resident = P.trace_capacity is None if resident is None else resident
    key = (P.model, P.torch_dtype, P.device, resident)
    loaded = _LOADED.pop(key, None) or prepared.load(resident=resident)
    _LOADED[key] = loaded  # the most recently used last
    if len(_LOADED) > 2:
        del _LOADED[next(iter(_LOADED))]
    return loaded


# ---------------------------------------------------------------------------------------------
# Routing traces (01, 02)
# ---------------------------------------------------------------------------------------------
# Profile keys that decide what a trace holds; a stored trace made under other values is re-recorded.
TRACE_SETTINGS = (
    "model",
    "dtype",
    "device",
    "link",
    "latency_us",
    "link_gbps",
    "mode",
    "gen_length",
    "steps",
    "threshold",
    "trace_n_prompts",
    "seed",
    "max_prompt_tokens",
    "trace_capacity",
)


def trace_path(P: Settings, task: str, batch_size: int) -> Path:
    """A run's own trace (ignored by git): data/traces/<profile>/<task>-b<batch size>.safetensors."""
    return traces_dir(P) / f"{task}-b{batch_size}.safetensors"


def reference_trace_path(P: Settings, task: str, batch_size: int) -> Path:
    """The committed reference trace (written by --store, store_traces): data/results/<profile>/traces/."""
    return reference_traces_dir(P.name) / trace_path(P, task, batch_size).name


def trace_current(P: Settings, task: str, batch_size: int) -> bool:
    """A trace file for (task, batch size) exists and was made with this profile's settings."""
    return current_trace(P, task, batch_size) is not None


def current_trace(P: Settings, task: str, batch_size: int) -> Trace | None:
    """The stored trace for (task, batch size) made with this profile's settings: the committed reference
    (reference_trace_path) when it holds one, else the run's own (trace_path); None when neither exists, is
    readable and of these settings (it is then recorded again). The reference comes first because a recorded
    trace depends on the machine: torch's CPU kernels (AVX-512 or AVX2) and thread count round the router's
    scores differently, and the tiny model has top-k choices decided by one ulp (docs/DESIGN.md, "Exact
    counts"), so every exact count of the profile is computed from the same committed traces."""
    for path in (reference_trace_path(P, task, batch_size), trace_path(P, task, batch_size)):
        t = _trace_of(P, path, task, batch_size)
        if t is not None:
            return t
    return None


def _trace_of(P: Settings, path: Path, task: str, batch_size: int) -> Trace | None:
    """The trace at `path` when it exists and was made with P's settings (fingerprint of TRACE_SETTINGS, the
    same prompts, the same batch size), else None."""
    if not path.is_file():
        return None
    try:
        t = Trace.load(path)
    except TraceError:
        return None
    ids = [r["id"] for r in select(task, P.trace_n_prompts, P.seed)]
    want = (fingerprint(P, TRACE_SETTINGS), ids, batch_size)
    return (
        t
        if (t.meta.get("profile_fingerprint"), t.meta.get("prompt_ids"), t.meta.get("batch_size")) == want
        else None
    )


def traces(P: Settings, progress: bool = True) -> list[Trace]:
    """One trace per (trace task, trace batch size), the committed reference or the run's own when one was
    made with this profile's settings (current_trace), else recorded (resident, or offloaded at
    trace_capacity) and saved atomically into data/traces/<profile>/. The model is loaded only when
    something is recorded."""
    fp = fingerprint(P, TRACE_SETTINGS)
    jobs = trace_jobs(P)
    out = {j: t for j in jobs if (t := current_trace(P, *j)) is not None}
    todo = [j for j in jobs if j not in out]
    for task, b in tqdm(todo, desc="record traces", disable=not progress or not todo):
        t = record_trace(P, task, b)
        t.meta["profile_fingerprint"] = fp
        out[(task, b)] = Trace.load(t.save(trace_path(P, task, b)))
    return [out[j] for j in jobs]


def trace_jobs(P: Settings) -> list[tuple[str, int]]:
    """(task, batch size) of every trace of the profile, in the order traces() returns them."""
    return [(t, b) for t in P.trace_tasks for b in P.trace_batch_sizes]


def store_traces(P: Settings, dest: Path | None = None) -> int:
    """--store: the run's own traces of the profile's settings become the reference (into `dest`, default
    data/results/<profile>/traces/) where the reference holds no trace of these settings; a current reference
    trace stays as it is (the run computed its counts from it). Returns how many were copied."""
    dest = Path(dest) if dest is not None else reference_traces_dir(P.name)
    n = 0
    for task, b in trace_jobs(P):
        own, ref = trace_path(P, task, b), dest / trace_path(P, task, b).name
        if _trace_of(P, ref, task, b) is None and _trace_of(P, own, task, b) is not None:
            atomic_write_bytes(ref, own.read_bytes())
            n += 1
    return n


def record_trace(P: Settings, task: str, batch_size: int) -> Trace:
    """A trace of the profile's prompts for `task` at `batch_size`; its meta names what recorded it (torch's
    version, CPU kernels and threads: a trace recorded elsewhere can differ in a near-tied top-k choice)."""
    loaded = load_model(P)
    ids, ps = prompts(loaded.tokenizer, task, P.trace_n_prompts, P.seed, P.max_prompt_tokens)
    capacity = None if P.trace_capacity is None else min(P.trace_capacity, loaded.cfg.num_experts)
    spec = P.run_spec(capacity, "demand")
    t = decode_prompts(loaded, ps, batch_size, spec, record=True, prompt_ids=ids, task=task).trace
    t.meta["recorded_with"] = {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "device": P.device,
    }
    return t


def trace_label(t: Trace) -> dict:
    return {"task": t.meta.get("task"), "batch_size": int(t.meta.get("batch_size"))}


# ---------------------------------------------------------------------------------------------
# Benchmark grids (03, 04, 05)
# ---------------------------------------------------------------------------------------------
def bench_file(P: Settings, stem: str = "bench") -> Path:
    """data/results/<profile>/<stem>.csv, or <stem>-<fingerprint>.csv when that file holds runs made
    under other settings (so an old result file is never mixed with, nor blocks, this one)."""
    path = results_dir(P) / f"{stem}.csv"
    if path.is_file():
        try:
            fps = set(read_rows(path).fingerprint)
        except ValueError:
            fps = {None}
        if fps and fps != {bench_fingerprint(P)}:
            return results_dir(P) / f"{stem}-{bench_fingerprint(P)}.csv"
    return path


def recorded_before_the_aa_pair(P: Settings, path: Path, log=print):
    """A grid file written before the bench's A/A pair (no `arm` column: a stored run's rows put back in
    place) that holds every run of every cell of the profile's grid without the pair: its rows, ruled with the
    stand-in A/A (verdicts/pairs.py); None otherwise (the file is resumed, or refused, by the bench)."""
    if not has_aa_pair(P) or not path.is_file():
        return None
    with open(path) as f:
        if "arm" in f.readline().strip().split(","):
            return None
    rows = read_rows(path)
    per_cell = pd.Series(cell_keys(rows)).value_counts()
    if any(per_cell.get(c.key, 0) != len(P.policies) * P.repetitions for c in grid(P)):
        return None
    log(f"{path.name}: rows recorded before the A/A pair, every cell whole: ruled with the stand-in A/A")
    return rows


def run_grid(P: Settings, stem: str = "bench", progress: bool = True, log=print):
    """run_bench on the profile's grid into bench_file(P, stem): resumes, skips finished cells (a whole grid
    recorded before the A/A pair is read as it is: recorded_before_the_aa_pair)."""
    loaded = load_model(P) if P.model else None
    path = bench_file(P, stem)
    rows = recorded_before_the_aa_pair(P, path, log)
    if rows is None:
        rows = run_bench(P, path, loaded=loaded, progress=progress, log=log)
    cells = {c.key for c in grid(P)}  # the file may also hold cells of another grid
    keep = [k in cells for k in cell_keys(rows)]
    return rows[keep].reset_index(drop=True)
