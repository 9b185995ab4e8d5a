"""Running a profile's bench cells on a model, and the facts of the machine the rows record.

ModelRunner loads the profile's checkpoint once (after every check `prepare` can make before the weights
are read), traces each (task, batch size) once to measure W (the run doubles as the warm-up and its trace
feeds the oracle), and measures one policy at a capacity (ModelRunner.measure), returning a row of the result
file's STAT_COLUMNS.
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np
import torch

from artifact.errors import ProfileError
from artifact.experiments.bench.grid import Cell
from artifact.experiments.bench.results import HOST_COLUMNS, STAT_COLUMNS, phase_stats
from artifact.experiments.settings import Settings
from artifact.model.checkpoint import weights_fingerprint
from artifact.model.tasks import prompts, tokens_sha
from artifact.offload.policy.policies import check_policy
from artifact.offload.prepare import prepare
from artifact.offload.replay.trace import mean_working_set
from artifact.offload.runner import check_device, decode_prompts
from artifact.offload.spec import RunSpec


def usable_core_ids() -> list[int]:
    """The ids of the CPU cores this process may run on: its affinity mask where the OS has one, else
    0..cpu_count-1."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many CPU cores this process may run on (usable_core_ids)."""
    return len(usable_core_ids())


def hardware(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.machine()} cpu x{os.cpu_count()}"


def measure_h2d_gbps(device: str, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Host-to-device bandwidth of pinned copies (the cuda link's unthrottled rate)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    return repeats * nbytes / (time.perf_counter() - t0) / 1e9


def host_medians(host_ms: list[float], wall_ms: list[float]) -> dict:
    """The run's HOST_COLUMNS: medians over its denoising forwards of host and wall ms (None without any)."""
    return {col: float(np.median(ms)) if ms else None for col, ms in zip(HOST_COLUMNS, (host_ms, wall_ms))}


class ModelRunner:
    """Runs a profile's cells on a model. Tests may substitute an object with the same `meta`,
    `num_experts`, `working_set` and `measure`."""

    def __init__(self, P: Settings, loaded=None):
        if P.model is None:
            raise ProfileError(f"profile {P.name!r} needs a checkpoint directory: pass --model DIR")
        check_device(P.device)
        if P.torch_threads is not None:
            torch.set_num_threads(P.torch_threads)
        self.P = P
        if loaded is None:  # every check that needs no weights first (artifact.offload.prepare)
            loaded = prepare(P.run_spec()).load(resident=P.trace_capacity is None)
        self.loaded = loaded
        if P.device.startswith("cuda") and not self.loaded.experts.is_pinned():
            self.loaded.experts = self.loaded.experts.pin_memory()  # once, not in every run's HostStore
        cfg = self.loaded.cfg
        self.num_experts = cfg.num_experts
        self.expert_bytes = cfg.expert_params * self.loaded.experts.element_size()
        self.meta = {
            "model": cfg.name,
            "model_hash": cfg.config_hash(),
            "weights_fingerprint": weights_fingerprint(self.loaded.path) if self.loaded.path else "none",
            "dtype": str(self.loaded.experts.dtype).removeprefix("torch."),
            "device": P.device,
            "link": P.link,
            "hardware": hardware(P.device),
        }
        self._group = None  # (task, batch size) -> (W, ids, prompts, trace): the last one only
        self._nominal = None

    def _measure(self) -> float:
        """The cuda link's unthrottled rate, measured once (only a scale < 1 without link_gbps needs it)."""
        if self._nominal is None:
            self._nominal = measure_h2d_gbps(self.P.device)
        return self._nominal

    def spec(self, capacity: int | None, policy: str = "demand", bandwidth_scale: float = 1.0) -> RunSpec:
        """A run of the bench: the profile's RunSpec (every run key, the forward mode and kernel too) at
        `capacity` (None: resident) with `policy`, its link at `bandwidth_scale`."""
        spec = self.P.run_spec(capacity, policy, bandwidth_scale=bandwidth_scale)
        if spec.link == "cuda" and bandwidth_scale != 1.0 and spec.link_gbps is None:
            spec = spec.replace(link_gbps=self._measure())  # a cap below the hardware's measured rate
        return spec

    def _prompts(self, task: str, batch_size: int):
        if self._group is None or self._group[0] != (task, batch_size):
            P = self.P
            ids, ps = prompts(self.loaded.tokenizer, task, P.n_prompts, P.seed, P.max_prompt_tokens)
            capacity = None if P.trace_capacity is None else min(P.trace_capacity, self.num_experts)
            res = decode_prompts(
                self.loaded, ps, batch_size, self.spec(capacity), record=True, prompt_ids=ids, task=task
            )
            self._group = ((task, batch_size), mean_working_set(res.trace), ids, ps, res.trace)
        return self._group

    def working_set(self, task: str, batch_size: int) -> float:
        return self._prompts(task, batch_size)[1]

    def measure(self, cell: Cell, policy: str, capacity: int) -> dict:
        """One run of `policy` at `capacity` on the cell's prompts: its row of STAT_COLUMNS (and phases, host
        ms)."""
        _, _, ids, ps, trace = self._prompts(cell.task, cell.batch_size)
        spec = self.spec(capacity, policy, cell.bandwidth_scale)
        oracle = trace if check_policy(policy).needs_trace else None
        res = decode_prompts(
            self.loaded,
            ps,
            cell.batch_size,
            spec,
            oracle=oracle,
            prompt_ids=ids,
            task=cell.task,
        )
        out = {k: getattr(res.stats, k, None) for k in STAT_COLUMNS}
        out.update(phase_stats(res.stats.by_phase))
        out["tokens"] = res.stats.tokens_generated
        out["link_gbps"] = spec.link_rate(self.expert_bytes)
        out["tokens_sha"] = tokens_sha(res.tokens)
        out.update(host_medians(res.stats.forward_host_ms, res.stats.forward_wall_ms))
        return out
