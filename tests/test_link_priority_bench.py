"""benchmarks/link_priority.py runs with its default (virtual time) path: its Timed wrapper is an
ExpertBackend (the model asks it for groups of experts; it wrapped `experts()` of an older interface and
crashed with AttributeError on the first MoE layer), and it charges the virtual clock per group."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "_benchmarks_link_priority", ROOT / "benchmarks/link_priority.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Groups:
    """A backend handing out the demand's experts in two groups."""

    def groups(self, demand):
        half = len(demand.experts) // 2
        yield SimpleNamespace(experts=demand.experts[:half])
        yield SimpleNamespace(experts=demand.experts[half:])


def test_timed_charges_the_virtual_clock_per_group_and_samples_per_group_without_one():
    mod = load_benchmark()
    demand = SimpleNamespace(experts=(1, 4, 7), counts=(2, 3, 5))
    clock = mod.VirtualClock()
    timed = mod.Timed(Groups(), clock, per_expert=10.0, per_token=1.0)
    assert [g.experts for g in timed.groups(demand)] == [(1,), (4, 7)]
    assert clock.t == pytest.approx((10.0 + 2) + (2 * 10.0 + 3 + 5))
    fit = mod.Timed(Groups())  # no clock: the samples of the fit, (experts, routed tokens, seconds)
    list(fit.groups(demand))
    assert [s[:2] for s in fit.samples] == [(1, 2), (2, 8)] and all(s[2] >= 0 for s in fit.samples)


@pytest.mark.slow
def test_the_default_virtual_time_run_prints_every_configuration(capsys):
    """The default path (virtual time, the compute model fitted from a timed resident run), in miniature."""
    mod = load_benchmark()
    mod.main(["--n", "1", "--ratios", "1", "--gen-length", "8"])
    out = capsys.readouterr().out
    assert "virtual time" in out and "compute model (--costs):" in out, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["1"]]
    assert [(r[2], r[3]) for r in rows] == mod.CONFIGS, out
    assert out.count("last_step / demand tokens/s under") == 2, out


@pytest.mark.slow
def test_pinned_costs_give_the_same_numbers_twice(capsys):
    """Virtual time is a deterministic function of the routing, the policy and the priority."""
    mod = load_benchmark()
    argv = ["--n", "1", "--ratios", "1", "--gen-length", "8", "--costs", "700,1,2"]
    mod.main(argv)
    first = capsys.readouterr().out
    mod.main(argv)
    assert capsys.readouterr().out == first and "700.0,1.00,2.000 us" in first, first
