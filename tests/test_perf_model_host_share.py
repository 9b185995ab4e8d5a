"""Modelled cells follow the measured cells' host-share rule (performance_model/engines.py and the claims of
notebook 08): a modelled step's host work, the rule on a modelled cell, and the segmented engine's pricing."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from artifact.experiments.criteria import thresholds
from artifact.experiments.hardware import HARDWARE
from artifact.experiments.settings import load_profile
from artifact.experiments.studies import performance_model as pm
from artifact.experiments.studies.performance_model import explain as ex
from artifact.experiments.studies.performance_model import search as se
from artifact.experiments.verdicts import rules
from artifact.offload.links.costs import Costs
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.spec import RunSpec
from artifact.offload.trace_engine import run_virtual

P = load_profile("cpu")


@pytest.fixture(scope="module")
def paper_point():
    return pm.paper_point(P)


def synthetic_run(host: float, launches: float, device: float, stall: float) -> dict:
    """A modelled run's decomposition (model_run's keys), ms per step: the host term, the launches above the
    rooflines (all in the non-expert compute), the device's rooflines and the stall."""
    ms = 1e-3
    return {
        "host_per_step": host * ms,
        "compute_per_step": (launches + device) * ms,
        "device_compute_per_step": device * ms,
        "experts_per_step": 0.0,
        "device_experts_per_step": 0.0,
        "stall_per_step": stall * ms,
        "seconds_per_step": (host + launches + device + stall) * ms,
    }


def grid_of(cells: list[tuple[str, float, float, dict]]) -> pd.DataFrame:
    """A grid with one cell per (hardware, C/W, demand over last_step %, run): both policies carry the run's
    host share."""
    rows = []
    for hw, ratio, diff, run in cells:
        share = pm.host_work(run)["share"]
        for policy, tps in (("demand", 100.0 * (1 + diff / 100)), ("last_step", 100.0)):
            rows.append(
                {
                    "hardware": hw,
                    "shape": pm.CLAIM_SHAPE,
                    "trace": "planted",
                    "cache_ratio": ratio,
                    "link_priority": "fifo",
                    "policy": policy,
                    "tokens_per_second": tps,
                    "host_share": share,
                }
            )
    return pd.DataFrame(rows)


HOST_BOUND = synthetic_run(host=3.0, launches=25.0, device=0.2, stall=0.1)  # about 99% host work
LINK_BOUND = synthetic_run(host=3.0, launches=0.1, device=0.7, stall=4.0)  # about 40%


def test_host_work_adds_up_and_reads_the_planted_shares():
    for run in (HOST_BOUND, LINK_BOUND):
        h = pm.host_work(run)
        assert math.isclose(h["device"] + h["link"] + h["host"], run["seconds_per_step"], rel_tol=1e-12)
    assert pm.host_work(HOST_BOUND)["share"] == pytest.approx(28.0 / 28.3)
    assert pm.host_work(LINK_BOUND)["share"] == pytest.approx(3.1 / 7.8)


def test_a_modelled_cell_over_the_host_share_limit_is_inconclusive_with_the_host_bound_reason():
    d = pm.modelled_cells(grid_of([("h200", 1.0, 10.0, HOST_BOUND)]))
    share = pm.host_work(HOST_BOUND)["share"]
    assert share > thresholds.HOST_SHARE_LIMIT and d.gate.iloc[0] == rules.host_bound(share)
    verdict, reason = pm.rule_modelled(rules.FASTER, d)
    assert verdict == rules.INCONCLUSIVE  # +10% would reproduce the claim: the gate alone holds it back
    assert reason == f"h200 planted C/W 1: {rules.host_bound(share)}"


def test_a_modelled_cell_under_the_limit_decides():
    d = pm.modelled_cells(grid_of([("h200", 1.0, 10.0, LINK_BOUND)]))
    assert d.gate.iloc[0] is None
    assert pm.rule_modelled(rules.FASTER, d)[0] == rules.REPRODUCED
    slower = pm.modelled_cells(grid_of([("h200", 1.0, -2.0, LINK_BOUND)]))
    assert pm.rule_modelled(rules.FASTER, slower)[0] == rules.NOT_REPRODUCED
    # one decided cell that fails makes the claim fail, whatever a host-bound cell beside it says
    both = pm.modelled_cells(grid_of([("h200", 1.0, -2.0, LINK_BOUND), ("a5000", 1.0, 10.0, HOST_BOUND)]))
    assert pm.rule_modelled(rules.FASTER, both)[0] == rules.NOT_REPRODUCED
    # the equivalence claim of C/W 0.43 by the same rule
    level = pm.modelled_cells(grid_of([("h200", 0.43, 1.0, LINK_BOUND)]))
    assert pm.rule_modelled(rules.NO_DIFFERENCE, level)[0] == rules.REPRODUCED
    apart = pm.modelled_cells(grid_of([("h200", 0.43, 5.0, LINK_BOUND)]))
    assert pm.rule_modelled(rules.NO_DIFFERENCE, apart)[0] == rules.NOT_REPRODUCED


def test_the_cells_share_is_the_larger_of_its_policies():
    g = grid_of([("h200", 1.0, 10.0, LINK_BOUND)])
    g.loc[g.policy == "last_step", "host_share"] = 0.7
    assert pm.cell_host_shares(g).host_share.iloc[0] == 0.7
    assert pm.modelled_cells(g).gate.iloc[0] == rules.host_bound(0.7)


def test_the_paper_points_eager_step_is_84_percent_host_work(paper_point):
    """The issue's figures, computed from the model's own decomposition at the H200 paper point: of a 32.90 ms
    step, 25.07 ms non-expert compute (0.219 ms of it roofline) and 2.93 ms host term."""
    d = ex.decomposition(paper_point, HARDWARE["h200"], P.run_spec())
    step = d.table.loc["step", "demand"]
    compute = d.table.loc[ex.TERMS["compute"], "demand"]
    host = d.table.loc[ex.TERMS["host"], "demand"]
    assert 1e3 * step == pytest.approx(32.90, abs=0.01) and 1e3 * compute == pytest.approx(25.07, abs=0.01)
    assert 1e3 * d.device_compute == pytest.approx(0.219, abs=0.001) and 1e3 * host == pytest.approx(
        2.93, abs=0.01
    )
    h = d.host["demand"]
    assert h["launch_compute"] == pytest.approx(compute - d.device_compute, rel=1e-12)
    narrow = (host + h["launch_compute"]) / step  # the host term and the non-expert launches
    assert narrow == pytest.approx(0.844, abs=0.005)
    assert h["share"] >= narrow and d.host_share > thresholds.HOST_SHARE_LIMIT
    text = ex.decomposition_text(d)
    assert "eager engine" in text and "host-bound" in text and f"{100 * narrow:.1f}%" in text


def test_segmented_pricing_puts_the_host_share_under_eagers(paper_point):
    spec = P.run_spec()
    for gpu in pm.GPUS:
        eager = se.pair_runs(paper_point, HARDWARE[gpu], spec, 1.0, engine=pm.EAGER)
        seg = se.pair_runs(paper_point, HARDWARE[gpu], spec, 1.0, engine=pm.SEGMENTED)
        for p in se.PAIR:
            assert pm.host_work(seg[p])["share"] < pm.host_work(eager[p])["share"]
            # the same engine work on the device, the same copies and their host time: only launches differ
            assert seg[p]["transfers"] == eager[p]["transfers"]
            assert seg[p]["host_per_step"] == pytest.approx(eager[p]["host_per_step"], rel=1e-12)
            assert seg[p]["device_compute_per_step"] == pytest.approx(
                eager[p]["device_compute_per_step"], rel=1e-12
            )
        # one replay per (forward, MoE layer), one more at each forward's first MoE layer
        forwards = seg["demand"]["steps"]
        replays = len(paper_point.demands) + forwards
        launches = pm.host_work(seg["demand"])["launch_compute"]
        assert launches == pytest.approx(replays * pm.REPLAY_US * 1e-6 / forwards, rel=1e-9)
    d = ex.decomposition(paper_point, HARDWARE["a5000"], spec, engine=pm.SEGMENTED)
    assert d.host_share <= thresholds.HOST_SHARE_LIMIT and "not host-bound" in ex.decomposition_text(d)


def test_metering_leaves_the_modelled_time_as_it_is():
    stream = synth(SynthParams(layers=2, blocks=1, steps=4, w=30.0, seed=2))
    costs = Costs(HARDWARE["h200"], pm.shape(pm.CLAIM_SHAPE))
    spec = RunSpec().replace(capacity=20, policy="last_step")
    bare = run_virtual(stream, pm.priced_spec(costs, spec), costs)
    out = pm.model_run(stream, costs, spec)
    assert out["seconds"] == bare["seconds"] and out["transfers"] == bare["transfers"]
    assert 0 < out["device_compute_per_step"] <= out["compute_per_step"]
    assert 0 < out["device_experts_per_step"] <= out["experts_per_step"]


def test_the_segmented_engine_refuses_a_calibrated_profile_and_an_unknown_engine():
    from artifact.errors import SettingError

    with pytest.raises(SettingError, match="calibrated"):
        pm.costs_for(HARDWARE["cpu-emulated"], pm.shape("tiny"), pm.SEGMENTED)
    with pytest.raises(SettingError, match="unknown engine"):
        pm.costs_for(HARDWARE["h200"], pm.shape("tiny"), "graphs")


def test_the_engines_table_rules_each_cell_by_its_host_share(paper_point):
    df = pm.engines_table(paper_point, P.run_spec())
    assert set(df.engine) == set(pm.ENGINES) and set(df.hardware) == set(pm.GPUS)
    assert set(df.cache_ratio) == set(pm.GRID_RATIOS)
    assert ((df.ruled == "host-bound") == (df.host_share > thresholds.HOST_SHARE_LIMIT)).all()
    assert (df[df.engine == pm.EAGER].ruled == "host-bound").all()  # the eager engine hides the link
    seg = df[df.engine == pm.SEGMENTED].set_index(["hardware", "cache_ratio"])
    eager = df[df.engine == pm.EAGER].set_index(["hardware", "cache_ratio"])
    assert (seg.host_share < eager.host_share).all() and (seg.link_busy > eager.link_busy).all()
    text = pm.engine_predictions_text(df)
    assert "segmented" in text and f"{pm.REPLAY_US:g} us" in text
    for r in seg.reset_index().itertuples():
        assert f"{r.diff_pct:+.2f}%" in text


def test_the_claims_name_the_engine_they_price():
    small = synth(SynthParams(layers=2, blocks=1, steps=4, w=30.0, seed=2))
    grid = pm.gpu_grid({"paper point": small}, RunSpec(), progress=False)
    assert set(grid.engine) == {pm.ENGINE}
    d = pm.modelled_cells(grid)
    assert ((d.gate.notna()) == (d.host_share > thresholds.HOST_SHARE_LIMIT)).all()
    summary = {"median_abs_error": 0.05, "worst_abs_error": 0.2, "cells": 6, "signs": []}
    from helpers_streams import validation_rows

    claims = pm.verdicts(grid, pm.errors_of(validation_rows(0.05), []), summary, "given")
    for c in claims[:2]:
        assert f"{pm.ENGINE} engine" in c.claim and f"{pm.ENGINE} engine" in c.measured
        if d.gate.notna().all():
            assert c.verdict == rules.INCONCLUSIVE and "host-bound" in c.reason
