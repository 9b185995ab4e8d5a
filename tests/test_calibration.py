"""The calibration harness (artifact/experiments/calibration): a small fixed-seed run in the unit tier. The
full one (1,000 studies per claim and scenario, 10 fresh runs each) is a benchmark: `python -m artifact
calibrate`, its table in docs/verdicts.md. The harness must find the truth it planted and must fail a pipeline
that gets it wrong."""

from __future__ import annotations

import numpy as np
import pytest

from artifact.experiments import calibration, effects
from artifact.experiments.calibration.generator import SCENARIOS, Generator, Noise, Scenario, true_effect
from artifact.experiments.criteria import thresholds
from artifact.experiments.criteria.timing import CLAIMS
from artifact.experiments.settings import load_profile
from artifact.experiments.verdicts.records import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

ROLE = {s.name: s for s in SCENARIOS}
SLOWER, FASTER = ROLE["boundary, non-demand role 5% slower"], ROLE["boundary, non-demand role 5% faster"]
MISSING = ROLE["clear, a run lacks a cell"]


@pytest.fixture(scope="module")
def cpu():
    return load_profile("cpu")


def _run(P, claims, scenarios, studies=25, fresh=2):
    return calibration.table(
        calibration.run(P, claims, scenarios, studies, fresh, seed=7, progress=False, processes=1)
    )


def test_the_harness_finds_the_planted_truth_with_demand_as_a_and_as_b(cpu):
    """A role bias of 5% either way at the boundary, demand as A (04) and as B (09): the net intervals cover
    the true effect, the effect intervals cover the biased one, and neither error rate runs away."""
    t = _run(cpu, ["04-faster", "09-eviction"], [SLOWER, FASTER])
    assert len(t) == 4 and set(t.demand) == {"A", "B"}
    assert (t.cover_net >= 85).all() and (t.cover_effect >= 85).all(), t
    assert (t.reproduced <= 12).all() and (t.not_reproduced <= 12).all(), t
    assert (t.fresh_opposite == 0).all() and (t.fresh == 50).all()


def test_the_harness_fails_the_pre_fix_sign(cpu, monkeypatch):
    """The same scenario through the rule this replaced (the control subtracted whatever demand's role): the
    net intervals miss the truth and the claim's verdict follows the bias, so the harness could not pass
    it."""

    def old(w, a, b, metric, basis):
        return basis.difference(w, a, b, metric) - basis.difference(
            w, "last_step_conservative", "demand", metric
        )

    monkeypatch.setattr(effects, "net_difference", old)
    t = _run(cpu, ["04-faster"], [SLOWER, FASTER], studies=10, fresh=0)
    assert (t.cover_net <= 20).all(), t
    assert t.reproduced.iloc[0] >= 80 and t.not_reproduced.iloc[1] >= 80, t


def test_a_run_without_a_cell_keeps_every_run_matched_by_name(cpu):
    t = _run(cpu, ["04-faster"], [MISSING], studies=10, fresh=1)
    assert t.runs_aligned.iloc[0] == 100 and t.cover_net.iloc[0] >= 85 and t.reproduced.iloc[0] >= 80, t


def test_the_generator_plants_what_it_says(cpu):
    """The synthetic rows hold the true effect: with no noise, the effect and the net are exact."""
    c = CLAIMS["04-faster"]
    reps = calibration.stored_template(cpu, c)
    s = Scenario("exact", role_bias=5.0, slot_bias=0.0)
    gen = Generator(c, reps.stored, Noise(0.0, 0.0, 2), s, np.random.default_rng(0))
    gen.s = s
    run = gen.run(0)
    v = effects.run_views(run, c.a, c.b, list(c.by), c.metric)
    want_effect, want_net = gen.targets()
    for k in v["net"]:
        assert v["net"][k].mean == pytest.approx(want_net, abs=1e-6)
        assert v["effect"][k].mean == pytest.approx(want_effect, abs=1e-6)
    assert true_effect(c, s, Noise(1.0, 1.0, 2)) == thresholds.MARGIN


def test_the_model_error_rule_never_gives_a_fresh_run_the_opposite_verdict():
    m = calibration.model_error(studies=200, fresh=10, seed=1)
    assert m["fresh_opposite"] == 0 and m["fresh"] == 2000
    assert m["reproduced"] <= 5.0, m  # at the limit, reproduced only when the whole interval is under it


def test_a_claim_of_one_cell_skips_the_missing_cell_scenario(cpu):
    rows = calibration.run(cpu, ["09-eviction"], [MISSING], 2, 0, progress=False, processes=1)
    assert rows == []


def test_bad_arguments_are_refused(cpu):
    with pytest.raises(ValueError, match="unknown timing claims"):
        calibration.run(cpu, ["nope"], studies=1)
    with pytest.raises(ValueError, match="studies 0"):
        calibration.run(cpu, ["04-faster"], studies=0)


def test_outcomes_are_counted_per_verdict():
    t = calibration.Tally(studies=4, verdicts={REPRODUCED: 1, NOT_REPRODUCED: 2, INCONCLUSIVE: 1})
    assert (t.rate(REPRODUCED), t.rate(NOT_REPRODUCED)) == (0.25, 0.5)


def test_the_command_refuses_bad_input_with_one_line(capsys, tmp_path):
    from artifact.cli import main

    assert main(["calibrate", "--claim", "nope", "--studies", "1"]) == 2
    assert "unknown timing claims ['nope']" in capsys.readouterr().err
    assert main(["calibrate", "--scenario", "nope", "--studies", "1"]) == 2
    assert "--scenario 'nope': expected one of" in capsys.readouterr().err
    out = tmp_path / "t.csv"
    out.write_text("kept\n")
    assert main(["calibrate", "--claim", "09-eviction", "--studies", "1", "--out", str(out)]) == 2
    assert out.read_text() == "kept\n"  # never silently overwritten


def test_the_command_prints_and_writes_the_table(capsys, tmp_path):
    from artifact.cli import main

    out = tmp_path / "t.csv"
    argv = [
        "calibrate",
        "--claim",
        "09-eviction",
        "--scenario",
        "as stored",
        "--studies",
        "3",
        "--fresh",
        "1",
        "--processes",
        "1",
        "--out",
        str(out),
        "--markdown",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert (
        "| claim | scenario |" in text and "| 09-eviction | as stored |" in text and "08 model error" in text
    )
    lines = out.read_text().splitlines()
    assert lines[0].startswith("claim,question,demand,scenario") and len(lines) == 2
