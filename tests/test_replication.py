"""The run as the unit of replication (artifact/experiments/replication.py) and the verdict rules it feeds
(rules.py): intervals over per-run means, one-run intervals and their hull with the pooled one, the A/A
control as a direction claim's null (difference in differences) and an equivalence claim's gate, one interval
per cell, the paper's magnitude reported apart, stored runs on disk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from artifact.experiments import replication, stored_runs
from artifact.experiments.verdicts.records import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.verdicts.pairs import STALL_SHARE, RunEffect, run_effects
from artifact.experiments.verdicts.pooling import Compared, Replicas, Replicated, one_run_interval, pooled_interval
from artifact.experiments.verdicts.rules import Interval, control_ruling, faster, no_difference, not_faster
from artifact.experiments.settings import CONTROL, load_profile
from artifact.experiments.outputs.paired_table import CELL_KEYS
from artifact.experiments.verdicts.judge import judge

CELL = list(CELL_KEYS)
KEY = ("gsm8k", 1, 1.0, 1.0)


def rows(
    effects: dict,
    control: dict | None = None,
    reps: int = 2,
    base: float = 100.0,
    jitter: float = 0.0,
    seed: int = 0,
) -> pd.DataFrame:
    """Bench-like rows of one run: per cell key (batch size, C/W) demand at `base` tokens/s, last_step slower
    so that demand over last_step is effects[key] % per pair (+- jitter), the A/A control at control[key] %
    over demand."""
    rng = np.random.default_rng(seed)
    out = []
    for (b, ratio), eff in effects.items():
        for rep in range(reps):
            e = eff + (jitter * (1 if rep % 2 else -1) if jitter else 0.0) + rng.normal(0, 1e-9)
            cell = dict(task="gsm8k", batch_size=b, cache_ratio=ratio, bandwidth_scale=1.0, rep=rep)
            out.append(dict(cell, policy="demand", tokens_per_second=base))
            out.append(dict(cell, policy="last_step", tokens_per_second=base / (1 + e / 100)))
            if control is not None:
                out.append(
                    dict(cell, policy=CONTROL, tokens_per_second=base * (1 + control[(b, ratio)] / 100))
                )
    return pd.DataFrame(out)


def stored(*frames) -> tuple:
    return tuple((f"run{i + 1}", f) for i, f in enumerate(frames))


# --- intervals ------------------------------------------------------------------------------------
def test_the_pooled_interval_is_the_t_interval_over_per_run_means():
    runs = stored(*(rows({(1, 1.0): m}) for m in (10.0, 14.0, 12.0)))
    r = Replicas(runs[0][1], runs).effects("demand", "last_step", CELL)[KEY]
    means = [10.0, 14.0, 12.0]
    half = stats.t.ppf(0.975, 2) * np.std(means, ddof=1) / np.sqrt(3)
    assert r.pooled.unit == "runs" and r.pooled.n == 3
    assert r.pooled.mean == pytest.approx(12.0, abs=1e-6)
    assert (r.pooled.low, r.pooled.high) == (
        pytest.approx(12 - half, abs=1e-6),
        pytest.approx(12 + half, abs=1e-6),
    )
    # each stored run's own interval: its mean +- t_2 * sd of the run means
    one = stats.t.ppf(0.975, 2) * np.std(means, ddof=1)
    assert [iv.mean for iv in r.runs] == pytest.approx(means, abs=1e-6)
    assert r.runs[0].high - r.runs[0].low == pytest.approx(2 * one, abs=1e-6)


def test_a_stored_run_is_ruled_pooled_and_another_run_on_the_hull_of_its_interval_and_the_pooled_one():
    runs = stored(*(rows({(1, 1.0): m}) for m in (10.0, 14.0, 12.0)))
    mine = Replicas(runs[1][1], runs).effects("demand", "last_step", CELL)[KEY]
    assert mine.stored and mine.ruled is mine.pooled
    fresh = rows({(1, 1.0): 25.0}, jitter=0.5)
    other = Replicas(fresh, runs).effects("demand", "last_step", CELL)[KEY]
    assert not other.stored and other.this.unit == "run" and other.ruled.unit == "hull"
    assert other.this.mean == pytest.approx(25.0, abs=0.01)
    assert other.ruled.low == pytest.approx(other.pooled.low) and other.ruled.high == pytest.approx(
        other.this.high
    )
    # the widening: the stored runs' spread, or this run's own pairs' when that is larger
    wide = rows({(1, 1.0): 11.0}, jitter=30.0)
    w = Replicas(wide, runs).effects("demand", "last_step", CELL)[KEY].this
    assert w.high - w.low > other.this.high - other.this.low


def test_without_stored_runs_a_run_has_only_its_pairs_and_says_so():
    r = Replicas(rows({(1, 1.0): 5.0}, reps=4, jitter=1.0)).effects("demand", "last_step", CELL)[KEY]
    assert (
        r.this.unit == "pairs" and r.this.n == 4 and r.pooled is None and not r.stored and r.ruled is r.this
    )
    t = judge(Compared({("c",): r}), faster(), str)
    assert t.ruled_on == replication.WITHIN and t.per_run == ()


def test_fewer_runs_than_the_minimum_is_inconclusive():
    iv = pooled_interval([10.0, 11.0])
    assert iv.n == 2 < thresholds.MIN_RUNS and not iv.usable
    assert faster()(iv).verdict == INCONCLUSIVE and f"needs >= {thresholds.MIN_RUNS} runs" in faster()(iv).why


# --- a single run never contradicts the pooled verdict: fresh runs from the predictive distribution ---------
def fresh_runs(means, n_pairs: int, draws: int, rng) -> list[RunEffect]:
    """Fresh runs of one cell drawn from the predictive distribution of the stored runs' means (a run's mean
    ~ mean + s * sqrt(1 + 1/N) * t_(N-1)), each with n_pairs pairs around it (the pairs' sd drawn too)."""
    m, s, n = float(np.mean(means)), float(np.std(means, ddof=1)), len(means)
    centre = m + s * np.sqrt(1 + 1 / n) * rng.standard_t(n - 1, draws)
    sd = rng.uniform(0.1, 3.0, draws) * max(s, 0.1)
    return [
        RunEffect(float(np.mean(d)), tuple(d))
        for d in (rng.normal(c, w, n_pairs) for c, w in zip(centre, sd))
    ]


def single_verdicts(cells: dict, q, draws: int, seed: int) -> tuple[str, list[str]]:
    """(the pooled verdict, each fresh run's verdict) of a claim over `cells` {key: stored run means}."""
    rng = np.random.default_rng(seed)
    pooled = {k: pooled_interval(v) for k, v in cells.items()}
    per_cell = {k: fresh_runs(v, 4, draws, rng) for k, v in cells.items()}
    stored_view = {k: Replicated(pooled[k], (), pooled[k], True) for k in cells}
    want = judge(Compared(stored_view), q, str).verdict
    got = []
    for i in range(draws):
        eff = {k: Replicated(one_run_interval(per_cell[k][i], cells[k]), (), pooled[k], False) for k in cells}
        got.append(judge(Compared(eff), q, str).verdict)
    return want, got


@pytest.mark.parametrize(
    "q, cells",
    [
        # 07's earlier stored runs (data/results/cpu/earlier_runs/a7d8449: demand over last_step net of the
        # control, %
        # forwards/s, per run), as they are, shifted by +0.2 (where the rule this replaces gave a pooled
        # `reproduced`
        # beside per-run `not reproduced`) and by +2.8 (the paper point then straddles the boundary +3)
        (
            faster(paper=paper.FASTER_PCT),
            {("paper point",): [0.391, 0.559, 0.859], ("cpu point",): [10.313, 9.213, 9.274]},
        ),
        (
            faster(paper=paper.FASTER_PCT),
            {("paper point",): [0.591, 0.759, 1.059], ("cpu point",): [10.513, 9.413, 9.474]},
        ),
        (
            faster(paper=paper.FASTER_PCT),
            {("paper point",): [3.191, 3.359, 3.659], ("cpu point",): [10.313, 9.213, 9.274]},
        ),
        # 04-like cells: clearly faster, and one near the boundary
        (faster(), {(1,): [28.0, 26.9, 29.6], (2,): [3.1, 4.4, 5.9], (3,): [0.9, -4.1, 4.0]}),
        (no_difference(), {(1,): [0.4, -1.1, 1.3], (2,): [2.1, 4.0, 2.9]}),
        (not_faster(), {(1,): [-8.1, -6.0, -7.7], (2,): [1.2, 2.8, 0.3]}),
    ],
)
def test_a_fresh_run_never_gives_the_verdict_opposite_to_the_pooled_one(q, cells):
    """10,000 fresh runs per claim, not only the stored ones: each says the pooled verdict or inconclusive."""
    want, got = single_verdicts(cells, q, 10_000, seed=len(cells))
    opposite = [v for v in got if v != want and v != INCONCLUSIVE]
    assert not opposite, (
        f"{len(opposite)} of {len(got)} fresh runs say {opposite[0]} where the pooled says {want}"
    )
    assert len(got) >= 10_000


def test_the_07_case_a_paper_point_run_of_1_05_to_1_35_percent_cannot_read_reproduced():
    """07's earlier stored runs (committed under data/results/cpu/earlier_runs/a7d8449) and a fresh run that
    is run 1 with its paper-point pairs at [1.05, 1.15, 1.25, 1.35] (demand over last_step, % forwards/s):
    under the rule this replaces both A/A controls passed and the claim read reproduced beside a pooled `not
    reproduced`. On its hull with the stored runs it says the pooled verdict or inconclusive."""
    from artifact.experiments.studies import routing_map as rm

    earlier = Path(__file__).resolve().parent.parent / "data" / "results" / "cpu" / "earlier_runs" / "a7d8449"
    runs = tuple((f"run{k}", pd.read_csv(earlier / f"run{k}" / "streams.csv")) for k in (1, 2, 3))
    fresh = runs[0][1].copy()
    at = (fresh.task == "paper point") & (fresh.rep >= 0)
    for rep, e in zip(sorted(fresh[at].rep.unique()), (1.05, 1.15, 1.25, 1.35)):
        demand = fresh.loc[at & (fresh.rep == rep) & (fresh.policy == "demand"), rm.METRIC].iloc[0]
        fresh.loc[at & (fresh.rep == rep) & (fresh.policy == "last_step"), rm.METRIC] = demand / (1 + e / 100)
    own = run_effects(fresh, "demand", "last_step", ["task"], rm.METRIC)[("paper point",)]
    assert own.diffs == pytest.approx((1.05, 1.15, 1.25, 1.35))
    c = rm.throughput_claim(rm.throughput(Replicas(fresh, runs, metric=rm.METRIC)))
    assert (
        c.pooled == NOT_REPRODUCED and c.verdict in (NOT_REPRODUCED, INCONCLUSIVE) and c.ruled == "this run"
    )
    assert c.interval.startswith(replication.SINGLE)


# --- the A/A control: the null of a direction claim (difference in differences) ----------------------------
def test_a_direction_claim_rules_on_the_effect_net_of_the_control_per_matched_pair():
    """Known truth: the control is demand's double in the non-demand role, so a control +4% over demand says
    the non-demand role gains 4%. last_step runs in that role, so its role-free level is 4% below its measured
    one, and demand's true gain over it is 1.10 x 1.04 - 1 = +14.4% (demand as A: the bias is added back,
    never subtracted). The net is CONTROL over last_step per pair; the undifferenced +10 is reported beside,
    the bias-bound alternative printed."""
    ds = (-0.4, 0.0, 0.5)
    runs = stored(*(rows({(1, 1.0): 10.0 + d}, {(1, 1.0): 4.0 + d / 2}, reps=2) for d in ds))
    c = Replicas(runs[0][1], runs).compare("demand", "last_step", CELL)
    net = c.net[KEY].pooled
    truth = [((1 + (10.0 + d) / 100) * (1 + (4.0 + d / 2) / 100) - 1) * 100 for d in ds]
    assert net.mean == pytest.approx(float(np.mean(truth)), abs=1e-6)
    assert c.effects[KEY].pooled.mean == pytest.approx(10.0 + 0.1 / 3, abs=1e-6)
    t = judge(c, faster(), str)
    assert t.verdict == REPRODUCED and "net +14.5%" in t.measured and "A over B +10.0%" in t.measured
    assert t.alternative.startswith("bias-bound alternative") and t.alternative.endswith(REPRODUCED)
    # the control exactly as slow as last_step (the non-demand role costs all of demand's lead): net 0
    same = stored(
        *(rows({(1, 1.0): 10.0 + d}, {(1, 1.0): (1 / (1 + (10.0 + d) / 100) - 1) * 100}, reps=2) for d in ds)
    )
    same_c = Replicas(same[0][1], same).compare("demand", "last_step", CELL)
    assert same_c.net[KEY].pooled.mean == pytest.approx(0.0, abs=1e-6)
    assert judge(same_c, faster(), str).verdict == NOT_REPRODUCED


def test_the_stall_basis_is_stall_per_forward_in_points_of_the_baselines_wall_per_forward():
    """03 at a fast link: demand stalls ~10 us a run, so a percentage of it is huge and noisy; the basis is
    the stall difference per forward as a share of demand's wall time per forward."""
    out = []
    for rep in range(4):
        cell = dict(task="gsm8k", batch_size=4, cache_ratio=1.0, bandwidth_scale=2.0, rep=rep)
        out += [
            dict(cell, policy="demand", stall_seconds=1e-5, forwards=100, seconds=2.0),
            dict(cell, policy="last_step", stall_seconds=0.2 + 0.01 * rep, forwards=100, seconds=2.2),
            dict(cell, policy=CONTROL, stall_seconds=2e-5, forwards=100, seconds=2.0),
        ]
    e = run_effects(pd.DataFrame(out), "last_step", "demand", CELL, "stall_seconds", STALL_SHARE)
    d = e[("gsm8k", 4, 1.0, 2.0)].diffs
    assert d[0] == pytest.approx((0.2 - 1e-5) / 2.0 * 100) and len(d) == 4  # ~10 points, not ~2,000,000%
    net = run_effects(pd.DataFrame(out), "last_step", "demand", CELL, "stall_seconds", STALL_SHARE, net=True)
    assert net[("gsm8k", 4, 1.0, 2.0)].diffs[0] == pytest.approx(d[0] - 1e-5 / 2.0 * 100)


def test_an_aa_control_must_show_equivalence_not_merely_contain_zero():
    ok = Interval(0.2, -1.0, 1.4, 3, "runs")
    wide = Interval(-6.9, -21.6, 7.8, 3, "runs")  # contains 0, far wider than +-3
    small_bias = Interval(2.0, 1.0, 3.0, 3, "runs")  # significant, but inside the margin: one answer
    biased = Interval(4.0, 2.0, 6.0, 3, "runs")
    assert control_ruling(ok) is None and control_ruling(small_bias) is None
    assert "too noisy" in control_ruling(wide)
    assert "excludes 0" in control_ruling(biased) and "biased" in control_ruling(biased)


def test_the_control_gates_an_equivalence_cell_in_every_view_and_never_a_direction_cell():
    quiet = [
        rows({(1, 1.0): 0.5 + d, (4, 1.0): 0.5 + d}, {(1, 1.0): 0.1 * d, (4, 1.0): 0.1 * d})
        for d in (-0.2, 0, 0.2)
    ]
    runs = stored(*quiet)
    c = Replicas(runs[0][1], runs).compare("demand", "last_step", CELL)
    assert judge(c, no_difference(), str).verdict == REPRODUCED
    noisy = [
        rows({(1, 1.0): 0.5 + d, (4, 1.0): 0.5 + d}, {(1, 1.0): 0.0, (4, 1.0): 8.0 * d}) for d in (-1, 0, 1)
    ]
    runs = stored(*noisy)
    c = Replicas(runs[0][1], runs).compare("demand", "last_step", CELL)
    t = judge(c, no_difference(), lambda k: f"b={k[1]}")
    assert t.verdict == INCONCLUSIVE and "b=4: A/A control" in t.reason and "too noisy" in t.reason
    assert len(t.per_run) == 3 and "A/A control" in t.half_widths and "<= 3 in 1 of 2 cells" in t.half_widths


# --- one cell, one interval -------------------------------------------------------------------------
def test_no_interval_pools_batch_sizes_and_the_verdict_flips_with_it():
    """Batch 1 is faster by 14%, batch 4 slower by 4%: pooled over batch sizes the interval lies near +5,
    above +3 (reproduced); per cell, batch 4 rules `not reproduced`, and so does the claim."""
    runs = stored(*(rows({(1, 1.0): 14.0 + d, (4, 1.0): -4.0 + d}) for d in (-0.3, 0.0, 0.4)))
    eff = Replicas(runs[0][1], runs).effects("demand", "last_step", CELL)
    assert len(eff) == 2
    per_cell = judge(Compared(eff), faster(), lambda k: f"b={k[1]}")
    assert per_cell.verdict == NOT_REPRODUCED and "b=4" in per_cell.reason
    pooled_over_batches = Replicas(runs[0][1], runs).effects("demand", "last_step", ["task", "cache_ratio"])
    assert judge(Compared(pooled_over_batches), faster(), str).verdict == REPRODUCED


@pytest.mark.parametrize(
    "low, high, where",
    [(4.0, 4.5, "below"), (6.0, 10.0, "inside"), (20.0, 40.0, "above"), (3.5, 8.0, "overlapping")],
)
def test_the_papers_magnitude_is_reported_beside_the_verdict(low, high, where):
    iv = Interval((low + high) / 2, low, high, 3, "runs")
    r = faster(paper=paper.FASTER_PCT)(iv)
    assert r.verdict == REPRODUCED and r.magnitude.startswith(f"magnitude {where} the paper's")
    t = judge(
        Compared({("a",): Replicated(iv, (), iv, True)}), faster(paper=paper.FASTER_PCT), lambda k: "C/W 1"
    )
    assert t.verdict == REPRODUCED and f"direction reproduced; C/W 1: magnitude {where}" in t.reason


def test_a_significant_difference_inside_the_margin_has_one_answer_and_says_both():
    iv = Interval(0.7, 0.3, 1.0, 3, "runs")  # significantly faster, by less than 3%
    nf = not_faster()(iv)
    assert nf.verdict == REPRODUCED and "also excludes 0" in nf.why
    nd = no_difference()(iv)
    assert nd.verdict == REPRODUCED and "also excludes 0" in nd.why
    assert not_faster()(Interval(5.0, 3.5, 7.0, 3, "runs")).verdict == NOT_REPRODUCED
    assert not_faster()(Interval(1.0, -1.0, 4.0, 3, "runs")).verdict == INCONCLUSIVE


# --- stored runs on disk ----------------------------------------------------------------------------------
@pytest.fixture
def cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    return load_profile("cpu")


def test_recording_a_run_copies_the_row_files_whole_and_never_over_another(cpu, tmp_path):
    work = tmp_path / "data" / "results" / "cpu"
    work.mkdir(parents=True)
    rows({(1, 1.0): 5.0}).to_csv(work / "bench.csv", index=False)
    rows({(1, 1.0): 6.0}).to_csv(work / "streams.csv", index=False)
    first = stored_runs.record_run(cpu, log=lambda s: None)
    second = stored_runs.record_run(cpu, log=lambda s: None)
    assert [p.name for p in stored_runs.stored_runs("cpu")] == ["run1", "run2"] == [first.name, second.name]
    meta = json.loads((first / "run.json").read_text())
    assert meta["files"] == ["bench.csv", "streams.csv"] and meta["commit"] and len(meta["load_average"]) == 3
    got = stored_runs.stored_rows(cpu, "bench")
    assert [n for n, _ in got] == ["run1", "run2"] and len(got[0][1]) == len(rows({(1, 1.0): 5.0}))
    assert json.loads((first / "manifest.json").read_text())["files"]["bench.csv"]["rows"] == len(got[0][1])
    (first.parent / "run3").mkdir()  # a run folder without its run.json: damaged
    with pytest.raises(replication.RunsError, match="run3: no run.json"):
        stored_runs.stored_runs("cpu")
    with pytest.raises(replication.RunsError, match="run3: no run.json"):
        stored_runs.record_run(cpu, log=lambda s: None)
    assert stored_runs.clear_working(cpu, log=lambda s: None) == 2 and not (work / "bench.csv").exists()
    with pytest.raises(replication.RunsError, match="no row files"):
        (first.parent / "run3").rmdir()
        stored_runs.record_run(cpu, log=lambda s: None)


def test_cached_rows_are_reused_only_under_the_same_settings(cpu):
    calls = []

    def measure():
        calls.append(1)
        return rows({(1, 1.0): 5.0})

    a = stored_runs.cached_rows(cpu, "streams", "fp1", measure, log=lambda s: None)
    b = stored_runs.cached_rows(cpu, "streams", "fp1", measure, log=lambda s: None)
    assert len(calls) == 1 and a.equals(b)
    stored_runs.cached_rows(cpu, "streams", "fp2", measure, log=lambda s: None)
    assert len(calls) == 2


def test_a_zero_baseline_has_no_percentage_and_its_cell_no_interval():
    """Where the baseline is 0 (demand never stalled), A over B in % is undefined: a percentage basis has no
    pair there (03 therefore rules on STALL_SHARE, whose baseline is the wall time)."""
    r = rows({(1, 1.0): 5.0, (4, 1.0): 5.0}, reps=4)
    r.loc[(r.batch_size == 1) & (r.policy == "last_step"), "tokens_per_second"] = 0.0  # the baseline B below
    eff = Replicas(r).effects("last_step", "demand", CELL)
    assert eff[("gsm8k", 4, 1.0, 1.0)].this.usable
    zero = run_effects(
        r.assign(tokens_per_second=r.tokens_per_second.where(r.policy != "demand", 0.0)),
        "last_step",
        "demand",
        CELL,
        "tokens_per_second",
    )
    assert all(e.diffs == () for e in zero.values())
    t = judge(
        Compared(
            Replicas(
                r.assign(tokens_per_second=r.tokens_per_second.where(r.policy != "demand", 0.0))
            ).effects("last_step", "demand", CELL)
        ),
        faster(),
        str,
    )
    assert t.verdict == INCONCLUSIVE
