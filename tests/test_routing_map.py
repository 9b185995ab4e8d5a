"""07 routing map: the map's logic on small grids (exact replay numbers checked against the simulator and
the floor), what the paper's figure implies read off a hand-made map, the claims, the figures, and the
timed streams through the stream-driven engine (slow)."""

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers_streams import store_run, stream_rows

from artifact.experiments.bench.order import slot_order
from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.criteria.claims import STATED
from artifact.experiments.outputs.figures import CONTROL_COLOR, save
from artifact.experiments.settings import CONTROL, load_profile
from artifact.experiments.studies import routing_map as rm
from artifact.experiments.verdicts.pooling import Replicas  # noqa: E402
from artifact.experiments.verdicts.records import INCONCLUSIVE, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED
from artifact.offload.replay.bounds import relaxed_min
from artifact.offload.replay.sim import capacity_for, replay
from artifact.offload.replay.synth import SynthParams, synth
from artifact.offload.replay.trace import mean_working_set
from artifact.offload.trace_engine import Calibration

TINY = rm.MapGrid(
    novelty=(0.05, 0.3),
    spread=(0.0, 0.3),
    ratios=(1.0, 1.73),
    layers=3,
    blocks=1,
    steps=8,
    stream_layers=2,
    stream_steps=4,
    repetitions=2,
)
BASE = SynthParams(layers=3, experts=64, top_k=4, tokens=8, blocks=1, steps=8, w=16, w_persistence=0.5)


@pytest.fixture(scope="module")
def small_map():
    return rm.routing_map(BASE, TINY, prefill=1.5, progress=False)


def fits_at(points, cut=1.5):
    return pd.DataFrame(
        [
            {
                "task": f"t{i}",
                "batch_size": 1,
                "w": 16.0,
                "novelty": nu,
                "w_spread": s,
                "w_cv_total": s,
                "w_persistence": 0.5,
                "prefill": 1.5,
                "cache_ratio": 1.0,
                "trace_oracle_cut": cut,
            }
            for i, (nu, s) in enumerate(points)
        ]
    )


def hand_map(values: dict) -> pd.DataFrame:
    """A map with oracle cuts given per (prefill, novelty) as a row over spreads (0, 0.1, 0.2)."""
    rows = []
    for (pf, nu), cuts in values.items():
        for s, c in zip((0.0, 0.1, 0.2), cuts, strict=True):
            rows.append(
                {
                    "prefill": pf,
                    "novelty": nu,
                    "w_spread": s,
                    "cache_ratio": 1.0,
                    "policy": "oracle",
                    "cut": c,
                }
            )
    return pd.DataFrame(rows)


def test_map_rows_are_the_simulators_counts(small_map):
    assert len(small_map) == 2 * 2 * 2 * 2 * len(rm.POLICIES)
    r = small_map[
        (small_map.novelty == 0.3)
        & (small_map.w_spread == 0.3)
        & small_map.prefill
        & (small_map.cache_ratio == 1.0)
    ].set_index("policy")
    t = synth(dataclasses.replace(BASE, novelty=0.3, w_spread=0.3, prefill=1.5))
    C = capacity_for(1.0, mean_working_set(t), BASE.experts)
    assert (r.cache_experts == C).all()
    lru = replay(t, "demand", C)["demand_misses"]
    assert (r.lru_misses == lru).all()
    assert r.loc["oracle", "demand_misses"] == replay(t, "oracle", C)["demand_misses"]
    assert r.loc["min", "demand_misses"] == relaxed_min(t, C)["demand_misses"]
    assert r.loc["oracle", "cut"] == pytest.approx(lru / r.loc["oracle", "demand_misses"])


def test_map_respects_the_floor_and_the_prefill_rows_have_prefill(small_map):
    lru = small_map.lru_misses
    mins = small_map[small_map.policy == "min"]
    assert (mins.demand_misses <= mins.lru_misses).all()  # min <= LRU, a demand-paging policy
    key = ["prefill", "novelty", "w_spread", "cache_ratio"]
    floor = mins.set_index(key).demand_misses
    for pol in ("last_step", "oracle"):
        p = small_map[small_map.policy == pol].set_index(key)
        # min <= misses + speculative
        assert ((p.demand_misses + p.speculative_transfers) >= floor).all(), pol
    assert (lru > 0).all()
    flat = small_map[small_map.w_spread == 0]  # W is exactly w = 16 then: accesses are known
    L, S = BASE.layers, BASE.steps
    assert (flat[~flat.prefill].accesses == L * S * 16).all()
    assert (flat[flat.prefill].accesses == L * S * 16 + L * 24).all()  # one prefill forward of 1.5 w


def test_more_cache_never_costs_lru_misses(small_map):
    lru = small_map[small_map.policy == "oracle"].pivot_table(
        index=["prefill", "novelty", "w_spread"], columns="cache_ratio", values="lru_misses"
    )
    assert (lru[1.73] <= lru[1.0]).all()


def test_crossing_and_the_implied_region_on_a_hand_made_map():
    t = paper.ORACLE_CUT
    assert rm.crossing(np.array([0.0, 0.1, 0.2]), np.array([4 * t, t, t / 4]), t) == pytest.approx(0.1)
    assert rm.crossing(np.array([0.0, 0.1]), np.array([t * np.e, t / np.e]), t) == pytest.approx(0.05)
    assert rm.crossing(np.array([0.0, 0.1]), np.array([t / 2, t / 3]), t) is None
    assert rm.crossing(np.array([0.0, 0.1]), np.array([2 * t, 2 * t]), t) == 0.1
    m = hand_map(
        {
            (False, 0.05): (t / 2, t / 3, t / 4),
            (False, 0.15): (4 * t, t, t / 4),
            (True, 0.05): (t / 2, t / 3, t / 4),
            (True, 0.15): (t / 2, t / 3, t / 4),
        }
    )
    n = rm.numbers(m, fits_at([(0.14, 0.2), (0.16, 0.05)]))
    assert n.limit[(False, 0.05)] is None and n.limit[(False, 0.15)] == pytest.approx(0.1)
    assert n.limit[(True, 0.15)] is None
    assert n.implied == (0.15, pytest.approx(0.1))  # the cpu traces' novelty row, its crossing
    assert n.cpu_inside == 1 and n.cpu_traces == 2  # (0.16, 0.05) lies left of the crossing
    assert n.best == (0.15, 0.0, 4 * t)
    assert rm.stream_points(n) == {"paper point": n.implied, "cpu point": n.cpu_point}
    c1, c2 = rm.verdicts(n)
    assert (
        c1.verdict == REPRODUCED
        and "nu 0.15: spread <= 0.10" in c1.measured
        and "nu 0.05: none" in c1.measured
    )
    assert c2.verdict == NOT_REPRODUCED and c2.measured.startswith("1 of 2 traces inside")
    assert c1.paper == STATED["07-contour"].said and c2.paper == STATED["07-traces"].said


def test_the_claims_rule_on_the_rows_without_prefill_and_their_basis_says_so():
    """The map's rows without prefill forwards (every demand a denoising step) decide; the with-prefill rows
    are printed beside them. Here at the traces' novelty (0.15) only the with-prefill row reaches the cut, so
    a rule on it would say reproduced; with the rows swapped the verdict swaps."""
    t = paper.ORACLE_CUT
    m = hand_map(
        {
            (False, 0.05): (4 * t, t, t / 4),
            (False, 0.15): (t / 2, t / 3, t / 4),
            (True, 0.05): (t / 2, t / 3, t / 4),
            (True, 0.15): (4 * t, t, t / 4),
        }
    )
    c1, c2 = rm.verdicts(rm.numbers(m, fits_at([(0.14, 0.05)])))
    assert (
        c1.verdict == NOT_REPRODUCED
        and "with prefill at nu 0.05: none; nu 0.15: spread <= 0.100" in c1.measured
    )
    assert c1.counting == (
        "synthetic streams without prefill forwards (every demand a denoising step); the "
        "with-prefill rows printed, not ruled on"
    )
    assert c2.verdict == NOT_REPRODUCED and c2.counting.startswith(
        "synthetic streams without prefill forwards"
    )
    flipped = hand_map(
        {
            (pf, nu): m[(m.prefill != pf) & (m.novelty == nu)].cut.tolist()
            for pf in (False, True)
            for nu in (0.05, 0.15)
        }
    )
    assert rm.verdicts(rm.numbers(flipped, fits_at([(0.14, 0.05)])))[0].verdict == REPRODUCED


def test_a_traces_own_cut_counts_its_denoising_steps_like_the_map_it_is_compared_with():
    t = synth(dataclasses.replace(BASE, prefill=3.0))
    fit = rm.trace_fits([t]).iloc[0]
    C = capacity_for(1.0, mean_working_set(t), BASE.experts)
    steps = {
        p: sum(replay(t, p, C, by_phase=True)["by_phase"][q]["demand_misses"] for q in ("first", "later"))
        for p in ("demand", "oracle")
    }
    every = {p: replay(t, p, C)["demand_misses"] for p in ("demand", "oracle")}
    assert fit.trace_oracle_cut == pytest.approx(steps["demand"] / steps["oracle"])
    assert fit.trace_oracle_cut != pytest.approx(every["demand"] / every["oracle"], rel=0.01)
    c2 = rm.verdicts(
        rm.numbers(
            hand_map({(pf, nu): (1.0, 1.0, 1.0) for pf in (False, True) for nu in (0.05, 0.15)}),
            rm.trace_fits([t]),
        )
    )[1]
    assert f"the traces' own replay (denoising steps): {fit.trace_oracle_cut:.1f}-" in c2.measured


def test_nothing_reaches_the_cut():
    t = paper.ORACLE_CUT
    m = hand_map({(pf, nu): (t / 2, t / 3, t / 4) for pf in (False, True) for nu in (0.05, 0.15)})
    n = rm.numbers(m, fits_at([(0.1, 0.1)]))
    # the best cell
    assert n.implied is None and rm.stream_points(n)["paper point"] == n.best[:2] == (0.05, 0.0)
    assert rm.verdicts(n)[0].verdict == NOT_MEASURABLE and rm.verdicts(n)[1].verdict == NOT_REPRODUCED


def test_at_point_interpolates_in_log_cut():
    m = hand_map({(False, 0.1): (1.0, 4.0, 16.0), (False, 0.2): (1.0, 4.0, 16.0)})
    assert rm.at_point(m, "oracle", 1.0, False, 0.15, 0.05) == pytest.approx(2.0)
    assert rm.at_point(m, "oracle", 1.0, False, 0.5, 0.5) == pytest.approx(16.0)  # clamped to the grid


def test_throughput_table_and_claim():
    rows = []
    for name, gain in (("paper point", 1.10), ("cpu point", 1.0)):
        for rep in range(4):
            for pol, v in (
                ("demand", 10.0 * gain * (1 + 0.01 * rep)),
                ("last_step", 10.0 * (1 + 0.01 * rep)),
            ):
                rows.append(
                    {
                        "task": name,
                        "batch_size": 1,
                        "cache_ratio": 1.0,
                        "bandwidth_scale": 1.0,
                        "rep": rep,
                        "policy": pol,
                        "forwards_per_second": v + (0.01 * rep if pol == "demand" else 0),
                    }
                )
    tab = rm.throughput_table(pd.DataFrame(rows)).set_index("task")
    assert tab.loc["paper point", "verdict"] == paper.FASTER
    assert tab.loc["paper point", "diff_pct"] == pytest.approx(10.0, abs=0.2)
    c = rm.throughput_claim(
        rm.throughput(Replicas(pd.DataFrame(rows), metric=rm.METRIC)), Calibration(50.0, 400.0)
    )
    assert c.timing and "50 us per expert" in c.measured and "paper point: +10.1% [" in c.measured
    assert c.paper == STATED["07-streams"].said and "only the direction is ruled" in c.paper
    # one run, nothing stored beside it: no run-to-run spread to size it, inconclusive whatever its pairs say
    assert c.verdict == INCONCLUSIVE and "record >= 3 runs" in c.reason
    assert "pairs alone" in c.interval and "no stored runs" in c.runs_text()


# --- the streams' verdict over stored runs (verdicts/pooling.py) --------------------------------------------
STORED = [
    ({"paper point": 7.0, "cpu point": 6.0}, {"paper point": 0.2, "cpu point": -0.1}),
    ({"paper point": 8.0, "cpu point": 5.0}, {"paper point": 0.0, "cpu point": 0.2}),
    # controls around 0
    ({"paper point": 9.0, "cpu point": 7.0}, {"paper point": -0.2, "cpu point": -0.1}),
]


def stored_streams(monkeypatch, tmp_path, runs=STORED):
    """The cpu profile with three stored runs of the streams (ARTIFACT_DATA in tmp_path)."""
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    P = load_profile("cpu")
    for k, (effect, control) in enumerate(runs, 1):
        store_run(P.name, k, rm.STREAMS, stream_rows(effect, control), bench_fingerprint(P))
    return P


def test_stream_claim_of_a_stored_run_is_the_pooled_one(monkeypatch, tmp_path):
    P = stored_streams(monkeypatch, tmp_path)
    this = pd.read_csv(tmp_path / "data" / "results" / "cpu" / "runs" / "run2" / f"{rm.STREAMS}.csv")
    reps = rm.replicas(P, this)
    assert reps.names == ["run1", "run2", "run3"] and reps.metric == "forwards_per_second"
    t = rm.throughput(reps)
    assert set(t.effects) == {("paper point",), ("cpu point",)} and set(t.aa) == set(t.effects)
    assert t.aa_label.startswith("stand-in A/A")  # the rows carry CONTROL, not demand's arm B
    iv = t.effects[("paper point",)].ruled
    # over the 3 runs' means 7, 8, 9
    assert iv.unit == "runs" and iv.mean == pytest.approx(8.0) and iv.low > 0
    c = rm.throughput_claim(t)
    assert c.verdict == REPRODUCED and c.ruled == "pooled" and "3 stored runs" in c.interval
    # each run alone is widened by the other two's spread (t with 1 df): shown beside, never an input
    assert set(c.per_run) <= {REPRODUCED, INCONCLUSIVE} and len(c.per_run) == 3 and c.pooled == REPRODUCED
    assert "paper point: +8.0% [" in c.measured and "(3 runs); A/A [" in c.measured  # the plain effect
    assert "compute: 20 us per expert" in c.measured  # the calibration the rows were timed with
    assert "runs [timing]: 3 stored runs: pooled reproduced" in "\n".join(c.lines())


def test_stream_claim_of_a_fresh_run_is_its_own_and_may_differ_from_the_pooled(monkeypatch, tmp_path):
    """A run that is not a stored one is ruled alone, on its own mean widened by the stored runs' spread
    (never bounded by the pooled interval): +2% on the paper point reaches 0 there (inconclusive) while the
    stored runs, pooled, are reproduced; a fresh run well below them says not reproduced, the opposite of the
    pooled verdict."""
    P = stored_streams(monkeypatch, tmp_path)
    t = rm.throughput(rm.replicas(P, stream_rows({"paper point": 2.0, "cpu point": 6.5})))
    r = t.effects[("paper point",)]
    assert r.ruled.unit == "run" and r.ruled.mean == pytest.approx(2.0) and r.ruled.low < 0 < r.ruled.high
    assert r.ruled.high < r.pooled.high  # its own interval, not a hull with the pooled one
    c = rm.throughput_claim(t)
    assert c.verdict == INCONCLUSIVE and c.ruled == "this run" and "this run alone" in c.interval
    assert c.pooled == REPRODUCED and "paper point: interval reaches 0" in c.reason
    assert c.agreement == "is inconclusive alone" and "this run is inconclusive alone" in c.runs_text()
    good = rm.throughput_claim(
        rm.throughput(rm.replicas(P, stream_rows({"paper point": 8.5, "cpu point": 7.5})))
    )
    assert good.verdict == REPRODUCED and good.ruled == "this run"
    assert good.agreement == "agrees with the stored verdict"
    bad = rm.throughput_claim(
        rm.throughput(rm.replicas(P, stream_rows({"paper point": -30.0, "cpu point": 7.5})))
    )
    assert bad.verdict == NOT_REPRODUCED and bad.agreement == "differs from the stored verdict"


def test_stream_claim_with_a_too_wide_aa_is_inconclusive_by_the_gate(monkeypatch, tmp_path):
    """The stand-in A/A varies from -4% to +4% between runs on the paper point: its pooled interval is not
    inside +-3%, and a bias of its size could explain the effect (+8%, every run above 0), so that stream is
    inconclusive; the cpu point, whose A/A is calm, is ruled as usual."""
    wide = [
        ({"paper point": 8.0 + d, "cpu point": 6.0 + d}, {"paper point": c, "cpu point": 0.0})
        for d, c in ((-1, -4.0), (0, 0.0), (1, 4.0))
    ]
    P = stored_streams(monkeypatch, tmp_path, wide)
    this = pd.read_csv(tmp_path / "data" / "results" / "cpu" / "runs" / "run1" / f"{rm.STREAMS}.csv")
    c = rm.throughput_claim(rm.throughput(rm.replicas(P, this)))
    assert c.verdict == INCONCLUSIVE and c.ruled == "pooled"
    assert "paper point: interval above 0, but stand-in A/A" in c.reason  # wide, and could explain it
    assert f"is not inside +-{thresholds.MARGIN:g}%" in c.reason and "could change it" in c.reason
    assert "cpu point" not in c.reason  # its A/A is calm: ruled as usual
    assert "paper point: +8.0% [" in c.measured  # the effect itself is untouched by the A/A


def test_stream_figure_draws_the_ruled_intervals_the_control_and_the_papers_band(monkeypatch, tmp_path):
    P = stored_streams(monkeypatch, tmp_path)
    monkeypatch.setenv("ARTIFACT_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "results"))
    rows = pd.read_csv(tmp_path / "data" / "results" / "cpu" / "runs" / "run3" / f"{rm.STREAMS}.csv")
    t = rm.throughput(rm.replicas(P, rows))
    fig, df = rm.plot_throughput(rows, t, P)
    ax = fig.axes[2]
    labels = ax.get_legend_handles_labels()[1]
    assert any(lb.startswith(f"abstract: +{paper.FASTER_PCT[0]}..+{paper.FASTER_PCT[1]}%") for lb in labels)
    assert f"stand-in A/A ({CONTROL} over demand)" in labels and "demand over last_step" in labels
    colors = {c.get_label(): c.lines[0].get_color() for c in ax.containers}
    assert colors[f"stand-in A/A ({CONTROL} over demand)"] == CONTROL_COLOR
    pp = df[df.task == "paper point"].iloc[0]
    ruled, control = t.effects[("paper point",)].ruled, t.aa[("paper point",)].ruled
    assert (pp["diff_pct"], pp["low"], pp["high"], pp["interval"]) == (
        ruled.mean,
        ruled.low,
        ruled.high,
        "runs",
    )
    assert (pp["control_diff_pct"], pp["control_low"]) == (control.mean, control.low)
    assert len(df) == len(rows) and set(df.novelty) == {0.1}  # 08 reads the paper point's novelty here
    png, _ = save(fig, df, P, "07_test_streams", log=lambda *_: None)
    assert png.stat().st_size > 10_000


def test_base_params_take_persistence_and_prefill_from_the_fits():
    f = fits_at([(0.1, 0.2), (0.2, 0.3), (0.3, 0.4)])
    f["w_persistence"] = [0.6, 0.8, 0.99]
    f["prefill"] = [1.0, 2.0, 4.0]
    b = rm.base_params(f, TINY)
    assert b.w_persistence == 0.8 and b.prefill == 0 and (b.layers, b.steps) == (TINY.layers, TINY.steps)
    assert rm.prefill_multiple(f) == 2.0
    assert rm.grid_for(load_profile("cpu")) is rm.GRIDS["cpu"]


def test_figures_are_saved_with_their_data(small_map, tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "results"))
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    P = load_profile("cpu")
    fits = fits_at([(0.1, 0.1), (0.3, 0.2)])
    n = rm.numbers(small_map, fits)
    fig, df = rm.plot_map(small_map, fits, n, P)
    png, csv = save(fig, df, P, "07_test_map", log=lambda *_: None)
    assert png.stat().st_size > 10_000 and len(pd.read_csv(csv)) == len(small_map)
    rows = pd.DataFrame(
        [
            {
                "task": k,
                "batch_size": 1,
                "cache_ratio": 1.0,
                "bandwidth_scale": 1.0,
                "rep": r,
                "policy": p,
                "novelty": 0.1,
                "w_spread": 0.2,
                "forwards_per_second": 5.0 + r + (p == "demand"),
                "stall_seconds": 0.1,
            }
            for k in ("a", "b")
            for r in range(2)
            for p in ("demand", "last_step")
        ]
    )
    fig, df = rm.plot_throughput(rows, rm.throughput(Replicas(rows, metric=rm.METRIC)), P)
    assert (
        set(df.columns) >= {"forwards_per_second", "diff_pct", "low", "high", "control_diff_pct"}
        and len(df) == 8
    )


def test_module_imports_at_the_top_and_writes_no_paper_figure():
    tree = ast.parse(Path(rm.__file__).read_text())
    local = [
        n.lineno
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef)
        for n in ast.walk(f)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    ]
    assert not local
    literals = {
        repr(n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, float)
    }
    assert repr(paper.ORACLE_CUT) not in literals


@pytest.mark.slow
def test_timed_streams_run_through_the_engine(tiny):
    P = load_profile("cpu", {"rotation": 1})
    points = {"paper point": (0.05, 0.0), "cpu point": (0.3, 0.3)}
    rows = rm.stream_runs(P, BASE, points, TINY, Calibration(20.0, 100.0), progress=False)
    assert len(rows) == 2 * 3 * TINY.repetitions  # demand, last_step, the stand-in; no warm-up row
    assert (rows.forwards == TINY.stream_steps).all() and (rows.forwards_per_second > 0).all()
    for _, g in rows.groupby("task"):
        by = g.groupby("policy")
        assert by.demand_misses.nunique().max() == 1  # counts repeat exactly across repetitions
        assert (g[g.policy == "demand"].speculative_transfers == 0).all()
        control, demand = g[g.policy == CONTROL], g[g.policy == "demand"]
        assert control.transfers.tolist() == demand.transfers.tolist()  # the control does demand's work
    for (_, rep), g in rows.groupby(["task", "rep"], sort=False):  # round r: slot_order at rotation * R + r
        assert tuple(g.policy) == slot_order(("demand", "last_step", CONTROL), TINY.repetitions + rep)
    assert rows.groupby("rep").policy.first().tolist() == ["last_step", "demand"]
    claim = rm.throughput_claim(rm.throughput(Replicas(rows, metric=rm.METRIC)))
    assert f"A/A: stand-in A/A ({CONTROL} over demand)" in claim.measured
    assert "compute: 20 us per expert, 100 us other per demand" in claim.measured  # the rows' own calibration
