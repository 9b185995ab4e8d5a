"""'A/A' has one meaning: demand against demand (bench/order.py's AA). last_step_conservative
(settings.CONTROL: last_step's prediction on the host, no transfers) is never called the A/A, except as the
stand-in A/A of runs without demand's pair (07's streams, runs recorded before the pair: verdicts/pairs.py's
STAND_IN), which always says "stand-in".

Read: the strings and comments of the Python code under artifact/, scripts/, benchmarks/; docs/*.md and
README.md; the notebooks' markdown cells; every string of the committed claim records
(data/results/<profile>/*.claims.json); and the legend labels the notebooks' figures draw (built as
tests/helpers_figures.py builds them, from committed inputs only)."""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from helpers_figures import BUILDERS, TRACED, figure_cases  # noqa: E402

from artifact.experiments import harness  # noqa: E402
from artifact.experiments.settings import CONTROL, load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# how CONTROL is written: its name, settings.CONTROL, CONTROL, an f-string's {CONTROL}, in backticks or not
NAME = r"(?:`?(?:settings\.)?CONTROL`?|`?last_step_conservative`?|\{CONTROL\})"
MISNAMED = [
    # "the A/A control", "A/A controls", "A/A-control"
    re.compile(r"\bA/A[\s-]+controls?\b", re.I),
    # "A/A (last_step_conservative ...", "A/A: CONTROL", "A/A is last_step_conservative": not the stand-in's
    re.compile(rf"(?<!stand-in )\bA/A\s*(?:\(\s*|:\s*|=\s*|\bis\s+)(?:the\s+)?{NAME}"),
    # "last_step_conservative (A/A ...", "{CONTROL} (the A/A)"
    re.compile(rf"{NAME}\s*\(\s*(?:the\s+|an?\s+)?A/A\b"),
    # "last_step_conservative ... as the A/A", "CONTROL, which ..., is an A/A" (within one clause)
    re.compile(rf"{NAME}[^.;]{{0,80}}?\b(?:as|is)\s+(?:an?|the|its)\s+A/A\b(?!\s+(?:pair|arm|gate))"),
]


def misnamed(text: str) -> list[str]:
    """The passages of `text` (whitespace collapsed) where 'A/A' names CONTROL or is called a control."""
    flat = " ".join(text.split())
    found = []
    for pattern in MISNAMED:
        for m in pattern.finditer(flat):
            found.append(flat[max(0, m.start() - 40) : m.end() + 40])
    return found


def python_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string (adjacent literals joined, as Python joins them) and each run of comment
    lines of a Python file."""
    out: list[tuple[int, str]] = []
    kind = None
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for tok in tokens:
        if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.type == tokenize.COMMENT:
            now, text = "comment", tok.string.lstrip("#")
        elif tok.type == tokenize.STRING:
            now, text = "string", re.sub(r"^[A-Za-z]*('''|\"\"\"|'|\")|('''|\"\"\"|'|\")$", "", tok.string)
        else:
            kind = None
            continue
        if now == kind:
            out[-1] = (out[-1][0], out[-1][1] + " " + text)
        else:
            out.append((tok.start[0], text))
        kind = now
    return out


def python_files() -> list[Path]:
    return sorted(p for d in ("artifact", "scripts", "benchmarks") for p in (ROOT / d).rglob("*.py"))


def test_python_strings_and_comments_call_only_demand_against_demand_the_aa():
    bad = [
        f"{p.relative_to(ROOT)}:{line}: ...{hit}..."
        for p in python_files()
        for line, text in python_texts(p)
        for hit in misnamed(text)
    ]
    assert not bad, "'A/A' names last_step_conservative (say what it is, or 'the stand-in'):\n" + "\n".join(
        bad
    )


def test_docs_and_readme_call_only_demand_against_demand_the_aa():
    bad = [
        f"{p.relative_to(ROOT)}: ...{hit}..."
        for p in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
        for hit in misnamed(p.read_text())
    ]
    assert not bad, "'A/A' names last_step_conservative:\n" + "\n".join(bad)


def test_the_notebooks_markdown_calls_only_demand_against_demand_the_aa():
    bad = []
    for p in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(p.read_text())["cells"]):
            if cell["cell_type"] == "markdown":
                bad += [f"{p.name} cell {i}: ...{hit}..." for hit in misnamed("".join(cell["source"]))]
    assert not bad, "'A/A' names last_step_conservative:\n" + "\n".join(bad)


def strings(value, where: str):
    """(where, text) of every string in a JSON value."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, f"{where}[{i}]")


def test_the_committed_claim_records_call_only_demand_against_demand_the_aa():
    records = sorted((ROOT / "data" / "results").glob("*/*.claims.json"))
    assert records
    bad = [
        f"{p.relative_to(ROOT)} {where}: ...{hit}..."
        for p in records
        for where, text in strings(json.loads(p.read_text()), "")
        for hit in misnamed(text)
    ]
    assert not bad, "'A/A' names last_step_conservative (store the records again):\n" + "\n".join(bad)


def test_the_patterns_catch_the_old_names_and_pass_the_true_aa_and_the_stand_in():
    for wrong in (
        "A/A control (last_step_conservative over demand)",
        "last_step_conservative (A/A control), b=1",
        "the A/A\n    control (settings.CONTROL)",
        "A/A (last_step_conservative over demand)",
        "`last_step_conservative`, which does exactly demand's work, is the A/A of the timing noise",
        "demand, last_step and CONTROL as the A/A",
    ):
        assert misnamed(wrong), wrong
    for right in (
        "A/A (demand over demand)",
        "the A/A of demand against demand",
        "C/W 1 b=1: +4.2% [+3.8, +4.5] (9 runs); A/A [-0.5, +0.1]",
        "stand-in A/A (last_step_conservative over demand)",
        "A/A: stand-in A/A (last_step_conservative over demand); compute: 12 us",
        "last_step_conservative (stand-in A/A): mean",
        "last_step_conservative over demand is shown as a decomposition when the A/A is demand's own pair",
        "CONTROL: last_step_conservative, the stand-in A/A of 07 and of runs recorded before the A/A pair",
    ):
        assert not misnamed(right), right


# --- the legend labels the figures draw ---------------------------------------------------------------
P = load_profile("cpu")


@pytest.fixture(scope="module")
def traces():
    """The profile's first task's traces, as tests/test_figures_readable.py reads them (skipped when none is
    there: recording one runs the model)."""
    task = P.trace_tasks[0]
    found = [harness.current_trace(P, task, b) for b in P.trace_batch_sizes]
    if any(t is None for t in found):
        pytest.skip(f"no current {task} trace of profile {P.name} (committed or recorded)")
    return found


def legend_labels(fig) -> set[str]:
    """Every label a figure's legends show, and every labelled artist's label (what a legend would show)."""
    labels = {t.get_text() for lg in fig.legends for t in lg.get_texts()}
    for ax in fig.axes:
        if ax.get_legend() is not None:
            labels |= {t.get_text() for t in ax.get_legend().get_texts()}
        labels |= {lb for lb in ax.get_legend_handles_labels()[1] if not lb.startswith("_")}
    return labels


def wrong_labels(labels: set[str]) -> list[str]:
    """Labels that call CONTROL the A/A (not as 'stand-in A/A') or call anything an A/A control."""
    return sorted(
        lb for lb in labels if misnamed(lb) or ("A/A" in lb and CONTROL in lb and "stand-in A/A" not in lb)
    )


# (study, fresh): every figure as `--store` draws it; 07 as a fresh run draws it (its throughput figure
# only: the routing map, like 08's modelled grid, takes long enough for the slow tier)
CASES = figure_cases(fresh=("07",))


@pytest.mark.parametrize("study,fresh", CASES)
def test_no_legend_calls_last_step_conservative_the_aa(study, fresh, request):
    ts = request.getfixturevalue("traces") if study in TRACED else []
    figures = BUILDERS[study](P, ts, fresh)
    try:
        for name, fig in figures.items():
            labels = legend_labels(fig)
            assert labels, name
            assert not wrong_labels(labels), (name, wrong_labels(labels))
    finally:
        plt.close("all")
