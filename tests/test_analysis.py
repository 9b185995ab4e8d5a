"""The notebooks' logic: claims and verdicts on known numbers, traces recorded once and reused, bench files
that never mix settings, and every figure saved as PNG + the CSV of what it plotted."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from artifact.experiments import analysis as A
from artifact.experiments import figures as F
from artifact.experiments.analysis import NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, Claim
from artifact.experiments.bench import COLUMNS, write_rows
from artifact.experiments.notebooks import claims_of
from artifact.experiments.settings import load_profile


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Figures, results and traces under tmp_path."""
    monkeypatch.setenv("ARTIFACT_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setattr(A, "results_dir", lambda P: tmp_path / "results" / P.name)
    monkeypatch.setattr(A, "traces_dir", lambda P: tmp_path / "traces" / P.name)
    monkeypatch.setattr(F, "results_dir", lambda P: tmp_path / "results" / P.name)
    return tmp_path


def test_claim_lines_round_trip_through_the_runner_parser(capsys):
    A.report(Claim("c1", "p1", "m1", REPRODUCED), Claim("c2", "p2", "m2", NOT_REPRODUCED, "why", timing=True))
    text = capsys.readouterr().out
    assert "measured [timing]: m2" in text and "verdict [timing]: not reproduced (why)" in text
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}]}
    import nbformat
    assert claims_of(nbformat.from_dict(nb)) == [("c1", "reproduced"), ("c2", "not reproduced (why)")]
    with pytest.raises(AssertionError):
        Claim("c", "p", "m", "maybe")


def test_setup_lays_parameters_over_the_profile():
    P = A.setup("cpu", **A.parameters({"gen_length": 64, "repetitions": 2, "not_a_key": 1, "profile": "x"}))
    assert P.name == "cpu" and P.gen_length == 64 and P.repetitions == 2


def sweep_rows(lru, last, spec, oracle, refresh, ratios=(0.43, 1.0, 1.73)):
    rows = []
    for k, r in enumerate(ratios):
        for pol, m, s in (("demand", lru[k], 0), ("last_step", last[k], spec[k]), ("oracle", oracle[k], spec[k]),
                          ("interval_refresh", refresh[k], 0), ("belady", oracle[k], 0)):
            rows.append({"trace": "t", "task": "x", "batch_size": 1, "policy": pol, "cache_ratio": r,
                         "demand_misses": m, "speculative_transfers": s, "prefetch_hits": 0, "wasted_prefetches": 0,
                         "accesses": 1000})
    return pd.DataFrame(rows)


def test_miss_claims_judge_known_counts():
    s = A.miss_summary(sweep_rows(lru=[500, 300, 100], last=[480, 290, 99], spec=[200, 150, 40],
                                  oracle=[400, 45, 10], refresh=[495, 298, 100]))
    useless, oracle, refresh = A.miss_claims(s)
    assert useless.verdict == REPRODUCED and "1: 3% removed" in useless.measured
    assert oracle.verdict == REPRODUCED and "C/W = 1: 6.7x" in oracle.measured
    assert refresh.verdict == REPRODUCED
    s = A.miss_summary(sweep_rows(lru=[500, 300, 100], last=[400, 150, 50], spec=[200, 150, 40],
                                  oracle=[400, 200, 10], refresh=[400, 250, 100]))
    useless, oracle, refresh = A.miss_claims(s)
    assert (useless.verdict, oracle.verdict, refresh.verdict) == (NOT_REPRODUCED,) * 3
    assert not any(c.timing for c in (useless, oracle, refresh))       # exact counts: compared by nbval


def bench_rows(diffs: dict, reps=2, policies=("demand", "last_step")):
    """Rows whose paired tokens/s differ by diffs[C/W] percent, +-0.3 points alternating pair by pair."""
    rng = np.random.default_rng(0)
    rows, sign = [], 1
    for r, d in diffs.items():
        for task in ("gsm8k", "mbpp"):
            for b in (1, 4):
                for rep in range(reps):
                    base, sign = 50 + 10 * rng.random(), -sign
                    for k, pol in enumerate(policies):
                        tps = base * (1 + (d + 0.3 * sign) / 100) if k == 0 else base
                        rows.append({c: 0 for c in COLUMNS} | {
                            "task": task, "batch_size": b, "cache_ratio": r, "bandwidth_scale": 1.0, "policy": pol,
                            "rep": rep, "order": k, "tokens_per_second": tps, "seconds": 128 / tps,
                            "tokens_sha": "abc", "demand_misses": 100 - 10 * k, "cache_experts": 10})
    return pd.DataFrame(rows)


def test_capacity_claims_follow_the_paired_intervals():
    rows = bench_rows({0.43: 0.0, 0.83: 8.0, 1.0: 6.0, 1.73: 5.0})
    by_ratio, by_cell = A.capacity_tables(rows)
    same, faster, low = A.capacity_claims(by_ratio, rows)
    assert same.verdict == REPRODUCED and "16 of 16 cells" in same.measured
    assert faster.verdict == REPRODUCED and faster.timing
    assert low.verdict == REPRODUCED
    assert set(by_cell.task) == {"gsm8k", "mbpp"} and len(by_cell) == 4
    rows = bench_rows({0.43: 20.0, 0.83: 8.0, 1.73: 0.0})
    rows.loc[0, "tokens_sha"] = "changed"
    by_ratio, _ = A.capacity_tables(rows)
    same, faster, low = A.capacity_claims(by_ratio, rows)
    assert same.verdict == NOT_REPRODUCED
    assert faster.verdict == NOT_REPRODUCED and "1.73" in faster.reason
    assert low.verdict == NOT_REPRODUCED and "demand faster" in low.reason


def throttle_rows():
    rows = []
    for scale, gbps in ((2.0, 0.2), (1.0, 0.1), (0.5, 0.05)):
        for pol, stall, misses, spec in (("demand", 0.5 / scale, 100, 0), ("last_step", 0.9 / scale, 90, 40)):
            rows.append({"bandwidth_scale": scale, "link_gbps": gbps, "policy": pol, "seconds": 2 + stall,
                         "tokens_per_second": 128 / (2 + stall), "stall_seconds": stall, "link_busy_seconds": 1.0,
                         "demand_misses": misses, "speculative_transfers": spec})
    return pd.DataFrame(rows)


def test_throttle_claims(places):
    s = A.throttle_summary(throttle_rows())
    counts, stall = A.throttle_claims(s)
    assert counts.verdict == REPRODUCED and "+30% link transfers" in counts.measured and not counts.timing
    assert stall.verdict == REPRODUCED and stall.timing
    P = load_profile("cpu")
    T = A.throttle_profile(P)
    assert (T.tasks, T.batch_sizes, T.cache_ratios, T.policies) == (P.tasks[:1], (4,), (1.0,), ("demand", "last_step"))
    assert T.bandwidth_scales == P.throttle_scales == (2.0, 1.0, 0.5)


def test_throttle_summary_fills_the_unpaced_cuda_bandwidth():
    rows = throttle_rows()
    rows.loc[rows.bandwidth_scale == 2.0, "link_gbps"] = None        # as a cuda row at scale 1 holds it
    s = A.throttle_summary(rows)
    assert len(s) == 6 and np.allclose(sorted(s.link_gbps.unique()), [0.05, 0.1, 0.2])


def test_tide_claims_without_tide_say_why():
    P = load_profile("cpu")
    reason = A.tide_unavailable(P)
    assert "tide_path is null" in reason and "tiny" in reason
    (c,) = A.tide_claims(P, None, reason)
    assert c.verdict == NOT_MEASURABLE and reason in c.lines()[-1]
    rows = bench_rows({1.0: 0.0, 0.5: 0.5}, policies=("demand", "interval_refresh"))
    table, claim = A.tide_style_claim(rows)
    assert claim.verdict == REPRODUCED and set(table.cache_ratio) == {1.0, 0.5}


def test_bench_file_never_mixes_settings(places):
    P = load_profile("cpu")
    assert A.bench_file(P).name == "bench.csv"
    path = A.results_dir(P) / "bench.csv"
    row = {c: 0 for c in COLUMNS} | {"profile": "cpu", "fingerprint": "other", "task": "gsm8k", "policy": "demand",
                                      "tokens_sha": "x"}
    write_rows(path, [row])
    other = A.bench_file(P)
    assert other.name.startswith("bench-") and other.name != "bench.csv"


def test_traces_are_recorded_once_and_rerecorded_when_settings_change(places, monkeypatch):
    P = load_profile("cpu", {"trace_tasks": ["gsm8k"], "trace_batch_sizes": [1], "trace_n_prompts": 1})
    first = A.traces(P, progress=False)
    assert len(first) == 1 and A.trace_path(P, "gsm8k", 1).is_file()
    calls = []
    real = A.record_trace
    monkeypatch.setattr(A, "record_trace", lambda *a: calls.append(a) or real(*a))
    again = A.traces(P, progress=False)
    assert calls == [] and again[0].equal_routing(first[0])
    changed = load_profile("cpu", {"trace_tasks": ["gsm8k"], "trace_batch_sizes": [1], "trace_n_prompts": 1,
                                   "threshold": 0.9})
    A.traces(changed, progress=False)
    assert len(calls) == 1


def test_every_figure_is_saved_with_the_data_it_plotted(places):
    P = load_profile("cpu", {"trace_tasks": ["gsm8k"], "trace_batch_sizes": [1], "trace_n_prompts": 1})
    ts = A.traces(P, progress=False)
    ws, sim = A.working_set_table(ts), A.stability_table(ts)
    share = A.lru_share(ts, (0.5, 1.0))
    claim = A.stability_claim(ws, sim, share)
    assert claim.verdict in (REPRODUCED, NOT_REPRODUCED) and "C/W = 1" in claim.measured
    summary = A.miss_summary(A.miss_sweep(ts, load_profile("cpu", {"cache_ratios": [0.5, 1.0]}), progress=False))
    assert set(summary.policy) == set(P.sim_policies)
    assert (summary[summary.policy == "demand"].misses_vs_lru == 1).all()
    rows = bench_rows({0.43: 1.0, 1.0: 5.0})
    by_ratio, by_cell = A.capacity_tables(rows)
    q = {"resident": {"seconds": 1.0}, "offloaded": {"seconds": 2.0, "stall_seconds": 0.5}, "cache_experts": 5}
    made = {
        "00": F.quickstart_time(q, P),
        "01a": F.working_set(ws, P),
        "01b": F.stability(sim, share, P, A.STABLE),
        "02": F.misses(summary, P),
        "03": F.throttle(A.throttle_summary(throttle_rows()), P),
        "04": F.capacity(by_ratio, by_cell, P),
        "05": F.tide(bench_rows({1.0: 0.0, 0.5: 0.5}, policies=("demand", "interval_refresh")), P),
    }
    for name, (fig, df) in made.items():
        png, csv = F.save(fig, df, P, name, log=lambda s: None)
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 500_000
        assert len(pd.read_csv(csv)) == len(df) > 0
        assert not list(png.parent.glob(".*.tmp")) and not list(csv.parent.glob(".*.tmp"))
    assert (places / "figures" / "cpu" / "04.png").is_file()
