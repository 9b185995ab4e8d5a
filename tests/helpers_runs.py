"""Synthetic bench rows and stored runs for the timing claims' tests (verdicts/pooling.py): no model runs.

make_rows builds one run's rows: per cell, `reps` pairs of policy A and B whose `metric` differs by the cell's
percentage, +-noise points alternating pair by pair, and optionally the A/A beside B: the stand-in
(settings.CONTROL), or with `arm` demand's own A/A pair (rows of demand told apart by their `arm` column).
store_runs writes runs as data/results/<profile>/runs/run<k>/<stem>.csv with their run.json and
manifest.json, the layout stored_runs.stored_runs reads (under ARTIFACT_DATA)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from artifact.experiments.outputs.manifest import write_manifest
from artifact.experiments.settings import CONTROL


def make_rows(
    cells: dict,
    a: str,
    b: str,
    metric: str = "tokens_per_second",
    reps: int = 4,
    noise: float = 0.3,
    control: float | dict | None = 0.0,
    control_noise: float = 0.2,
    fingerprint: str = "",
    misses: dict | None = None,
    base: float = 50.0,
    arm: bool = False,
) -> pd.DataFrame:
    """One run's rows. cells: {(task, batch_size, cache_ratio, bandwidth_scale): % of A over B}; control: the
        % of CONTROL over B (one number, or per cell; None: no control rows); misses: {policy: (demand misses,
        speculative transfers)} per run (default 100 and 0 for every policy); arm: the A/A is demand's arm B
    over its arm A (every row gets an `arm` column, A but for that second demand run), not CONTROL over B."""
    rows = []
    for (task, bs, ratio, scale), d in cells.items():
        aa = control.get((task, bs, ratio, scale), 0.0) if isinstance(control, dict) else control
        for rep in range(reps):
            sign = 1 if rep % 2 else -1
            value = base * (1 + 0.01 * rep) / scale
            policies = [(b, value, "A"), (a, value * (1 + (d + noise * sign) / 100), "A")]
            if aa is not None:
                # the A/A is over demand: B must be demand for the arm-B row to pair with it
                second = ("demand", "B") if arm else (CONTROL, "A")
                policies.append((second[0], value * (1 + (aa - control_noise * sign) / 100), second[1]))
            for order, (pol, v, which) in enumerate(policies):
                m, spec = (misses or {}).get(pol, (100, 0))
                seconds = v if metric != "tokens_per_second" else 128 / v
                rows.append(
                    {
                        "profile": "cpu",
                        "fingerprint": fingerprint,
                        "task": task,
                        "batch_size": bs,
                        "cache_ratio": ratio,
                        "bandwidth_scale": scale,
                        "policy": pol,
                        "rep": rep,
                        "order": order,
                        "seconds": 2 + seconds,
                        "forwards": 100,
                        "tokens_per_second": 128 / (2 + seconds),
                        "stall_seconds": 0.5 / scale,
                        "link_gbps": 0.1 * scale,
                        "link_busy_seconds": 1.0,
                        "tokens_sha": "abc",
                        "demand_misses": m,
                        "speculative_transfers": spec,
                        "cache_experts": 10,
                    }
                    | ({"arm": which} if arm else {})
                    | {metric: v}
                )
    return pd.DataFrame(rows)


def store_runs(data: Path, profile: str, stem: str, runs: list[pd.DataFrame]) -> list[Path]:
    """Write `runs` as stored runs run1, run2, ... of `profile` under the data folder `data`
    (ARTIFACT_DATA)."""
    out = []
    for k, rows in enumerate(runs, 1):
        d = Path(data) / "results" / profile / "runs" / f"run{k}"
        d.mkdir(parents=True)
        rows.to_csv(d / f"{stem}.csv", index=False)
        (d / "run.json").write_text(json.dumps({"run": k, "commit": "abc1234", "files": [f"{stem}.csv"]}))
        write_manifest(d)
        out.append(d)
    return out


def read_back(rows: pd.DataFrame, path: Path) -> pd.DataFrame:
    """`rows` as a run reads them: written to `path` and read back (the values a stored copy holds)."""
    rows.to_csv(path, index=False)
    return pd.read_csv(path)
