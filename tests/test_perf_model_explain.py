"""Notebook 08's explanation of the level result at the paper point: the decomposition of demand's and
last_step's modelled step (performance_model/explain.py), and the search for what the paper's +4.9% needs
(performance_model/search.py)."""

from __future__ import annotations

import math

import pytest

from artifact.experiments.criteria import paper
from artifact.experiments.hardware import HARDWARE
from artifact.experiments.settings import load_profile
from artifact.experiments.studies import performance_model as pm
from artifact.experiments.studies.performance_model import explain as ex
from artifact.experiments.studies.performance_model import search as se

P = load_profile("cpu")


@pytest.fixture(scope="module")
def stream():
    return pm.paper_point(P)


@pytest.mark.parametrize("gpu", pm.GPUS)
def test_the_terms_add_up_to_the_step_and_the_named_terms_are_the_argmaxes(stream, gpu):
    d = ex.decomposition(stream, HARDWARE[gpu], P.run_spec())
    terms = d.table.drop(index="step")
    assert list(terms.index) == list(ex.TERMS.values())
    for p in se.PAIR:
        assert math.isclose(terms[p].sum(), d.runs[p]["seconds_per_step"], rel_tol=1e-9)
        assert math.isclose(d.table.loc["step", p], d.runs[p]["seconds_per_step"], rel_tol=1e-12)
    assert math.isclose(terms[ex.DIFF].sum(), d.table.loc["step", ex.DIFF], rel_tol=1e-9, abs_tol=1e-12)
    assert d.largest == terms["share"].idxmax()
    assert d.largest_difference == terms[ex.DIFF].abs().idxmax()
    dem, ls = (d.runs[p]["tokens_per_second"] for p in se.PAIR)
    assert math.isclose(d.gain_pct, 100 * (dem / ls - 1), rel_tol=1e-12)
    assert 0 < d.device_compute <= d.table.loc[ex.TERMS["compute"], "demand"]
    text = ex.decomposition_text(d)
    assert d.largest in text and d.largest_difference in text and "claim:" not in text


def test_crossing_finds_the_largest_scale_that_reaches_the_target():
    s, v, _ = se.crossing(lambda x: 10 * (1 - x), 4.9)
    assert v >= 4.9 and s == pytest.approx(0.51, abs=1e-3)
    s, v, at = se.crossing(lambda x: 10 * (1 - x), 4.9, lowest=0.6)  # bounded above the crossing
    assert s is None and v == pytest.approx(4.0) and at == pytest.approx(0.6)
    assert se.crossing(lambda x: 7.0, 4.9)[0] == 1.0  # reached at the profile's own link


def test_a_slow_link_reaches_the_target_at_its_own_bandwidth(stream):
    slow = se.scaled(HARDWARE["a5000"], bandwidth=0.3)  # link-bound: demand beats last_step by > 4.9%
    s = se.sensitivity(stream, slow, P.run_spec(), ratio=0.83)
    assert s.reached and s.bandwidth_scale == 1.0 and s.host_scale == 1.0
    assert s.gain_pct >= paper.FASTER_PCT[0] and s.gbps == pytest.approx(slow.h2d_gbps)
    assert "reaches" in se.sensitivity_text(s)


def test_the_search_finds_the_crossing_at_or_beyond_the_target(stream):
    s = se.sensitivity(stream, HARDWARE["a5000"], P.run_spec(), ratio=0.83, host_scales=(1.0,))
    assert s.reached and se.BANDWIDTH_FLOOR < s.bandwidth_scale < 1.0 and s.gain_pct >= paper.FASTER_PCT[0]
    again = se.pair_runs(stream, se.scaled(HARDWARE["a5000"], s.bandwidth_scale), P.run_spec(), 0.83)
    assert se.gain_pct(again) == pytest.approx(s.gain_pct) and 0 < s.link_busy <= 1


@pytest.mark.parametrize("ratio, lowest", [(1.73, se.BANDWIDTH_FLOOR), (0.83, 0.6)])
def test_the_search_says_cannot_when_its_bounds_do_not_reach(stream, ratio, lowest):
    """At C/W 1.73 last_step issues no speculative transfer (no link setting separates the two); at 0.83
    the crossing lies below a bound of 0.6x the bandwidth."""
    s = se.sensitivity(
        stream, HARDWARE["a5000"], P.run_spec(), ratio=ratio, lowest=lowest, host_scales=(1.0,)
    )
    assert not s.reached and s.gain_pct < paper.FASTER_PCT[0]
    assert "cannot" in se.sensitivity_text(s)
    assert s.lowest == lowest


def test_the_finding_names_which_reading_the_numbers_support(stream):
    decs = [ex.decomposition(stream, HARDWARE[g], P.run_spec()) for g in pm.GPUS]
    hit = se.sensitivity(stream, HARDWARE["a5000"], P.run_spec(), ratio=0.83, host_scales=(1.0,))
    miss = se.sensitivity(stream, HARDWARE["a5000"], P.run_spec(), ratio=1.73, host_scales=(1.0,))
    assert "has the link contention" in ex.finding_text(decs, [hit, miss])
    assert "something other than link contention" in ex.finding_text(decs, [miss])
