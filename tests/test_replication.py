"""The run as the unit of replication (artifact/experiments/replication.py) and the verdict rules it feeds
(rules.py): intervals over per-run means, one-run intervals, the A/A equivalence gate, one interval per cell,
faster's magnitude, one answer where a margin meets a significant difference, stored runs on disk."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from artifact.experiments import replication
from artifact.experiments.claims import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.replication import Compared, Replicas, judge, one_run_interval, pooled_interval
from artifact.experiments.rules import Interval, control_ruling, faster, gated, no_difference, not_faster
from artifact.experiments.settings import CONTROL, load_profile
from artifact.experiments.stats import CELL_KEYS

CELL = list(CELL_KEYS)


def rows(effects: dict, control: dict | None = None, reps: int = 2, base: float = 100.0, jitter: float = 0.0,
         seed: int = 0) -> pd.DataFrame:
    """Bench-like rows of one run: per cell key (batch size, C/W) demand at `base` tokens/s, last_step slower so
    that demand over last_step is effects[key] % per pair (+- jitter), the A/A control at control[key] % over
    demand."""
    rng = np.random.default_rng(seed)
    out = []
    for (b, ratio), eff in effects.items():
        for rep in range(reps):
            e = eff + (jitter * (1 if rep % 2 else -1) if jitter else 0.0) + rng.normal(0, 1e-9)
            cell = dict(task="gsm8k", batch_size=b, cache_ratio=ratio, bandwidth_scale=1.0, rep=rep)
            out.append(dict(cell, policy="demand", tokens_per_second=base))
            out.append(dict(cell, policy="last_step", tokens_per_second=base / (1 + e / 100)))
            if control is not None:
                out.append(dict(cell, policy=CONTROL, tokens_per_second=base * (1 + control[(b, ratio)] / 100)))
    return pd.DataFrame(out)


def stored(*frames) -> tuple:
    return tuple((f"run{i + 1}", f) for i, f in enumerate(frames))


# --- intervals ------------------------------------------------------------------------------------
def test_the_pooled_interval_is_the_t_interval_over_per_run_means():
    runs = stored(*(rows({(1, 1.0): m}) for m in (10.0, 14.0, 12.0)))
    r = Replicas(runs[0][1], runs).effects("demand", "last_step", CELL)[("gsm8k", 1, 1.0, 1.0)]
    means = [10.0, 14.0, 12.0]
    half = stats.t.ppf(0.975, 2) * np.std(means, ddof=1) / np.sqrt(3)
    assert r.pooled.unit == "runs" and r.pooled.n == 3
    assert r.pooled.mean == pytest.approx(12.0, abs=1e-6)
    assert (r.pooled.low, r.pooled.high) == (pytest.approx(12 - half, abs=1e-6), pytest.approx(12 + half, abs=1e-6))
    # each stored run's own interval: its mean +- t_2 * sd of the run means
    one = stats.t.ppf(0.975, 2) * np.std(means, ddof=1)
    assert [iv.mean for iv in r.runs] == pytest.approx(means, abs=1e-6)
    assert r.runs[0].high - r.runs[0].low == pytest.approx(2 * one, abs=1e-6)


def test_a_stored_run_is_ruled_pooled_and_another_run_on_its_own_widened_interval():
    runs = stored(*(rows({(1, 1.0): m}) for m in (10.0, 14.0, 12.0)))
    mine = Replicas(runs[1][1], runs).effects("demand", "last_step", CELL)[("gsm8k", 1, 1.0, 1.0)]
    assert mine.stored and mine.ruled is mine.pooled
    fresh = rows({(1, 1.0): 11.0}, jitter=0.5)
    other = Replicas(fresh, runs).effects("demand", "last_step", CELL)[("gsm8k", 1, 1.0, 1.0)]
    assert not other.stored and other.ruled is other.this and other.this.unit == "run"
    assert other.this.mean == pytest.approx(11.0, abs=0.01)
    # the widening: the stored runs' spread, or this run's own pairs' when that is larger
    wide = rows({(1, 1.0): 11.0}, jitter=30.0)
    w = Replicas(wide, runs).effects("demand", "last_step", CELL)[("gsm8k", 1, 1.0, 1.0)].this
    assert w.high - w.low > other.this.high - other.this.low


def test_without_stored_runs_a_run_has_only_its_pairs_and_says_so():
    r = Replicas(rows({(1, 1.0): 5.0}, reps=4, jitter=1.0)).effects("demand", "last_step", CELL)[("gsm8k", 1, 1.0, 1.0)]
    assert r.this.unit == "pairs" and r.this.n == 4 and r.pooled is None and not r.stored
    t = judge(Compared({("c",): r}), faster, str)
    assert t.ruled_on == replication.WITHIN and t.per_run == ()


def test_fewer_runs_than_the_minimum_is_inconclusive():
    iv = pooled_interval([10.0, 11.0])
    assert iv.n == 2 < thresholds.MIN_RUNS and not iv.usable
    assert faster(iv).verdict == INCONCLUSIVE and f"needs >= {thresholds.MIN_RUNS} runs" in faster(iv).why


def test_a_single_run_never_contradicts_the_pooled_verdict_on_the_stored_runs():
    """The property the one-run interval is built for, over many simulated sets of 3 runs: a run whose mean
    lies within the stored spread gets the pooled verdict or inconclusive, never the opposite one."""
    rng = np.random.default_rng(7)
    opposite = 0
    for _ in range(300):
        means = rng.normal(rng.normal(5, 5), rng.uniform(0.5, 5), size=3)
        pooled = faster(pooled_interval(means)).verdict
        for m in means:
            own = faster(one_run_interval(replication.RunEffect(m, (m, m)), means)).verdict
            opposite += own != pooled and INCONCLUSIVE not in (own, pooled)
    assert opposite == 0


# --- one cell, one interval -------------------------------------------------------------------------
def test_no_interval_pools_batch_sizes_and_the_verdict_flips_with_it():
    """Batch 1 is faster by 10%, batch 4 slower by 10%: pooled over batch sizes the interval crosses 0
    (inconclusive); per cell, batch 4 rules `not reproduced`, and so does the claim."""
    runs = stored(*(rows({(1, 1.0): 10.0 + d, (4, 1.0): -10.0 + d}) for d in (-0.3, 0.0, 0.4)))
    eff = Replicas(runs[0][1], runs).effects("demand", "last_step", CELL)
    assert len(eff) == 2
    per_cell = judge(Compared(eff), faster, lambda k: f"b={k[1]}")
    assert per_cell.verdict == NOT_REPRODUCED and "b=4" in per_cell.reason
    pooled_over_batches = Replicas(runs[0][1], runs).effects("demand", "last_step", ["task", "cache_ratio"])
    assert judge(Compared(pooled_over_batches), faster, str).verdict == INCONCLUSIVE


# --- the A/A control ---------------------------------------------------------------------------------
def test_an_aa_control_must_show_equivalence_not_merely_contain_zero():
    ok = Interval(0.2, -1.0, 1.4, 3, "runs")
    wide = Interval(-6.9, -21.6, 7.8, 3, "runs")           # contains 0, far wider than +-3
    small_bias = Interval(2.0, 1.0, 3.0, 3, "runs")          # significant, but inside the margin: one answer
    biased = Interval(4.0, 2.0, 6.0, 3, "runs")
    assert control_ruling(ok) is None and control_ruling(small_bias) is None
    assert "too noisy" in control_ruling(wide)
    assert "excludes 0" in control_ruling(biased) and "biased" in control_ruling(biased)
    effect = faster(Interval(12.0, 8.0, 16.0, 3, "runs"))
    assert effect.verdict == REPRODUCED
    assert gated(effect, ok).verdict == REPRODUCED
    assert gated(effect, wide).verdict == INCONCLUSIVE          # the flip: containing 0 used to pass


def test_the_control_gates_its_own_cell_in_every_view():
    ctl = {(1, 1.0): 0.0, (4, 1.0): 0.0}
    quiet = [rows({(1, 1.0): 12.0 + d, (4, 1.0): 12.0 + d}, {(1, 1.0): 0.1 * d, (4, 1.0): 0.1 * d}) for d in
             (-1, 0, 1)]
    runs = stored(*quiet)
    eff = Replicas(runs[0][1], runs).effects("demand", "last_step", CELL)
    aa = Replicas(runs[0][1], runs).effects(CONTROL, "demand", CELL)
    assert judge(Compared(eff, aa), faster, str).verdict == REPRODUCED
    noisy = [rows({(1, 1.0): 12.0 + d, (4, 1.0): 12.0 + d}, {(1, 1.0): 0.0, (4, 1.0): 8.0 * d}) for d in (-1, 0, 1)]
    runs = stored(*noisy)
    eff = Replicas(runs[0][1], runs).effects("demand", "last_step", CELL)
    aa = Replicas(runs[0][1], runs).effects(CONTROL, "demand", CELL)
    t = judge(Compared(eff, aa), faster, lambda k: f"b={k[1]}")
    assert t.verdict == INCONCLUSIVE and "b=4: A/A control" in t.reason and "too noisy" in t.reason
    assert len(t.per_run) == 3 and ctl


# --- the rules ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("low, high, where", [(1.0, 3.0, "below"), (6.0, 10.0, "inside"), (20.0, 40.0, "above"),
                                              (3.0, 8.0, "overlapping")])
def test_faster_rules_the_direction_and_states_the_magnitude_apart(low, high, where):
    r = faster(Interval((low + high) / 2, low, high, 3, "runs"), paper.FASTER_PCT)
    assert r.verdict == REPRODUCED and r.magnitude.startswith(f"magnitude {where} the paper's")
    t = judge(Compared({("a",): _const(Interval((low + high) / 2, low, high, 3, "runs"))}),
              lambda iv: faster(iv, paper.FASTER_PCT), lambda k: "C/W 1")
    assert t.verdict == REPRODUCED and f"direction reproduced; C/W 1: magnitude {where}" in t.reason


def test_a_significant_difference_inside_the_margin_has_one_answer_and_says_both():
    iv = Interval(0.7, 0.3, 1.0, 3, "runs")                     # significantly faster, by less than 3%
    nf = not_faster(iv)
    assert nf.verdict == REPRODUCED and "also excludes 0" in nf.why
    nd = no_difference(iv)
    assert nd.verdict == REPRODUCED and "also excludes 0" in nd.why
    assert not_faster(Interval(4.0, 1.0, 7.0, 3, "runs")).verdict == NOT_REPRODUCED
    assert not_faster(Interval(1.0, -1.0, 4.0, 3, "runs")).verdict == INCONCLUSIVE


def _const(iv):
    return replication.Replicated(iv, (), iv, True)


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
    first = replication.record_run(cpu, log=lambda s: None)
    second = replication.record_run(cpu, log=lambda s: None)
    assert [p.name for p in replication.stored_runs("cpu")] == ["run1", "run2"] == [first.name, second.name]
    meta = json.loads((first / "run.json").read_text())
    assert meta["files"] == ["bench.csv", "streams.csv"] and meta["commit"] and len(meta["load_average"]) == 3
    got = replication.stored_rows(cpu, "bench")
    assert [n for n, _ in got] == ["run1", "run2"] and len(got[0][1]) == len(rows({(1, 1.0): 5.0}))
    assert json.loads((first / "manifest.json").read_text())["files"]["bench.csv"]["rows"] == len(got[0][1])
    (first.parent / "run3").mkdir()                              # a run folder without its run.json: damaged
    with pytest.raises(replication.RunsError, match="run3: no run.json"):
        replication.stored_runs("cpu")
    with pytest.raises(replication.RunsError, match="run3: no run.json"):
        replication.record_run(cpu, log=lambda s: None)
    assert replication.clear_working(cpu, log=lambda s: None) == 2 and not (work / "bench.csv").exists()
    with pytest.raises(replication.RunsError, match="no row files"):
        (first.parent / "run3").rmdir()
        replication.record_run(cpu, log=lambda s: None)


def test_cached_rows_are_reused_only_under_the_same_settings(cpu):
    calls = []

    def measure():
        calls.append(1)
        return rows({(1, 1.0): 5.0})
    a = replication.cached_rows(cpu, "streams", "fp1", measure, log=lambda s: None)
    b = replication.cached_rows(cpu, "streams", "fp1", measure, log=lambda s: None)
    assert len(calls) == 1 and a.equals(b)
    replication.cached_rows(cpu, "streams", "fp2", measure, log=lambda s: None)
    assert len(calls) == 2


def test_a_zero_baseline_has_no_percentage_and_its_cell_no_interval():
    """03 rules on stall seconds: where demand never stalled, last_step over demand in % is undefined."""
    r = rows({(1, 1.0): 5.0, (4, 1.0): 5.0}, reps=4)
    r.loc[(r.batch_size == 1) & (r.policy == "last_step"), "tokens_per_second"] = 0.0      # the baseline B below
    eff = Replicas(r).effects("last_step", "demand", CELL)
    assert eff[("gsm8k", 4, 1.0, 1.0)].this.usable
    zero = replication.run_effects(r.assign(tokens_per_second=r.tokens_per_second.where(r.policy != "demand", 0.0)),
                                   "last_step", "demand", CELL, "tokens_per_second")
    assert all(e.diffs == () for e in zero.values())
    t = judge(Compared(Replicas(r.assign(tokens_per_second=r.tokens_per_second.where(r.policy != "demand", 0.0)))
                       .effects("last_step", "demand", CELL)), faster, str)
    assert t.verdict == INCONCLUSIVE
