"""One picture of every timing claim, the README's first screen: a forest plot drawn from the claim records
(claims_table.records), a row per claim and cell with the effect and its 95% interval as the record states it
(pooled over the stored runs), the claim's boundary (0 for a direction claim, the margin for the others),
the abstract's value where it states one (04: its gain range, and its interval at C/W 0.43; paper.py) and
the cell's ruling as the marker's fill. A display of the records: it rules nothing. `write` saves
figures/<profile>/claims_forest.png and the rows it drew (data/results/<profile>/claims_forest.csv);
claims_readme.update_readme calls it, tests/test_claims_forest.py holds it to the records."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from artifact.experiments import claims_table
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.criteria.timing import CLAIMS, FASTER, NO_DIFFERENCE
from artifact.experiments.outputs.figure_check import DPI
from artifact.experiments.outputs.figures import PAPER_STYLE
from artifact.experiments.outputs.paths import reference_data_dir, reference_figures_dir
from artifact.experiments.verdicts.rules import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from artifact.paths import atomic_write_bytes, atomic_write_text

BOUNDARY = "boundary: 0 (faster) or +-3% (no difference, not faster)"
XLIM = (-30.0, 40.0)  # % (03: points); every stored cell's interval lies inside
NAME = "claims_forest"  # figures/<profile>/claims_forest.png, data/results/<profile>/claims_forest.csv
FILL = {REPRODUCED: "full", INCONCLUSIVE: "left", NOT_REPRODUCED: "none"}  # a cell's ruling: its marker
# the abstract's own values on a claim's cells: a range (low, high) or an interval (effect, low, high)
LOW = paper.AT_LOW
PAPER = {"04-faster": (None, *paper.FASTER_PCT), "04-equal": (LOW.diff_pct, LOW.ci_low, LOW.ci_high)}


def boundary(key: str) -> tuple[float, ...]:
    """Where the claim's question reads its intervals: 0 (faster), +-margin (no difference), +margin."""
    q, m = CLAIMS[key].question, thresholds.MARGIN
    return (0.0,) if q == FASTER else (-m, m) if q == NO_DIFFERENCE else (m,)


def rows(records: list[dict]) -> pd.DataFrame:
    """One row per timing claim (criteria/timing.py) and cell of the records, in record order."""
    out = []
    for c in (c for r in records for c in r["claims"] if c.get("key") in CLAIMS):
        for x in c.get("cells") or []:
            if x.get("effect") is None:
                continue
            pv = PAPER.get(c["key"], (None, None, None))
            out.append(
                dict(
                    key=c["key"],
                    cell=x["label"],
                    effect=x["effect"],
                    low=x["low"],
                    high=x["high"],
                    ruling=x["ruling"],
                    verdict=c["verdict"],
                    unit=CLAIMS[c["key"]].unit.strip(),
                    boundary=" ".join(f"{b:+g}" for b in boundary(c["key"])),
                    paper_effect=pv[0],
                    paper_low=pv[1],
                    paper_high=pv[2],
                )
            )
    return pd.DataFrame(out)


def plot(df: pd.DataFrame, profile: str):
    """The forest: y a row per cell (top to bottom), x its effect with the 95% interval and its ruling as the
    marker's fill; each claim's boundary as a dashed grey tick per row; the abstract's range (band) or
    interval (diamond) in crimson; each claim's verdict on the right, beside its first cell."""
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(df) + 1.8), layout="constrained")
    y = pd.Series(range(len(df) - 1, -1, -1), index=df.index, dtype=float)
    ax.hlines(y, df.low, df.high, color="black", lw=1.3)
    for ruling, fill in FILL.items():
        r = df.ruling == ruling
        ax.plot(
            df.effect[r], y[r], "o", color="black", fillstyle=fill, ls="none", ms=6, label=f"cell {ruling}"
        )
    ticks = [(b, yi) for yi, bs in zip(y, df.boundary) for b in map(float, bs.split())]
    bx, by = zip(*ticks)
    ax.vlines(bx, [t - 0.4 for t in by], [t + 0.4 for t in by], color="gray", lw=1.2, ls="--", label=BOUNDARY)
    _paper(ax, df, y)
    keys = df.key.tolist()
    first = [k == 0 or keys[k] != keys[k - 1] for k in range(len(df))]
    ax.hlines([yi + 0.5 for yi, f in zip(y, first) if f][1:], *XLIM, color="lightgray", lw=0.8)
    ax.set_xlim(*XLIM)
    labels = [f"{r.key}: {r.cell}" + ("" if r.unit == "%" else f" ({r.unit})") for r in df.itertuples()]
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.set_ylim(-0.8, len(df) - 0.2)
    right = ax.twinx()  # the claim's verdict beside its first cell
    right.set_yticks(list(y), [r.verdict if f else "" for r, f in zip(df.itertuples(), first)], fontsize=8)
    right.set_ylim(ax.get_ylim())
    ax.set_xlabel(
        "effect of A over B per cell with its 95% interval (% of B's tokens/s or forwards/s; 03: points of "
        "B's wall time)"
    )
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.09))
    ax.set_title(
        f"every timing claim, profile {profile}: the stored runs pooled (docs/claims.md)", fontsize=11
    )
    return fig


def _paper(ax, df: pd.DataFrame, y: pd.Series) -> None:
    """The abstract's values: a band over the rows of a range, a diamond with its interval for a point."""
    color = PAPER_STYLE["color"]
    band = df.paper_effect.isna() & df.paper_low.notna()
    if band.any():
        lo, hi = df.paper_low[band].iloc[0], df.paper_high[band].iloc[0]
        label = f"abstract: {lo:g}-{hi:g}% ({', '.join(dict.fromkeys(df.key[band]))})"
        span = [y[band].min() - 0.45, y[band].max() + 0.45]
        ax.fill_betweenx(span, lo, hi, color=color, alpha=0.15, label=label)
    point = df.paper_effect.notna()
    if point.any():
        r = df[point].iloc[0]
        text = f"{r.paper_effect:+g}% [{r.paper_low:+g}, {r.paper_high:+g}]"
        ax.hlines(y[point] - 0.3, df.paper_low[point], df.paper_high[point], color=color, lw=1)
        label = f"abstract: {text} ({', '.join(dict.fromkeys(df.key[point]))})"
        ax.plot(df.paper_effect[point], y[point] - 0.3, "D", color=color, ms=4, ls="none", label=label)


def write(profile: str = "cpu", results: Path | None = None) -> tuple[Path, Path] | None:
    """Draw the forest from the profile's committed records and write it with its rows (None: no timing
    claims in the records)."""
    df = rows(claims_table.records(profile, results))
    if df.empty:
        return None
    fig = plot(df, profile)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    png = atomic_write_bytes(reference_figures_dir(profile) / f"{NAME}.png", buf.getvalue())
    csv = atomic_write_text(reference_data_dir(profile) / f"{NAME}.csv", df.to_csv(index=False))
    return png, csv
