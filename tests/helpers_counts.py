"""The committed exact-count outputs of the cpu profile, recomputed the way the notebooks compute them.

Notebooks 01, 02, 06, 07 and 09 save data computed from the profile's routing traces by exact replay (no
timing): the CSVs under data/results/cpu/ (06's `misses` panel only: its other rows are timings) and 09's
libCacheSim check (its claim record). `recompute` runs the studies' own functions on the given traces (the
notebook cells up to their `save`, without the timed parts) and `differences` compares a recomputed output
with the committed file value for value. Used by tests/test_exact_counts.py, in process and, through
`python tests/helpers_counts.py OUT`, in subprocesses under other environments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "data" / "results" / "cpu"
# name -> the study computing it (a file data/results/cpu/<name>.csv unless it ends in .claims.json)
OUTPUTS = (
    "01_working_set",
    "01_working_set_stability",
    "02_miss_accounting",
    "06_beyond_the_paper",
    "07_routing_map",
    "09_cache_design_space",
    "09_libcachesim_check",
)
LIBCACHESIM = "libCacheSim's LRU"  # the words naming 09's libCacheSim claim


def settings(torch_threads: int | None = None):
    """The cpu profile (torch's thread count set from it, or from `torch_threads`)."""
    from artifact.experiments import harness

    return harness.setup("cpu", {} if torch_threads is None else {"torch_threads": torch_threads})


def committed_traces(P):
    """The committed cpu traces (data/results/cpu/traces/) in the order harness.traces returns them, never
    recorded (a recorded trace depends on the machine's float kernels: docs/DESIGN.md, "Exact counts")."""
    from artifact.experiments.harness import TRACE_SETTINGS, reference_trace_path, trace_jobs
    from artifact.experiments.settings import fingerprint
    from artifact.offload.replay.trace import Trace

    ts = [Trace.load(reference_trace_path(P, *j)) for j in trace_jobs(P)]
    stale = [str(t.path) for t in ts if t.meta.get("profile_fingerprint") != fingerprint(P, TRACE_SETTINGS)]
    assert not stale, f"committed traces of other settings than the cpu profile's (store them again): {stale}"
    return ts


def _figure_data(plotted) -> pd.DataFrame:
    import matplotlib.pyplot as plt

    fig, df = plotted
    plt.close(fig)
    return df


def recompute(ts, P, names=OUTPUTS) -> dict[str, pd.DataFrame]:
    """Each output in `names` computed from the traces `ts` by the code of its notebook."""
    import matplotlib

    matplotlib.use("Agg")
    from artifact.experiments.studies import beyond_the_paper, miss_accounting, routing_map, working_set
    from artifact.experiments.studies import cache_design_space as cd

    out = {}
    if {"01_working_set", "01_working_set_stability"} & set(names):
        ws = working_set.working_set_table(ts)
        out["01_working_set"] = _figure_data(working_set.plot_working_set(ws, P))
        sim, share = working_set.stability_table(ts), working_set.lru_share(ts, P.cache_ratios)
        out["01_working_set_stability"] = _figure_data(working_set.plot_stability(sim, share, P))
    if "02_miss_accounting" in names:
        summary = miss_accounting.miss_summary(miss_accounting.miss_sweep(ts, P, progress=False))
        out["02_miss_accounting"] = _figure_data(miss_accounting.plot(summary, P))
    if "06_beyond_the_paper" in names:  # the `misses` panel of 06's figure data is its count summary
        summary = beyond_the_paper.miss_summary(beyond_the_paper.miss_sweep(ts, P, progress=False))
        out["06_beyond_the_paper"] = summary.assign(panel="misses")
    if "07_routing_map" in names:
        g = routing_map.grid_for(P)
        fits = routing_map.trace_fits(ts)
        rmap = routing_map.routing_map(
            routing_map.base_params(fits, g), g, routing_map.prefill_multiple(fits), progress=False
        )
        out["07_routing_map"] = _figure_data(
            routing_map.plot_map(rmap, fits, routing_map.numbers(rmap, fits), P)
        )
    if {"09_cache_design_space", "09_libcachesim_check"} & set(names):
        summary = cd.summary(cd.eviction_sweep(ts, P))
        if "09_cache_design_space" in names:
            combined = cd.combined(ts, P, cd.best_eviction(summary))
            out["09_cache_design_space"] = _figure_data(cd.plot(summary, combined, P))
        if "09_libcachesim_check" in names:
            check = cd.libcachesim_check(ts)
            claim = next(c for c in cd.verdicts(cd.numbers(summary, check)) if LIBCACHESIM in c.claim)
            out["09_libcachesim_check"] = pd.DataFrame(
                [{"claim": claim.claim, "measured": claim.measured, "verdict": claim.verdict}]
            )
    return {n: out[n] for n in names}


def committed(name: str) -> pd.DataFrame:
    """The committed counterpart of a recompute output."""
    if name == "09_libcachesim_check":
        record = json.loads((REFERENCE / "09_cache_design_space.claims.json").read_text())
        rows = [
            {k: c[k] for k in ("claim", "measured", "verdict")}
            for c in record["claims"]
            if LIBCACHESIM in c["claim"]
        ]
        return pd.DataFrame(rows)
    df = pd.read_csv(REFERENCE / f"{name}.csv")
    if name == "06_beyond_the_paper":
        df = df[df.panel == "misses"].dropna(axis=1, how="all").reset_index(drop=True)
    return df


def _normal(df: pd.DataFrame) -> pd.DataFrame:
    """As a CSV round trip leaves it (to_csv, then read_csv): the committed files' types."""
    import io

    return pd.read_csv(io.StringIO(df.to_csv(index=False)))


def _plain(v):
    return v.item() if isinstance(v, np.generic) else v


def differences(
    name: str, fresh: pd.DataFrame, reference: pd.DataFrame | None = None, limit: int = 10
) -> list[str]:
    """Where `fresh` differs from the committed output (or `reference`), value for value: columns, rows and
    every cell (floats exactly, as a CSV stores them: shortest repr round trips). Empty: equal."""
    ref = committed(name) if reference is None else reference
    got = _normal(fresh)
    if name == "06_beyond_the_paper":
        got = got.dropna(axis=1, how="all")
    ref = _normal(ref)
    if list(got.columns) != list(ref.columns):
        return [f"{name}: columns {list(got.columns)} != committed {list(ref.columns)}"]
    if len(got) != len(ref):
        return [f"{name}: {len(got)} rows != committed {len(ref)}"]
    out = []
    for c in got.columns:
        a, b = got[c].to_numpy(), ref[c].to_numpy()
        same = (a == b) | (pd.isna(a) & pd.isna(b))
        for r in np.flatnonzero(~same)[: limit - len(out)]:
            key = {
                k: _plain(got.at[r, k])
                for k in (
                    "prefill",
                    "batch_size",
                    "cache_ratio",
                    "policy",
                    "task",
                    "layer",
                    "block_step",
                    "novelty",
                    "w_spread",
                    "panel",
                )
                if k in got and not pd.isna(got.at[r, k])
            }
            out.append(f"{name} row {r} {key}: {c} = {_plain(a[r])!r}, committed {_plain(b[r])!r}")
        if len(out) >= limit:
            break
    return out


def runtime() -> dict:
    """What the environment variations of tests/test_exact_counts.py change, as this process sees it."""
    import torch

    core = getattr(np, "_core", None) or np.core
    umath = core._multiarray_umath
    return {
        "str_hash": hash("artifact"),
        "torch_threads": torch.get_num_threads(),
        "numpy_simd": [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)],
    }


if __name__ == "__main__":
    # python tests/helpers_counts.py OUT [NAME ...]: each output as OUT/<name>.csv, and OUT/runtime.json;
    # COUNTS_TORCH_THREADS sets torch's thread count (else the profile's)
    import os

    sys.path.insert(0, str(REPO))
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    threads = os.environ.get("COUNTS_TORCH_THREADS")
    P = settings(int(threads) if threads else None)
    for n, df in recompute(committed_traces(P), P, tuple(sys.argv[2:]) or OUTPUTS).items():
        df.to_csv(dest / f"{n}.csv", index=False)
    (dest / "runtime.json").write_text(json.dumps(runtime()))
