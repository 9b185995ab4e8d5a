"""The timing claims of the throttle (03), TIDE-style (05) and cache-design bench (09) studies over stored
runs (replication.py): ruled pooled when this run is a stored run and on the hull of its one-run interval and
the pooled one otherwise; a wide A/A control widens a direction claim's net interval and gates a
non-superiority claim; ruled per cell (a batch size that fails is not averaged away).
Synthetic rows only (tests/helpers_runs.py): no model runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from helpers_runs import make_rows, read_back, store_runs  # noqa: E402

from artifact.experiments.bench.results import bench_fingerprint  # noqa: E402
from artifact.experiments.criteria import thresholds
from artifact.experiments.outputs.figures import AA_LABEL, CONTROL_COLOR
from artifact.experiments.settings import (  # noqa: E402
    CONTROL,  # noqa: E402
    Settings,
    load_profile,
)
from artifact.experiments.studies import bandwidth_throttling as throttle  # noqa: E402
from artifact.experiments.studies import cache_design_space as cache_design  # noqa: E402
from artifact.experiments.studies import tide_head_to_head as head_to_head  # noqa: E402
from artifact.experiments.verdicts.pooling import Replicas  # noqa: E402
from artifact.experiments.verdicts.records import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Claim  # noqa: E402

BEST = "demand+lrfu:lam=2"
OFFSETS = (-0.5, 0.0, 0.5)  # the stored runs' effects around the cell's: the spread between runs
CONTROLS = (-0.3, 0.0, 0.3)  # their A/A controls: around 0 (an interval that excludes 0 is a bias)


@dataclass(frozen=True)
class Study:
    stem: str
    a: str
    b: str
    metric: str
    base: float
    ratios: tuple
    scales: tuple
    good: float  # an effect the claim's rule reproduces
    bad: float  # one it does not (the other side)
    fingerprint: Callable[[Settings], str]
    claim: Callable[[Settings, pd.DataFrame], Claim]
    misses: dict | None = None

    def cells(self, by_batch: dict) -> dict:
        return {("gsm8k", b, r, s): d for b, d in by_batch.items() for r in self.ratios for s in self.scales}

    def rows(self, by_batch: dict, offset: float = 0.0, control: float = 0.0) -> pd.DataFrame:
        cells = {k: d + offset for k, d in self.cells(by_batch).items()}
        return make_rows(
            cells,
            self.a,
            self.b,
            self.metric,
            base=self.base,
            control=control,
            fingerprint=self.fingerprint(load_profile("cpu")),
            misses=self.misses,
        )


STUDIES = {
    "throttle": Study(
        throttle.STEM,
        "last_step",
        "demand",
        "stall_seconds",
        0.5,
        (1.0,),
        (2.0, 1.0, 0.5),
        40.0,
        -10.0,
        lambda P: bench_fingerprint(throttle.throttle_profile(P)),
        lambda P, rows: throttle.verdicts(throttle.numbers(throttle.replicas(P, rows)))[1],
        {"demand": (100, 0), "last_step": (90, 40), CONTROL: (100, 0)},
    ),
    "tide": Study(
        head_to_head.STEM,
        "interval_refresh",
        "demand",
        "tokens_per_second",
        50.0,
        (1.0, 0.5),
        (1.0,),
        -6.0,
        8.0,
        lambda P: bench_fingerprint(head_to_head.tide_style_profile(P)),
        lambda P, rows: head_to_head.style_verdict(
            head_to_head.style_numbers(head_to_head.replicas(P, rows))
        ),
    ),
    "cache": Study(
        cache_design.STEM,
        BEST,
        "demand",
        "tokens_per_second",
        50.0,
        (1.0,),
        (1.0,),
        10.0,
        -3.0,
        lambda P: bench_fingerprint(cache_design.bench_profile(P, BEST)),
        lambda P, rows: cache_design.bench_verdict(
            cache_design.bench_numbers(cache_design.bench_replicas(P, BEST, rows), BEST)
        ),
    ),
}


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def stored(data, st: Study, by_batch: dict, controls=CONTROLS) -> list[pd.DataFrame]:
    runs = [st.rows(by_batch, o, c) for o, c in zip(OFFSETS, controls)]
    store_runs(data, "cpu", st.stem, runs)
    return runs


@pytest.mark.parametrize("name", STUDIES)
def test_a_stored_run_is_ruled_pooled_and_any_other_run_on_its_one_run_interval(name, data, tmp_path):
    st, P = STUDIES[name], load_profile("cpu")
    runs = stored(data, st, {1: st.good})
    c = st.claim(P, read_back(runs[1], tmp_path / "this.csv"))  # this run is stored run 2
    assert c.verdict == REPRODUCED and c.ruled == "pooled" and c.interval.startswith(f"{METHOD}, N = 3;")
    assert c.per_run == (REPRODUCED,) * 3 and c.pooled == REPRODUCED
    assert "runs [timing]: this verdict is the pooled one" in "\n".join(c.lines())
    c = st.claim(P, st.rows({1: st.good}, 0.2))  # a fresh run: not one of them
    assert c.verdict == REPRODUCED and c.ruled == "this run" and c.interval.startswith(f"{SINGLE}, N = 3")
    assert c.per_run == (REPRODUCED,) * 3 and c.this_run == REPRODUCED


@pytest.mark.parametrize("name", STUDIES)
def test_stored_runs_of_other_settings_leave_one_run_within_its_pairs(name, data):
    st, P = STUDIES[name], load_profile("cpu")
    store_runs(data, "cpu", st.stem, [st.rows({1: st.good}, o).assign(fingerprint="other") for o in OFFSETS])
    c = st.claim(P, st.rows({1: st.good}))
    assert c.interval.startswith(WITHIN) and c.per_run == () and c.verdict == REPRODUCED
    assert "no stored runs to compare" in c.runs_text()


def test_an_aa_control_too_wide_between_runs_gates_a_non_superiority_claim(data, tmp_path):
    st, P = STUDIES["tide"], load_profile("cpu")
    runs = stored(data, st, {1: st.good}, controls=(-4.0, 0.0, 4.0))
    for this in (read_back(runs[1], tmp_path / "this.csv"), st.rows({1: st.good}, 0.2)):
        c = st.claim(P, this)
        assert c.verdict == INCONCLUSIVE and "A/A control" in c.reason and "too noisy" in c.reason
        assert c.per_run == (INCONCLUSIVE,) * 3


def test_an_aa_control_too_wide_between_runs_widens_a_direction_claims_net_interval(data, tmp_path):
    """09: the best eviction +10% over lru in every run, the control at -4, 0, +4: net of it the run means are
    about 14, 10 and 6, so the pooled interval crosses +3 (inconclusive by its width, not by a veto); the
    undifferenced effect and the bias-bound alternative are printed beside."""
    st, P = STUDIES["cache"], load_profile("cpu")
    runs = stored(data, st, {1: st.good}, controls=(-4.0, 0.0, 4.0))
    c = st.claim(P, read_back(runs[1], tmp_path / "this.csv"))
    assert c.verdict == INCONCLUSIVE and "crosses +3" in c.reason and "A/A control" not in c.reason
    assert "net +" in c.measured and "A over B +" in c.measured and "bias-bound alternative" in c.margin
    calm = stored(data / "calm", st, {1: st.good})
    assert calm and st.claim(P, read_back(runs[1], tmp_path / "this.csv")).verdict == INCONCLUSIVE


@pytest.mark.parametrize("name", STUDIES)
def test_each_batch_size_is_its_own_cell(name, data, tmp_path):
    """One batch size reproduces and the other does not: not reproduced, although the mean over both batch
    sizes lies on the reproducing side (an interval pooled over them would have ruled it reproduced)."""
    st, P = STUDIES[name], load_profile("cpu")
    m = thresholds.MARGIN  # every question here has its boundary at +m: the mean lies on good's side of it
    assert ((st.good + st.bad) / 2 - m) * (st.good - m) > 0
    runs = stored(data, st, {1: st.good, 4: st.bad})
    for this in (read_back(runs[1], tmp_path / "this.csv"), st.rows({1: st.good, 4: st.bad}, 0.2)):
        c = st.claim(P, this)
        assert c.verdict == NOT_REPRODUCED and "b=4" in c.reason and "b=1" not in c.reason
        only = this[this.batch_size == 1]
        assert st.claim(P, only).verdict == REPRODUCED


def test_not_faster_by_less_than_the_margin_says_both(data, tmp_path):
    """05: interval_refresh faster by a significant +1.5%, below the +3% margin: reproduced (does not beat
    demand by more than the margin), and the reason says the difference is significant."""
    st, P = STUDIES["tide"], load_profile("cpu")
    runs = [st.rows({1: 1.5}, o / 5, c) for o, c in zip(OFFSETS, CONTROLS)]
    store_runs(data, "cpu", st.stem, runs)
    c = st.claim(P, read_back(runs[0], tmp_path / "this.csv"))
    assert c.verdict == REPRODUCED and c.ruled == "pooled"
    assert "significant difference, smaller than the margin" in c.reason
    assert "significant difference, smaller than the margin" in c.lines()[-1]


def test_the_throttle_figure_draws_the_control_apart_with_intervals(data):
    st = STUDIES["throttle"]
    rows = st.rows({1: st.good})
    n = throttle.numbers(Replicas(rows))
    fig, df = throttle.plot(throttle.summary_table(rows), n, load_profile("cpu"))
    ax1, ax2, ax3 = fig.axes[:3]
    colors = {line.get_label(): line.get_color() for line in ax2.get_lines()}
    assert colors[f"A/A control ({CONTROL})"] == CONTROL_COLOR != colors["demand"]
    assert len(ax3.containers) == 2  # last_step over demand and the control, with error bars
    iv = df[df.panel == "intervals"]
    assert (
        set(iv.series) == {"last_step over demand", f"A/A control ({CONTROL} over demand)"} and len(iv) == 6
    )
    assert (iv.low < iv.diff_pct).all() and (iv.diff_pct < iv.high).all() and set(iv.interval) == {"pairs"}


@pytest.mark.parametrize("name", STUDIES)
def test_stored_claims_rule_the_last_stored_run_pooled(name, data):
    st = STUDIES[name]
    stored(data, st, {1: st.good})
    module = {"throttle": throttle, "tide": head_to_head, "cache": cache_design}[name]
    (c,) = module.stored_claims(load_profile("cpu"))
    assert c.timing and c.verdict == REPRODUCED and c.ruled == "pooled" and c.per_run == (REPRODUCED,) * 3


def test_the_figures_of_a_fresh_run_beside_stored_runs_name_the_hull_they_draw(data):
    """A fresh run (not a stored one) is ruled on the hull of its interval and the pooled one: 03's figure
    (and 04's, below) draws that interval and says so in its title."""
    st, P = STUDIES["throttle"], load_profile("cpu")
    stored(data, st, {1: st.good})
    n = throttle.numbers(throttle.replicas(P, st.rows({1: st.good}, 0.2)))
    assert {r.ruled.unit for r in n.stall.effects.values()} == {"hull"}
    fig, _ = throttle.plot(throttle.summary_table(st.rows({1: st.good}, 0.2)), n, P)
    assert "hull of its interval and the pooled one" in fig.axes[2].get_title()


def test_the_capacity_figure_of_a_fresh_run_names_the_hull_it_draws(data):
    from artifact.experiments.studies import capacity_sweep as capacity

    P = load_profile("cpu")
    bench = {("gsm8k", 1, r, 1.0): 8.0 for r in (0.83, 1.0)}
    store_runs(
        data,
        "cpu",
        capacity.STEM,
        [
            make_rows(
                {k: v + d for k, v in bench.items()}, "demand", "last_step", fingerprint=bench_fingerprint(P)
            )
            for d in OFFSETS
        ],
    )
    fresh = make_rows({k: 9.0 for k in bench}, "demand", "last_step", fingerprint=bench_fingerprint(P))
    cn = capacity.numbers(capacity.replicas(P, fresh))
    fig, df = capacity.plot(cn, P)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("hull of its interval and the pooled one" in t for t in legend)
    assert any(t.startswith(f"the {len(OFFSETS)} stored runs") for t in legend)  # the pooled one beside it
    # the direction claim's cells also draw the effect net of the control, on the interval the claim rules on,
    # in a row of their own (effect, net, A/A control), with the pooled interval beside it
    assert [ax.get_title() for ax in fig.axes] == [
        f"{s}, b=1" for s in (capacity.EFFECT, capacity.NET, AA_LABEL)
    ]
    net = df[df.series == capacity.NET].set_index("cache_ratio")
    assert sorted(net.index) == [0.83, 1.0]
    for key, r in cn.timed.net.items():
        assert (net.loc[key.cache_ratio, "low"], net.loc[key.cache_ratio, "high"]) == (
            r.ruled.low,
            r.ruled.high,
        )
        assert (net.loc[key.cache_ratio, "pooled_low"], net.loc[key.cache_ratio, "pooled_high"]) == (
            r.pooled.low,
            r.pooled.high,
        )
    assert len(fig.axes[1].containers) == 2  # as ruled, and pooled
