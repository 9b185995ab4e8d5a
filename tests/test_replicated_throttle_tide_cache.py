"""The timing claims of the throttle (03), TIDE-style (05) and cache-design bench (09) studies over stored
runs (verdicts/pooling.py, verdicts/judge.py): the stored runs ruled pooled, on a t interval over their
per-run means; a fresh run ruled alone on its mean widened by the stored runs' spread, with its agreement
with the stored verdict beside it (never an input); a lone run without stored runs of its settings
inconclusive; the A/A gates a direction and a non-superiority claim alike, and never widens or corrects the
effect; each batch size is its own cell; the figures draw the A/A apart, with the intervals the claims rule
on.
Synthetic rows only (tests/helpers_runs.py): no model runs. The expected intervals are computed here by hand
from the rows (a pivot per pair, scipy's t quantiles), not read from the code under test."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from helpers_runs import make_rows, read_back, store_runs  # noqa: E402
from scipy import stats  # noqa: E402

from artifact.errors import RunsError  # noqa: E402
from artifact.experiments.bench.order import AA  # noqa: E402
from artifact.experiments.bench.results import bench_fingerprint  # noqa: E402
from artifact.experiments.criteria import thresholds  # noqa: E402
from artifact.experiments.criteria.timing import FASTER, NOT_FASTER, TimingClaim  # noqa: E402
from artifact.experiments.outputs.figures import (  # noqa: E402
    CONTROL_COLOR,
    CONTROL_LABEL,
    INTERVAL_BASIS,
    style,
)
from artifact.experiments.settings import CONTROL, Settings, load_profile  # noqa: E402
from artifact.experiments.studies import bandwidth_throttling as throttle  # noqa: E402
from artifact.experiments.studies import cache_design_space as cache_design  # noqa: E402
from artifact.experiments.studies import tide_head_to_head as head_to_head  # noqa: E402
from artifact.experiments.verdicts.pairs import STAND_IN  # noqa: E402
from artifact.experiments.verdicts.pooling import Replicas  # noqa: E402
from artifact.experiments.verdicts.records import (  # noqa: E402
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
)

BEST = "demand+lrfu:lam=2"
OFFSETS = (-0.5, 0.0, 0.5)  # the stored runs' effects around the cell's: the spread between runs
CONTROLS = (-0.3, 0.0, 0.3)  # their A/A: around 0, a narrow interval inside +-3
WIDE = (-4.0, 0.0, 4.0)  # an A/A whose interval between runs is not inside +-3
M = thresholds.MARGIN


@dataclass(frozen=True)
class Study:
    stem: str
    module: ModuleType
    definition: TimingClaim  # the claim's definition (criteria/timing.py)
    a: str
    b: str
    metric: str
    base: float
    ratios: tuple
    scales: tuple
    good: float  # an effect the claim's rule reproduces
    bad: float  # one it does not (the other side, clear of the boundary for a fresh run too)
    fingerprint: Callable[[Settings], str]
    claim: Callable[[Settings, pd.DataFrame], Claim]
    misses: dict | None = None

    def cells(self, by_batch: dict) -> dict:
        return {("gsm8k", b, r, s): d for b, d in by_batch.items() for r in self.ratios for s in self.scales}

    def rows(self, by_batch: dict, offset: float = 0.0, control: float = 0.0, **kw) -> pd.DataFrame:
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
            **kw,
        )

    @property
    def boundary(self) -> float:
        """Where the claim's question turns: 0 for a direction claim, +MARGIN for non-superiority."""
        return {FASTER: 0.0, NOT_FASTER: M}[self.definition.question]


STUDIES = {
    "throttle": Study(
        throttle.STEM,
        throttle,
        throttle.CLAIM,
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
        head_to_head,
        head_to_head.CLAIM,
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
        cache_design,
        cache_design.CLAIM,
        BEST,
        "demand",
        "tokens_per_second",
        50.0,
        (1.0,),
        (1.0,),
        10.0,
        -6.0,
        lambda P: bench_fingerprint(cache_design.bench_profile(P, BEST)),
        lambda P, rows: cache_design.bench_verdict(cache_design.bench_replicas(P, BEST, rows), BEST),
    ),
}
KEY = ["task", "batch_size", "cache_ratio", "bandwidth_scale"]


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def stored(data, st: Study, by_batch: dict, controls=CONTROLS, offsets=OFFSETS) -> list[pd.DataFrame]:
    runs = [st.rows(by_batch, o, c) for o, c in zip(offsets, controls)]
    store_runs(data, "cpu", st.stem, runs)
    return runs


# --- the numbers by hand -----------------------------------------------------------------------------------
def pair_effects(st: Study, rows: pd.DataFrame, a: str, b: str) -> pd.Series:
    """Per pair (cell, rep), A over B on the claim's basis: % of B's metric, or (03) A's stall seconds per
    forward minus B's in % of B's wall seconds per forward."""
    w = rows.pivot_table(index=[*KEY, "rep"], columns="policy", values=[st.metric, "forwards", "seconds"])
    if st.definition.basis == "stall share":
        stall = w[st.metric] / w["forwards"]
        return (stall[a] - stall[b]) / (w["seconds"][b] / w["forwards"][b]) * 100
    return (w[st.metric][a] / w[st.metric][b] - 1) * 100


def run_means(st: Study, rows: pd.DataFrame, aa: bool = False) -> pd.Series:
    """{cell: the run's mean per-pair effect} of A over B, or of the stand-in A/A (CONTROL over demand)."""
    d = pair_effects(st, rows, CONTROL, "demand") if aa else pair_effects(st, rows, st.a, st.b)
    return d.groupby(level=KEY).mean()


def pooled_interval(means) -> tuple[float, float, float]:
    x = np.asarray(means, dtype=float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def pooled_var(cells) -> tuple[float, int]:
    """The variance of a pair's effect pooled over cells (one-way ANOVA's), with its df."""
    cells = [np.asarray(c, dtype=float) for c in cells if len(c) >= 2]
    df = sum(len(c) - 1 for c in cells)
    return sum(((c - c.mean()) ** 2).sum() for c in cells) / df, df


def one_run_interval(pairs, stored_means, fresh: pd.Series, stored_pairs) -> tuple[float, float, float]:
    """A fresh run's mean +- t se, se^2 = s^2 + max(0, w^2 - w_s^2) / n: s the stored runs' spread, w^2 the
    fresh run's pooled within-run variance over its cells, w_s^2 the stored runs' (docs/verdicts.md), df by
    Welch-Satterthwaite."""
    d, s = np.asarray(pairs, dtype=float), np.asarray(stored_means, dtype=float)
    w2, wdf = pooled_var([g.to_numpy() for _, g in fresh.groupby(level=KEY)])
    ws2, _ = pooled_var([g.to_numpy() for p in stored_pairs for _, g in p.groupby(level=KEY)])
    s2, k = s.var(ddof=1), len(s) - 1
    excess = max(0.0, w2 - ws2) / len(d)
    df = (s2 + excess) ** 2 / (s2**2 / k + excess**2 / wdf)
    half = stats.t.ppf(0.975, df) * math.sqrt(s2 + excess)
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def by_cell(c: Claim) -> dict:
    return {tuple(x["cell"][k] for k in KEY): x for x in c.cells}


def assert_cell(x: dict, want: tuple, aa: tuple | None = None) -> None:
    assert (x["effect"], x["low"], x["high"]) == pytest.approx(want, abs=2e-3)
    if aa is not None:
        assert (x["aa_low"], x["aa_high"]) == pytest.approx(aa[1:], abs=2e-3)


# --- the stored runs, pooled; a fresh run alone ------------------------------------------------------------
@pytest.mark.parametrize("name", STUDIES)
def test_stored_runs_are_ruled_pooled_on_a_t_interval_over_their_run_means(name, data, tmp_path):
    st, P = STUDIES[name], load_profile("cpu")
    runs = stored(data, st, {1: st.good})
    c = st.claim(P, read_back(runs[1], tmp_path / "this.csv"))  # this run is stored run 2
    assert c.verdict == REPRODUCED and c.ruled == "pooled" and c.pooled == REPRODUCED
    assert len(c.per_run) == len(runs) and c.agreement == "" and f"{len(runs)} stored runs" in c.interval
    means = [run_means(st, r) for r in runs]
    aa_means = [run_means(st, r, aa=True) for r in runs]
    cells = by_cell(c)
    assert set(cells) == set(means[0].index) and len(cells) == len(st.cells({1: 0}))
    for k, x in cells.items():
        assert x["runs"] == len(runs)
        assert_cell(x, pooled_interval([m[k] for m in means]), pooled_interval([m[k] for m in aa_means]))
    assert f"runs [timing]: {len(runs)} stored runs: pooled {REPRODUCED}" in "\n".join(c.lines())


@pytest.mark.parametrize("name", STUDIES)
def test_a_fresh_run_is_ruled_alone_on_its_own_interval_with_its_agreement(name, data):
    st, P = STUDIES[name], load_profile("cpu")
    runs = stored(data, st, {1: st.good})
    means = [run_means(st, r) for r in runs]
    for effect, verdict, agreement in (
        (st.good, REPRODUCED, "agrees with the stored verdict"),
        (st.bad, NOT_REPRODUCED, "differs from the stored verdict"),  # never bounded by the stored verdict
    ):
        fresh = st.rows({1: effect}, 0.2)
        c = st.claim(P, fresh)
        assert (c.verdict, c.ruled, c.agreement) == (verdict, "this run", agreement)
        assert c.pooled == REPRODUCED and len(c.per_run) == len(runs) and "this run alone" in c.interval
        d = pair_effects(st, fresh, st.a, st.b)
        theirs = [pair_effects(st, r, st.a, st.b) for r in runs]
        for k, x in by_cell(c).items():
            assert x["runs"] == 1
            assert_cell(x, one_run_interval(d.xs(k, level=KEY), [m[k] for m in means], d, theirs))
        assert f"this run {agreement}" in c.runs_text()


@pytest.mark.parametrize("name", STUDIES)
def test_stored_runs_of_other_settings_are_not_pooled_leaving_a_lone_run_inconclusive(name, data, tmp_path):
    st, P = STUDIES[name], load_profile("cpu")
    store_runs(data, "cpu", st.stem, [st.rows({1: st.good}, o).assign(fingerprint="other") for o in OFFSETS])
    c = st.claim(P, st.rows({1: st.good}))
    assert c.verdict == INCONCLUSIVE and "record >= 3 runs" in c.reason and c.ruled == "this run"
    assert c.per_run == () and c.pooled == "" and "no stored runs" in c.runs_text()
    assert {x["runs"] for x in c.cells} == {1}
    # the same runs under this grid's settings are pooled, and the same run is ruled beside them
    stored(tmp_path / "same", st, {1: st.good})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARTIFACT_DATA", str(tmp_path / "same"))
        c = st.claim(P, st.rows({1: st.good}))
    assert c.verdict == REPRODUCED and len(c.per_run) == len(OFFSETS)


# --- the A/A gate -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tide", "cache"])  # non-superiority (05) and direction (09)
def test_an_aa_too_wide_between_runs_gates_the_claim_and_leaves_its_effect_alone(name, tmp_path):
    """The A/A at -4, 0, +4 over the stored runs: its pooled interval is not inside +-3, so the claim is
    inconclusive whichever side its effect lies on; the effect's interval is the one the calm A/A gives
    (the gate never widens or corrects it)."""
    st, P = STUDIES[name], load_profile("cpu")
    claims = {}
    with pytest.MonkeyPatch.context() as mp:
        for aa in ("calm", "wide"):
            for effect in ("good", "bad"):
                where = tmp_path / aa / effect
                mp.setenv("ARTIFACT_DATA", str(where))
                runs = stored(where, st, {1: getattr(st, effect)}, CONTROLS if aa == "calm" else WIDE)
                this = read_back(runs[1], tmp_path / f"{aa}-{effect}.csv")
                claims[aa, effect] = (st.claim(P, this), st.claim(P, st.rows({1: getattr(st, effect)}, 0.2)))
    assert [c.verdict for c in claims["calm", "good"]] == [REPRODUCED] * 2
    assert [c.verdict for c in claims["calm", "bad"]] == [NOT_REPRODUCED] * 2
    for effect in ("good", "bad"):
        for calm, wide in zip(claims["calm", effect], claims["wide", effect]):
            assert (
                wide.verdict == INCONCLUSIVE
                and STAND_IN in wide.reason
                and f"not inside +-{M:g}%" in wide.reason
            )
            assert [(x["effect"], x["low"], x["high"]) for x in wide.cells] == [
                (x["effect"], x["low"], x["high"]) for x in calm.cells
            ]
            for w, cc in zip(wide.cells, calm.cells):
                assert w["aa_high"] - w["aa_low"] > 2 * M > cc["aa_high"] - cc["aa_low"]
        pooled, fresh = claims["wide", effect]
        assert pooled.ruled == "pooled" and pooled.per_run == (INCONCLUSIVE,) * len(OFFSETS)
        assert fresh.ruled == "this run" and fresh.agreement == "is inconclusive alone"


# --- cells ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", STUDIES)
def test_each_batch_size_is_its_own_cell(name, data, tmp_path):
    """One batch size reproduces and the other does not: not reproduced, although the mean over both batch
    sizes lies on the reproducing side of the question's boundary (an interval pooled over them would have
    ruled it reproduced)."""
    st, P = STUDIES[name], load_profile("cpu")
    assert ((st.good + st.bad) / 2 - st.boundary) * (st.good - st.boundary) > 0
    runs = stored(data, st, {1: st.good, 4: st.bad})
    for this in (read_back(runs[1], tmp_path / "this.csv"), st.rows({1: st.good, 4: st.bad}, 0.2)):
        c = st.claim(P, this)
        assert c.verdict == NOT_REPRODUCED and "b=4" in c.reason and "b=1" not in c.reason
        assert {x["cell"]["batch_size"] for x in c.cells} == {1, 4}
        only = st.claim(P, this[this.batch_size == 1])
        assert only.verdict == REPRODUCED and {x["cell"]["batch_size"] for x in only.cells} == {1}


def test_a_significant_effect_below_the_margin_is_not_faster(data, tmp_path):
    """05: interval_refresh faster than demand by +1.5%, its interval clear of 0 but below the +3% margin:
    reproduced (it does not beat demand by more than the margin), whatever its significance."""
    st, P = STUDIES["tide"], load_profile("cpu")
    runs = [st.rows({1: 1.5}, o / 5, c) for o, c in zip(OFFSETS, CONTROLS)]
    store_runs(data, "cpu", st.stem, runs)
    c = st.claim(P, read_back(runs[0], tmp_path / "this.csv"))
    assert c.verdict == REPRODUCED and c.ruled == "pooled" and f"below +{M:g}%" in c.reason
    assert all(0 < x["low"] < x["high"] < M for x in c.cells)  # significant, and below the margin


# --- stored_claims ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", STUDIES)
def test_stored_claims_rule_the_stored_runs_pooled(name, data, tmp_path):
    st, P = STUDIES[name], load_profile("cpu")
    runs = stored(data, st, {1: st.good})
    (c,) = [c for c in st.module.stored_claims(P) if c.timing]
    want = st.claim(P, read_back(runs[-1], tmp_path / "last.csv"))  # the last stored run under --store
    assert c.verdict == REPRODUCED and c.ruled == "pooled" and c.pooled == c.verdict
    assert (c.per_run, c.cells, c.reason) == (want.per_run, want.cells, want.reason)
    assert {x["runs"] for x in c.cells} == {len(runs)}


@pytest.mark.parametrize("name", STUDIES)
def test_stored_claims_refuse_fewer_than_the_minimum_of_stored_runs(name, data):
    st, P = STUDIES[name], load_profile("cpu")
    stored(data, st, {1: st.good}, offsets=OFFSETS[: thresholds.MIN_RUNS - 1])
    with pytest.raises(RunsError, match="MIN_RUNS"):
        st.module.stored_claims(P)


# --- figures ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arm", [False, True])
def test_the_throttle_figure_draws_the_aa_apart_with_intervals(data, arm):
    """One run alone: the A/A (the stand-in, or demand's own pair when the rows carry `arm`) is its own
    series in its own colour, each cell with the interval over its pairs, labelled with the comparison's A/A
    label."""
    st = STUDIES["throttle"]
    rows = st.rows({1: st.good}, arm=arm)
    n = throttle.numbers(Replicas(rows))
    assert n.stall.aa_label == (AA if arm else STAND_IN)
    fig, df = throttle.plot(throttle.summary_table(rows), n, load_profile("cpu"))
    ax1, ax2, ax3 = fig.axes[:3]
    colors = {line.get_label(): line.get_color() for line in ax2.get_lines()}
    if not arm:
        assert colors[CONTROL_LABEL] == style(CONTROL)["color"] != colors["demand"]
    assert set(colors) == ({"demand", "last_step"} | (set() if arm else {CONTROL_LABEL}))
    assert len(ax3.containers) == 2  # last_step over demand and the A/A, with error bars
    assert ax3.containers[1].lines[0].get_color() == CONTROL_COLOR
    iv = df[df.panel == "intervals"]
    assert set(iv.series) == {"last_step over demand", n.stall.aa_label} and len(iv) == 2 * len(st.scales)
    assert (iv.low < iv.diff_pct).all() and (iv.diff_pct < iv.high).all() and set(iv.interval) == {"pairs"}
    for series, src in (("last_step over demand", n.stall.effects), (n.stall.aa_label, n.stall.aa)):
        got = iv[iv.series == series].set_index("bandwidth_scale")
        for k, r in src.items():
            assert (got.loc[k[3], "low"], got.loc[k[3], "high"]) == (r.ruled.low, r.ruled.high)


def test_the_throttle_figure_of_a_fresh_run_names_the_interval_it_draws(data):
    """A fresh run beside stored runs is ruled on its one-run interval: 03's figure draws that interval and
    its title says what it is over."""
    st, P = STUDIES["throttle"], load_profile("cpu")
    stored(data, st, {1: st.good})
    fresh = st.rows({1: st.good}, 0.2)
    n = throttle.numbers(throttle.replicas(P, fresh))
    assert {r.ruled.unit for r in n.stall.effects.values()} == {"run"}
    fig, df = throttle.plot(throttle.summary_table(fresh), n, P)
    assert INTERVAL_BASIS["run"] in fig.axes[2].get_title()
    iv = df[(df.panel == "intervals") & (df.series == "last_step over demand")].set_index("bandwidth_scale")
    for k, r in n.stall.effects.items():
        assert (iv.loc[k[3], "low"], iv.loc[k[3], "high"]) == (r.this.low, r.this.high)
        assert r.this.high - r.this.low > r.pooled.high - r.pooled.low  # one run, not the pooled runs


def test_the_capacity_figure_of_a_fresh_run_draws_its_interval_and_the_pooled_one_beside(data):
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
    assert any(INTERVAL_BASIS["run"] in t for t in legend)
    assert any(t.startswith(f"the {len(OFFSETS)} stored runs") for t in legend)  # the pooled one beside it
    # the effect and the A/A (the stand-in: no demand arm B in these rows), each in a row of its own
    assert cn.timed.aa_label == STAND_IN
    assert [ax.get_title() for ax in fig.axes] == [f"{s}, b=1" for s in (capacity.EFFECT, STAND_IN)]
    for series, src in ((capacity.EFFECT, cn.timed.effects), (STAND_IN, cn.timed.aa)):
        got = df[df.series == series].set_index("cache_ratio")
        assert sorted(got.index) == [0.83, 1.0]
        for key, r in src.items():
            assert (got.loc[key.cache_ratio, "low"], got.loc[key.cache_ratio, "high"]) == (
                r.ruled.low,
                r.ruled.high,
            )
            assert (got.loc[key.cache_ratio, "pooled_low"], got.loc[key.cache_ratio, "pooled_high"]) == (
                r.pooled.low,
                r.pooled.high,
            )
    # as ruled, and pooled; the effect's row also draws the paper's interval at C/W 0.43 (mark_paper_04)
    assert [len(ax.containers) for ax in fig.axes] == [3, 2]
