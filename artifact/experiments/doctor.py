"""A preflight for a profile's run: will it fit, and how long will it take? (`python -m artifact doctor`)

It reads only the checkpoint's config.json, its safetensors headers (checked against the file sizes, as
the loader does, and for every tensor the loader will read, with its shape) and its tokenizer, never a
weight, and the profile. For every batch size and C/W of the
profile's grid it adds up the device memory a run needs:

    non-expert weights (artifact.model.memory.non_expert_bytes)
  + C slots x MoE layers x expert bytes              (C = capacity_for(C/W, W, E), as the bench sizes it)
  + the prefix KV cache: 2 x layers x kv heads x head dim x positions x batch x dtype bytes
  + activations of the largest forward, the prefill of a batch (its logits, in float32, dominate)
  + CONTEXT_BYTES for the CUDA context and the allocator's slack (a stated figure)

W is the mean working set of the profile's stored trace for that (task, batch size) when one is current
(harness.current_trace), else its upper bound min(E, batch x block x top-k), marked as such. The device
memory is the GPU's total (torch.cuda.get_device_properties), or --gpu-memory-gb to plan for another GPU.
Host memory must hold the expert store (MemAvailable in /proc/meminfo); on CUDA it is page-locked in place
(RLIMIT_MEMLOCK is reported). Disk must hold the traces and result files (estimated from their formats).
The run time of a GPU profile's grid is the performance model's (performance_model.estimate): every run of
every cell (warm-ups, repetitions, the A/A arm, every policy) and one traced run per (task, batch size),
priced per denoising forward by model_run on a synthetic stream shaped like the cell (the checkpoint's real
MoE layers and experts, the cell's batch size, W and C) on the hardware profile (h200, calibrated on the
committed H200 gpu_check runs; a5000 for the a5000 profiles). It prints a range: the model's time times the
least and the largest ratio of measured to modelled seconds per denoising forward over the committed H200
runs, and names what it extrapolates beyond them (their 5 MoE layers, their batch sizes 1 and 4, their W).
On a CPU device the time is forwards x a stated CPU_SECONDS_PER_FORWARD (the tiny model on 2 cores).

A blocking problem (a cell that does not fit, an expert store larger than host memory, a profile that
cannot run on this machine) is raised as DoctorError naming it; otherwise `check` returns the report.
"""

from __future__ import annotations

import os
import resource
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from artifact.errors import UserError
from artifact.experiments.bench.grid import grid
from artifact.experiments.bench.order import slots
from artifact.experiments.bench.results import has_aa_pair
from artifact.experiments.criteria import thresholds
from artifact.experiments.harness import current_trace
from artifact.experiments.settings import Settings
from artifact.model.checkpoint import DTYPES
from artifact.model.memory import non_expert_bytes
from artifact.model.tasks import prompts
from artifact.offload.prepare import checked_checkpoint, tokenizer_and_config
from artifact.offload.replay.sim import capacity_for
from artifact.offload.replay.trace import mean_working_set
from artifact.paths import data_dir

GB = 1e9
CONTEXT_BYTES = 1 << 30  # CUDA context + allocator slack: a stated figure, not measured here
ACTIVATION_FACTOR = 16  # hidden-sized float tensors alive at once in a layer's forward (a stated bound)
TRACE_BYTES_PER_EXPERT = 6  # a trace stores an expert id (int16) and its token count (int32) per use
TRACE_BYTES_PER_DEMAND = 24  # and a position, step and phase per (forward, MoE layer)
RESULT_BYTES_PER_ROW = 1024  # a bench CSV row, rounded up
# Seconds per forward of one batch of the tiny model on 2 CPU cores, stated (not measured) for a CPU device's
# estimate; a GPU profile's time is the performance model's (module docstring).
CPU_SECONDS_PER_FORWARD = 0.02


class DoctorError(UserError):
    """A profile's run that cannot go ahead here: the message names what does not fit or cannot run."""


@dataclass
class Cell:
    batch_size: int
    cache_ratio: float
    working_set: float
    measured_w: bool
    capacity: int
    slots: int  # bytes
    kv: int
    activations: int
    total: int

    def fits(self, device_bytes: int | None) -> bool:
        return device_bytes is None or self.total <= device_bytes


@dataclass
class Report:
    profile: str
    model: str
    dtype: str
    device: str
    device_bytes: int | None
    device_source: str
    weights: int  # non-expert bytes on the device
    expert_store: int  # host bytes of every routed expert
    checkpoint_bytes: int  # tensor bytes in the safetensors headers
    host_available: int | None
    memlock: str
    disk_free: int
    disk_need: int
    cells: list[Cell]
    grid_cells: int
    runs: int
    forwards: int
    hours: tuple[float, float]  # low, high (equal on a CPU device: a stated figure)
    time_basis: str  # how `hours` was made
    extrapolated: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        g = lambda b: f"{b / GB:8.2f}"  # noqa: E731
        head = (
            f"{'batch':>5} {'C/W':>5} {'W':>7} {'C':>5} {'slots GB':>8} {'weights':>8} {'KV GB':>8} "
            f"{'act GB':>8} {'total GB':>8}  fits"
        )
        lines = [
            f"doctor: profile {self.profile}, model {self.model} ({self.dtype}), device {self.device}",
            f"device memory: {self.device_bytes / GB:.2f} GB ({self.device_source})"
            if self.device_bytes
            else f"device memory: host memory ({self.device_source})",
            head,
        ]
        for c in self.cells:
            w = f"{c.working_set:.1f}" + ("" if c.measured_w else "*")
            lines.append(
                f"{c.batch_size:>5} {c.cache_ratio:>5g} {w:>7} {c.capacity:>5} {g(c.slots)} "
                f"{g(self.weights)} "
                f"{g(c.kv)} {g(c.activations)} {g(c.total)}  "
                f"{'yes' if c.fits(self.device_bytes) else 'NO'}"
            )
        if any(not c.measured_w for c in self.cells):
            lines.append(
                "  * no current trace for this (task, batch size): W is its upper bound min(E, "
                "batch x block x top-k), so C and the slots are upper bounds too"
            )
        if self.device_bytes is not None:  # the same condition under which _cells adds it to each total
            lines.append(
                f"  totals add {CONTEXT_BYTES / GB:.2f} GB of CUDA context and allocator slack (stated)"
            )
        else:
            lines.append(
                "  totals add no CUDA context: they run in host memory (--gpu-memory-gb plans a GPU)"
            )
        host = "unknown" if self.host_available is None else f"{self.host_available / GB:.2f} GB available"
        lines += [
            f"host memory: expert store {self.expert_store / GB:.2f} GB "
            f"({self.checkpoint_bytes / GB:.2f} GB "
            f"of tensors in the checkpoint); {host}; page-lockable (RLIMIT_MEMLOCK): {self.memlock}",
            f"disk: traces and results need about {self.disk_need / GB:.3f} GB; "
            f"{self.disk_free / GB:.1f} GB "
            f"free under {data_dir()}",
            f"grid: {self.grid_cells} cells, {self.runs} runs (warm-ups, repetitions, the A/A arm) and a "
            f"traced run per (task, batch size), about {self.forwards} forwards: {self.time_basis}",
        ]
        if self.extrapolated:
            lines.append(f"  extrapolated: {'; '.join(self.extrapolated)}")
        n, (lo, hi) = thresholds.MIN_RUNS, self.hours
        lines.append(
            f"verdicts: a timing verdict pools >= {n} recorded runs of a profile (one run "
            f"alone, with no stored runs to size the run-to-run spread, reads inconclusive): "
            f"{n} x ({_hours(lo, hi)}) = {_hours(n * lo, n * hi)} for the "
            f"bench grid (scripts/record_runs.py --runs {n})"
        )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _hours(lo: float, hi: float) -> str:
    return f"{lo:.2f} h" if lo == hi else f"{lo:.2f}-{hi:.2f} h"


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


def check(P: Settings, gpu_memory_gb: float | None = None) -> Report:
    """Everything a run of profile P needs, against this machine (or the stated GPU memory)."""
    if P.model is None:
        raise DoctorError(
            f"profile {P.name!r} has model: null: pass --model DIR (a LLaDA2.0 checkpoint directory)"
        )
    notes = []
    dtype = P.torch_dtype
    cfg, index = checked_checkpoint(P.model)  # config.json, the headers, every tensor's shape
    tok, cfg = tokenizer_and_config(P.model, cfg)
    ckpt = sum(
        int(i["data_offsets"][1]) - int(i["data_offsets"][0])
        for t in index.tables.values()
        for i in t.values()
    )
    nbytes = DTYPES[dtype].itemsize
    kind = _kind(P.device)
    device_bytes, source = _device_memory(P, kind, gpu_memory_gb, notes)
    if P.link == "cuda" and kind != "cuda":
        raise DoctorError(f"profile {P.name!r}: link cuda needs device cuda, not {P.device!r}")
    weights = non_expert_bytes(cfg, nbytes)
    per_slot = cfg.expert_params * nbytes * len(cfg.moe_layers)
    store = per_slot * cfg.num_experts
    cells = _cells(P, cfg, nbytes, _prompt_tokens(P, tok), weights, per_slot, device_bytes)
    _check_fit(cells, weights, device_bytes, source)
    host, memlock = _host_memory(store, kind, cells, notes)
    grid_cells, runs, forwards, forwards_per_prompt = _grid_size(P, cfg)
    disk_need, free = _disk(P, cfg, runs, forwards_per_prompt)
    notes += _profile_notes(P)
    hours, basis, extrapolated = _time(P, cfg, nbytes, kind, forwards, cells)
    return Report(
        P.name,
        cfg.name if P.model == "tiny" else str(P.model),
        dtype,
        P.device,
        device_bytes,
        source,
        weights,
        store,
        ckpt,
        host,
        memlock,
        free,
        disk_need,
        cells,
        grid_cells,
        runs,
        forwards,
        hours,
        basis,
        extrapolated,
        notes,
    )


def _time(P: Settings, cfg, nbytes: int, kind: str, forwards: int, cells: list[Cell]):
    """((low, high) hours, how they were made, what they extrapolate): the performance model's range on a
    GPU (performance_model.estimate), forwards x CPU_SECONDS_PER_FORWARD on a CPU device."""
    if kind != "cuda":
        h = forwards * CPU_SECONDS_PER_FORWARD / 3600
        basis = f"roughly {h:.2f} h at a stated {CPU_SECONDS_PER_FORWARD} s per forward "
        basis += "(cpu; an estimate, not a measurement)"
        return (h, h), basis, []
    from artifact.experiments.studies.performance_model.estimate import (
        estimate,
    )  # pandas, the model: here only

    measured = {c.batch_size: (c.working_set, c.measured_w) for c in cells}
    e = estimate(P, cfg, nbytes, measured)
    assert e.forwards == forwards, (e.forwards, forwards)  # one count: the bench's runs (_grid_size)
    return (e.low_hours, e.high_hours), e.text(), e.extrapolated


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


def _check_fit(cells: list[Cell], weights: int, device_bytes: int | None, source: str) -> None:
    """A cell that does not fit the device memory is a DoctorError naming its parts."""
    for c in cells:
        if not c.fits(device_bytes):
            raise DoctorError(
                f"batch {c.batch_size} at C/W {c.cache_ratio:g} (C = {c.capacity}) "
                f"needs {c.total / GB:.2f} GB of device memory ({weights / GB:.2f} GB weights + "
                f"{c.slots / GB:.2f} GB slots + {c.kv / GB:.2f} GB KV cache + {c.activations / GB:.2f} GB "
                f"activations + context) > {device_bytes / GB:.3g} GB ({source}); "
                "lower the batch size or C/W, or use a larger GPU"
            )


def _host_memory(store: int, kind: str, cells: list[Cell], notes: list) -> tuple[int | None, str]:
    """(host memory available, RLIMIT_MEMLOCK as text): the expert store (on a CPU device, also the model and
    cache) must fit in the available memory; on CUDA a lock limit below the store is a note."""
    host = _host_available()
    need_host = store + (0 if kind == "cuda" else max(c.total for c in cells))
    if host is not None and need_host > host:
        raise DoctorError(
            f"the expert store needs {store / GB:.2f} GB of host memory"
            + ("" if kind == "cuda" else " (plus the model and cache on this CPU device)")
            + f", and {host / GB:.2f} GB is available (MemAvailable)"
        )
    memlock, limit = _memlock()
    if kind == "cuda" and limit is not None and limit < store and os.geteuid() != 0:
        notes.append(
            f"RLIMIT_MEMLOCK is {memlock} < the store's {store / GB:.2f} GB: pinning may fail "
            "(raise it with ulimit -l, or run where it is unlimited)"
        )
    return host, memlock


def _grid_size(P: Settings, cfg) -> tuple[int, int, int, int]:
    """(grid cells, bench runs, forwards, forwards per prompt) of the profile's bench as run_bench runs it:
    per cell `warmup` runs of every policy and R repetitions of every slot (the A/A arm one of them); the
    forwards add one traced run per (task, batch size)."""
    # at most steps per block, + prefill
    forwards_per_prompt = (P.gen_length // cfg.block_length) * P.steps + 1
    cells = grid(P)
    per_cell = len(P.policies) * P.warmup + len(slots(P.policies, has_aa_pair(P))) * P.repetitions
    runs = len(cells) * per_cell
    per_run = {b: -(-P.n_prompts // b) * forwards_per_prompt for b in P.batch_sizes}
    forwards = sum(per_run[c.batch_size] for c in cells) * per_cell + len(P.tasks) * sum(per_run.values())
    return len(cells), runs, forwards, forwards_per_prompt


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


def _profile_notes(P: Settings) -> list[str]:
    """What the profile states that the report should say: no TIDE checkout, a bench budget."""
    notes = []
    if P.tide_path is None:
        notes.append(
            "tide_path is null: notebook 05 runs the TIDE-style policy only, not TIDE's released code"
        )
    if P.budget_minutes is not None:
        notes.append(f"the profile states a bench budget of {P.budget_minutes:g} min")
    return notes


def _device_memory(
    P: Settings, kind: str, gpu_memory_gb: float | None, notes: list
) -> tuple[int | None, str]:
    """(device memory in bytes, where the figure comes from): the stated --gpu-memory-gb, this machine's GPU,
    or None on a CPU device (everything lives in host memory)."""
    if gpu_memory_gb is not None:
        if kind == "cuda" and not torch.cuda.is_available():
            notes.append(
                f"device {P.device} is not on this machine: planned for {gpu_memory_gb:g} GB of GPU memory"
            )
        return int(gpu_memory_gb * GB), "--gpu-memory-gb"
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
