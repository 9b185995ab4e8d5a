"""Notebook markdown says what to look at, never what a run showed: no markdown cell holds a number that is
not a parameter, a setting or one of the paper's quoted figures (measured facts are printed by code)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import nbformat
import pytest

from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.settings import list_profiles, load_profile
from artifact.experiments.studies import beyond_the_paper as beyond
from artifact.experiments.studies import routing_map

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
# Names with digits in them (LLaDA2.0, PCIe, D(t-1, l), l+1, top-k 8 is a parameter below), code spans and
# link
# targets (the committed figure a notebook shows: ![...](../figures/cpu/07_routing_map.png))
NAMES = re.compile(r"`[^`]*`|\]\([^)\s]*\)|\b[A-Za-z_]+\d[\w.]*|[a-z]\s?[+-]\s?\d+")
NOTATION = {0, 1, 2}  # (1), (2), t-1, lookahead 1 and 2, C = W/2


def _numbers(value) -> set[float]:
    out = set()
    if isinstance(value, bool):
        return out
    if isinstance(value, (int, float)):
        v = abs(float(value))
        out |= {round(v, 6), round(v * 100, 6)}  # 0.8 is also written 80%; signs are not matched
    elif isinstance(value, (tuple, list)):
        for v in value:
            out |= _numbers(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            out |= _numbers(k) | _numbers(v)
    elif hasattr(value, "__dataclass_fields__"):
        for f in fields(value):
            out |= _numbers(getattr(value, f.name))
    return out


def allowed() -> set[float]:
    """The paper's figures and this artifact's thresholds (criteria/), every bundled profile's settings,
    the cpu trims and map grids (parameters), the 95% of the intervals, and the notation above."""
    ok = set(map(float, NOTATION)) | {95.0}
    for module in (paper, thresholds):
        for name in dir(module):
            if name.isupper():
                ok |= _numbers(getattr(module, name))
    for name in list_profiles():
        P = load_profile(name)
        ok |= _numbers({k: v for k, v in P.as_dict().items() if k != "slurm"})
    ok |= (
        _numbers(beyond.CPU_TRIM)
        | _numbers(list(routing_map.GRIDS.values()))
        | _numbers(routing_map.DEFAULT_GRID)
    )
    ok |= {256.0, 8.0, 32.0, 70.0, 13.0}  # LLaDA2.0-mini's shape (E, top-k, block, W) and issue 13
    return ok


def stray_numbers(text: str, ok: set[float]) -> list[str]:
    text = NAMES.sub(" ", text)
    return [m for m in NUMBER.findall(text) if round(float(m), 6) not in ok]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_markdown_cell_states_a_measured_number(path):
    ok = allowed()
    nb = nbformat.read(path, as_version=4)
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        text = re.sub(r"^# \d\d ", "# ", cell.source)  # the notebook's number in its title
        stray = stray_numbers(text, ok)
        assert not stray, f"{path.name} cell {k}: {stray} in markdown; print measured facts from code"


def test_the_check_catches_measured_numbers():
    ok = allowed()
    assert stray_numbers("W climbs from about 37 to about 91 experts", ok) == ["37", "91"]
    assert stray_numbers("a one-off demand (1.1-3.5x W on the cpu traces)", ok) == ["1.1", "3.5"]
    assert stray_numbers("the bench takes 3 minutes", ok) == ["3"] or 3.0 in ok
    assert stray_numbers("paper: +4.9 to +11.8% at C/W 0.83-1.73, 6.7x, 95% intervals", ok) == []
    assert stray_numbers("`beyond.CPU_TRIM` LLaDA2.0-mini D(t-1, l) layer l+1", ok) == []
