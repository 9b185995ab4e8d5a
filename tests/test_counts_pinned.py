"""Regression: the cache's exact counts, pinned before it was rewritten for speed.

tests/fixtures/counts.json holds every count field for every policy (and option variant) at C = 1,
< W, ~W, > W and = E on two recorded tiny-model traces (batch 1 and 4) and three seeded random streams;
tests/fixtures/pin_counts.py wrote it with the code of commit dbafb69. A change that moves any count
changes the simulator's results and must be a deliberate, explained one."""

import importlib.util
import json
from pathlib import Path

import pytest

from artifact.offload.replay.sim import COUNTS, replay
from artifact.offload.replay.trace import Trace

# The fixtures' writer is a script, not a package module: load it by path.
_spec = importlib.util.spec_from_file_location(
    "pin_counts", Path(__file__).parent / "fixtures" / "pin_counts.py"
)
pin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pin)
PINNED = json.loads(pin.COUNTS_FILE.read_text())


@pytest.mark.parametrize("name", [*pin.RECORDED, *pin.RANDOM])
def test_counts_equal_the_pinned_ones(name):
    t = Trace.load(pin.trace_path(name))
    assert sorted(int(c) for c in PINNED[name]) == pin.capacities(t)
    for C, by_variant in PINNED[name].items():
        for label, policy, opts in pin.VARIANTS:
            got = replay(t, policy, int(C), **opts)
            assert {k: got[k] for k in COUNTS} == by_variant[label], f"{name} C={C} {label}"
