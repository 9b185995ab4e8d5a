"""One run's effect per cell on a timing claim's basis: how the two runs of one pair (same cell, run and
repetition) become one number, A over B (`Basis`: PERCENT, (A - B) / B x 100, or STALL_SHARE, A's stall per
forward minus B's in % of B's wall time per forward), the A/A control's (CONTROL over demand) and A over B net
of it, a difference in differences per matched pair oriented by demand's role (`net_difference`); `run_views`
gives all three per cell
(RunEffect: the mean over the run's pairs, the pairs, and the run's within-run sd pooled over the cells)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from artifact.experiments.settings import CONTROL
from artifact.experiments.stats import CELL_KEYS, PAIR_KEYS, CellKey


@dataclass(frozen=True)
class RunEffect:
    """One run's effect in one cell: the mean per-pair value and the per-pair values; `pooled_sd` and
    `pooled_df`: the run's within-run standard deviation of a pair pooled over the cells of its comparison
    (the ANOVA error term: sum of squares about each cell's mean over sum(n_c - 1)), which sizes a one-run
    interval when given."""

    mean: float
    diffs: tuple[float, ...]
    pooled_sd: float | None = None
    pooled_df: int | None = None

    @property
    def se(self) -> float:
        """The standard error of the mean: from the pooled sd when given, else from this cell's own pairs."""
        n = len(self.diffs)
        if self.pooled_sd is not None and n >= 1:
            return float(self.pooled_sd / math.sqrt(n))
        d = np.asarray(self.diffs)
        return float(d.std(ddof=1) / math.sqrt(n)) if n >= 2 else float("nan")

    @property
    def df(self) -> int:
        return self.pooled_df if self.pooled_df is not None else len(self.diffs) - 1


@dataclass(frozen=True)
class Basis:
    """How the two runs of one pair become one number, A over B: `difference(wide, a, b, metric)` over a frame
    indexed by pair with columns (column, policy); NaN where a pair has none (a 0 baseline). `ratio`: the
    number is a percentage of a ratio, so the difference in differences is taken on the log scale, where a
    bias that scales one role's metric cancels exactly (`net_difference`)."""

    name: str
    unit: str
    columns: tuple[str, ...]  # the row columns it reads; () = the claim's metric
    difference: Callable
    text: str
    ratio: bool = False


def _percent(w, a: str, b: str, metric: str) -> np.ndarray:
    x, y = np.asarray(w[(metric, a)], dtype=float), np.asarray(w[(metric, b)], dtype=float)
    ok = (y > 0) & np.isfinite(x) & np.isfinite(y)
    return np.where(ok, (x - y) / np.where(ok, y, 1.0) * 100.0, np.nan)


def _stall_share(w, a: str, b: str, metric: str) -> np.ndarray:
    def per_forward(col: str, pol: str) -> np.ndarray:
        return np.asarray(w[(col, pol)], dtype=float) / np.asarray(w[("forwards", pol)], dtype=float)

    with np.errstate(divide="ignore", invalid="ignore"):
        wall = per_forward("seconds", b)
        d = (per_forward("stall_seconds", a) - per_forward("stall_seconds", b)) / wall * 100.0
    return np.where(wall > 0, d, np.nan)


PERCENT = Basis("percent", "%", (), _percent, "A over B, % per pair", ratio=True)
STALL_SHARE = Basis(
    "stall share",
    " points",
    ("stall_seconds", "forwards", "seconds"),
    _stall_share,
    "A's stall seconds per forward minus B's, in % of B's wall seconds per forward, per pair",
)
BASES = {b.name: b for b in (PERCENT, STALL_SHARE)}


def demand_sign(a: str, b: str) -> int:
    """How the A/A control (CONTROL over demand: the bias beta of the non-demand role) enters A over B: +1
    when demand is B (A over demand carries +beta, so the net subtracts the control), -1 when demand is A
    (demand over B carries -beta, so the net adds it back). ValueError when demand is neither."""
    if b == "demand" and a != "demand":
        return 1
    if a == "demand" and b != "demand":
        return -1
    raise ValueError(f"the A/A control is demand's double: demand must be A or B, got {a!r} over {b!r}")


def net_difference(w, a: str, b: str, metric: str, basis: Basis) -> np.ndarray:
    """A over B net of the A/A control per matched pair, oriented by demand's role (`demand_sign`): a
    difference in differences d(A over B) - sign * d(CONTROL over demand). On a ratio basis it is taken on the
    log scale, so it is exactly the claim's comparison with demand replaced by its double in the other role
    (demand as B: A over CONTROL; demand as A: CONTROL over B), and a bias that scales the non-demand role's
    metric cancels exactly. `w`: {(column, policy): per-pair values}, aligned by pair (a stats.wide_pairs
    frame or run_views' arrays)."""
    sign = demand_sign(a, b)
    if basis.ratio:
        x = {p: np.asarray(w[(metric, p)], dtype=float) for p in (a, b, CONTROL, "demand")}
        ok = np.logical_and.reduce([np.isfinite(v) & (v > 0) for v in x.values()])
        safe = {p: np.where(ok, v, 1.0) for p, v in x.items()}
        log = np.log(safe[a] / safe[b]) - sign * np.log(safe[CONTROL] / safe["demand"])
        return np.where(ok, np.expm1(log) * 100.0, np.nan)
    return basis.difference(w, a, b, metric) - sign * basis.difference(w, CONTROL, "demand", metric)


VIEWS = ("effect", "control", "net")


def run_views(
    rows, a: str, b: str, by: Sequence[str], metric: str, basis: Basis = PERCENT, views: Sequence[str] = VIEWS
) -> dict[str, dict[tuple, RunEffect]]:
    """{view: {cell key: RunEffect}} of one run's rows, from one alignment of its pairs: "effect" A over B on
    `basis`; "control" the A/A control, CONTROL over demand; "net" A over B net of the control per matched
    pair (`net_difference`, a difference in differences oriented by demand's role). A pair is one cell of `by`
    and one repetition (keys beyond the bench's cell keys, such as 06's link_priority, are part of the pair:
    pairs never cross them). A pair without a value (03: demand never stalled, so no percentage; a side
    missing) is left out; a cell left without pairs has no interval (inconclusive). Each view's RunEffects
    carry the run's pooled within-run sd over the view's cells (RunEffect.pooled_sd). The control and net
    views are left out when the rows hold no control runs. Refuses rows without the columns, a policy the rows
    lack and two rows for the same run (as
    stats.wide_pairs)."""
    rows = pd.DataFrame(rows)
    have = set(rows.policy.astype(str)) if "policy" in rows else set()
    has_control = {CONTROL, "demand"} <= have and CONTROL not in (a, b)
    views = [v for v in views if v == "effect" or has_control]
    policies = list(dict.fromkeys([a, b, *((CONTROL, "demand") if len(views) > 1 else ())]))
    columns = basis.columns or (metric,)
    keys = list(dict.fromkeys([*[k for k in by if k not in PAIR_KEYS], *PAIR_KEYS]))
    missing = [c for c in (*keys, "policy", *columns) if c not in rows.columns]
    if missing:
        raise ValueError(f"rows lack columns {missing} (expected the bench's CSV)")
    for p in policies:
        if p not in have:
            raise ValueError(f"policy {p!r} is not in these rows; they hold {sorted(have)}")
    sel = rows[rows.policy.isin(policies)].reset_index(drop=True)
    pair = sel.groupby(keys, sort=True).ngroup().to_numpy()
    pol = sel.policy.map({p: i for i, p in enumerate(policies)}).to_numpy()
    slot = pair * len(policies) + pol
    if len(np.unique(slot)) != len(slot):
        u, counts = np.unique(slot, return_counts=True)
        first = sel.iloc[int(np.flatnonzero(slot == u[counts > 1][0])[0])]
        raise ValueError(
            f"two rows for the same run: {dict(first[[*PAIR_KEYS, 'policy']])}; "
            "merge shards with `python -m artifact merge` (it refuses duplicates)"
        )
    n = int(pair.max()) + 1 if len(pair) else 0
    w = {}
    for col in columns:
        values = sel[col].to_numpy(dtype=float)
        for i, p in enumerate(policies):
            arr = np.full(n, np.nan)
            m = pol == i
            arr[pair[m]] = values[m]
            w[(col, p)] = arr
    first = np.zeros(n, dtype=int)
    first[pair[::-1]] = np.arange(len(pair))[::-1]
    cells = sel.iloc[first][list(by)].reset_index(drop=True) if n else sel[list(by)].iloc[:0]
    out = {}
    for v in views:
        d = (
            basis.difference(w, a, b, metric)
            if v == "effect"
            else basis.difference(w, CONTROL, "demand", metric)
            if v == "control"
            else net_difference(w, a, b, metric, basis)
        )
        out[v] = _per_cell(cells, np.asarray(d, dtype=float), by)
    return out


def _per_cell(cells: pd.DataFrame, d: np.ndarray, by: Sequence[str]) -> dict[tuple, RunEffect]:
    groups = []
    for key, idx in cells.groupby(list(by), sort=True).indices.items():
        key = key if isinstance(key, tuple) else (key,)
        v = d[idx]
        groups.append((_key(by, key), v[np.isfinite(v)]))
    ss = sum(float(((v - v.mean()) ** 2).sum()) for _, v in groups if len(v))
    df = sum(max(len(v) - 1, 0) for _, v in groups)
    sd = math.sqrt(ss / df) if df > 0 else None
    out = {
        k: RunEffect(
            float(v.mean()) if len(v) else float("nan"),
            tuple(float(x) for x in v),
            sd,
            df if sd is not None else None,
        )
        for k, v in groups
    }
    return dict(sorted(out.items(), key=lambda kv: tuple(str(k) for k in kv[0])))


def run_effects(
    rows, a: str, b: str, by: Sequence[str], metric: str, basis: Basis = PERCENT, net: bool = False
) -> dict[tuple, RunEffect]:
    """{cell key: RunEffect} of A over B in one run's rows on `basis`, per cell of `by` (run_views' "effect"),
    or with `net` the effect net of the A/A control (run_views' "net": a difference in differences per matched
    pair, oriented by demand's role; ValueError without control runs)."""
    if net:
        got = run_views(rows, a, b, by, metric, basis, ("effect", "net"))
        if "net" not in got:
            raise ValueError(f"no A/A control ({CONTROL} and demand) in these rows: no effect net of it")
        return got["net"]
    return run_views(rows, a, b, by, metric, basis, ("effect",))["effect"]


def _plain(v):
    return v.item() if hasattr(v, "item") else v


def _key(by: Sequence[str], key: tuple) -> tuple:
    """A group's key as plain values: a CellKey when the groups are the cells."""
    plain = tuple(_plain(k) for k in key)
    return CellKey(*plain) if tuple(by) == CELL_KEYS else plain
