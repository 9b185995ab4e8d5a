"""Every saved figure of the numbered notebooks, built as its notebook builds it but from committed inputs
only (tests/test_figures_readable.py): the stored runs of the timing studies (data/results/<profile>/runs/),
the committed 00 and 07 records, and routing traces (the test passes the committed fixture traces, so no model
runs). `fresh=True` builds the timing figures as a run that is not a stored one draws them: the last stored
run's rows as this run, beside the other stored runs."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import pytest

from artifact.experiments.outputs.paths import reference_data_dir
from artifact.experiments.settings import Settings
from artifact.experiments.verdicts.pooling import Replicas


def stored(reps: Replicas, fresh: bool) -> Replicas:
    """What a `--store` pass rules on, or (fresh) a run that is not one of the stored runs."""
    if fresh:
        return Replicas(reps.stored[-1][1], reps.stored[:-1], reps.commit, reps.metric)
    return reps.last_stored()


def quickstart(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import quickstart as qs

    df = pd.read_csv(reference_data_dir(P.name) / "00_quickstart.csv")
    off = df[df.run != "resident"]
    stall = float(off[off.part != "compute"].seconds.sum())
    q = {
        "resident": {"seconds": float(df[df.run == "resident"].seconds.sum())},
        "offloaded": {"seconds": float(off.seconds.sum()), "stall_seconds": stall},
        "cache_experts": int(off.run.iloc[0].split("C=")[1]),
    }
    return {"00_quickstart": qs.plot(q, P)[0]}


def working_set(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import working_set as w

    ws = w.working_set_table(ts)
    sim = w.stability_table(ts)
    share = w.lru_share(ts, P.cache_ratios)
    return {
        "01_working_set": w.plot_working_set(ws, P)[0],
        "01_working_set_stability": w.plot_stability(sim, share, P)[0],
    }


def miss_accounting(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import miss_accounting as m

    return {"02_miss_accounting": m.plot(m.miss_summary(m.miss_sweep(ts, P, progress=False)), P)[0]}


def bandwidth_throttling(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import bandwidth_throttling as bt

    reps = stored(bt.replicas(P, None), fresh)
    return {"03_bandwidth_throttling": bt.plot(bt.summary_table(reps.rows), bt.numbers(reps), P)[0]}


def capacity_sweep(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import capacity_sweep as cs

    return {"04_capacity_sweep": cs.plot(cs.numbers(stored(cs.replicas(P, None), fresh)), P)[0]}


def tide_head_to_head(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import tide_head_to_head as th

    return {"05_tide_head_to_head": th.plot(stored(th.replicas(P, None), fresh).rows, P)[0]}


def beyond_the_paper(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import beyond_the_paper as bp

    summary = bp.miss_summary(bp.miss_sweep(ts, P, progress=False))
    reps = stored(bp.replicas(P, None), fresh)
    n = bp.numbers(summary, bp.throughput_table(reps.rows), reps)
    return {"06_beyond_the_paper": bp.plot(summary, n, P)[0]}


def routing_map(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import routing_map as rm

    reps = stored(rm.replicas(P, None), fresh)
    out = {"07_routing_map_throughput": rm.plot_throughput(reps.rows, rm.throughput(reps), P)[0]}
    if not fresh:  # the map is drawn from the traces alone: the same in a fresh run
        g = rm.grid_for(P)
        fits = rm.trace_fits(ts)
        rmap = rm.routing_map(rm.base_params(fits, g), g, rm.prefill_multiple(fits), progress=False)
        out["07_routing_map"] = rm.plot_map(rmap, fits, rm.numbers(rmap, fits), P)[0]
    return out


def performance_model(P: Settings, ts, fresh: bool):
    from artifact.experiments.bench.results import bench_fingerprint
    from artifact.experiments.outputs.stored_runs import stored_rows
    from artifact.experiments.studies import performance_model as pm
    from artifact.experiments.studies.performance_model.validation import VALIDATION

    runs = stored_rows(P, VALIDATION, bench_fingerprint(P))
    trace = ts[0]  # the notebook's is the largest batch size's: any trace draws the same
    grid = pm.gpu_grid(
        {"paper point": pm.paper_point(P), f"{trace.meta['task']} trace": trace}, P.run_spec(), progress=False
    )
    return {"08_performance_model": pm.plot(grid, runs[-1][1], P)[0]}


def cache_design_space(P: Settings, ts, fresh: bool):
    from artifact.experiments.studies import cache_design_space as cd

    summary = cd.summary(cd.eviction_sweep(ts, P))
    combined = cd.combined(ts, P, cd.best_eviction(summary))
    return {"09_cache_design_space": cd.plot(summary, combined, P)[0]}


BUILDERS: dict[str, Callable] = {
    "00": quickstart,
    "01": working_set,
    "02": miss_accounting,
    "03": bandwidth_throttling,
    "04": capacity_sweep,
    "05": tide_head_to_head,
    "06": beyond_the_paper,
    "07": routing_map,
    "08": performance_model,
    "09": cache_design_space,
}
TIMED = ("03", "04", "05", "06", "07")  # the figures a fresh run draws differently (stored runs beside it)
TRACED = ("01", "02", "06", "07", "08", "09")  # the figures drawn from routing traces
SLOW = {
    ("07", False),
    ("08", False),
}  # stored figures that take seconds (07's routing map, 08's modelled grid)


def figure_cases(fresh: tuple[str, ...] = TIMED) -> list:
    """pytest params (study, fresh): every figure as `--store` draws it, and the studies of `fresh` as a fresh
    run draws them; SLOW ones in the slow tier."""
    return [
        pytest.param(
            s, f, id=f"{s}-{'fresh' if f else 'stored'}", marks=[pytest.mark.slow] * ((s, f) in SLOW)
        )
        for s in BUILDERS
        for f in (False, True)
        if not f or s in fresh
    ]
