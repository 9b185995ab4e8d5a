"""Nothing hidden (outputs/figure_check.py): a series under another drawn over it, and a value printed on a
heatmap under a line or a marker, are findings of check_figure. Each fault is planted once on a small figure
and caught, with the figure that avoids it passing; every notebook's figure is held to both rules by
tests/test_figures_readable.py (check_figure)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from artifact.experiments.outputs.figure_check import check_figure, covered_cell_text  # noqa: E402

X, Y = [1, 2, 4, 8], [3.0, 2.0, 2.5, 1.0]
UNDER = "line 'demand' in axes 0 ('throughput') lies under line 'last_step_conservative'"


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _two(under: dict, over: dict, labels=("demand", "last_step_conservative"), y=Y):
    """Two series of the same points, `under` drawn first and `over` on top of it, both in the legend."""
    fig, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
    ax.plot(X, y, label=labels[0], **{"marker": "o", "color": "tab:blue", **under})
    ax.plot(X, Y, label=labels[1], **{"marker": "o", "color": "tab:orange", **over})
    ax.set_title("throughput")
    ax.legend(loc="upper right")
    return fig


def test_a_series_under_an_identical_one_drawn_over_it_is_caught():
    found = check_figure(_two({}, {}))
    assert found == [
        f"hidden: {UNDER}, drawn over it within 3 px all along: give one its own line style or marker, "
        "or say in a label that they coincide"
    ], found


def test_one_a_pixel_or_two_off_is_hidden_still():
    fig = _two({}, {}, y=[v + 0.015 for v in Y])  # 2 px off: as 03's demand and last_step_conservative were
    assert [p[: len(UNDER) + 8] for p in check_figure(fig)] == [f"hidden: {UNDER}"]
    fig = _two({}, {}, y=[v + 0.05 for v in Y])  # 6 px off: two lines
    assert check_figure(fig) == []


@pytest.mark.parametrize(
    "under,over",
    [
        ({}, {"ls": "--"}),  # the one under shows through the dashes of the one over it
        ({"marker": "s"}, {}),  # its own marker
        ({"marker": "o", "ms": 9}, {}),  # bigger markers, seen round the ones over them
        ({"lw": 6, "alpha": 0.4, "marker": None}, {}),  # wide and pale under the other (03 now)
        ({"ms": 5}, {"marker": "s", "ms": 9, "mfc": "none"}),  # inside a hollow square (08): seen
    ],
    ids=["dashed-over-solid", "own-marker", "bigger-marker", "wider-line", "inside-hollow-marker"],
)
def test_two_coinciding_series_told_apart_by_their_style_pass(under, over):
    assert check_figure(_two(under, over)) == []


@pytest.mark.parametrize(
    "under,over",
    [
        ({"ls": "--"}, {}),  # dashes under a solid line: covered
        ({"lw": 1.0}, {"lw": 2.5}),  # a thinner line under a wider one
        ({"ms": 5}, {"marker": "s", "ms": 9}),  # a small dot inside a filled square
        ({"marker": None}, {}),  # a line without markers under the same line with them
    ],
    ids=["dashed-under-solid", "thinner", "inside-filled-marker", "no-marker"],
)
def test_a_series_covered_in_any_other_way_is_caught(under, over):
    assert [p[: len(UNDER) + 8] for p in check_figure(_two(under, over))] == [f"hidden: {UNDER}"]


@pytest.mark.parametrize(
    "labels,caught",
    [
        (("demand", "last_step_conservative (coincides with demand)"), False),
        (("demand (= last_step_conservative)", "last_step_conservative"), False),
        (("demand, b=1", "last_step_conservative, b=1"), True),  # "b=1" is no "="
    ],
)
def test_a_label_saying_that_they_coincide_lets_them_pass(labels, caught):
    found = check_figure(_two({}, {}, labels=labels))
    assert bool(found) == caught, found


def test_the_one_drawn_first_is_the_hidden_one_and_zorder_decides():
    fig = _two({"zorder": 3}, {})  # the first one drawn over the second
    (found,) = check_figure(fig)
    assert found.startswith(
        "hidden: line 'last_step_conservative' in axes 0 ('throughput') lies under line 'demand'"
    ), found


def test_error_bars_count_by_their_data_line_and_label():
    fig, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
    for label in ("last_step over demand", "the A/A"):
        ax.errorbar(X, Y, yerr=0.1, fmt="o", capsize=3, label=label)
    ax.legend()
    (found,) = check_figure(fig)
    assert found.startswith("hidden: line 'last_step over demand' in axes 0 lies under line 'the A/A'"), found


def test_a_series_under_an_unlabelled_line_is_caught_and_one_out_of_view_is_not():
    fig, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
    ax.plot(X, [0, 0, 0, 0], lw=1, label="a difference of 0")
    ax.axhline(0, color="black", lw=1.5)  # the zero line, drawn over it
    ax.plot([100, 200], [5, 5], label="out of view")
    ax.plot([100, 200], [5, 5], label="over it, out of view too")
    ax.set_xlim(0, 10)
    ax.legend()
    (found,) = check_figure(fig)
    assert found.startswith(
        "hidden: line 'a difference of 0' in axes 0 lies under an unlabelled line (#000000 - None)"
    ), found


# --- values printed on a heatmap
# --------------------------------------------------------------------------------
CELLS = np.array([[1.0, 2.0, 3.0, 4.0], [2.0, 3.5, 5.0, 6.0], [3.0, 5.0, 7.0, 9.0], [4.0, 6.0, 9.0, 12.0]])


def _heatmap(seaborn: bool = False):
    """A 4 x 4 heatmap with every cell's value printed in it (07's map; seaborn's annot=True as 09's)."""
    fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
    if seaborn:
        import seaborn as sns

        sns.heatmap(CELLS, annot=True, fmt=".1f", annot_kws={"fontsize": 8}, ax=ax, cbar=False)
        return fig, ax, 0.5  # seaborn's cells are centred on i + 0.5
    ax.imshow(CELLS, origin="lower", cmap="viridis")
    for (i, j), v in np.ndenumerate(CELLS):
        ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8, color="white")
    return fig, ax, 0.0


def _legend(ax):
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))


def test_a_contour_through_a_printed_value_is_caught():
    fig, ax, _ = _heatmap()
    ax.contour(CELLS, levels=[5.0], colors="crimson", linestyles="dashed")  # through the 5.0s: 07's contour
    found = check_figure(fig)
    assert found == ["covered: contour at 5 in axes 0 is drawn over 2 printed values ('5.0', '5.0')"], found


def test_a_contour_between_the_values_passes():
    fig, ax, _ = _heatmap()
    ax.contour(CELLS, levels=[2.5], colors="crimson", linestyles="dashed")  # between the cells' centres
    assert check_figure(fig) == []


def test_a_marker_on_a_printed_value_is_caught():
    fig, ax, _ = _heatmap()
    ax.scatter([2.1], [1.0], s=14, c="white", edgecolors="black", label="a trace")  # on the 5.0: 07's dots
    _legend(ax)
    found = check_figure(fig)
    assert found == ["covered: scatter 'a trace' in axes 0 is drawn over 1 printed value ('5.0')"], found


def test_a_marker_beside_a_value_passes():
    fig, ax, _ = _heatmap()
    ax.scatter([2.45], [1.35], s=14, c="white", edgecolors="black", label="a trace")  # the cell's corner
    _legend(ax)
    assert check_figure(fig) == []


@pytest.mark.parametrize("seaborn", [False, True], ids=["imshow", "seaborn"])
def test_a_line_and_its_markers_over_printed_values_are_caught(seaborn):
    fig, ax, at = _heatmap(seaborn)
    ax.plot([at, 3 + at], [1 + at, 1 + at], color="red", label="a row's line")  # along row 1: its 4 values
    ax.plot([0.12 + at], [2.06 + at], "s", color="red", label="a marker")  # on the right end of the 3.0
    _legend(ax)
    found = covered_cell_text(fig)
    assert found[0].startswith('covered: line "a row\'s line" in axes 0 is drawn over 4 printed values ('), (
        found
    )
    assert found[1].startswith("covered: line 'a marker' in axes 0 is drawn over 1 printed value"), found


def test_a_value_drawn_over_a_line_in_an_opaque_box_passes_and_without_it_is_caught():
    fig, ax, _ = _heatmap()
    ax.axhline(1, color="red", lw=1, zorder=2)  # through row 1, under the texts (zorder 3)
    for t in ax.texts[4:8]:
        t.set_bbox(dict(facecolor="black", edgecolor="none", pad=1))
    assert covered_cell_text(fig) == []
    ax.texts[5].get_bbox_patch().set_alpha(0.5)  # a box the line shows through
    fig.canvas.draw()
    assert covered_cell_text(fig) == [
        "covered: an unlabelled line (#ff0000 - None) in axes 0 is drawn over 1 printed value ('3.5')"
    ]
