"""The policies' run order (bench/order.py): a Williams design, balanced over slots and adjacent pairs,
continued across stored runs by Settings.rotation; the bench's cells run in it and record each run's slot."""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
from test_bench import FakeRunner

from artifact.errors import ProfileError
from artifact.experiments import recording
from artifact.experiments.bench.grid import Cell
from artifact.experiments.bench.order import cycle_length, slot_order
from artifact.experiments.bench.results import bench_fingerprint
from artifact.experiments.bench.run import measure_cell
from artifact.experiments.settings import CONTROL, load_profile

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("demand", "last_step", CONTROL)


def names(k: int) -> tuple[str, ...]:
    return tuple(f"p{i}" for i in range(k))


def slot_counts(orders) -> Counter:
    return Counter((p, slot) for order in orders for slot, p in enumerate(order))


def pair_counts(orders) -> Counter:
    return Counter((a, b) for order in orders for a, b in zip(order, order[1:]))


def alternating(policies, index):
    """The order the bench used before a balanced design: listed on even repetitions, reversed on odd ones."""
    return tuple(policies) if index % 2 == 0 else tuple(policies)[::-1]


def balanced(orders, policies) -> bool:
    """Every policy in every slot equally often (and every slot seen)."""
    c = slot_counts(orders)
    return len(c) == len(policies) ** 2 and len(set(c.values())) == 1


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_one_cycle_puts_every_policy_in_every_slot_equally_often(k):
    ps = names(k)
    L = cycle_length(k)
    assert L == (k if k % 2 == 0 else 2 * k)
    orders = [slot_order(ps, i) for i in range(L)]
    assert all(sorted(o) == sorted(ps) for o in orders)  # each a permutation of the policies
    assert slot_counts(orders) == {(p, s): L // k for p in ps for s in range(k)}
    assert [slot_order(ps, i + L) for i in range(L)] == orders  # the cycle repeats
    assert slot_order(ps, 0) == ps and slot_order(ps, 1) == ps[::-1]  # listed (as the warm-up), then reversed
    assert all(orders[i + 1] == orders[i][::-1] for i in range(0, L, 2))  # each row beside its mirror


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_every_ordered_pair_is_adjacent_equally_often(k):
    ps = names(k)
    L = cycle_length(k)
    pairs = pair_counts(slot_order(ps, i) for i in range(L))
    per_pair = 1 if k % 2 == 0 else 2  # even: the square; odd: square + mirror
    assert pairs == {(a, b): per_pair for a in ps for b in ps if a != b}


def test_the_alternating_order_fails_the_balance_for_three_policies():
    """The check above can fail: listed/reversed leaves last_step in the middle slot every time."""
    orders = [alternating(POLICIES, i) for i in range(cycle_length(3))]
    assert not balanced(orders, POLICIES)
    assert slot_counts(orders)[("last_step", 1)] == cycle_length(3)
    assert balanced([slot_order(POLICIES, i) for i in range(cycle_length(3))], POLICIES)


@pytest.mark.parametrize("R, runs", [(2, 6), (4, 3)])
def test_the_stored_run_plan_is_balanced(R, runs):
    """Run k measures with rotation k - 1; repetition r of a grid with R repetitions uses index rotation * R +
    r."""
    orders = [slot_order(POLICIES, rotation * R + r) for rotation in range(runs) for r in range(R)]
    assert slot_counts(orders) == {(p, s): R * runs // 3 for p in POLICIES for s in range(3)}
    assert slot_counts(orders)[("last_step", 1)] == 4
    assert not balanced(
        [alternating(POLICIES, rotation * R + r) for rotation in range(runs) for r in range(R)], POLICIES
    )


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="at least one policy"):
        slot_order([], 0)
    with pytest.raises(ValueError, match="distinct policies; 'demand' listed twice"):
        slot_order(["demand", "last_step", "demand"], 0)
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="index must be an integer >= 0"):
            slot_order(POLICIES, bad)
    for bad in (0, -2):
        with pytest.raises(ValueError, match="number of policies must be an integer >= 1"):
            cycle_length(bad)


def test_measure_cell_runs_a_balanced_cycle_and_records_each_runs_slot():
    cell = Cell("gsm8k", 4, 1.0, 1.0)
    R, warmup = cycle_length(3), 1
    runner = FakeRunner()
    rows = measure_cell(runner, cell, list(POLICIES), R, warmup, {"profile": "test"})
    called = [p for _, p in runner.calls]
    assert called[:3] == list(POLICIES)  # the warm-up keeps the listed order
    timed = [tuple(called[3 + 3 * r : 6 + 3 * r]) for r in range(R)]
    assert balanced(timed, POLICIES)
    assert [(row["rep"], row["order"], row["policy"]) for row in rows] == [
        (r, s, p) for r, order in enumerate(timed) for s, p in enumerate(order)
    ]
    # rotation continues the cycle: rotation 1 with R repetitions starts at index R
    again = FakeRunner()
    rows = measure_cell(again, cell, list(POLICIES), 2, 0, {}, rotation=2)
    assert [p for _, p in again.calls] == [*slot_order(POLICIES, 4), *slot_order(POLICIES, 5)]
    assert [row["order"] for row in rows] == [0, 1, 2, 0, 1, 2]


def test_rotation_is_a_checked_setting_outside_every_fingerprint():
    assert load_profile("cpu").rotation == 0 and load_profile("cpu", {"rotation": 5}).rotation == 5
    with pytest.raises(ProfileError, match="overrides: rotation must be >= 0, got -1"):
        load_profile("cpu", {"rotation": -1})
    with pytest.raises(ProfileError, match="rotation must be an integer, got 1.5"):
        load_profile("cpu", {"rotation": 1.5})
    assert bench_fingerprint(load_profile("cpu", {"rotation": 3})) == bench_fingerprint(load_profile("cpu"))


def test_record_runs_measures_stored_run_k_with_rotation_k_minus_1(tmp_path, monkeypatch):
    """scripts/record_runs.py end to end, its measurement replaced by one row file per run (the timing
    notebooks' real measurements take many minutes): each run's profile, and its run.json, carry rotation k -
    1."""
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    spec = importlib.util.spec_from_file_location("record_runs", ROOT / "scripts" / "record_runs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seen = []

    def measure(P, log=print, only=None):
        seen.append(P.rotation)
        out = tmp_path / "data" / "results" / P.name / "bench.csv"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"rotation\n{P.rotation}\n")

    monkeypatch.setattr(script, "measure", measure)
    # the checkout's own uncommitted edits aside (tests/test_record_runs_dirty_tree.py)
    monkeypatch.setattr(recording, "check_committed", lambda root=None: None)
    script.record(argparse.Namespace(profile="cpu", model=None, runs=2))
    # a later call continues the numbering
    script.record(argparse.Namespace(profile="cpu", model=None, runs=1))
    assert seen == [0, 1, 2]
    runs = tmp_path / "data" / "results" / "cpu" / "runs"
    for k in (1, 2, 3):
        assert json.loads((runs / f"run{k}" / "run.json").read_text())["rotation"] == k - 1
        assert (runs / f"run{k}" / "bench.csv").read_text() == f"rotation\n{k - 1}\n"
