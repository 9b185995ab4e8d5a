"""Synthetic rows of notebook 07's timed streams and 08's validation cells, and stored runs of them
(data/results/<profile>/runs/run<k>/, stored_runs/), for tests that rule claims without running a model."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from artifact.experiments.outputs.manifest import write_manifest
from artifact.experiments.outputs.stored_runs import runs_root
from artifact.experiments.settings import CONTROL

STREAM_NAMES = ("paper point", "cpu point")


def stream_rows(
    effect: dict[str, float], control: dict[str, float] | None = None, reps: int = 4, jitter: float = 0.2
) -> pd.DataFrame:
    """Rows like routing_map.stream_runs: per stream, `reps` rounds of demand, last_step and the stand-in A/A
    (CONTROL). demand is `effect[stream]` % faster than last_step in forwards/s, the stand-in
    `control[stream]` % faster than demand (0 by default); each pair's difference moves by +-`jitter` points
    around it (alternating), so a run's mean is exactly the given effect and its pairs have a spread."""
    control = control or {}
    rows = []
    for name, pct in effect.items():
        for rep in range(reps):
            base = 10.0 * (1 + 0.01 * rep)
            d = pct + (jitter if rep % 2 == 0 else -jitter)
            demand = base * (1 + d / 100)
            for policy, fps in (
                ("demand", demand),
                ("last_step", base),
                (CONTROL, demand * (1 + control.get(name, 0.0) / 100)),
            ):
                rows.append(
                    {
                        "task": name,
                        "batch_size": 1,
                        "cache_ratio": 1.0,
                        "bandwidth_scale": 1.0,
                        "rep": rep,
                        "policy": policy,
                        "novelty": 0.1,
                        "w_spread": 0.2,
                        "cache_experts": 16,
                        "forwards": 16,
                        "seconds": 16 / fps,
                        "forwards_per_second": fps,
                        "stall_seconds": 0.1,
                        "link_busy_seconds": 0.2,
                        "demand_misses": 5,
                        "speculative_transfers": 0,
                        "transfers": 5,
                        "calibration": "20 us per expert, 100 us other per demand",
                    }
                )
    return pd.DataFrame(rows)


def validation_rows(
    error: float, last_step_over_demand: float = 0.10, ratios=(0.43, 1.0), batches=(1, 4), reps: int = 2
) -> pd.DataFrame:
    """Rows like performance_model.validate_cpu whose every cell (batch x C/W x policy, its repetitions' mean)
    has modelled seconds per step exactly `error` above the measured: the run's median absolute error is
    `error`. last_step takes `last_step_over_demand` longer per step than demand, in the measurement and the
    model."""
    rows = []
    for b in batches:
        for ratio in ratios:
            for policy, s in (("demand", 0.10 * b), ("last_step", 0.10 * b * (1 + last_step_over_demand))):
                measured = [s * (1 + 0.001 * rep) for rep in range(reps)]
                modeled = sum(measured) / reps * (1 + error)
                for rep, m in enumerate(measured):
                    rows.append(
                        {
                            "task": "gsm8k",
                            "batch_size": b,
                            "cache_ratio": ratio,
                            "bandwidth_scale": 1.0,
                            "cache_experts": 8,
                            "rep": rep,
                            "policy": policy,
                            "measured_seconds_per_step": m,
                            "modeled_seconds_per_step": modeled,
                            "measured_stall": 0.0,
                            "modeled_stall": 0.0,
                            "demand_misses": 3,
                            "modeled_demand_misses": 3,
                            "forwards": 16,
                            "error": modeled / m - 1,
                            "calibration": "given",
                        }
                    )
    return pd.DataFrame(rows)


def store_run(profile: str, k: int, stem: str, rows: pd.DataFrame, fingerprint: str | None = None) -> Path:
    """Write `rows` as stored run k's <stem>.csv (with the fingerprint column when given), its run.json and
    manifest.json, under the data folder ARTIFACT_DATA names (stored_runs.runs_root)."""
    d = runs_root(profile) / f"run{k}"
    d.mkdir(parents=True, exist_ok=True)
    (rows.assign(fingerprint=fingerprint) if fingerprint is not None else rows).to_csv(
        d / f"{stem}.csv", index=False
    )
    files = sorted(p.name for p in d.glob("*.csv"))
    (d / "run.json").write_text(json.dumps({"run": k, "commit": "abc123", "files": files}))
    write_manifest(d)
    return d
