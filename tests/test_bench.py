"""Benchmark runner: whole cells only, resume without repeats or losses, shards that merge into one grid.

The bookkeeping tests use a fake runner (instant, deterministic); the interruption test runs the tiny
model for real on a two-cell grid."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from artifact.cli import main as main_for_tests
from artifact.experiments.bench import run_bench
from artifact.experiments.bench.grid import Cell, grid, parse_shard, shard_cells
from artifact.experiments.bench.model_runner import ModelRunner
from artifact.experiments.bench.order import primary
from artifact.experiments.bench.results import COLUMNS, STAT_COLUMNS, merge, read_rows
from artifact.experiments.settings import load_profile
from artifact.offload.replay.sim import capacity_for


def fake_profile(**over):
    base = {
        "tasks": ["gsm8k", "mbpp"],
        "batch_sizes": [1, 4],
        "cache_ratios": [0.43, 1.0, 1.73],
        # the bench's mechanics: 2 policies
        "repetitions": 2,
        "warmup": 1,
        "policies": ["demand", "last_step"],
    }
    base.update(over)
    return load_profile("cpu", base)


class FakeRunner:
    """Stands in for ModelRunner: counts calls, makes every run's seconds distinct."""

    num_experts = 256
    meta = {
        "model": "fake",
        "model_hash": "0123456789",
        "weights_fingerprint": "fedcba9876543210",
        "dtype": "float32",
        "device": "cpu",
        "link": "emulated",
        "hardware": "test",
    }

    def __init__(self, fail_on_cell: int | None = None):
        self.calls, self.cells, self.fail_on_cell = [], [], fail_on_cell

    def working_set(self, task, batch_size):
        return 10.0 + batch_size

    def measure(self, cell, policy, capacity):
        if not self.cells or self.cells[-1] != cell:
            self.cells.append(cell)
        if self.fail_on_cell is not None and len(self.cells) > self.fail_on_cell:
            raise RuntimeError("injected failure")
        self.calls.append((cell, policy))
        s = 1.0 + len(self.calls) / 1000 + (0.05 if policy == "last_step" else 0.0)
        out = {k: 0 for k in STAT_COLUMNS}
        out.update(seconds=s, tokens=64, tokens_per_second=64 / s, link_gbps=0.1, tokens_sha="000042")
        return out


def quiet(*a, **k):
    pass


def test_grid_order_and_shards():
    p = fake_profile()
    cells = grid(p)
    assert len(cells) == 2 * 2 * 3
    assert cells[0] == Cell("gsm8k", 1, 0.43, 1.0) and cells[1] == Cell("gsm8k", 1, 1.0, 1.0)
    assert cells[-1] == Cell("mbpp", 4, 1.73, 1.0)
    for n in (1, 2, 5):
        parts = [shard_cells(cells, (i, n)) for i in range(n)]
        assert sorted(c.key for part in parts for c in part) == sorted(c.key for c in cells)
        assert shard_cells(cells, (0, n))[0] == cells[0]
    assert parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)


def test_rows_alternate_order_and_are_complete(tmp_path):
    p = fake_profile(tasks=["gsm8k"], batch_sizes=[4], cache_ratios=[1.0])
    runner = FakeRunner()
    df = run_bench(p, tmp_path / "b.csv", runner=runner, progress=False, log=quiet)
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 3 * 2  # (policies + demand's B arm) x repetitions
    assert len(runner.calls) == 3 * 2 + 2  # + one warm-up run per policy (not per arm)
    first = list(df.sort_values(["rep", "order"])[["policy", "arm"]].itertuples(index=False, name=None))
    assert first == [("demand", "A"), ("last_step", "A"), ("demand", "B")] + [
        ("demand", "B"),
        ("last_step", "A"),
        ("demand", "A"),
    ]
    assert (df.cache_experts == capacity_for(1.0, 14.0, 256)).all() and (df.working_set == 14.0).all()
    # strings survive the CSV
    assert set(df.model_hash) == {"0123456789"} and set(df.tokens_sha) == {"000042"}


def test_interrupted_fake_bench_resumes_exactly(tmp_path):
    p, out = fake_profile(), tmp_path / "b.csv"
    with pytest.raises(RuntimeError, match="injected"):
        run_bench(p, out, runner=FakeRunner(fail_on_cell=5), progress=False, log=quiet)
    part = read_rows(out)
    assert part.groupby(["task", "batch_size", "cache_ratio"]).ngroups == 5
    runner = FakeRunner()
    full = run_bench(p, out, runner=runner, progress=False, log=quiet)
    assert len(runner.cells) == 12 - 5  # only the missing cells ran
    assert (
        len(full) == 12 * 3 * 2
        and not full.duplicated(["task", "batch_size", "cache_ratio", "policy", "arm", "rep"]).any()
    )
    pd.testing.assert_frame_equal(full.iloc[: len(part)], part)
    again = FakeRunner()
    run_bench(p, out, runner=again, progress=False, log=quiet)
    assert again.calls == []  # nothing left to do


def test_two_shards_merge_into_the_unsharded_grid(tmp_path):
    p = fake_profile()
    whole = run_bench(p, tmp_path / "all.csv", runner=FakeRunner(), progress=False, log=quiet)
    shards = [tmp_path / f"s{i}.csv" for i in range(2)]
    for i, f in enumerate(shards):
        run_bench(p, f, shard=(i, 2), runner=FakeRunner(), progress=False, log=quiet)
    assert len(read_rows(shards[0])) == len(read_rows(shards[1])) == len(whole) // 2
    merged = merge(shards, tmp_path / "merged.csv", log=quiet)
    run_keys = ["task", "batch_size", "cache_ratio", "bandwidth_scale", "policy", "rep", "order"]
    as_set = lambda df: set(map(tuple, df[run_keys].itertuples(index=False)))  # noqa: E731
    assert as_set(merged) == as_set(whole) and len(merged) == len(whole)
    assert read_rows(tmp_path / "merged.csv").equals(merged)
    # shards may share a file: shard 1 run into a copy of shard 0's file completes the grid there
    shared = tmp_path / "shared.csv"
    shared.write_bytes(shards[0].read_bytes())
    both = run_bench(p, shared, shard=(1, 2), runner=FakeRunner(), progress=False, log=quiet)
    assert as_set(both) == as_set(whole) and len(both) == len(whole)
    # merge refuses what is not one grid
    with pytest.raises(ValueError, match="appears twice"):
        merge([shards[0], shards[0], shards[1]], tmp_path / "dup.csv", log=quiet)
    with pytest.raises(ValueError, match="holds? 6 of the grid's 12 cells"):
        merge([shards[0]], tmp_path / "half.csv", log=quiet)
    assert len(merge([shards[0]], tmp_path / "half.csv", partial=True, log=quiet)) == len(whole) // 2
    with pytest.raises(FileExistsError, match="merged.csv exists"):
        merge(shards, tmp_path / "merged.csv", log=quiet)
    merge(shards, tmp_path / "merged.csv", force=True, log=quiet)
    other = tmp_path / "other.csv"
    run_bench(
        fake_profile(repetitions=3), other, shard=(1, 2), runner=FakeRunner(), progress=False, log=quiet
    )
    with pytest.raises(ValueError, match="shards disagree on fingerprint"):
        merge([shards[0], other], tmp_path / "x.csv", log=quiet)


def test_resume_refuses_other_settings_and_damaged_files(tmp_path):
    out = tmp_path / "b.csv"
    run_bench(fake_profile(), out, runner=FakeRunner(), progress=False, log=quiet)
    with pytest.raises(ValueError, match="not this profile's"):
        run_bench(fake_profile(gen_length=64), out, runner=FakeRunner(), progress=False, log=quiet)
    df = read_rows(out)
    df.drop(index=1).to_csv(out, index=False)  # a cell missing a run (not the last cell: see below)
    with pytest.raises(ValueError, match="has 5 runs, expected"):
        run_bench(fake_profile(), out, runner=FakeRunner(), progress=False, log=quiet)
    with pytest.raises(ValueError, match="has 5 runs, expected"):
        read_rows(out)  # what report reads: refused like bench refuses it
    (tmp_path / "junk.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="lacks columns"):
        read_rows(tmp_path / "junk.csv")


def test_cli_list_report_merge(tmp_path, capsys):
    p = fake_profile()
    shards = [tmp_path / f"s{i}.csv" for i in range(2)]
    for i, f in enumerate(shards):
        run_bench(p, f, shard=(i, 2), runner=FakeRunner(), progress=False, log=quiet)
    assert main_for_tests(["bench", "--profile", "cpu", "--shard", "1/5", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == len(shard_cells(grid(load_profile("cpu")), (1, 5))) and listed[0].split()[0] == "1"
    out = tmp_path / "m.csv"
    assert main_for_tests(["merge", *map(str, shards), "--out", str(out)]) == 0
    assert main_for_tests(["merge", *map(str, shards), "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main_for_tests(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "demand (A) vs last_step (B)" in text and "1.73" in text and "[-1.16, +2.63]" in text
    table = tmp_path / "table.csv"
    assert main_for_tests(["report", str(out), "--csv", str(table)]) == 0
    capsys.readouterr()
    assert main_for_tests(["report", str(out), "--csv", str(table)]) == 2  # never silently replaced
    assert "exists; pass --force" in capsys.readouterr().err
    assert main_for_tests(["report", str(out), "--csv", str(table), "--force"]) == 0
    assert main_for_tests(["report", str(out), "--a", "oracle"]) == 2
    assert "policy 'oracle' is not in these rows" in capsys.readouterr().err
    assert main_for_tests(["report", str(tmp_path / "none.csv")]) == 2
    assert main_for_tests(["bench", "--shard", "2/2", "--list"]) == 2
    assert "0 <= i < n" in capsys.readouterr().err


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_real_bench_interrupted_and_resumed(tiny, tmp_path, one_thread):
    """The tiny model on a two-cell grid: fail in cell 2, rerun, and check nothing repeats or is lost."""
    p = load_profile(
        "cpu",
        {
            "tasks": ["gsm8k"],
            "batch_sizes": [1],
            "cache_ratios": [1.3, 1.73],
            "repetitions": 2,
            "n_prompts": 1,
            "gen_length": 32,
            "max_prompt_tokens": 32,
            "policies": ["demand", "last_step"],
        },
    )
    out = tmp_path / "b.csv"

    class Failing(ModelRunner):
        def measure(self, cell, policy, capacity):
            if cell.cache_ratio == 1.73:
                raise RuntimeError("injected failure")
            return super().measure(cell, policy, capacity)

    with pytest.raises(RuntimeError, match="injected"):
        run_bench(p, out, runner=Failing(p, tiny), progress=False, log=quiet)
    first = read_rows(out)
    assert len(first) == 6 and set(first.cache_ratio) == {1.3}  # 2 reps x (demand A, B; last_step)
    full = run_bench(p, out, loaded=tiny, progress=False, log=quiet)
    assert len(full) == 12
    assert full.groupby(["cache_ratio", "policy", "arm", "rep"]).size().eq(1).all()
    pd.testing.assert_frame_equal(full[full.cache_ratio == 1.3].reset_index(drop=True), first)
    # the rows are real measurements of identical work
    W = full.working_set.iloc[0]
    assert W > 0 and (full.working_set == W).all()
    for r, g in full.groupby("cache_ratio"):
        assert (g.cache_experts == capacity_for(r, W, tiny.cfg.num_experts)).all()
        assert g.tokens_sha.nunique() == 1 and g.tokens.nunique() == 1  # offloading changes time, not tokens
    assert (full.seconds > 0).all()
    # host time per forward (CPU: the forward computes on the host, so host is its wall time less nothing)
    assert (full.host_ms_per_forward > 0).all() and (
        full.host_ms_per_forward <= full.wall_ms_per_forward
    ).all()
    assert full.tokens_per_second.to_numpy() == pytest.approx((full.tokens / full.seconds).to_numpy())
    assert (full[full.policy == "demand"].speculative_transfers == 0).all()
    assert (full.demand_hits + full.demand_misses > 0).all()
    assert set(full.model) == {tiny.cfg.name} and set(full.link) == {"emulated"}


def test_changed_tokens_are_flagged(tmp_path, capsys):
    from artifact.experiments.bench.results import changed_tokens

    out = tmp_path / "b.csv"
    df = run_bench(fake_profile(), out, runner=FakeRunner(), progress=False, log=quiet)
    assert changed_tokens(df) == []
    df.loc[0, "tokens_sha"] = "ffffff"
    assert changed_tokens(df) == [str(Cell(df.task[0], int(df.batch_size[0]), df.cache_ratio[0], 1.0))]
    df.to_csv(out, index=False)
    assert main_for_tests(["report", str(out)]) == 0
    assert "warning: policies generated different tokens in 1 cells" in capsys.readouterr().err


@pytest.mark.slow
def test_real_bench_runs_every_engine_policy(tiny, tmp_path, one_thread):
    """oracle is fed the traced run of the same prompts; all four policies give the same tokens."""
    pols = ["demand", "last_step", "oracle", "interval_refresh"]
    p = load_profile(
        "cpu",
        {
            "tasks": ["mbpp"],
            "batch_sizes": [1],
            "cache_ratios": [1.0],
            "repetitions": 1,
            "n_prompts": 1,
            "gen_length": 32,
            "max_prompt_tokens": 32,
            "policies": pols,
        },
    )
    df = primary(run_bench(p, tmp_path / "b.csv", loaded=tiny, progress=False, log=quiet)).set_index("policy")
    assert list(df.index) == pols and df.tokens_sha.nunique() == 1
    assert df.speculative_transfers["demand"] == 0 and df.speculative_transfers["oracle"] > 0
    assert df.demand_misses["oracle"] < df.demand_misses["demand"]  # true future knowledge removes misses
    assert (
        df.prefetch_hits["oracle"] > 0 and df.wasted_prefetches["oracle"] <= df.wasted_prefetches["last_step"]
    )


def test_rows_carry_host_time_and_old_files_read_without_it(tmp_path):
    """host_ms_per_forward / wall_ms_per_forward: medians of a run's per-forward lists; a file written before
    them reads with them empty and takes appends in its own columns."""
    from artifact.experiments.bench.model_runner import host_medians
    from artifact.experiments.bench.results import BEFORE_HOST, HOST_COLUMNS

    assert host_medians([3.0, 1.0, 2.0], [4.0, 8.0]) == {
        "host_ms_per_forward": 2.0,
        "wall_ms_per_forward": 6.0,
    }
    assert host_medians([], []) == {"host_ms_per_forward": None, "wall_ms_per_forward": None}
    # a file of that version has no A/A pair either (aa_pair: false resumes it)
    p = fake_profile(tasks=["gsm8k"], batch_sizes=[4], cache_ratios=[1.0, 1.73], aa_pair=False)
    out = tmp_path / "b.csv"
    df = run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)
    old = df[df.cache_ratio == 1.0][list(BEFORE_HOST)]
    old.to_csv(out, index=False)  # as the previous version wrote it
    back = read_rows(out)
    assert list(back.columns) == list(COLUMNS) and back[list(HOST_COLUMNS)].isna().all().all()
    df = run_bench(p, out, runner=FakeRunner(), progress=False, log=quiet)  # resumes: appends C/W 1.73
    assert sorted(set(df.cache_ratio)) == [1.0, 1.73] and len(df) == 8
    assert out.read_text().splitlines()[0] == ",".join(BEFORE_HOST)
