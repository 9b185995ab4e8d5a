"""The engine asks the same of its link as the engine it replaced, and counts what the simulator counts.

tests/fixtures/engine_golden.json holds, per (trace, engine policy, capacity, link priority, link kind),
the length and hash of every call the engine made on a recording link and of the groups it yielded,
written by tests/fixtures/engine_golden.py with the engine of commit 6398730 (before the lean path of
issue 30). Here the engine of this checkout is driven the same way and must reproduce each record, and
its counts must equal sim.replay of the same trace."""

import importlib.util
import json
from pathlib import Path

import pytest

from artifact.offload.replay.sim import COUNTS, replay

# The fixture's writer is a script, not a package module: load it by path.
_spec = importlib.util.spec_from_file_location(
    "engine_golden", Path(__file__).parent / "fixtures" / "engine_golden.py"
)
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)
RECORD = json.loads(golden.GOLDEN_FILE.read_text())


@pytest.mark.parametrize("name", list(golden.TRACES))
def test_engine_calls_and_groups_equal_the_recorded_engine(name):
    t = golden.load_trace(name)
    configs = golden.configurations(t)
    missing = [golden.key(name, *c) for c in configs if golden.key(name, *c) not in RECORD]
    assert not missing, (
        f"configurations with no record (re-run tests/fixtures/engine_golden.py on an engine "
        f"known to be right): {missing}"
    )
    assert len([k for k in RECORD if k.startswith(name + " ")]) == len(configs)
    wrong, replays, promotes, logs = [], {}, 0, {}
    for cfg in configs:
        policy, capacity, priority, kind = cfg
        log, stats = golden.drive(t, *cfg)
        want = RECORD[golden.key(name, *cfg)]
        got = golden.summarize(log)
        moved = [k for k in got if got[k] != want["log"][k]]
        if moved:
            wrong.append(
                f"{golden.key(name, *cfg)}: {moved} differ (got {[got[k] for k in moved]}, "
                f"recorded {[want['log'][k] for k in moved]})"
            )
        counts = {k: stats[k] for k in COUNTS}
        if (policy, capacity) not in replays:
            sim = replay(t, policy, capacity)
            replays[policy, capacity] = {k: sim[k] for k in COUNTS}
        assert counts == replays[policy, capacity] == want["counts"], golden.key(name, *cfg)
        promotes += got["promote"][0]
        logs[cfg] = got["all"]
    assert not wrong, "\n".join(wrong)
    # The record exercises what it should: demanded prefetches in flight, and a link kind that changes
    # the partition (ready() by the clock) against one that does not (ready() always).
    assert promotes > 0
    assert any(logs[p, c, prio, "cuda"] != logs[p, c, prio, "timed"] for p, c, prio, _ in configs)
