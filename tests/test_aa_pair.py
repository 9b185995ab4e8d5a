"""The A/A pair of every timing grid (Settings.aa_pair): demand runs twice per repetition, as two arms of the
balanced order with the same code; rows `policy` demand with `arm` A and B, every other row arm A. Files
written before the column read as arm A; consumers that pivot by policy read the arm-A rows (primary)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from test_bench import FakeRunner, fake_profile, quiet

from artifact.errors import ResultFileError
from artifact.experiments.bench import run_bench
from artifact.experiments.bench.order import primary, slot_order, slot_run, slots
from artifact.experiments.bench.results import (
    COLUMNS,
    check_rows,
    expected_runs,
    load_for_append,
    merge,
    read_rows,
)
from artifact.experiments.paired_table import paired_table
from artifact.experiments.settings import load_profile

ROOT = Path(__file__).resolve().parent.parent
STORED = sorted((ROOT / "data" / "results" / "cpu" / "runs").glob("run*/bench.csv"))
# the nine runs of 0a2396f, recorded before bench rows carried their arm (earlier_runs/README.md)
EARLIER = sorted((ROOT / "data" / "results" / "cpu" / "earlier_runs" / "0a2396ff3627").glob("run*/bench.csv"))
RUN_KEYS = ["task", "batch_size", "cache_ratio", "bandwidth_scale", "policy", "arm", "rep"]


def runs_per_cell(df) -> set[tuple]:
    """{(cell, runs)}: each cell's sorted (policy, arm, rep) list, as a tuple."""
    return {
        (key, tuple(sorted(zip(g.policy, g.arm, g.rep))))
        for key, g in df.groupby(["task", "batch_size", "cache_ratio", "bandwidth_scale"])
    }


def test_the_grid_writes_the_aa_pair_once_per_policy_arm_and_repetition(tmp_path):
    p = fake_profile()
    assert p.aa_pair is True  # the default
    runner = FakeRunner()
    df = run_bench(p, tmp_path / "b.csv", runner=runner, progress=False, log=quiet)
    want = tuple(
        sorted(
            (pol, arm, r)
            for pol, arm in [("demand", "A"), ("demand", "B"), ("last_step", "A")]
            for r in range(2)
        )
    )
    assert {runs for _, runs in runs_per_cell(df)} == {want}
    assert len(df) == len(runs_per_cell(df)) * len(want) and not df.duplicated(RUN_KEYS).any()
    assert set(df[df.arm == "B"].policy) == {"demand"}  # the B arm is demand's, under demand's own name
    assert set(df.policy) == {"demand", "last_step"} and set(df.arm) == {"A", "B"}
    # the B arm's slot label reaches neither the runner nor the CSV: the runner ran demand for it
    assert {pol for _, pol in runner.calls} == {"demand", "last_step"}
    timed = len(runner.calls) - 12 * 2  # less one warm-up run per policy and cell
    assert timed == len(df) and sum(pol == "demand" for _, pol in runner.calls) == 12 * (1 + 2 * 2)
    assert "#" not in (tmp_path / "b.csv").read_text()
    # a repetition's slots are 0..k-1 over its three runs, the B arm one of them
    assert (df.groupby(RUN_KEYS[:4] + ["rep"]).order.apply(sorted).map(tuple) == (0, 1, 2)).all()


def test_no_b_arm_without_the_switch_or_without_demand(tmp_path):
    off = run_bench(
        fake_profile(aa_pair=False), tmp_path / "off.csv", runner=FakeRunner(), log=quiet, progress=False
    )
    assert set(off.arm) == {"A"} and len(off) == 12 * 2 * 2
    no_demand = fake_profile(policies=["last_step", "oracle"])
    assert expected_runs(no_demand) == {(pol, "A", r) for pol in ("last_step", "oracle") for r in range(2)}
    assert slots(["last_step", "oracle"], True) == ("last_step", "oracle")
    assert slots(["demand", "last_step"], True) == ("demand", "last_step", "demand#B")
    assert [slot_run(s) for s in slots(["demand"], True)] == [("demand", "A"), ("demand", "B")]
    with pytest.raises(ValueError, match="true or false"):
        load_profile("cpu", {"aa_pair": "yes"})


def test_the_b_arm_is_balanced_in_the_williams_order():
    """Over one cycle the B arm takes every slot as often as demand's A arm does (the order's guarantee for
    distinct labels)."""
    labels = slots(["demand", "last_step", "last_step_conservative"], True)
    rows = [slot_order(labels, i) for i in range(4)]
    for label in labels:
        assert sorted(row.index(label) for row in rows) == [0, 1, 2, 3]


def test_old_files_without_arm_read_as_arm_a(tmp_path):
    assert EARLIER, "the committed earlier runs of the cpu profile"
    for f in EARLIER[:2]:
        assert "arm" not in f.read_text().split("\n", 1)[0].split(",")
        df = read_rows(f)  # never rewritten: read as it is
        assert list(df.columns) == list(COLUMNS) and set(df.arm) == {"A"}
        assert primary(df) is df
    # a file the previous version wrote (no arm column): reads, and resumes without the pair
    p = fake_profile(tasks=["gsm8k"], batch_sizes=[4], cache_ratios=[1.0, 1.73], aa_pair=False)
    out = tmp_path / "b.csv"
    df = run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
    df[df.cache_ratio == 1.0].drop(columns="arm").to_csv(out, index=False)
    assert set(read_rows(out).arm) == {"A"}
    with pytest.raises(ResultFileError, match="before bench rows carried their arm"):
        run_bench(dataclasses.replace(p, aa_pair=True), out, runner=FakeRunner(), progress=False, log=quiet)
    full = run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
    assert len(full) == 8 and set(full.arm) == {"A"}
    assert "arm" not in out.read_text().split("\n", 1)[0]  # appended in the file's own columns


def test_a_partial_grid_with_arms_resumes_exactly(tmp_path):
    p, out = fake_profile(), tmp_path / "b.csv"
    with pytest.raises(RuntimeError, match="injected"):
        run_bench(p, out, runner=FakeRunner(fail_on_cell=5), progress=False, log=quiet)
    part = read_rows(out)
    assert len(runs_per_cell(part)) == 5 and (part.arm == "B").sum() == 5 * 2
    # an interrupted append: the next cell's rows but its last (a B arm, say) cut off
    runner = FakeRunner()
    whole = run_bench(p, tmp_path / "whole.csv", runner=runner, progress=False, log=quiet)
    cell6 = whole.iloc[len(part) : len(part) + 6]
    cell6 = cell6[~((cell6.arm == "B") & (cell6.rep == 1))]
    with open(out, "a") as f:
        f.write(cell6.to_csv(index=False, header=False))
    notes = []
    kept = load_for_append(out, p, log=notes.append)
    assert len(kept) == len(part) and "incomplete last cell" in notes[0] and "(5 of 6 runs)" in notes[0]
    again = FakeRunner()
    full = run_bench(p, out, runner=again, progress=False, log=quiet)
    assert len(again.cells) == 12 - 5 and len(full) == 12 * 6 and not full.duplicated(RUN_KEYS).any()
    assert runs_per_cell(full) == runs_per_cell(whole)
    pd.testing.assert_frame_equal(full.iloc[: len(part)], part)
    # a grid with the pair is not resumed without it
    with pytest.raises(ResultFileError, match="hold the A/A pair"):
        run_bench(fake_profile(aa_pair=False), out, runner=FakeRunner(), progress=False, log=quiet)


def test_shards_with_arms_merge_and_a_run_twice_is_refused(tmp_path):
    p = fake_profile()
    whole = run_bench(p, tmp_path / "all.csv", runner=FakeRunner(), progress=False, log=quiet)
    shards = [tmp_path / f"s{i}.csv" for i in range(2)]
    for i, f in enumerate(shards):
        run_bench(p, f, shard=(i, 2), runner=FakeRunner(), progress=False, log=quiet)
    merged = merge(shards, tmp_path / "m.csv", log=quiet)
    assert runs_per_cell(merged) == runs_per_cell(whole) and len(merged) == len(whole)
    with pytest.raises(ValueError, match="appears twice"):
        merge([shards[0], shards[0]], tmp_path / "dup.csv", partial=True, log=quiet)
    # the arm is part of a run's key: demand's two arms of one repetition are not duplicates, two Bs are
    df = read_rows(shards[0])
    b = df.index[df.arm == "B"][0]
    df.loc[b, "arm"] = "A"
    with pytest.raises(ResultFileError, match="runs, expected"):
        check_rows(df, "x.csv", expected_runs(p))
    df.loc[b, "arm"] = "C"
    with pytest.raises(ResultFileError, match="arm \\(A or B\\)"):
        check_rows(df, "x.csv")


def test_tables_read_arm_a_only():
    """stats.paired_table (every consumer's table) is the same with and without the B arm's rows, however
    different their times."""
    stored = read_rows(STORED[0])
    assert set(stored[stored.arm == "B"].policy) == {"demand"}  # the stored runs hold the pair
    rows = stored[stored.policy.isin(["demand", "last_step"]) & (stored.arm == "A")].reset_index(drop=True)
    before = paired_table(rows, "demand", "last_step", ("cache_ratio",))
    b = rows[rows.policy == "demand"].assign(arm="B", tokens_per_second=lambda d: d.tokens_per_second * 3)
    both = pd.concat([rows, b], ignore_index=True)
    pd.testing.assert_frame_equal(paired_table(both, "demand", "last_step", ("cache_ratio",)), before)
    assert len(primary(both)) == len(rows) and set(primary(both).arm) == {"A"}
    # the stored run's own B rows change nothing either
    pd.testing.assert_frame_equal(
        paired_table(
            stored[stored.policy.isin(["demand", "last_step"])], "demand", "last_step", ("cache_ratio",)
        ),
        before,
    )


@pytest.mark.slow
def test_the_b_arm_runs_demands_code(tiny, tmp_path):
    """On the tiny model both arms of the pair give demand's exact counts and tokens, repetition by
    repetition, and differ from a predictor's."""
    p = load_profile(
        "cpu",
        {
            "tasks": ["gsm8k"],
            "batch_sizes": [1],
            "cache_ratios": [0.83],
            "repetitions": 2,
            "warmup": 0,
            "n_prompts": 1,
            "gen_length": 32,
            "max_prompt_tokens": 32,
            "policies": ["demand", "last_step"],
        },
    )
    df = run_bench(p, tmp_path / "b.csv", loaded=tiny, progress=False, log=quiet)
    counts = [
        "demand_hits",
        "demand_misses",
        "speculative_transfers",
        "bytes_h2d",
        "tokens",
        "tokens_sha",
        "demand_misses_later",
    ]
    a = df[(df.policy == "demand") & (df.arm == "A")].set_index("rep")[counts]
    b = df[(df.policy == "demand") & (df.arm == "B")].set_index("rep")[counts]
    assert len(a) == len(b) == 2
    pd.testing.assert_frame_equal(a, b)
    assert (b.speculative_transfers == 0).all()
    ls = df[df.policy == "last_step"].set_index("rep")
    assert (ls.speculative_transfers > 0).all()  # the check can tell another policy's code apart


def test_a_study_table_reads_arm_a_only():
    """03's summary (runs and means per bandwidth and policy) is the same with the B arm's rows added."""
    from artifact.experiments.studies.bandwidth_throttling import summary_table

    stored = pd.read_csv(STORED[0].with_name("throttle_runs.csv"))
    assert (stored.arm == "B").any()  # the stored run holds the pair
    rows = stored[stored.arm == "A"].reset_index(drop=True)
    before = summary_table(rows)
    b = rows[rows.policy == "demand"].assign(arm="B", tokens_per_second=lambda d: d.tokens_per_second * 3)
    after = summary_table(pd.concat([rows, b], ignore_index=True))
    pd.testing.assert_frame_equal(after[before.columns], before)
    pd.testing.assert_frame_equal(summary_table(stored)[before.columns], before)
