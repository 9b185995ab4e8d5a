"""The performance model's virtual runs: model_grid replays routing traces (recorded or synthetic) through the
real engine, cache, policies and link timeline on a virtual clock priced by a hardware profile (hardware.py)
and an engine (engines.py), for every policy x C/W x link priority, with the physical limit beside each cell.
Every number is a pure function of the inputs: two runs give identical bits."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from artifact.errors import SettingError
from artifact.experiments.studies.performance_model.engines import EAGER, Metered, costs_for, host_work
from artifact.model.config import get_preset
from artifact.offload.links.costs import Costs, Hardware, Shape
from artifact.offload.links.timeline import CLOCKS, PRIORITIES
from artifact.offload.policy.policies import check_policy
from artifact.offload.replay.sim import capacity_for, replay
from artifact.offload.replay.trace import KINDS, Trace, mean_working_set
from artifact.offload.spec import RunSpec
from artifact.offload.trace_engine import Calibration, ExpertShape, run_stream, run_virtual

SHAPES = ("llada2-mini", "llada2-flash", "tiny")  # model.config presets; tiny in float32 (the cpu profile)
# A model grid's table: the cell and its modelled figures per denoising step (the CLI's and notebook 08's).
TABLE_COLUMNS = (
    "link_priority",
    "policy",
    "tokens_per_second",
    "seconds_per_step",
    "stall_per_step",
    "limit_per_step",
    "floor_per_step",
)
WALL_STORE_LIMIT = 2 << 30  # bytes: the wall clock replays real expert tensors on this machine
# notebook 08's grid: its C/W, its modelled GPUs (hardware.HARDWARE), the shape its claims rule on
GRID_RATIOS = (0.43, 0.83, 1.0, 1.73)
GPUS = ("a5000", "h200")
CLAIM_SHAPE = "llada2-mini"


def shape(name: str) -> Shape:
    if name not in SHAPES:
        raise SettingError(f"unknown shape {name!r}; choose one of {list(SHAPES)}")
    return Shape.of(get_preset(name), dtype_bytes=4 if name == "tiny" else 2)


def tokens_decoded(trace: Trace) -> int:
    """Tokens the traced run decoded: every block round decodes block_length tokens per batch row."""
    first = trace.meta["moe_layers"][0]
    rounds = int(
        np.sum((trace.kind == KINDS.index("denoise")) & (trace.block_step == 0) & (trace.layer == first))
    )
    block = int((trace.meta.get("decode") or {}).get("block_length", 32))
    return rounds * block * int(trace.meta.get("batch_size") or 1)


def priced_spec(costs: Costs, spec: RunSpec) -> RunSpec:
    """`spec` on the modelled link: the hardware profile's bandwidth and copy latency (hardware.py). A spec
    that sets its own link bandwidth, cap or scale is refused: the performance model would not read them."""
    if spec.link_gbps is not None or spec.cap_gbps is not None or spec.bandwidth_scale != 1.0:
        raise SettingError(
            "the performance model's link is its hardware profile's (hardware.py): leave link_gbps, "
            "cap_gbps and bandwidth_scale unset"
        )
    return spec.replace(link="emulated", link_gbps=costs.link_gbps, latency_us=costs.hw.copy_latency_us)


def model_run(trace: Trace, costs: Costs, spec: RunSpec, min_misses: int | None = None) -> dict:
    """One modelled run of `spec` (capacity, policy, link priority, lookahead, tau; the link priced by
    `costs`): per_step's figures with the time split (host, compute, experts, and the rooflines alone of
    both compute terms: device_compute_per_step, device_experts_per_step), by phase, and the host share
    (engines.host_work)."""
    meter = Metered(costs)
    st = run_virtual(trace, priced_spec(costs, spec), meter)
    t = st["time"]
    split = {"host": t["host"], "compute": t["compute"], "experts": t["experts"]}
    split |= {f"device_{k}": v for k, v in meter.device.items()}
    by_phase = {f"{k}_{ph}": v for ph, d in t["by_phase"].items() for k, v in d.items()}
    out = per_step(trace, costs, spec.capacity, st, t["stall"], split, min_misses)
    return {**out, "host_share": host_work(out)["share"], **by_phase}


def per_step(
    trace: Trace, costs: Costs, capacity: int, st: dict, stall: float, split: dict, min_misses
) -> dict:
    """A modelled or wall run's figures per denoising step from its stats `st`: time, tokens/s, stall,
    `split` (seconds by part, where the run has them), link busy / wall, the counts, and the physical limit,
    max(compute, transfers x expert bytes / bandwidth), with its floor on min's misses. The compute is the
    device's (Costs.device_only: no launches), each demand's non-expert compute and experts in one group."""
    steps = max(st["forwards"], 1)
    tokens = tokens_decoded(trace)
    seconds = st["seconds"]
    first = trace.meta["moe_layers"][0]
    dev = costs.device_only()
    compute = sum(dev.compute(d, d.layer == first) + dev.group(list(d.counts)) for d in trace.demands)
    link_s = costs.expert_bytes / (costs.link_gbps * 1e9)
    if min_misses is None:
        min_misses = replay(trace, "min", capacity)["demand_misses"]
    return {
        "seconds": seconds,
        "steps": st["forwards"],
        "prefill_forwards": st["prefill_forwards"],
        "seconds_per_step": seconds / steps,
        "tokens_per_second": tokens / seconds if seconds else float("nan"),
        "tokens": tokens,
        "stall_per_step": stall / steps,
        **{f"{part}_per_step": v / steps for part, v in split.items()},
        "link_busy_over_wall": st["link_busy_seconds"] / seconds if seconds else float("nan"),
        "limit_per_step": max(compute, st["transfers"] * link_s) / steps,
        "floor_per_step": max(compute, min_misses * link_s) / steps,
        "min_misses": min_misses,
        **{k: st[k] for k in ("demand_misses", "speculative_transfers", "prefetch_hits", "transfers")},
    }


def wall_run(trace: Trace, costs: Costs, spec: RunSpec, min_misses: int | None = None) -> dict:
    """The same cell on the wall clock: the stream engine with the emulated link sleeping and the calibrated
    compute spinning on this machine (cpu-emulated), to check the virtual clock."""
    hw, s = costs.hw, costs.shape
    check_clock("wall", hw)
    store = len(trace.meta["moe_layers"]) * trace.meta["num_experts"] * s.expert_bytes
    if store > WALL_STORE_LIMIT:
        raise SettingError(
            f"clock 'wall' would allocate {store / 2**30:.1f} GiB of experts for this shape; "
            "use shape 'tiny' or clock 'virtual'"
        )
    st = run_stream(
        trace,
        priced_spec(costs, spec),
        ExpertShape(s.hidden_size, s.moe_intermediate_size),
        Calibration(hw.expert_us, hw.other_us_per_demand, source=hw.name),
    )
    return per_step(trace, costs, spec.capacity, st, st["stall_seconds"], {}, min_misses)


def check_clock(clock: str, hw: Hardware) -> None:
    if clock not in CLOCKS:
        raise SettingError(f"unknown clock {clock!r}; choose one of {CLOCKS}")
    if clock == "wall" and not hw.calibrated:
        raise SettingError(
            "clock 'wall' runs the stream on this machine: "
            f"it needs a calibrated hardware profile (cpu-emulated), not {hw.name!r}; use clock 'virtual'"
        )


def check_grid(policies, ratios, priorities, batch_sizes=None) -> None:
    """Every bad value fails before a replay."""
    if not policies:
        raise SettingError("--policies is empty; give at least one engine policy, e.g. demand,last_step")
    for p in policies:
        if not check_policy(p).engine_ok:
            raise SettingError(
                f"policy {p!r} runs in the simulator only; the model runs the engine's policies"
            )
    if not ratios:
        raise SettingError("--cache-ratios is empty; give ratios C/W, e.g. 0.43,1,1.73")
    for r in ratios:
        if not (isinstance(r, (int, float)) and np.isfinite(r) and r > 0):
            raise SettingError(f"--cache-ratios: a ratio C/W must be a finite number > 0, got {r!r}")
    for p in priorities:
        if p not in PRIORITIES:
            raise SettingError(f"--link-priority: unknown {p!r}; choose one of {PRIORITIES}")
    for b in batch_sizes or ():
        if not (isinstance(b, int) and b >= 1):
            raise SettingError(f"--batch-sizes: a batch size is an integer >= 1, got {b!r}")


def model_grid(
    traces: list[Trace],
    hw: Hardware,
    shape_name: str,
    spec: RunSpec,
    policies,
    ratios,
    priorities=None,
    progress: bool = False,
    names: list[str] | None = None,
    clock: str = "virtual",
    floors: dict | None = None,
    engine: str = EAGER,
) -> pd.DataFrame:
    """One row per trace x C/W x link priority x policy, each cell `spec` at that capacity, policy and
    priority (priorities None: the spec's own), priced as `engine` (engines.ENGINES); clock 'wall' runs each
    cell on this machine instead (wall_run). `floors` caches min's misses per (trace, C) across calls."""
    priorities = (spec.link_priority,) if priorities is None else priorities
    check_grid(policies, ratios, priorities)
    check_clock(clock, hw)
    one = model_run if clock == "virtual" else wall_run
    costs = costs_for(hw, shape(shape_name), engine)
    floors = {} if floors is None else floors
    rows = []
    jobs = [(i, r) for i in range(len(traces)) for r in ratios]
    for i, ratio in tqdm(jobs, desc="model", disable=not progress):
        t = traces[i]
        C = capacity_for(ratio, mean_working_set(t), t.meta["num_experts"])
        if (id(t), C) not in floors:
            floors[id(t), C] = replay(t, "min", C)["demand_misses"]
        for priority in priorities:
            for policy in policies:
                cell = spec.replace(capacity=C, policy=policy, link_priority=priority)
                rows.append(
                    {
                        "trace": names[i] if names else str(t.path or i),
                        "task": t.meta.get("task"),
                        "batch_size": int(t.meta.get("batch_size") or 1),
                        "hardware": hw.name,
                        "engine": engine,
                        "shape": shape_name,
                        "clock": clock,
                        "cache_ratio": ratio,
                        "cache_experts": C,
                        "link_priority": priority,
                        "policy": policy,
                        **one(t, costs, cell, min_misses=floors[id(t), C]),
                    }
                )
    return pd.DataFrame(rows)


def to_json(df: pd.DataFrame) -> str:
    """Rows as JSON, floats by Python's repr (shortest round-trip): identical bits give identical text."""
    return json.dumps(df.to_dict("records"), sort_keys=False)


def diffs(
    grid: pd.DataFrame, a: str = "demand", b: str = "last_step", priority: str = "fifo"
) -> pd.DataFrame:
    """Modelled tokens/s of a over b, %, per hardware x shape x stream x C/W."""
    g = grid[grid.link_priority == priority].pivot_table(
        index=["hardware", "shape", "trace", "cache_ratio"], columns="policy", values="tokens_per_second"
    )
    return (100 * (g[a] / g[b] - 1)).rename("diff_pct").reset_index()
