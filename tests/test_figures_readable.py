"""Every saved figure reads at a glance (outputs/figure_check.py): no legend or text box over a title or
another axes, no text under 8 pt at the saved DPI, no image wider than 1800 px, a legend entry for every data
series, no series hidden under another and no value printed on a heatmap under a line or a marker (those two
planted in tests/test_figure_check_hidden.py).

The check itself is tested on figures made to break each rule; then every notebook's figure is built as its
notebook builds it, from committed inputs only (tests/helpers_figures.py: the stored runs, the committed 00
and 07 records, the profile's routing traces), both as a `--store` pass draws it and as a fresh run beside the
stored runs does; and
the committed PNGs are held to the width limit (the one rule a PNG alone can show)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from helpers_figures import BUILDERS, TRACED, figure_cases  # noqa: E402

from artifact.experiments import harness  # noqa: E402
from artifact.experiments.outputs.figure_check import (  # noqa: E402
    DPI,
    MAX_WIDTH_PX,
    check_figure,
    png_size,
)
from artifact.experiments.outputs.figures import figure_legend, legend, mark_clipped  # noqa: E402
from artifact.experiments.outputs.paths import reference_figures_dir  # noqa: E402
from artifact.experiments.settings import load_profile  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _clean():
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3), layout="constrained")
    a.plot([0, 1], [0, 1], label="a line")
    b.errorbar([0, 1], [1, 2], yerr=[0.1, 0.2], fmt="o", label="an interval")
    b.scatter([0.5], [1.5], label="a dot")
    a.axhline(0.5, ls=":", color="black")  # a reference line, not a data series
    a.set_title("left")
    b.set_title("right")
    fig.suptitle("a figure")
    figure_legend(fig)
    return fig, a, b


def test_a_readable_figure_passes():
    fig, _, _ = _clean()
    assert check_figure(fig) == []


def test_a_legend_over_the_title_is_caught():
    fig, a, _ = _clean()
    fig.legends[0].remove()
    fig.suptitle("a figure whose title runs over its whole width, as a title naming the profile does")
    fig.legend(loc="outside right upper")  # the old 04: beside the panels, up into the title
    found = check_figure(fig)
    assert any(
        p.startswith("overlap: legend ('a line', ...) overlaps title 'a figure whose") for p in found
    ), found


def test_a_legend_over_another_axes_is_caught():
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))  # no layout engine to make room for it
    a.plot([0, 1], [0, 1], label="a line")
    a.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))  # out of its own axes, into its neighbour's
    found = check_figure(fig)
    assert found == ["overlap: legend ('a line', ...) overlaps axes 1"], found


def test_overlapping_titles_are_caught():
    fig, a, b = _clean()
    a.set_title("a title far too long for its panel, running on into the next one's title")  # the old 06
    b.set_title("and the next panel's title, just as long as the one beside it")
    found = check_figure(fig)
    assert any(p.startswith("overlap: title") and "overlaps title" in p for p in found), found


def test_a_text_box_over_a_title_is_caught():
    fig, a, _ = _clean()
    a.text(0.5, 1.08, "a note in a box", transform=a.transAxes, ha="center", bbox=dict(fc="w"))
    found = check_figure(fig)
    assert any(p.startswith("overlap: text box 'a note in a box'") for p in found), found


def test_text_under_8_pt_is_caught():
    fig, a, _ = _clean()
    a.annotate("+1.3%", (0.5, 0.0), fontsize=7)  # the old 08's labels along the bottom
    found = check_figure(fig)
    assert found == ["size: '+1.3%' is 7 pt (9.7 px at 100 dpi), under 8 pt"], found


def test_a_figure_wider_than_1800_px_is_caught():
    fig, _, _ = _clean()
    fig.set_size_inches(22, 3)  # the old 08: 5 panels in a row, 2214 px
    found = check_figure(fig)
    assert len(found) == 1 and found[0].startswith("width: ") and f"over {MAX_WIDTH_PX} px" in found[0], found


def test_a_series_without_a_legend_entry_is_caught():
    fig, a, b = _clean()
    a.plot([0, 1], [1, 0], color="tab:purple")  # the old 08's purple line
    b.plot([0, 1], [0, 0.5], label="labelled, but in no legend")
    b.scatter([0.2], [1.0])
    b.errorbar([0.3], [1.0], yerr=[0.1], fmt="s")
    found = check_figure(fig)
    assert sum(p.startswith("legend: line") for p in found) == 2, found
    assert sum(p.startswith("legend: scatter") for p in found) == 1, found
    assert sum(p.startswith("legend: error bars") for p in found) == 1, found


def test_bars_share_their_entry_with_their_error_bars_and_same_labels_share_one():
    fig, ax = plt.subplots(layout="constrained")
    for x in (0, 1):  # one label drawn twice: one entry
        ax.bar([x], [2.0], yerr=[0.5], color="tab:blue", label="demand")
    leg = legend(ax)
    assert [t.get_text() for t in leg.get_texts()] == ["demand"]
    assert check_figure(fig) == []


def test_clipped_intervals_are_marked_and_labelled():
    fig, ax = plt.subplots(layout="constrained")
    ax.errorbar([0.5, 1.0], [0.0, 1.0], yerr=[[250, 1], [280, 1]], fmt="o", label="an interval")
    ax.set_ylim(-10, 10)
    assert mark_clipped(ax, [0.5, 1.0], [-250, 0.0], [280, 2.0], "tab:blue") == 2
    assert {t.get_text() for t in ax.texts} == {"+280", "-250"}
    legend(ax)
    assert check_figure(fig) == []


def test_png_size_reads_the_header():
    fig, _, _ = _clean()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    assert png_size(buf.getvalue()) == (800, 300)


# --- every notebook's figure
# ------------------------------------------------------------------------------------
P = load_profile("cpu")


@pytest.fixture(scope="module")
def traces():
    """The profile's first task's traces (every batch size), as the notebooks read them
    (harness.current_trace: the committed reference traces, else this machine's recorded ones); skipped when
    none is there to read: recording
    one runs the model (the slow tier does)."""
    task = P.trace_tasks[0]
    found = [harness.current_trace(P, task, b) for b in P.trace_batch_sizes]
    if any(t is None for t in found):
        pytest.skip(
            f"no current {task} trace of profile {P.name} (committed or recorded); `python -m "
            "artifact "
            "trace` or a notebook run records them"
        )
    return found


# (study, fresh): every figure as `--store` draws it, and the timing studies' as a fresh run does; 07's map
# and 08's grid run in the slow tier (test_perf_model.py holds 08's figure to the check in the unit tier)
CASES = figure_cases()


@pytest.mark.parametrize("study,fresh", CASES)
def test_every_notebook_figure_reads_at_a_glance(study, fresh, request):
    ts = request.getfixturevalue("traces") if study in TRACED else []
    figures = BUILDERS[study](P, ts, fresh)
    assert figures
    for name, fig in figures.items():
        assert check_figure(fig) == [], name


@pytest.mark.parametrize("png", sorted(reference_figures_dir(P.name).glob("*.png")), ids=lambda p: p.name)
def test_committed_figures_are_at_most_1800_px_wide(png):
    width, _ = png_size(png.read_bytes())
    assert width <= MAX_WIDTH_PX, (
        f"{png.name} is {width} px wide: regenerate it (./run_all.sh {P.name} "
        "--force "
        "--store) or narrow its figure"
    )


def test_save_reports_what_the_check_finds(tmp_path, monkeypatch):
    import pandas as pd

    from artifact.experiments.outputs.figures import save

    monkeypatch.setenv("ARTIFACT_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("ARTIFACT_OUTPUT", str(tmp_path / "results"))
    lines = []
    fig, a, _ = _clean()
    save(fig, pd.DataFrame({"x": [1]}), P, "good", log=lines.append)
    a.plot([0, 1], [1, 0])
    png, _ = save(fig, pd.DataFrame({"x": [1]}), P, "bad", log=lines.append)
    assert png.is_file() and lines[0].startswith("saved ") and lines[1].startswith("saved ")
    assert len(lines) == 3 and lines[2].startswith("figure check: bad: legend: line '_child")


@pytest.mark.parametrize(
    "path",
    sorted((reference_figures_dir(P.name).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")),
    ids=lambda p: p.stem,
)
def test_every_notebook_shows_its_committed_figures(path):
    """A notebook on a repository browser shows the committed figure of each figure it saves: a markdown image
    of figures/cpu/<name>.png (git keeps no figure output: the strip script keeps only the claim cells'
    output, and nbval compares no markdown)."""
    import re

    import nbformat

    nb = nbformat.read(path, as_version=4)
    names = [
        m.group(1)
        for c in nb.cells
        if c.cell_type == "code"
        for m in re.finditer(r'save\(fig, df, P, "([^"]+)"\)', c.source)
    ]
    shown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert names
    for name in names:
        assert f"](../figures/cpu/{name}.png)" in shown, f"{path.name} does not show figures/cpu/{name}.png"
        assert (path.parent / ".." / "figures" / "cpu" / f"{name}.png").is_file()


# the figures seaborn draws (a heatmap is a QuadMesh with its colour bar; its printed values are texts of its
# axes): they are held to the check above, and here to what makes a heatmap readable
SEABORN = {"01": ("01_working_set", 1), "09": ("09_cache_design_space", 2)}  # study: (figure, heatmaps)


@pytest.mark.parametrize("study", sorted(SEABORN))
def test_the_seaborn_heatmaps_carry_their_scale_and_values(study, traces):
    from matplotlib.collections import QuadMesh

    name, count = SEABORN[study]
    fig = BUILDERS[study](P, traces, False)[name]
    maps = [ax for ax in fig.axes if any(isinstance(c, QuadMesh) for c in ax.collections)]
    cells = [ax for ax in maps if ax.get_xlabel()]  # the heatmaps; their colour bars have no x label
    assert len(cells) == count, [ax.get_title() for ax in maps]
    assert len(maps) == count + 1, "one colour bar for the heatmaps, labelled with its unit"
    (bar,) = [ax for ax in maps if ax not in cells]
    assert "(" in bar.get_ylabel() and ("experts" in bar.get_ylabel() or "%" in bar.get_ylabel())
    for ax in cells:
        mesh = next(c for c in ax.collections if isinstance(c, QuadMesh))
        values = mesh.get_array()
        shown = [t.get_text() for t in ax.texts]
        assert len(shown) == values.size, "every cell's value is printed"
        assert shown[0] == f"{float(values.flat[0]):.0f}"
    assert check_figure(fig) == []


def test_02_marks_the_oracle_cut_where_it_is_judged_and_the_few_line(traces):
    from artifact.experiments.criteria import paper, thresholds

    fig = BUILDERS["02"](P, traces, False)["02_miss_accounting"]
    for ax in fig.axes[:-1]:  # the demand-miss panels
        (mark,) = [c for c in ax.containers if "paper: oracle" in c.get_label()]
        x, y = mark.lines[0].get_data()
        assert list(x) == [1.0] and abs(y[0] - 100 / paper.ORACLE_CUT) < 1e-9  # one point, at C/W 1
        assert any(
            ln.get_ydata()[0] == 100 * (1 - thresholds.FEW) for ln in ax.lines if "'few'" in ln.get_label()
        )
    assert any("floor of demand paging" in t.get_text() for lg in fig.legends for t in lg.get_texts())


def test_06s_bottom_row_reads_as_04s_demand_over_the_predictor(traces):
    from artifact.experiments.bench.order import AA
    from artifact.experiments.studies import beyond_the_paper as bp

    summary = bp.miss_summary(bp.miss_sweep(traces, P, progress=False))
    reps = bp.replicas(P, None).last_stored()
    n = bp.numbers(summary, bp.throughput_table(reps.rows), reps)
    fig, df = bp.plot(summary, n, P)
    bottom = fig.axes[2:4]
    assert all(ax.get_ylabel().startswith("demand over predictor") for ax in bottom)
    effects = df[df.panel == "throughput"]
    aa = next(iter(n.timed.values())).aa_label  # the stored runs hold demand's A/A pair
    assert aa == AA and set(effects.effect) == {AA} | {f"demand over {p}" for p in n.timed}
    assert set(effects[effects.effect == AA].policy) == {"demand"}
    for (
        pol,
        compared,
    ) in n.shown.items():  # the drawn effect is demand over pol, the ruled one pol over demand
        for cell, drawn in compared.effects.items():
            ruled = n.timed[pol].effects[cell].ruled.mean
            assert drawn.ruled.mean == pytest.approx(100 * (100 / (100 + ruled) - 1), abs=1.0)
