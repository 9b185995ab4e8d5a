"""Phase-split accounting on every surface (prefill, first = a block's step 0, later): the phases add up to
the totals in the simulator (policies and the bound `min`), `simulate --by-phase` (JSON, CSV, table), the
engine's stats (equal to the replay's, phase by phase), the bench's columns and the trace metrics; and
`min` is a simulator-only bound that the engine and the bench refuse by name."""

import json

import numpy as np
import pandas as pd
import pytest

from artifact.cli import main
from artifact.errors import ProfileError, ResultFileError, SettingError
from artifact.experiments.bench.results import (
    ARM_COLUMNS,
    COLUMNS,
    HOST_COLUMNS,
    PHASE_COLUMNS,
    STAT_COLUMNS,
    phase_stats,
    read_rows,
)
from artifact.experiments.settings import load_profile
from artifact.model.decode import DecodeConfig
from artifact.model.routing import Demand, StepInfo
from artifact.offload.backend.plans import COUNTS, PHASES
from artifact.offload.policy.policies import check_policy
from artifact.offload.replay.bounds import relaxed_min
from artifact.offload.replay.sim import (
    BASES,
    DENOISING_ONLY,
    WITH_PREFILL,
    by_basis,
    denoising_only,
    phase_columns,
    replay,
    ruling_basis,
    sweep,
)
from artifact.offload.replay.trace import TraceRecorder, mean_working_set, working_set_by_phase, working_sets
from artifact.offload.runner import decode_prompts
from artifact.offload.spec import RunSpec

DC = DecodeConfig(gen_length=40)
SIM_POLICIES = ["demand", "last_step", "oracle", "belady", "min"]
KEYS = (*COUNTS, "accesses")


def stream(E=12, layers=2, prefill=2, blocks=2, steps=4, seed=0):
    """A random routing stream with prefill forwards and blocks of denoising steps (no model run)."""
    rng = np.random.default_rng(seed)
    rec = TraceRecorder()
    kinds = [StepInfo(t, -1, -1, "prefill") for t in range(prefill)]
    kinds += [StepInfo(prefill + b * steps + s, b, s, "denoise") for b in range(blocks) for s in range(steps)]
    for step in kinds:
        for layer in range(1, layers + 1):
            exp = tuple(
                sorted(
                    rng.choice(
                        E, size=int(rng.integers(2, 8 if step.kind == "prefill" else 6)), replace=False
                    ).tolist()
                )
            )
            rec(Demand(step, layer, exp, tuple(1 + e % 3 for e in exp)))
    return rec.trace(
        {
            "moe_layers": list(range(1, layers + 1)),
            "num_experts": E,
            "config_hash": "x",
            "task": "synthetic",
            "batch_size": 1,
            "expert_bytes": 5,
        }
    )


def assert_phases_add_up(row: dict, keys=KEYS):
    assert set(row["by_phase"]) == set(PHASES)
    for k in keys:
        assert sum(row["by_phase"][p][k] for p in PHASES) == row[k], k


@pytest.mark.parametrize("C", [2, 4, 7])
def test_replay_phases_add_up_for_policies_and_min(C):
    t = stream()
    rows = {p: replay(t, p, C, by_phase=True) for p in SIM_POLICIES}
    for p, row in rows.items():
        assert_phases_add_up(row)
        assert row["accesses"] == t.accesses, p
        for q in PHASES:  # every demanded expert is a hit or a miss, in its phase
            ph = row["by_phase"][q]
            assert ph["demand_hits"] + ph["demand_misses"] == ph["accesses"], (p, q)
    assert rows["min"]["by_phase"] == relaxed_min(t, C, by_phase=True)["by_phase"]
    assert rows["min"]["demand_misses"] <= rows["belady"]["demand_misses"] <= rows["demand"]["demand_misses"]
    for p in ("last_step", "oracle"):
        assert rows["min"]["demand_misses"] <= rows[p]["demand_misses"] + rows[p]["speculative_transfers"]
    assert rows["demand"]["by_phase"]["prefill"]["demand_misses"] > 0  # the stream starts cold in prefill


def test_sweep_takes_min_and_flattens_phases():
    t = stream()
    df = sweep([t], [0.5, 1.0], SIM_POLICIES, by_phase=True, lookahead=1, tau=2)
    assert list(df.policy) == SIM_POLICIES * 2
    assert (
        df[df.policy == "min"].demand_misses.to_numpy() <= df[df.policy == "belady"].demand_misses.to_numpy()
    ).all()
    flat = phase_columns(df)
    assert "by_phase" not in flat
    for k in KEYS:
        assert (flat[[f"{k}_{p}" for p in PHASES]].sum(axis=1) == flat[k]).all(), k
    with pytest.raises(SettingError, match="takes no options"):
        sweep([t], [1.0], ["min:x=1"])


def phase_split(steps: pd.DataFrame, prefill: pd.DataFrame, counts) -> pd.DataFrame:
    """A sweep as sweep(by_phase=True) and phase_columns give it, from two sweeps of the same rows: `steps`
    counts the denoising steps, `prefill` the prefill forwards; each total is their sum, `<count>_prefill` the
    prefill's (other tests build constructed cases where the two counting bases disagree with it)."""
    out = steps.copy()
    for c in counts:
        out[c] = steps[c] + prefill[c]
        out[f"{c}_prefill"] = prefill[c]
    return out


def test_by_basis_pools_all_demands_and_the_denoising_steps():
    t = stream()
    pols = ["demand", "last_step", "oracle", "min"]
    df = phase_columns(sweep([t], [0.5, 1.0], pols, by_phase=True))
    counts = ("demand_misses", "speculative_transfers", "accesses")
    s = by_basis(df, ["cache_ratio"], counts).set_index(["prefill", "cache_ratio", "policy"])
    assert set(s.index.get_level_values("prefill")) == set(BASES)
    assert ruling_basis(s.reset_index()) == DENOISING_ONLY
    for r in (0.5, 1.0):
        for p in pols:
            row = df[(df.cache_ratio == r) & (df.policy == p)].iloc[0]
            for c in counts:  # all demands: the totals; denoising steps: the phases first and later
                assert s.loc[(WITH_PREFILL, r, p), c] == row[c], (r, p, c)
                assert s.loc[(DENOISING_ONLY, r, p), c] == row[f"{c}_first"] + row[f"{c}_later"], (r, p, c)
            assert (
                s.loc[(DENOISING_ONLY, r, p), "lru_misses"]
                == s.loc[(DENOISING_ONLY, r, "demand"), "demand_misses"]
            )
    lru = s.xs("demand", level="policy").demand_misses
    assert lru[(DENOISING_ONLY, 1.0)] < lru[(WITH_PREFILL, 1.0)]
    assert (denoising_only(df, counts).accesses == df.accesses - df.accesses_prefill).all()
    plain = by_basis(
        df[[c for c in df if not c.endswith(("_prefill", "_first", "_later"))]], ["cache_ratio"], counts
    )
    # no phases: all demands
    assert set(plain.prefill) == {WITH_PREFILL} and ruling_basis(plain) == WITH_PREFILL


def test_min_is_refused_by_the_engine_and_the_bench_with_its_reason():
    for engine in (False, True):
        with pytest.raises(SettingError, match="is a bound.*not a cache policy.*simulate"):
            check_policy("min", engine=engine)
    with pytest.raises(SettingError, match="is a bound"):
        RunSpec(capacity=8, policy="min")
    with pytest.raises(ProfileError, match="policies.*'min'.*is a bound"):
        load_profile("cpu", {"policies": ["demand", "min"]})


def test_simulate_by_phase_json_csv_and_table(tmp_path, capsys):
    path = stream().save(tmp_path / "s.safetensors")
    args = ["simulate", "--trace", str(path), "--policies", ",".join(SIM_POLICIES), "--cache-ratios", "0.5,1"]
    assert main([*args, "--by-phase", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == SIM_POLICIES * 2
    for r in rows:
        assert set(r["by_phase"]) == {"prefill", "first", "later"}
        assert set(KEYS) <= set(r["by_phase"]["first"])
        assert_phases_add_up(r)
    assert main([*args, "--json"]) == 0  # without --by-phase the rows carry no by_phase
    assert all("by_phase" not in r for r in json.loads(capsys.readouterr().out))
    out = tmp_path / "m.csv"
    assert main([*args, "--by-phase", "--csv", str(out)]) == 0
    df = pd.read_csv(out)
    assert (
        df.demand_misses_prefill + df.demand_misses_first + df.demand_misses_later == df.demand_misses
    ).all()
    assert main([*args, "--by-phase"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[5] == "phase" and len(table) == 1 + 10 * 4  # 3 phases + total per row
    assert [ln.split()[5] for ln in table[1:5]] == ["prefill", "first", "later", "total"]


def test_trace_metrics_per_phase():
    t = stream()
    ws = working_sets(t, denoise_only=False)
    assert set(ws.phase) == set(PHASES)
    assert (ws[ws.kind == "prefill"].phase == "prefill").all()
    assert (ws[ws.block_step == 0].phase.isin(["prefill", "first"])).all()
    assert set(working_sets(t).phase) == {"first", "later"}
    s = working_set_by_phase(t).set_index("phase")
    assert list(s.index) == list(PHASES) and s.demands.sum() == len(t)
    for p in PHASES:
        assert s.loc[p, "mean_working_set"] == pytest.approx(ws[ws.phase == p].working_set.mean())
    den = s.loc[["first", "later"]]
    assert (den.demands * den.mean_working_set).sum() / den.demands.sum() == pytest.approx(
        mean_working_set(t)
    )


def test_bench_phase_columns_and_old_files(tmp_path):
    assert set(PHASE_COLUMNS) == {f"{c}_{p}" for c in COUNTS for p in PHASES}
    # the phase columns, then the host times, then the run's arm (the A/A pair's), last
    tail = PHASE_COLUMNS + HOST_COLUMNS + ARM_COLUMNS
    assert list(COLUMNS[-len(tail) :]) == list(tail)
    stats = {c: 0 for c in COUNTS}
    stats["by_phase"] = {p: {c: i + 10 * j for j, c in enumerate(COUNTS)} for i, p in enumerate(PHASES)}
    flat = phase_stats(stats["by_phase"])
    assert flat["demand_misses_first"] == 11 and flat["bytes_h2d_later"] == 52
    old = tmp_path / "bench.csv"  # a file from before the phase columns
    pd.DataFrame(columns=[c for c in COLUMNS if c not in PHASE_COLUMNS]).to_csv(old, index=False)
    with pytest.raises(ResultFileError, match="per-phase counts.*re-run the bench"):
        read_rows(old)
    assert set(STAT_COLUMNS).isdisjoint(PHASE_COLUMNS)


# --- the engine: its stats by phase equal the replay's by phase (model runs: slow tier) --------------------
@pytest.fixture(scope="module")
def recorded(tiny, tiny_prompts):
    return decode_prompts(
        tiny, tiny_prompts[:3], 2, RunSpec(decode=DC), record=True, prompt_ids=["a", "b", "c"], task="test"
    )


@pytest.mark.parametrize(
    "policy, capacity", [("demand", 12), ("demand", 40), ("last_step", 12), ("last_step", 40)]
)
def test_engine_stats_by_phase_equal_the_replay(tiny, tiny_prompts, recorded, policy, capacity):
    eng = decode_prompts(
        tiny,
        tiny_prompts[:3],
        2,
        RunSpec(decode=DC, capacity=capacity, policy=policy),
        record=True,
        prompt_ids=["a", "b", "c"],
        task="test",
    )
    assert eng.trace.equal_routing(recorded.trace)
    assert_phases_add_up(eng.stats.as_dict(), COUNTS)
    sim = replay(eng.trace, policy, capacity, by_phase=True)
    for p in PHASES:
        for k in COUNTS:
            assert eng.stats.by_phase[p][k] == sim["by_phase"][p][k], (p, k)
    assert eng.stats.by_phase["prefill"]["demand_misses"] > 0
    if policy == "last_step":
        assert sum(eng.stats.by_phase[p]["speculative_transfers"] for p in ("first", "later")) > 0


def test_simulate_by_phase_on_a_recorded_trace(recorded, tmp_path, capsys):
    path = recorded.trace.save(tmp_path / "rec.safetensors")
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(path),
                "--policies",
                ",".join(SIM_POLICIES),
                "--cache-ratios",
                "1,1.73",
                "--by-phase",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 10
    for r in rows:
        assert_phases_add_up(r)
    by = {(r["cache_ratio"], r["policy"]): r["demand_misses"] for r in rows}
    for ratio in (1, 1.73):
        assert by[ratio, "min"] <= by[ratio, "belady"] <= by[ratio, "demand"]


@pytest.mark.slow  # runs the tiny model end to end (subprocesses): not in the --fast tier
def test_generate_json_shows_the_engine_counts_by_phase(tiny, capsys):
    assert (
        main(
            [
                "generate",
                "--prompt",
                "What is 2 + 2?",
                "--gen-length",
                "32",
                "--offload",
                "--cache-experts",
                "16",
                "--policy",
                "last_step",
                "--json",
            ]
        )
        == 0
    )
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert_phases_add_up(stats, COUNTS)
    assert stats["by_phase"]["first"]["demand_misses"] > 0  # the cache starts cold in the first step
    assert stats["by_phase"]["later"]["speculative_transfers"] > 0
    assert (
        main(
            [
                "generate",
                "--prompt",
                "What is 2 + 2?",
                "--gen-length",
                "32",
                "--offload",
                "--cache-experts",
                "16",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert all(f"by_phase.{p}: demand_hits=" in err for p in PHASES)
