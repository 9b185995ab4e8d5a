"""Hardware profiles of the performance model (offload/links/costs.py), as data: each number with its source.

  a5000          RTX A5000 on PCIe 4.0 x16. Not measured here (no A5000): the link and device numbers are
                 datasheet and PCIe figures; the host's costs are those measured on the H200 machine's host
                 (the engine's Python and PyTorch's launches are host work, not the GPU's).
  h200           H200 on PCIe 5.0 x16: the link and the host costs measured by scripts/gpu_check.py on one
                 H200 (data/gpu_check/h200.json); peak compute and memory from the datasheet.
  cpu-emulated   the cpu profile: the emulated link's constants (PCIe 4 scaled to the expert's size) and the
                 tiny model's offloaded compute and host time per copy, measured on this CPU
                 (performance_model.cpu_emulated; validate_cpu measures them again in its own session).

A gpu_check JSON report (`from_gpu_check`) overrides what it measures: the H2D rate of expert copies from
a registered store, the host time per launch, the launches per layer and the host time per copy.

GPU compute and host time are apart. The physical limit's compute is the device's alone (virtual.model_run,
Costs.device_only: the rooflines without the host's launch term). The measured GPU compute, the CUDA-event
time of a resident forward that the host does not pace (forward "segmented", host at most
HOST_SHARE_NOT_COMPUTE of the wall), and the host costs of the segmented forward (its segments replayed as
CUDA graphs) come from the graphs check's report (scripts/gpu_run.sh, GPU_CHECK_GRAPHS: `h200_graphs`,
`from_graphs_check`, `graphs_on`), read whenever it exists. A row whose segments did not replay (`replayed`
is False, or a report without the counters) measured the eager path and is not read. Until that report
exists every one of those figures is unmeasured (None, with the reason), never a guess; the committed
gpu_check reports (data/gpu_check/h200.json, h200_run2.json) time resident forwards host-bound (host 74-100%
of wall), so their wall time is not the GPU's compute.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from artifact.errors import SettingError
from artifact.offload.links.costs import Hardware
from artifact.offload.links.link import PCIE4_GBPS, PCIE_LATENCY_US
from artifact.paths import repo_root

GPU_CHECK_H200 = "gpu_check/h200.json"  # under data/: the report the h200 profile's measured numbers are from
# under data/: the graphs check of scripts/gpu_run.sh on an H200
GPU_CHECK_GRAPHS = "gpu_check/h200_graphs.json"
# What the graphs check measures for the model: the graphs-on host costs in Hardware's terms and the GPU
# compute of a resident forward per batch size (ms, CUDA events).
GRAPHS_FIGURES = ("launch_us", "kernels_per_layer", "copy_host_us", "gpu_forward_ms")
HOST_SHARE_NOT_COMPUTE = 0.5  # the share of a resident forward's wall above which its host time paces it: its
# wall is then not the GPU's compute

# Host costs measured by gpu_check on the H200 machine (data/gpu_check/h200.json, step 7 "engine"; derived
# by from_gpu_check, and tests/test_perf_model.py checks these equal what it derives from the report).
H200_HOST = dict(launch_us=41.5, kernels_per_layer=120, copy_host_us=59.8, sync_us=0.0, plan_us=0.0)

HARDWARE: dict[str, Hardware] = {
    "a5000": Hardware(
        "a5000",
        h2d_gbps=PCIE4_GBPS,
        copy_latency_us=PCIE_LATENCY_US,
        bf16_tflops=111.1,
        memory_gbps=768.0,
        **H200_HOST,
    ),
    "h200": Hardware(
        "h200",
        h2d_gbps=53.05,
        copy_latency_us=PCIE_LATENCY_US,
        bf16_tflops=989.0,
        memory_gbps=4800.0,
        **H200_HOST,
    ),
    "cpu-emulated": Hardware(
        "cpu-emulated",
        h2d_gbps=PCIE4_GBPS,
        copy_latency_us=PCIE_LATENCY_US,
        launch_us=0.0,
        sync_us=0.0,
        plan_us=0.0,
        copy_host_us=26.9,
        kernels_per_group=0,
        kernels_per_layer=0,
        expert_us=16.0,
        other_us_per_demand=1273.0,
        scale_link=True,
    ),
}

SOURCES: dict[str, dict[str, str]] = {
    "a5000": {
        "h2d_gbps": "PCIe 4.0 x16 achieved, offload/links/link.py PCIE4_GBPS (about 80% of the link's 31.5 "
        "GB/s); not measured here",
        "copy_latency_us": "offload/links/link.py PCIE_LATENCY_US (stated per-copy setup, not measured)",
        "bf16_tflops": "NVIDIA RTX A5000 datasheet: 222.2 TFLOPS tensor performance with "
        "sparsity; dense is half",
        "memory_gbps": "NVIDIA RTX A5000 datasheet: 768 GB/s GDDR6",
        "host": "the H200 machine's host costs (see h200): an A5000 host runs the same Python and launches",
    },
    "h200": {
        "h2d_gbps": "gpu_check on one H200 (data/gpu_check/h200.json): pinned_peak.store_expert_copy_gbps, "
        "back-to-back 6 MiB copies from a registered store, best of 5",
        "copy_latency_us": "offload/links/link.py PCIE_LATENCY_US (stated, not measured)",
        "bf16_tflops": "NVIDIA H200 SXM datasheet: 1,979 TFLOPS bf16 with sparsity; dense is half",
        "memory_gbps": "NVIDIA H200 datasheet: 4.8 TB/s HBM3e",
        "launch_us": "gpu_check engine, batch 1, C/W 1, demand: host_ms_per_forward / launches_per_forward "
        "(that run's gpu_check counted the router-count sync's wait in host_ms; later versions "
        "report it apart as sync_wait_ms_per_forward)",
        "kernels_per_layer": "gpu_check engine, resident batch 1: launches_per_forward / model layers",
        "copy_host_us": "gpu_check engine, batch 1: least-squares slope of host_ms_per_forward on transfers "
        "per forward over its 6 offloaded runs",
        "sync_us": "0: inside the measured host time per launch (the run's syncs are among "
        "its launches' time)",
        "plan_us": "0: inside the measured host time per launch and per copy",
        "gpu_compute": "unmeasured until scripts/gpu_run.sh runs on an H200 (h200_graphs, "
        "data/gpu_check/h200_graphs.json): the CUDA-event time of a resident segmented forward that "
        "replayed, whose host is at most half its wall; "
        "meanwhile the physical limit's compute is the rooflines' device compute alone (Costs.device_only)",
        "graphs_on_host": "unmeasured until scripts/gpu_run.sh runs on an H200 (graphs_on(report) "
        "raises until then): launch_us, kernels_per_layer, copy_host_us of the segmented engine, replayed",
    },
    "cpu-emulated": {
        "h2d_gbps": "the emulated link: PCIe 4 (offload/links/link.py PCIE4_GBPS) "
        "scaled to the expert's size (emulated_bandwidth_gbps)",
        "copy_latency_us": "the emulated link's PCIE_LATENCY_US",
        "expert_us": "performance_model.cpu_emulated on this 2-core machine, batch 1 (2026-12-04): "
        "python benchmarks/validate_model.py --calibrate; "
        "the offloaded engine's compute on a link too fast to wait on, "
        "split by stream.calibrate's share of expert time",
        "other_us_per_demand": "the same measurement: the rest of the compute per (forward, MoE layer)",
        "copy_host_us": "the same measurement: the slope of run time on copies between C/W 0.43 and 3",
        "plan_us": "0: inside other_us_per_demand (measured on the offloaded engine)",
    },
}


def hardware(name: str, gpu_check: str | Path | None = None) -> Hardware:
    """A profile by name, with what a gpu_check report measured in place of its defaults."""
    if name not in HARDWARE:
        raise SettingError(f"unknown hardware {name!r}; choose one of {sorted(HARDWARE)}")
    hw = HARDWARE[name]
    if gpu_check is not None:
        hw = dataclasses.replace(hw, **from_gpu_check(load_gpu_check(gpu_check)))
    return hw


def load_gpu_check(path: str | Path) -> dict:
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise SettingError(
            f"gpu_check report {path} does not exist (scripts/gpu_check.py --out writes one)"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise SettingError(f"gpu_check report {path} is not readable JSON: {e}") from None
    if not isinstance(report, dict) or report.get("dry_run_on_cpu"):
        raise SettingError(f"gpu_check report {path} is not a GPU run's report (dry run or not a report)")
    return report


def from_gpu_check(report: dict) -> dict:
    """The hardware numbers a gpu_check report measured (module docstring); only those it has."""
    out = {}
    peak = report.get("pinned_peak") or {}
    if isinstance(peak.get("store_expert_copy_gbps"), (int, float)):
        out["h2d_gbps"] = round(float(peak["store_expert_copy_gbps"]), 2)
    eng = report.get("engine") or {}
    runs = [r for r in eng.get("runs", []) if isinstance(r, dict)]
    ref = [
        r
        for r in runs
        if r.get("batch") == 1
        and r.get("cache_ratio") == 1.0
        and r.get("policy") == "demand"
        and r.get("launches_per_forward")
    ]
    if ref:
        out["launch_us"] = round(1e3 * ref[0]["host_ms_per_forward"] / ref[0]["launches_per_forward"], 1)
    resident = [r for r in eng.get("resident", []) if r.get("batch") == 1 and r.get("launches_per_forward")]
    if resident and eng.get("layers"):
        out["kernels_per_layer"] = round(resident[0]["launches_per_forward"] / eng["layers"])
    b1 = [r for r in runs if r.get("batch") == 1 and r.get("forwards")]
    if len(b1) >= 2:
        x = np.array([(r["demand_misses"] + r["speculative_transfers"]) / r["forwards"] for r in b1])
        y = np.array([r["host_ms_per_forward"] for r in b1])
        if np.ptp(x) > 0:
            slope = np.polyfit(x, y, 1)[0]
            out["copy_host_us"] = round(1e3 * float(slope), 1)
    return out


def committed_gpu_check() -> Path:
    """The committed report (in the checkout's data/, whatever ARTIFACT_DATA says: it is an input, not
    output)."""
    return repo_root() / "data" / GPU_CHECK_H200


def forward_of(row: dict) -> str | None:
    """A graphs-check row's forward mode: its `forward`, or "segmented" / "eager" for a report's `graphs`
    "on" / "off"."""
    return row.get("forward") or {"on": "segmented", "off": "eager"}.get(row.get("graphs"))


def replayed(row: dict) -> bool:
    """A segmented row whose segments replayed as CUDA graphs (replays > 0, no capture error, no piece of its
    timed run eager for want of a graph); False for a row without the counters."""
    return bool(row.get("replays")) and not row.get("capture_error") and not row.get("eager")


def measured_segmented(row: dict) -> bool:
    """A row that measured the segmented forward as graphs: segmented, no error, its segments replayed."""
    return isinstance(row, dict) and "error" not in row and forward_of(row) == "segmented" and replayed(row)


def from_graphs_check(report: dict) -> dict:
    """GRAPHS_FIGURES from a graphs check's report (scripts/gpu_check_graphs.py), each None where the report
    did not measure it, read off its segmented rows that replayed (measured_segmented): launch_us (batch 1,
    C/W 1, demand: host ms per forward / host-issued launches per forward), kernels_per_layer (its launches
    per MoE layer), copy_host_us (the least-squares slope of host ms per forward on transfers per forward over
    the batch-1 runs), gpu_forward_ms ({batch: wall ms of a resident forward}, only where its host is at most
    HOST_SHARE_NOT_COMPUTE of it)."""
    eng = report.get("engine") or {}
    runs = [r for r in eng.get("runs", []) if measured_segmented(r)]
    out = dict.fromkeys(GRAPHS_FIGURES)
    ref = [
        r
        for r in runs
        if r.get("batch") == 1
        and r.get("cache_ratio") == 1.0
        and r.get("policy") == "demand"
        and (r.get("profile") or {}).get("launches_per_moe_layer")
    ]
    if ref and ref[0].get("host_ms_median"):
        p = ref[0]["profile"]
        out["kernels_per_layer"] = round(p["launches_per_moe_layer"])
        out["launch_us"] = round(
            1e3 * ref[0]["host_ms_median"] / (p["launches_per_moe_layer"] * p["moe_layers"]), 2
        )
    b1 = [
        r for r in runs if r.get("batch") == 1 and r.get("forwards") and r.get("host_ms_median") is not None
    ]
    if len(b1) >= 2:
        x = np.array([r["transfers_denoising"] / r["forwards"] for r in b1])
        if np.ptp(x) > 0:
            slope = np.polyfit(x, np.array([r["host_ms_median"] for r in b1]), 1)[0]
            out["copy_host_us"] = round(1e3 * float(slope), 2)
    gpu = {
        r["batch"]: r["wall_ms_median"]
        for r in eng.get("resident", [])
        if measured_segmented(r)
        and r.get("host_over_wall") is not None
        and r["host_over_wall"] <= HOST_SHARE_NOT_COMPUTE
    }
    out["gpu_forward_ms"] = gpu or None
    return out


def h200_graphs(path: str | Path | None = None) -> dict:
    """{"figures": GRAPHS_FIGURES -> value or None, "unmeasured": the names without a value, "source": the
    report or why there is none}: what the h200 profile knows of the GPU compute and the graphs-on host
    costs."""
    path = Path(path) if path is not None else repo_root() / "data" / GPU_CHECK_GRAPHS
    if not path.exists():
        return {
            "figures": dict.fromkeys(GRAPHS_FIGURES),
            "unmeasured": list(GRAPHS_FIGURES),
            "source": f"unmeasured: {path.name} does not exist "
            "(the graphs check of scripts/gpu_run.sh has not run on an H200)",
        }
    figures = from_graphs_check(load_gpu_check(path))
    return {
        "figures": figures,
        "unmeasured": [k for k, v in figures.items() if v is None],
        "source": str(path),
    }


def graphs_on(name: str = "h200", path: str | Path | None = None) -> Hardware:
    """The profile with the graphs-on host costs of a graphs check's report in place of the eager ones;
    refuses (naming what is unmeasured) rather than inventing a figure the report lacks."""
    g = h200_graphs(path)
    host = {k: g["figures"][k] for k in ("launch_us", "kernels_per_layer", "copy_host_us")}
    missing = [k for k, v in host.items() if v is None]
    if missing:
        raise SettingError(f"graphs-on host costs unmeasured ({', '.join(missing)}): {g['source']}")
    return dataclasses.replace(hardware(name), name=f"{name}-graphs", **host)
