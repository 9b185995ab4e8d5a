"""One run's paired effects per cell. A pair is the runs of one cell (task, batch size, C/W, bandwidth) and
one repetition, one per policy, on identical prompts in alternated order; its effect of A over B is one number
on the claim's basis (`Basis`: PERCENT, (A - B) / B x 100, or STALL_SHARE, A's stall per forward minus B's
in % of B's wall time per forward). Nothing is added to it or subtracted from it.

The A/A is the same comparison with demand on both sides: rows of policy demand told apart by their `arm`
column (A, B: the bench's A/A pair). Runs recorded before that pair existed carry a stand-in, settings.CONTROL
(last_step_conservative: last_step's prediction on the host, never a transfer) over demand, labelled so."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from artifact.experiments.bench.grid import CELL_KEYS, PAIR_KEYS, CellKey
from artifact.experiments.bench.order import AA, AA_POLICY, b_slot, row_slots
from artifact.experiments.settings import CONTROL

STAND_IN = f"stand-in A/A ({CONTROL} over demand)"


@dataclass(frozen=True)
class Basis:
    """How a pair becomes one number, A over B: `difference(w, a, b, metric)` over a frame with columns
    (column, slot), one row per pair; NaN where a pair has none."""

    name: str
    columns: tuple[str, ...]  # the row columns it reads; () = the claim's metric
    difference: Callable
    text: str


def _percent(w, a: str, b: str, metric: str) -> np.ndarray:
    x, y = (np.asarray(w[(metric, p)], dtype=float) for p in (a, b))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(y > 0, (x - y) / y * 100.0, np.nan)


def _stall_share(w, a: str, b: str, metric: str) -> np.ndarray:
    def per_forward(col: str, p: str) -> np.ndarray:
        return np.asarray(w[(col, p)], dtype=float) / np.asarray(w[("forwards", p)], dtype=float)

    with np.errstate(divide="ignore", invalid="ignore"):
        wall = per_forward("seconds", b)
        d = (per_forward("stall_seconds", a) - per_forward("stall_seconds", b)) / wall * 100.0
    return np.where(wall > 0, d, np.nan)


PERCENT = Basis("percent", (), _percent, "A over B, % per pair")
STALL_SHARE = Basis(
    "stall share",
    ("stall_seconds", "forwards", "seconds"),
    _stall_share,
    "A's stall seconds per forward minus B's, in % of B's wall seconds per forward, per pair",
)
BASES = {b.name: b for b in (PERCENT, STALL_SHARE)}


def wide(rows: pd.DataFrame, by: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """One row per pair (the keys of `by` beyond the cell's, then PAIR_KEYS), columns (column, slot). Refuses
    rows without the bench's columns and two rows for the same run."""
    keys = list(dict.fromkeys([*[k for k in by if k not in PAIR_KEYS], *PAIR_KEYS]))
    missing = [c for c in (*keys, "policy", *columns) if c not in rows.columns]
    if missing:
        raise ValueError(f"rows lack columns {missing} (expected the bench's CSV)")
    r = rows.assign(_slot=row_slots(rows))
    twice = r.duplicated([*keys, "_slot"])
    if twice.any():
        first = r[twice].iloc[0]
        raise ValueError(
            f"two rows for the same run: {dict(first[[*PAIR_KEYS, 'policy']])}; "
            "merge shards with `python -m artifact merge` (it refuses duplicates)"
        )
    return r.pivot(index=keys, columns="_slot", values=list(columns))


def aa_label(rows: pd.DataFrame) -> str | None:
    """AA when the rows hold demand's A/A pair, STAND_IN when they hold only the stand-in, else None."""
    have = set(row_slots(rows))
    if {AA_POLICY, b_slot(AA_POLICY)} <= have:
        return AA
    return STAND_IN if {AA_POLICY, CONTROL} <= have else None


def run_effects(
    rows: pd.DataFrame, a: str, b: str, by: Sequence[str], metric: str, basis: Basis = PERCENT
) -> dict[tuple, np.ndarray]:
    """{cell key (values of `by`): the per-pair effects of A over B, finite only} of one run. `a` may be
    "A/A": demand's arm B over its arm A, or the stand-in where the rows lack the pair."""
    if a == "A/A":
        label = aa_label(rows)
        if label is None:
            return {}
        a, b = (b_slot(AA_POLICY), AA_POLICY) if label == AA else (CONTROL, AA_POLICY)
    columns = basis.columns or (metric,)
    have = set(row_slots(rows))
    for p in (a, b):
        if p not in have:
            raise ValueError(f"policy {p!r} is not in these rows; they hold {sorted(have)}")
    w = wide(rows[row_slots(rows).isin([a, b])], by, columns)
    d = np.asarray(basis.difference(w, a, b, metric), dtype=float)
    cells = w.index.to_frame(index=False)[list(by)]
    out = {}
    for key, idx in cells.groupby(list(by), sort=True).indices.items():
        key = tuple(
            v.item() if hasattr(v, "item") else v for v in (key if isinstance(key, tuple) else (key,))
        )
        v = d[idx]
        out[CellKey(*key) if tuple(by) == CELL_KEYS else key] = v[np.isfinite(v)]
    return out


def host_shares(rows, by: Sequence[str]) -> dict:
    """{key tuple of `by`: the cell's host share of wall time per forward} over GPU rows: per row host ms over
    wall ms, the median per policy, the largest over the policies. {} for CPU rows (the CPU computes on the
    host, so the rule does not apply) and rows without host time."""
    if rows is None or not {"host_ms_per_forward", "wall_ms_per_forward", "device"} <= set(rows.columns):
        return {}
    gpu = rows[rows.device.astype(str).str.startswith("cuda")]
    wall = gpu.wall_ms_per_forward.astype(float)
    share = (gpu.host_ms_per_forward.astype(float) / wall).where(wall > 0)
    per = gpu.assign(_share=share).dropna(subset=["_share"]).groupby([*by, "policy"])._share.median()
    out = per.groupby(level=list(range(len(by)))).max()
    return {(k if isinstance(k, tuple) else (k,)): float(v) for k, v in out.items()}
