"""A profile's run before it starts (`python -m artifact doctor`): what its verdict costs, whether it fits,
which cells will be host-bound and how likely the design is to decide. It reads only the checkpoint's
config.json, its safetensors headers (checked against the file sizes, as the loader does, with every tensor's
shape) and its tokenizer, never a weight; `--shape NAME` reads a header-only checkpoint of a published model's
preset (shapes.py).

The verdict's cost, the report's first line: a stored verdict pools thresholds.MIN_RUNS runs (`--runs N`), so
N x one run's time, a run being notebook 04's bench grid and its traced run (scripts/record_runs.py measures
the other timing notebooks in each run too: not priced here).

Memory: for every batch size and C/W, non-expert weights (model.memory.non_expert_bytes) + C slots x MoE
layers x expert bytes (C = capacity_for(C/W, W, E), as the bench sizes it) + the prefix KV cache (2 x layers x
kv heads x head dim x positions x batch x dtype bytes) + the prefill's activations (its float32 logits
dominate) + CONTEXT_BYTES (stated). W is the profile's current trace's (harness.current_trace), else its upper
bound min(E, batch x block x top-k), marked. The device memory is the GPU's (torch.cuda), --gpu-memory-gb, or
under --shape with no GPU the profile's GPU (shapes.PLANNED_GPU_GB); under --shape a cell that fits only at a
measured W is a note, not a refusal (no trace can be current for a checkpoint without weights). Host memory
must hold the expert store (MemAvailable; on CUDA it is page-locked: RLIMIT_MEMLOCK is reported); disk, the
traces and result rows.

Time of one run: on a GPU the performance model's range (performance_model.estimate: every run of the grid,
the A/A arm and a traced run per (task, batch size), priced per denoising forward on a synthetic stream shaped
like the cell, times the least and the largest measured/modelled ratio over the committed H200 runs; eager
host costs, whatever the profile's forward). On a CPU device the profile's stored runs measure it: the median
over runs of bench.csv's seconds / forwards, times the grid's forwards counted as the stored rows ran them
(the decoder ends a block early, below the bound of `steps` forwards); without stored runs of the tiny model,
a stated CPU_SECONDS_PER_FORWARD.

Host-bound cells (host.py) and the power to decide under assumed noise (power.py) follow the time.

A blocking problem (a cell that does not fit, an expert store larger than host memory, a profile that cannot
run on this machine) is raised as DoctorError naming it; otherwise `check` returns the Report (report.py).
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import statistics
from pathlib import Path

import torch

from artifact.errors import RunsError, UserError
from artifact.experiments.bench.grid import grid
from artifact.experiments.bench.order import slots
from artifact.experiments.bench.results import bench_fingerprint, has_aa_pair
from artifact.experiments.criteria import thresholds
from artifact.experiments.doctor.host import host_shares
from artifact.experiments.doctor.power import power_lines
from artifact.experiments.doctor.report import CONTEXT_BYTES, GB, Cell, HostCell, Report
from artifact.experiments.doctor.shapes import PLANNED_GPU_GB, SHAPES, TOKENIZER_NOTE
from artifact.experiments.harness import current_trace
from artifact.experiments.outputs.stored_runs import check_stored_runs, run_meta, stored_rows
from artifact.experiments.settings import Settings
from artifact.model.checkpoint import DTYPES
from artifact.model.memory import non_expert_bytes
from artifact.model.tasks import prompts
from artifact.offload.prepare import checked_checkpoint, tokenizer_and_config
from artifact.offload.replay.sim import capacity_for
from artifact.offload.replay.trace import mean_working_set
from artifact.paths import data_dir

__all__ = ["CONTEXT_BYTES", "GB", "SHAPES", "Cell", "DoctorError", "HostCell", "Report", "check", "cpu_time"]

ACTIVATION_FACTOR = 16  # hidden-sized float tensors alive at once in a layer's forward (a stated bound)
TRACE_BYTES_PER_EXPERT = 6  # a trace stores an expert id (int16) and its token count (int32) per use
TRACE_BYTES_PER_DEMAND = 24  # and a position, step and phase per (forward, MoE layer)
RESULT_BYTES_PER_ROW = 1024  # a bench CSV row, rounded up
# Seconds per forward of one batch of the tiny model on 2 CPU cores, stated (not measured): a CPU device's
# time when there are no stored runs of the tiny model to measure it on.
CPU_SECONDS_PER_FORWARD = 0.02


class DoctorError(UserError):
    """A profile's run that cannot go ahead here: the message names what does not fit or cannot run."""


def check(
    P: Settings, gpu_memory_gb: float | None = None, runs: int = thresholds.MIN_RUNS, shape: str | None = None
) -> Report:
    """Everything `runs` runs of profile P need, against this machine (or the stated GPU memory); `shape`:
    P.model is a header-only checkpoint of that preset (shapes.py), a plan."""
    if P.model is None:
        raise DoctorError(
            f"profile {P.name!r} has model: null: pass --model DIR (a LLaDA2.0 checkpoint directory) "
            f"or --shape NAME (its public shapes, nothing downloaded: {', '.join(SHAPES)})"
        )
    notes = []
    cfg, index = checked_checkpoint(P.model)  # config.json, the headers, every tensor's shape
    tok, cfg = tokenizer_and_config(P.model, cfg)
    tables = index.tables.values()
    ckpt = sum(int(i["data_offsets"][1]) - int(i["data_offsets"][0]) for t in tables for i in t.values())
    nbytes = DTYPES[P.torch_dtype].itemsize
    kind = _kind(P.device)
    device_bytes, source = _device_memory(P, kind, gpu_memory_gb, notes, shape)
    if P.link == "cuda" and kind != "cuda":
        raise DoctorError(f"profile {P.name!r}: link cuda needs device cuda, not {P.device!r}")
    weights = non_expert_bytes(cfg, nbytes)
    per_slot = cfg.expert_params * nbytes * len(cfg.moe_layers)
    cells = _cells(P, cfg, nbytes, _prompt_tokens(P, tok), weights, per_slot, device_bytes)
    _check_fit(cells, weights, device_bytes, source, notes if shape else None)
    host, memlock = _host_memory(per_slot * cfg.num_experts, kind, cells, notes, plan=shape is not None)
    grid_cells, n_runs, forwards, (per_prompt, per_batch) = _grid_size(P, cfg)
    disk_need, free = _disk(P, cfg, n_runs, per_prompt)
    notes += _profile_notes(P, shape)
    hours, basis, extrapolated = _time(P, cfg, nbytes, kind, forwards, cells, per_batch)
    model = f"{shape} (its public shapes: a header-only checkpoint, no weights)" if shape else P.model
    report = Report(
        P.name,
        cfg.name if P.model == "tiny" else str(model),
        P.torch_dtype,
        P.device,
        device_bytes,
        source,
        weights,
        per_slot * cfg.num_experts,
        ckpt,
        host,
        memlock,
        free,
        disk_need,
        cells,
        grid_cells,
        n_runs,
        forwards,
        hours,
        basis,
        extrapolated,
        notes,
        verdict_runs=runs,
        gpu=kind == "cuda",
        budget_hours=None if P.budget_minutes is None else runs * P.budget_minutes / 60,
        forward=P.forward,
    )
    if kind == "cuda":
        report.host, report.host_basis = host_shares(P, cfg, nbytes, cells)
    report.power = power_lines(P, runs)
    fit = int(REVIEWER_HOURS // hours[1]) if kind == "cuda" and hours[1] > 0 else runs
    more = power_lines(P, fit) if fit > runs else []  # more runs fit the budget: what they would decide
    report.power += [
        f"{fit} runs fit {REVIEWER_HOURS:g} GPU-hours at the upper end ({fit} x {hours[1]:.2f} h): "
        + line.removeprefix("power: ")
        for line in more[:1]
    ]
    report.whole_run_minutes = None if kind == "cuda" else whole_run_minutes(P)
    return report


REVIEWER_HOURS = 2.0  # the budget a reviewer's verdict is promised within (README's first screen)


def _kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def _host_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _memlock() -> tuple[str, int | None]:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return "unlimited", None
    return f"{soft / GB:.3f} GB", soft


def _prompt_tokens(P: Settings, tok) -> int:
    """The longest prompt the grid will run, in tokens (after max_prompt_tokens)."""
    longest = 1
    for task in P.tasks:
        _, ps = prompts(tok, task, P.n_prompts, P.seed, P.max_prompt_tokens)
        longest = max([longest, *map(len, ps)])
    return longest


def _working_set(P: Settings, batch: int, bound: int) -> tuple[float, bool]:
    """The largest W over the profile's tasks at this batch size: measured where a trace is current."""
    ws = []
    for task in P.tasks:
        t = current_trace(P, task, batch) if task in P.trace_tasks and batch in P.trace_batch_sizes else None
        ws.append((mean_working_set(t), True) if t is not None else (float(bound), False))
    return max(ws)


def _time(P: Settings, cfg, nbytes: int, kind: str, forwards: int, cells: list[Cell], per_batch: dict):
    """((low, high) hours of one run, how they were made, what they extrapolate): the performance model's
    range on a GPU, priced eager (a virtual-time run has no segmented forward to run), the stored runs' on a
    CPU device."""
    if kind != "cuda":
        return cpu_time(P, per_batch)
    from artifact.experiments.studies.performance_model.estimate import estimate  # pandas, the model

    measured = {c.batch_size: (c.working_set, c.measured_w) for c in cells}
    e = estimate(dataclasses.replace(P, forward="eager"), cfg, nbytes, measured)
    assert e.forwards == forwards, (e.forwards, forwards)  # one count: the bench's runs (_grid_size)
    extrapolated = list(e.extrapolated)
    if P.forward != "eager":
        extrapolated.append(f"priced with the eager forward's host costs, not the profile's {P.forward}")
    return (e.low_hours, e.high_hours), e.text(), extrapolated


def cpu_time(P: Settings, per_batch: dict) -> tuple[tuple[float, float], str, list]:
    """One run's (hours, hours), how they were made and [] on a CPU device (module docstring); `per_batch` is
    {batch size: (the grid's forwards at that batch size, one run's forwards at it)}, both at the bound of
    `steps` per block."""
    try:
        found = stored_rows(P, "bench") if P.model == "tiny" else []
    except RunsError:
        found = []
    if not found:
        h = sum(f for f, _ in per_batch.values()) * CPU_SECONDS_PER_FORWARD / 3600
        basis = f"roughly {h:.2f} h at a stated {CPU_SECONDS_PER_FORWARD} s per forward (cpu; no stored runs)"
        return (h, h), basis, []
    per_forward = statistics.median(rows.seconds.sum() / rows.forwards.sum() for _, rows in found)
    same = [rows[rows.fingerprint.astype(str) == bench_fingerprint(P)] for _, rows in found]
    seconds, ran_as = 0.0, []
    for b, (forwards, bound) in sorted(per_batch.items()):
        ran = [int(f) for rows in same for f in rows.forwards[rows.batch_size == b]]
        each = statistics.median(ran) if ran else bound
        seconds += forwards * each / bound * per_forward
        ran_as.append(f"{each:g} per run at batch {b}" + ("" if ran else " (the bound: no stored row)"))
    basis = (
        f"{seconds / 3600:.2f} h at {per_forward:.4f} s per forward (the median over {len(found)} stored "
        f"runs of bench.csv's seconds / forwards), forwards as the stored rows ran them: {', '.join(ran_as)}"
    )
    return (seconds / 3600, seconds / 3600), basis, []


def whole_run_minutes(P: Settings) -> float | None:
    """The median minutes of the profile's stored runs as a whole (run.json `seconds`: scripts/record_runs.py,
    every timing notebook), or None without them."""
    try:
        whole = [s for run in check_stored_runs(P.name) if (s := run_meta(run).get("seconds"))]
    except RunsError:
        return None
    return statistics.median(whole) / 60 if whole else None


def _cells(
    P: Settings, cfg, nbytes: int, prompt_len: int, weights: int, per_slot: int, device_bytes: int | None
) -> list[Cell]:
    """For every batch size and C/W of the profile's grid, the device memory a run needs (the sum above)."""
    block = cfg.block_length
    positions = -(-(prompt_len + P.gen_length) // block) * block
    context = CONTEXT_BYTES if device_bytes is not None else 0
    cells = []
    for b in P.batch_sizes:
        bound = min(cfg.num_experts, b * block * cfg.num_experts_per_tok)
        W, measured = _working_set(P, b, bound)
        kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * positions * b * nbytes
        act = b * (prompt_len + block) * (cfg.vocab_size * 4 + ACTIVATION_FACTOR * cfg.hidden_size * nbytes)
        for r in P.cache_ratios:
            C = capacity_for(r, W, cfg.num_experts)
            total = weights + C * per_slot + kv + act + context
            cells.append(Cell(b, r, W, measured, C, C * per_slot, kv, act, total))
    return cells


def _check_fit(
    cells: list[Cell], weights: int, device_bytes: int | None, source: str, plan: list | None
) -> None:
    """A cell that does not fit the device memory is a DoctorError naming its parts; in a plan (`plan`, its
    notes) a cell whose W is only the upper bound is a note instead."""
    for c in cells:
        if c.fits(device_bytes):
            continue
        what = (
            f"batch {c.batch_size} at C/W {c.cache_ratio:g} (C = {c.capacity}) "
            f"needs {c.total / GB:.2f} GB of device memory ({weights / GB:.2f} GB weights + "
            f"{c.slots / GB:.2f} GB slots + {c.kv / GB:.2f} GB KV cache + {c.activations / GB:.2f} GB "
            f"activations + context) > {device_bytes / GB:.3g} GB ({source})"
        )
        if plan is None or c.measured_w:
            raise DoctorError(f"{what}; lower the batch size or C/W, or use a larger GPU")
        plan.append(f"{what} at W's upper bound: the run sizes C from its traces' W (record them first)")


def _host_memory(
    store: int, kind: str, cells: list[Cell], notes: list, plan: bool = False
) -> tuple[int | None, str]:
    """(host memory available, RLIMIT_MEMLOCK as text): the expert store (on a CPU device, also the model and
    cache) must fit in the available memory (in a plan, for another machine, a note); on CUDA a lock limit
    below the store is a note."""
    host = _host_available()
    need_host = store + (0 if kind == "cuda" else max(c.total for c in cells))
    if host is not None and need_host > host:
        what = (
            f"the expert store needs {store / GB:.2f} GB of host memory"
            + ("" if kind == "cuda" else " (plus the model and cache on this CPU device)")
            + f", and {host / GB:.2f} GB is available (MemAvailable)"
        )
        if not plan:
            raise DoctorError(what)
        notes.append(f"{what} here: the machine that runs it needs that much")
    memlock, limit = _memlock()
    if kind == "cuda" and limit is not None and limit < store and os.geteuid() != 0:
        notes.append(
            f"RLIMIT_MEMLOCK is {memlock} < the store's {store / GB:.2f} GB: pinning may fail "
            "(raise it with ulimit -l, or run where it is unlimited)"
        )
    return host, memlock


def _grid_size(P: Settings, cfg) -> tuple[int, int, int, tuple[int, dict]]:
    """(grid cells, bench runs, forwards, (forwards per prompt, {batch: (forwards, one run's forwards)}))
    of the profile's bench as run_bench runs it: per cell `warmup` runs of every policy and R repetitions of
    every slot (the A/A arm one of them); the forwards add one traced run per (task, batch size)."""
    per_prompt = (P.gen_length // cfg.block_length) * P.steps + 1  # at most steps per block, + prefill
    cells = grid(P)
    per_cell = len(P.policies) * P.warmup + len(slots(P.policies, has_aa_pair(P))) * P.repetitions
    per_batch = {}
    for b in P.batch_sizes:
        one = -(-P.n_prompts // b) * per_prompt
        per_batch[b] = (sum(c.batch_size == b for c in cells) * one * per_cell + len(P.tasks) * one, one)
    forwards = sum(f for f, _ in per_batch.values())
    return len(cells), len(cells) * per_cell, forwards, (per_prompt, per_batch)


def _disk(P: Settings, cfg, runs: int, forwards_per_prompt: int) -> tuple[int, int]:
    """(bytes the traces and results need, bytes free under the data directory); too little is a
    DoctorError."""
    need = _trace_bytes(P, cfg, forwards_per_prompt) + runs * RESULT_BYTES_PER_ROW
    free = shutil.disk_usage(_existing(data_dir())).free
    if need > free:
        raise DoctorError(
            f"traces and results need about {need / GB:.2f} GB and {data_dir()} has {free / GB:.2f} GB free"
        )
    return need, free


def _profile_notes(P: Settings, shape: str | None) -> list[str]:
    """What the report should say of the profile: no TIDE checkout, a bench budget, what is not priced."""
    notes = []
    if P.tide_path is None:
        notes.append(
            "tide_path is null: notebook 05 runs the TIDE-style policy only, not TIDE's released code"
        )
    if P.budget_minutes is not None:
        notes.append(f"the profile states a bench budget of {P.budget_minutes:g} min per run")
    if shape:
        notes.append(TOKENIZER_NOTE)
    notes.append(
        "only notebook 04's bench grid is priced here: record a verdict's runs of it alone with "
        "scripts/record_runs.py --only 04 (without --only, every timing notebook is measured in each run)"
    )
    return notes


def _device_memory(
    P: Settings, kind: str, gpu_memory_gb: float | None, notes: list, shape: str | None = None
) -> tuple[int | None, str]:
    """(device memory in bytes, where the figure comes from): the stated --gpu-memory-gb, this machine's GPU,
    under --shape with no GPU the profile's GPU, or None on a CPU device (everything lives in host memory)."""
    planned = "--gpu-memory-gb"
    if kind == "cuda" and gpu_memory_gb is None and shape and not torch.cuda.is_available():
        gpu = "a5000" if P.name.startswith("a5000") else "h200"  # as performance_model.estimate prices it
        gpu_memory_gb, planned = PLANNED_GPU_GB[gpu], f"planned: the profile's GPU, {gpu}; --gpu-memory-gb N"
    if gpu_memory_gb is not None:
        if kind == "cuda" and not torch.cuda.is_available():
            notes.append(
                f"device {P.device} is not on this machine: planned for {gpu_memory_gb:g} GB of GPU memory"
            )
        return int(gpu_memory_gb * GB), planned
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DoctorError(
                f"profile {P.name!r} runs on {P.device}, and this machine has no CUDA GPU; "
                "plan for one with --gpu-memory-gb N"
            )
        return (
            torch.cuda.get_device_properties(torch.device(P.device)).total_memory,
            torch.cuda.get_device_name(torch.device(P.device)),
        )
    return None, "cpu device: weights, slots and KV cache live in host memory"


def _trace_bytes(P: Settings, cfg, forwards_per_prompt: int) -> int:
    """The disk the profile's routing traces take: per trace, its demands times the bytes of a demand."""
    total = 0
    for b in P.trace_batch_sizes:
        W = _working_set(P, b, min(cfg.num_experts, b * cfg.block_length * cfg.num_experts_per_tok))[0]
        demands = -(-P.trace_n_prompts // b) * forwards_per_prompt * len(cfg.moe_layers)
        total += len(P.trace_tasks) * int(demands * (W * TRACE_BYTES_PER_EXPERT + TRACE_BYTES_PER_DEMAND))
    return total


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path
