"""Notebook 06's claim module: the miss table and its floors, one bench file per link priority, the
predictor-over-demand tables, and verdicts that follow the numbers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from test_phases import phase_split  # noqa: E402

from artifact.experiments import counting  # noqa: E402
from artifact.experiments.bench.results import COLUMNS, bench_fingerprint  # noqa: E402
from artifact.experiments.criteria import paper  # noqa: E402
from artifact.experiments.outputs import figures  # noqa: E402
from artifact.experiments.settings import CONTROL, load_profile  # noqa: E402
from artifact.experiments.studies import beyond_the_paper as beyond  # noqa: E402
from artifact.experiments.verdicts.pooling import Replicas
from artifact.experiments.verdicts.records import NOT_REPRODUCED, REPRODUCED  # noqa: E402
from artifact.model.decode import DecodeConfig  # noqa: E402
from artifact.offload.runner import decode_prompts  # noqa: E402
from artifact.offload.spec import RunSpec  # noqa: E402

RATIOS = (0.43, 1.0, 1.73)


def sweep_rows(removed: dict, lru=(100, 80, 60), spec=10):
    """One trace's sweep: policy -> misses removed from LRU's at each C/W (the floors remove more)."""
    rows = []
    for k, r in enumerate(RATIOS):
        for pol in beyond.MISS_POLICIES + (beyond.MIN,):
            cut = removed.get(pol, 0)
            s = (
                0
                if pol in ("demand", "belady", beyond.MIN) or pol.startswith("last_step_conservative")
                else spec
            )
            rows.append(
                {
                    "trace": "t",
                    "task": "x",
                    "batch_size": 1,
                    "policy": pol,
                    "cache_ratio": r,
                    "demand_misses": lru[k] - cut,
                    "speculative_transfers": s,
                    "prefetch_hits": 0,
                    "wasted_prefetches": 0,
                    "accesses": 1000,
                }
            )
    return pd.DataFrame(rows)


def bench_rows(diffs: dict, priorities=beyond.PRIORITIES, reps=4, offset=0.0):
    """Bench rows per priority whose predictor tokens/s differ from demand's by diffs[(priority, policy)] %
    (+ `offset`, a run's shift), +-0.3 points alternating pair by pair. The stand-in A/A (CONTROL, one of the
    bench's predictors) is level with demand unless `diffs` says otherwise."""
    rng = np.random.default_rng(0)
    rows, sign = [], 1
    for pr in priorities:
        for r in RATIOS:
            for b in (1, 4):
                for rep in range(reps):
                    base, sign = 50 + 10 * rng.random(), -sign
                    for k, pol in enumerate(("demand",) + beyond.BENCH_PREDICTORS):
                        d = 0.0 if pol == "demand" else diffs.get((pr, pol), 0.0) + offset + 0.3 * sign
                        rows.append(
                            {c: 0 for c in COLUMNS}
                            | {
                                "task": "gsm8k",
                                "batch_size": b,
                                "cache_ratio": r,
                                "bandwidth_scale": 1.0,
                                "policy": pol,
                                "rep": rep,
                                "order": k,
                                "tokens_per_second": base * (1 + d / 100),
                                "tokens_sha": "abc",
                                "link_priority": pr,
                            }
                        )
    return pd.DataFrame(rows)


def stored(diffs: dict, offsets=(-0.5, 0.0, 0.5)) -> Replicas:
    """Stored runs of bench_rows (ruled pooled), one per offset."""
    return Replicas(None, tuple((f"run{k}", bench_rows(diffs, offset=o)) for k, o in enumerate(offsets, 1)))


def test_miss_summary_relates_every_policy_to_lru_and_the_oracle():
    s = beyond.miss_summary(
        sweep_rows({"last_step": 2, "cross_layer": 10, "oracle": 20, "belady": 30, beyond.MIN: 35})
    )
    at = s.set_index(["cache_ratio", "policy"])
    assert (s[s.policy == "demand"].misses_vs_lru == 1).all()
    assert at.loc[(1.0, "cross_layer")].misses_removed == 10 and at.loc[(1.0, "cross_layer")].of_oracle == 0.5
    assert at.loc[(0.43, "last_step")].transfers == 98 + 10
    assert at.loc[(1.73, beyond.MIN)].misses_vs_lru == pytest.approx(25 / 60)


def test_miss_verdicts_follow_the_counts():
    def claims_of(removed):
        n = beyond.numbers(
            beyond.miss_summary(sweep_rows(removed)),
            beyond.throughput_table(bench_rows({})),
            Replicas(bench_rows({})),
        )
        out = beyond.verdicts(n)
        assert all("[own result]" in c.claim and c.paper.startswith(paper.OWN) for c in out)
        return {
            c.claim.split(")")[0].split("(")[-1] if "(2" in c.claim else c.claim.split()[2]: c for c in out
        }

    good = claims_of({"last_step": 2, "cross_layer": 10, "oracle": 20})
    assert good["2a"].verdict == REPRODUCED and "oracle 0.43: +20%" in good["2a"].measured
    assert good["2b"].verdict == REPRODUCED and "its share of the oracle's: 0.43: 50%" in good["2b"].measured
    assert good["last_step_conservative"].verdict == REPRODUCED

    bad = claims_of({"last_step": 12, "cross_layer": 10, "oracle": 20, "last_step_conservative": 1})
    assert bad["2a"].verdict == bad["2b"].verdict == bad["last_step_conservative"].verdict == NOT_REPRODUCED


def test_count_claims_rule_on_the_denoising_steps_and_print_all_demands_where_the_verdict_flips():
    """Constructed so that the two counting bases disagree: over the denoising steps last_step removes 60% of
    what the oracle removes (not < 50%), cross_layer more than last_step, and last_step_conservative matches
    LRU; the prefill forwards add oracle removals, cross_layer misses and a conservative transfer, so over all
    demands (2a) would hold, and (2b) and the conservative claim would fail."""
    steps = sweep_rows({"last_step": 6, "cross_layer": 8, "oracle": 10})
    prefill = sweep_rows({"oracle": 10, "cross_layer": -10, "last_step_conservative": 1}, lru=(50, 50, 50))
    prefill.loc[prefill.policy == "last_step_conservative", "speculative_transfers"] = 1
    summary = beyond.miss_summary(phase_split(steps, prefill, beyond.SUMMED))
    assert set(summary.prefill) == {"included", "excluded"}
    n = beyond.numbers(summary, beyond.throughput_table(bench_rows({})), Replicas(bench_rows({})))
    got = {
        c.claim.split(")")[0].split("(")[-1] if "(2" in c.claim else c.claim.split()[2]: c
        for c in beyond.verdicts(n)
    }
    a, b, cons = got["2a"], got["2b"], got["last_step_conservative"]
    assert all(c.counting == counting.DENOISING for c in (a, b, cons))
    assert a.verdict == NOT_REPRODUCED and re.fullmatch(
        r"denoising steps: 60\.0% at C/W [\d.]+ \(rules\); "
        r"all "
        r"demands: 30\.0% at C/W [\d.]+ \(would say "
        r"reproduced\)",
        a.reason,
    )
    assert "last_step's share of the oracle's: 0.43: 60.0%" in a.measured and "60.0% vs < 50%" in a.margin
    assert b.verdict == REPRODUCED and b.reason == (
        "denoising steps: smallest lead +2.0 points at C/W 0.43 "
        "(rules); "
        "all demands: smallest lead -7.3 points at C/W 1.73 "
        "(would say "
        "not reproduced)"
    )
    assert (
        cons.verdict == REPRODUCED
        and cons.reason == "denoising steps: equal (rules); all demands: not equal (would say not reproduced)"
    )
    same = beyond.verdicts(
        beyond.numbers(
            beyond.miss_summary(phase_split(steps, steps, beyond.SUMMED)),
            beyond.throughput_table(bench_rows({})),
            Replicas(bench_rows({})),
        )
    )
    assert not any(c.reason for c in same if not c.timing)  # bases agree: one verdict, nothing more to print


def test_throughput_claim_follows_the_intervals_under_demand_priority():
    summary = beyond.miss_summary(sweep_rows({"oracle": 20}))
    slower = bench_rows(
        {
            ("fifo", "last_step"): -8.0,
            ("demand", "last_step"): -3.0,
            ("fifo", "cross_layer"): -12.0,
            ("demand", "cross_layer"): -5.0,
        }
    )
    table = beyond.throughput_table(slower)
    assert set(table.link_priority) == set(beyond.PRIORITIES) and set(table.policy) == set(
        beyond.BENCH_PREDICTORS
    )
    row = table[
        (table.link_priority == "fifo") & (table.policy == "last_step") & (table.cache_ratio == 1.0)
    ].iloc[0]
    assert row.diff_pct == pytest.approx(-8.0, abs=0.5) and row.ci_high < 0  # predictor over demand
    diffs = {
        ("fifo", "last_step"): -8.0,
        ("demand", "last_step"): -3.0,
        ("fifo", "cross_layer"): -12.0,
        ("demand", "cross_layer"): -5.0,
    }
    same, q1 = beyond.verdicts(beyond.numbers(summary, table, stored(diffs)))[:2]
    assert same.verdict == REPRODUCED and f"{3 * 2 * 2} of {3 * 2 * 2} cells" in same.measured
    assert q1.timing and q1.verdict == REPRODUCED and "last_step C/W 0.43 b=1: -3.0% [" in q1.measured
    assert q1.ruled == "pooled" and "3 stored runs" in q1.interval and "(3 runs); A/A [" in q1.measured
    assert "fifo" not in q1.measured  # ruled under demand priority only
    # one run alone: no run-to-run spread to size it
    alone = beyond.verdicts(beyond.numbers(summary, table, Replicas(slower)))[1]
    assert alone.verdict == "inconclusive" and "record >= 3 runs" in alone.reason

    wins = {("demand", "cross_layer"): 6.0}
    five = stored(wins, offsets=(-0.4, -0.2, 0.0, 0.2, 0.4))  # not reproduced at the level over 12 cells
    q1 = beyond.verdicts(beyond.numbers(summary, beyond.throughput_table(bench_rows(wins)), five))[1]
    assert q1.verdict == NOT_REPRODUCED and "cross_layer C/W 0.43 b=1" in q1.reason
    # the stand-in A/A (CONTROL over demand) 6% off under demand priority gates every cell
    gated = beyond.verdicts(beyond.numbers(summary, table, stored(diffs | {("demand", CONTROL): 6.0})))[1]
    assert gated.verdict == "inconclusive" and "A/A" in gated.reason
    assert "last_step C/W 0.43 b=1: -3.0% [" in gated.measured  # the effect stays the plain one

    changed = Replicas(None, stored(diffs).stored[:-1] + (("run3", slower.copy()),))
    rows = changed.stored[-1][1]
    rows.loc[
        (rows.policy == "cross_layer") & (rows.link_priority == "demand") & (rows.rep == 1),
        "tokens_sha",
    ] = "def"
    assert beyond.verdicts(beyond.numbers(summary, table, changed))[0].verdict == NOT_REPRODUCED


def test_bench_profiles_differ_only_in_priority_and_never_share_a_file():
    P = load_profile("cpu")
    fifo, dem = beyond.bench_profile(P, "fifo"), beyond.bench_profile(P, "demand")
    assert (fifo.link_priority, dem.link_priority) == ("fifo", "demand")
    assert fifo.policies == dem.policies == ("demand",) + beyond.BENCH_PREDICTORS
    assert bench_fingerprint(fifo) != bench_fingerprint(dem)  # link_priority is in results.SETTINGS
    assert fifo.n_prompts >= max(fifo.batch_sizes) and fifo.batch_sizes == (1, 4)
    assert min(fifo.cache_ratios) == 0.43 and max(fifo.cache_ratios) == 1.73
    gpu = load_profile("h200")
    g = beyond.bench_profile(gpu, "demand")
    assert g.policies[-1] == "oracle" and (g.cache_ratios, g.tasks, g.n_prompts) == (
        gpu.cache_ratios,
        gpu.tasks,
        gpu.n_prompts,
    )


def test_the_figure_is_saved_with_both_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("ARTIFACT_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "results"))
    P = load_profile("cpu")
    rows = bench_rows({("fifo", "last_step"): -5.0})
    summary = beyond.miss_summary(sweep_rows({"oracle": 20}))
    fig, df = beyond.plot(summary, beyond.numbers(summary, beyond.throughput_table(rows), Replicas(rows)), P)
    png, csv = figures.save(fig, df, P, "06_beyond_the_paper", log=lambda s: None)
    assert png.read_bytes()[:4] == b"\x89PNG" and len(fig.axes) == 4
    assert "link_priority demand: last_step (A) vs demand (B)" in beyond.format_tables(
        beyond.throughput_table(rows)
    )
    assert set(pd.read_csv(csv).panel) == {"misses", "throughput"}


@pytest.fixture(scope="module")
def recorded(tiny, tiny_prompts):
    return decode_prompts(
        tiny,
        tiny_prompts[:4],
        2,
        RunSpec(decode=DecodeConfig(gen_length=32)),
        record=True,
        prompt_ids=list("abcd"),
        task="test",
    ).trace


def test_miss_sweep_on_a_recorded_trace_keeps_the_floors_below_every_policy(recorded):
    P = load_profile("cpu", {"cache_ratios": [0.43, 1.0, 1.73]})
    df = beyond.miss_sweep([recorded], P, progress=False)
    assert set(df.policy) == set(beyond.MISS_POLICIES) | {beyond.MIN}
    for r, g in df.groupby("cache_ratio"):
        m = g.set_index("policy")
        floor = m.loc[beyond.MIN].demand_misses
        assert floor <= m.loc["belady"].demand_misses <= m.loc["demand"].demand_misses, r
        for pol in beyond.PREDICTORS:  # a prefetcher's loads can be postponed to first use
            assert floor <= m.loc[pol].demand_misses + m.loc[pol].speculative_transfers, (r, pol)
        assert m.loc["last_step_conservative"].speculative_transfers == 0  # docs/policies.md
        assert m.loc["last_step_conservative"].demand_misses == m.loc["demand"].demand_misses


def test_the_module_imports_at_the_top():
    for part in sorted(Path(beyond.__file__).parent.glob("*.py")):
        tree = ast.parse(part.read_text())
        local = [
            n.lineno
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef)
            for n in ast.walk(f)
            if isinstance(n, (ast.Import, ast.ImportFrom))
        ]
        assert not local, f"beyond_the_paper/{part.name} imports inside functions at lines {local}"
