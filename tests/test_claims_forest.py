"""The README's picture of every timing claim (artifact/experiments/claims_forest.py) matches the claim
records: its committed rows are the records' cells, the figure draws each cell's interval, effect and ruling
from them, and the README shows it on its first screen."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from artifact.experiments import claims_forest, claims_table
from artifact.experiments.criteria.timing import CLAIMS

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "data" / "results"
FIRST_SCREEN = 40  # README lines a reader sees first


@pytest.fixture(scope="module")
def records():
    return claims_table.records("cpu", RESULTS)


def committed() -> pd.DataFrame:
    return pd.read_csv(RESULTS / "cpu" / f"{claims_forest.NAME}.csv", keep_default_na=False, na_values=[""])


def same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    for col in a.columns:
        x, y = a[col], b[col]
        if pd.api.types.is_numeric_dtype(x) or pd.api.types.is_numeric_dtype(y):
            if not np.allclose(x.astype(float), y.astype(float), equal_nan=True):
                return False
        elif list(x.astype(str)) != list(y.astype(str)):
            return False
    return True


def test_the_committed_rows_are_the_records_cells(records):
    rows = claims_forest.rows(records)
    want = {
        (c["key"], x["label"])
        for r in records
        for c in r["claims"]
        if c.get("key") in CLAIMS
        for x in c["cells"]
    }
    assert set(zip(rows.key, rows.cell)) == want and set(rows.key) == set(CLAIMS)
    assert same(rows.reset_index(drop=True), committed()), (
        "data/results/cpu/claims_forest.csv: not the records'"
    )


def test_a_changed_record_no_longer_matches_the_committed_rows(records):
    """Planted: one cell's effect moved in a copy of the records."""
    moved = copy.deepcopy(records)
    cell = next(x for r in moved for c in r["claims"] if c.get("key") == "04-faster" for x in c["cells"])
    cell["effect"] += 5.0
    assert not same(claims_forest.rows(moved).reset_index(drop=True), committed())


def test_the_figure_draws_every_cell_from_its_row(records):
    rows = claims_forest.rows(records)
    fig = claims_forest.plot(rows, "cpu")
    ax = fig.axes[0]
    drawn = {}
    for line in ax.get_lines():
        if line.get_label().startswith("cell "):
            drawn[line.get_label()[5:]] = sorted(line.get_xdata())
    for ruling, _ in claims_forest.FILL.items():
        assert drawn.get(ruling, []) == sorted(rows.effect[rows.ruling == ruling]), ruling
    segments = ax.collections[0].get_segments()  # the intervals, one per row
    assert sorted((s[0][0], s[1][0]) for s in segments) == sorted(zip(rows.low, rows.high))
    assert len(ax.get_yticklabels()) == len(rows)
    verdicts = [t.get_text() for t in fig.axes[1].get_yticklabels() if t.get_text()]
    assert verdicts == [c["verdict"] for r in records for c in r["claims"] if c.get("key") in CLAIMS]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("abstract: 4.9-11.8%") for label in labels)
    assert any(label.startswith("abstract: +0.73% [-1.16, +2.63]") for label in labels)


def test_the_readme_shows_it_on_its_first_screen():
    head = (ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN]
    assert any(f"(figures/cpu/{claims_forest.NAME}.png)" in line for line in head)
    assert (ROOT / "figures" / "cpu" / f"{claims_forest.NAME}.png").is_file()


def test_no_readme_line_is_longer_than_300_characters():
    long = [
        (n, len(line))
        for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
        if len(line) > 300
    ]
    assert not long, f"README lines over 300 characters (line, length): {long}"


def test_the_records_of_a_profile_without_timing_claims_draw_no_forest(tmp_path):
    (tmp_path / "cpu").mkdir()
    doc = {"notebook": "01_x", "claims": [{"claim": "c", "verdict": "reproduced", "key": "01-stable"}]}
    (tmp_path / "cpu" / "01_x.claims.json").write_text(json.dumps(doc))
    assert claims_forest.rows(claims_table.records("cpu", tmp_path)).empty
