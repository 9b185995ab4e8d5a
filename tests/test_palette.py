"""One look per policy in every figure (outputs/figures.style): every committed figure is built as its
notebook builds it, from committed inputs only (tests/helpers_figures.BUILDERS), its drawn series are read
(lines, scatter and fill collections, patches, bar and error-bar containers: each one's label and
matplotlib.colors.to_hex of its colour) and each is mapped to a policy by its label; the test fails when one
policy wears two colours across the figures, or when a series that is not a policy (the A/A, a batch size, a
hardware profile, a task) wears a policy's colour. The figures' text is read too: no figure says "this run",
and every +-band and threshold in a legend carries its unit.

The rule that maps a label to a policy (`policy_of`), in this order:
1. "A over B ..." (a comparison, e.g. "last_step over demand, b=4 C/W 1", "demand over cross_layer, b=1"): the
   side that is not demand (the predictor; demand is the baseline of every comparison). Demand over demand
   is the A/A (3).
2. A label that is a policy's name or starts with one followed by a space, ':', ',' or '(' ("demand (LRU)",
   "last_step: mean", "min: floor of demand paging ...", "TIDE released"): that policy. A variant, the name
   followed by options after ':' or an eviction after '+' ("last_step:lookahead=2", "demand+lrfu:lam=2"), is
   a policy of its own, told apart from its base (style draws it in a lighter shade of its base's colour).
   A policy is a registered prefetch policy (offload/policy/policies.POLICIES), an eviction policy
   (EVICTIONS), the floor min or TIDE's released code.
3. Not a policy, and so never in a policy's colour: a label with "A/A" in it; one naming a batch size
   ("batch size 4", "b=4"); one whose first word is a hardware profile (figures.HARDWARE) or a task.
4. Anything else (thresholds, margins, the paper's marks, repetition dots, the physical limit) is a mark of
   the figure, not a series of the comparison, and is not read."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from helpers_figures import BUILDERS, TRACED, figure_cases  # noqa: E402
from matplotlib.collections import Collection  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from artifact.experiments import harness  # noqa: E402
from artifact.experiments.outputs.figures import (  # noqa: E402
    CONTROL_COLOR,
    HARDWARE,
    POLICY_STYLE,
    SPARE,
    batch_color,
    grey,
    style,
)
from artifact.experiments.settings import load_profile  # noqa: E402
from artifact.model.decode import MAX_BATCH  # noqa: E402
from artifact.model.tasks import TASKS  # noqa: E402
from artifact.offload.policy.policies import EVICTIONS, POLICIES  # noqa: E402

P = load_profile("cpu")
NAMES = {*POLICIES, *EVICTIONS, "min"}  # one-word policy names (rule 2)
SPACED = ("TIDE released",)  # policy names with a space in them
SLOW = ("07", "08")  # their stored figures take seconds (07's routing map, 08's modelled grid)


# --- the rule ---------------------------------------------------------------------------------------------
def policy_of(label: str) -> tuple[str, str]:
    """(kind, name) of a drawn series by its label: ("policy", the policy), ("other", label) for a series that
    is not a policy (rule 3) or ("mark", label) for the figure's marks (rule 4)."""
    compared = re.match(r"([\w:=.+]+) over ([\w:=.+]+)(?=[\s,)]|$)", label)
    if compared:
        a, b = compared[1], compared[2]
        return ("other", label) if a == b == "demand" else ("policy", b if a == "demand" else a)
    for name in SPACED:
        if re.match(rf"{re.escape(name)}(?=[\s:,(]|$)", label):
            return "policy", name
    token = re.match(r"[A-Za-z_][\w.=:+]*", label)
    name = token[0].rstrip(":") if token else ""
    if name and re.split(r"[:+]", name, maxsplit=1)[0] in NAMES:
        return "policy", name
    first = re.split(r"[\s,]", label, maxsplit=1)[0]
    if "A/A" in label or re.search(r"\bbatch size \d+|\bb=\d+", label) or first in {*HARDWARE, *TASKS}:
        return "other", label
    return "mark", label


def test_the_rule_maps_the_labels_the_figures_draw():
    assert policy_of("demand") == ("policy", "demand")
    assert policy_of("demand (LRU): mean") == ("policy", "demand")
    assert policy_of("last_step_conservative: last_step's prediction\non the host") == (
        "policy",
        "last_step_conservative",
    )
    assert policy_of("last_step_conservative (stand-in A/A): mean") == ("policy", "last_step_conservative")
    assert policy_of("min: floor of demand paging") == ("policy", "min")
    assert policy_of("belady (floor)") == ("policy", "belady")
    assert policy_of("last_step:lookahead=2") == ("policy", "last_step:lookahead=2")
    assert policy_of("demand+lrfu:lam=2") == ("policy", "demand+lrfu:lam=2")
    assert policy_of("TIDE released") == ("policy", "TIDE released")
    assert policy_of("last_step over demand, b=4 C/W 1") == ("policy", "last_step")
    assert policy_of("demand over cross_layer, b=1") == ("policy", "cross_layer")
    assert policy_of("A/A (demand over demand), b=1")[0] == "other" == policy_of("demand over demand")[0]
    assert policy_of("stand-in A/A (last_step_conservative over demand)")[0] == "other"
    assert policy_of("batch size 4")[0] == "other"
    assert policy_of("gsm8k b=1")[0] == "other"
    assert policy_of("h200, tiny model's gsm8k trace")[0] == "other"
    for mark in ("one repetition", "physical limit (min's misses)", "+-3%: the margin", "paper at C/W 0.43"):
        assert policy_of(mark)[0] == "mark", mark
    assert policy_of("95% interval pooled over runs (9 stored runs)")[0] == "mark"


# --- the palette itself -----------------------------------------------------------------------------------
def test_the_palette_gives_each_policy_one_look_and_keeps_its_greys_apart():
    looks = [(c, m) for c, m, _ in POLICY_STYLE.values()]
    assert len(set(looks)) == len(looks), "two policies with one colour and one marker"
    policy_colours = {to_hex(style(p)["color"]) for p in POLICY_STYLE}
    base, variant = style("last_step"), style("last_step:lookahead=2")
    assert variant["marker"] == base["marker"] and variant["mfc"] == "none" and variant["ls"] == "--"
    assert variant["color"] != base["color"] and style("last_step+lrfu:lam=2")["color"] == variant["color"]
    assert style("a_policy_of_your_own")["color"] in SPARE  # a policy the table lacks: a spare, by its name
    assert style("a_policy_of_your_own") == style("a_policy_of_your_own")
    others = {batch_color(b) for b in range(1, 4 * MAX_BATCH)} | set(HARDWARE.values()) | {grey(0), grey(1)}
    assert not others & policy_colours and to_hex(CONTROL_COLOR) not in policy_colours
    assert len({HARDWARE["a5000"], HARDWARE["h200"]}) == 2


# --- the drawn figures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def traces():
    """The profile's first task's traces (every batch size), as test_figures_readable reads them."""
    found = [harness.current_trace(P, P.trace_tasks[0], b) for b in P.trace_batch_sizes]
    if any(t is None for t in found):
        pytest.skip(f"no current {P.trace_tasks[0]} trace of profile {P.name} (committed or recorded)")
    return found


_BUILT: dict = {}


@pytest.fixture(scope="module")
def build(traces):
    """build(studies, fresh=False) -> {figure name: figure}, each study's figures built once per module."""

    def _build(studies, fresh: bool = False) -> dict:
        out = {}
        for s in studies:
            if (s, fresh) not in _BUILT:
                _BUILT[s, fresh] = BUILDERS[s](P, traces if s in TRACED else [], fresh)
            out.update(_BUILT[s, fresh])
        return out

    yield _build
    _BUILT.clear()
    plt.close("all")


def _colour(artist) -> str | None:
    """to_hex of what a reader sees of a drawn series: a line's colour, a bar's or a band's face, an error
    bar's marker line (else its bars), a scatter's face (else its edge)."""
    if isinstance(artist, BarContainer):
        return to_hex(artist.patches[0].get_facecolor()) if artist.patches else None
    if isinstance(artist, ErrorbarContainer):
        data, _, bars = artist.lines
        return to_hex(data.get_color()) if data is not None else to_hex(bars[0].get_color()[0])
    if isinstance(artist, Line2D):
        return to_hex(artist.get_color())
    if isinstance(artist, Collection):
        face = artist.get_facecolor()
        return to_hex(face[0] if len(face) and face[0][3] > 0 else artist.get_edgecolor()[0])
    return to_hex(artist.get_facecolor())  # a patch: a band, a span


def drawn(figures: dict) -> list[tuple[str, str, str]]:
    """(figure, label, colour) of every labelled series drawn in `figures`' axes."""
    out = []
    for name, fig in figures.items():
        for ax in fig.axes:
            for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.containers]:
                label = str(artist.get_label())
                if label and not label.startswith("_") and (colour := _colour(artist)) is not None:
                    out.append((name, label, colour))
    return out


def colour_clashes(series: list[tuple[str, str, str]]) -> list[str]:
    """What breaks the palette: a policy in two colours across the figures, or a series that is not a policy
    in a policy's colour (a policy's drawn colours and POLICY_STYLE's)."""
    seen: dict[str, dict[str, list[str]]] = {}
    for fig, label, colour in series:
        kind, name = policy_of(label)
        if kind == "policy":
            seen.setdefault(name, {}).setdefault(colour, []).append(f"{fig} {label!r}")
    found = [
        f"{pol} drawn in {len(cols)} colours: "
        + "; ".join(f"{c} in {', '.join(dict.fromkeys(w))}" for c, w in cols.items())
        for pol, cols in seen.items()
        if len(cols) > 1
    ]
    policy_colours = {c for cols in seen.values() for c in cols} | {
        to_hex(v[0]) for v in POLICY_STYLE.values()
    }
    found += [
        f"{label!r} in {fig} is not a policy but wears a policy's colour {colour}"
        for fig, label, colour in series
        if policy_of(label)[0] == "other" and colour in policy_colours
    ]
    return found


STUDIES = [
    pytest.param(tuple(s for s in BUILDERS if s not in SLOW), id="unit"),
    pytest.param(tuple(BUILDERS), id="every-figure", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("studies", STUDIES)
def test_each_policy_wears_one_colour_in_every_figure(build, studies):
    series = drawn(build(studies))
    policies = {policy_of(label)[1] for _, label, _ in series if policy_of(label)[0] == "policy"}
    assert {"demand", "last_step", "oracle", "last_step_conservative", "cross_layer"} <= policies, policies
    assert colour_clashes(series) == []


def test_the_check_sees_a_policy_in_two_colours_and_a_batch_size_in_a_policys():
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([0, 1], [0, 1], color=style("last_step")["color"], label="last_step")
    b.plot([0, 1], [1, 0], color="purple", label="last_step")
    b.bar([0], [1], color=style("demand")["color"], label="batch size 4")
    found = colour_clashes(drawn({"03": fig}))
    plt.close(fig)
    assert len(found) == 2 and found[0].startswith("last_step drawn in 2 colours"), found
    assert "'batch size 4' in 03 is not a policy" in found[1], found


# --- the figures' text ------------------------------------------------------------------------------------
# a +-band or a threshold without its unit: "+-3:", "+-3 (", "threshold 80 " (a unit is %, points or x)
UNITLESS = re.compile(
    r"(?:\+-|±)\s*\d+(?:\.\d+)?(?!\d|\.\d|\s*(?:%|points?\b|pp\b|x\b))|\bthreshold \d+(?![\d.%])"
)
# every figure as `--store` draws it, and the timing studies' as a fresh run does (helpers_figures)
TEXTS = [pytest.param((p.values[0],), p.values[1], id=p.id, marks=p.marks) for p in figure_cases()]


@pytest.mark.parametrize("studies,fresh", TEXTS)
def test_no_figure_says_this_run_and_every_band_carries_its_unit(build, studies, fresh):
    for name, fig in build(studies, fresh).items():
        texts = [t.get_text() for t in fig.findobj(Text) if t.get_text()]
        assert not [t for t in texts if "this run" in t.lower()], name
        labels = {lb for ax in fig.axes for lb in ax.get_legend_handles_labels()[1] if not lb.startswith("_")}
        unitless = [lb for lb in labels if UNITLESS.search(lb)]
        assert not unitless, (name, unitless)
