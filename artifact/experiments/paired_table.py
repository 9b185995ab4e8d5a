"""Paired comparisons of two policies' throughput within one run, with 95% intervals over its pairs: a
display table (the verdicts are ruled over runs: verdicts/).

A pair is two runs of the same cell (task, batch size, C/W, bandwidth scale) and repetition, one per
policy, on identical prompts, back to back. The effect of A over B is the mean over pairs of the
per-pair percentage (a - b) / b * 100: each pair is its own baseline, so slow cells and fast cells
weigh alike and drift between repetitions cancels. Intervals over pairs:
  t          scipy.stats.ttest_1samp of the per-pair percentages: mean +- t_{n-1} * s / sqrt(n)
  bootstrap  percentile interval of the mean over resampled pairs (scipy.stats.bootstrap, seeded)
A difference "excludes zero" when its t interval lies entirely above or below 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from artifact.experiments.bench.grid import CELL_KEYS, PAIR_KEYS, CellKey
from artifact.experiments.bench.order import primary
from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.verdicts.pairs import wide

__all__ = [
    "CELL_KEYS",
    "PAIR_KEYS",
    "CellKey",
    "primary",
    "paired_table",
    "format_table",
    "with_paper",
    "cell_label",
]
CONFIDENCE = thresholds.CONFIDENCE


def cell_label(key) -> str:
    """A cell's name in a verdict's text: its C/W and batch size, then its task and bandwidth scale where
    they are not the grid's usual ones (gsm8k, x1)."""
    task, b, ratio, scale = key
    return (
        f"C/W {ratio:g} b={b}"
        + (f" {task}" if task != "gsm8k" else "")
        + (f" x{scale:g}" if scale != 1 else "")
    )


@dataclass(frozen=True)
class PairedDifference:
    n_pairs: int
    mean_a: float
    mean_b: float
    diff_pct: float  # mean over pairs of (a - b) / b * 100
    ci_low: float
    ci_high: float
    p_value: float  # two-sided, H0: mean percentage difference = 0

    @property
    def excludes_zero(self) -> bool:
        return bool(self.ci_low > 0 or self.ci_high < 0)

    @property
    def verdict(self) -> str:
        if not self.excludes_zero:
            return "no difference"
        return "A faster" if self.diff_pct > 0 else "B faster"


def percent_differences(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """(a - b) / b * 100 per pair; a[i] and b[i] are the two runs of pair i."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(
            "a and b must be 1-d arrays of the same length (one value per pair), "
            f"got shapes {a.shape} and {b.shape}"
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()) or (b <= 0).any():
        raise ValueError("paired values must be finite, and b > 0 (it is the per-pair baseline)")
    return (a - b) / b * 100.0


def paired_difference(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
) -> PairedDifference:
    """Mean per-pair percentage difference of a over b, its t interval over pairs (scipy's ttest_1samp)."""
    d = percent_differences(a, b)
    if len(d) == 0:
        raise ValueError("no pairs")
    mean = float(d.mean())
    if len(d) < 2:
        lo = hi = p = float("nan")
    elif d.std() == 0:
        lo = hi = mean
        p = 1.0 if mean == 0 else 0.0
    else:
        res = stats.ttest_1samp(d, 0.0)
        ci = res.confidence_interval(confidence)
        lo, hi, p = float(ci.low), float(ci.high), float(res.pvalue)
    return PairedDifference(len(d), float(np.mean(a)), float(np.mean(b)), mean, lo, hi, p)


def bootstrap_ci(
    values: Sequence[float], confidence: float = CONFIDENCE, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (scipy.stats.bootstrap, seeded)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or v.std() == 0:
        return (float("nan"), float("nan")) if len(v) < 2 else (float(v[0]), float(v[0]))
    res = stats.bootstrap(
        (v,), np.mean, confidence_level=confidence, n_resamples=n_resamples, method="percentile", rng=seed
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def wide_pairs(rows, policies: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """One row per pair (PAIR_KEYS), columns (column, policy), from arm A's rows (the A/A's second arm left
    out); a pair missing a side has NaN there. Refuses a policy the rows lack and two rows for one run."""
    rows = primary(pd.DataFrame(rows))
    have = sorted(rows.policy.unique()) if "policy" in rows else []
    for p in policies:
        if p not in have:
            raise ValueError(f"policy {p!r} is not in these rows; they hold {have}")
    return wide(rows[rows.policy.isin(list(policies))], PAIR_KEYS, columns)


def pairs(rows, a: str, b: str, metric: str = "tokens_per_second"):
    """One row per (cell, rep) holding both policies' `metric` (columns a and b); pairs missing a
    side are dropped. Rows: the bench's CSV rows (a DataFrame)."""
    if a == b:
        raise ValueError(f"compare two different policies, got {a!r} twice")
    wide = wide_pairs(rows, (a, b), (metric,))[metric].dropna()
    return wide[[a, b]].reset_index()


def paired_table(
    rows,
    a: str = "demand",
    b: str = "last_step",
    by: Sequence[str] = ("cache_ratio",),
    metric: str = "tokens_per_second",
    confidence: float = CONFIDENCE,
    n_resamples: int = 10_000,
    seed: int = 0,
):
    """The paper's table: policy A vs B per group (default per C/W), one row each with n_pairs,
    mean_a, mean_b, diff_pct (mean per-pair %), the t interval, the bootstrap interval, excludes_zero,
    p_value and verdict."""
    by = list(by)
    bad = [k for k in by if k not in CELL_KEYS]
    if bad:
        raise ValueError(f"cannot group by {bad}; choose from {list(CELL_KEYS)}")
    pr = pairs(rows, a, b, metric)
    out = []
    for key, g in pr.groupby(by, sort=True) if by else [((), pr)]:
        key = key if isinstance(key, tuple) else (key,)
        res = paired_difference(g[a].to_numpy(), g[b].to_numpy(), confidence)
        boot = bootstrap_ci(percent_differences(g[a], g[b]), confidence, n_resamples, seed)
        row = dict(zip(by, key))
        row.update(asdict(res))
        row.update(boot_low=boot[0], boot_high=boot[1], excludes_zero=res.excludes_zero, verdict=res.verdict)
        out.append(row)
    cols = by + [
        "n_pairs",
        "mean_a",
        "mean_b",
        "diff_pct",
        "ci_low",
        "ci_high",
        "boot_low",
        "boot_high",
        "excludes_zero",
        "p_value",
        "verdict",
    ]
    table = pd.DataFrame(out, columns=cols)
    table.attrs.update(a=a, b=b, metric=metric, confidence=confidence)
    return table


def with_paper(table):
    """Add the paper's figure and verdict per C/W (from criteria/paper.py; demand vs last_step tables grouped
    by cache_ratio only) and whether the measured verdict agrees. Other tables come back unchanged."""
    if table.attrs.get("a") != "demand" or table.attrs.get("b") != "last_step" or "cache_ratio" not in table:
        return table
    t = table.copy()
    ref = [paper.demand_vs_last_step(r) or ("", "") for r in t.cache_ratio]
    t["paper"] = [text for text, _ in ref]
    t["paper_verdict"] = [verdict for _, verdict in ref]
    t["agrees"] = [bool(pv) and v == pv for v, (_, pv) in zip(t.verdict, ref)]
    t.attrs.update(table.attrs)
    return t


def format_table(table) -> str:
    """A fixed-width text rendering of paired_table (with_paper) output."""
    a, b = table.attrs.get("a", "A"), table.attrs.get("b", "B")
    conf = int(round(table.attrs.get("confidence", CONFIDENCE) * 100))
    metric = table.attrs.get("metric", "tokens_per_second")
    keys = [c for c in table.columns if c in CELL_KEYS]
    lines = [f"{a} (A) vs {b} (B): mean per-pair difference in {metric}, {conf}% intervals over pairs"]
    view = table[keys].astype(str).copy() if keys else table[[]].copy()
    view["pairs"] = table.n_pairs.astype(str)
    view[f"A {a}"] = table.mean_a.map("{:.2f}".format)
    view[f"B {b}"] = table.mean_b.map("{:.2f}".format)
    view["diff %"] = table.diff_pct.map("{:+.2f}".format)
    view[f"t CI{conf}"] = [f"[{lo:+.2f}, {hi:+.2f}]" for lo, hi in zip(table.ci_low, table.ci_high)]
    view["bootstrap CI"] = [f"[{lo:+.2f}, {hi:+.2f}]" for lo, hi in zip(table.boot_low, table.boot_high)]
    view["excl. 0"] = table.excludes_zero.map({True: "yes", False: "no"})
    for c in ("paper", "agrees"):
        if c in table:
            view[c] = table[c].map({True: "yes", False: "no"}) if c == "agrees" else table[c]
    lines.append(view.to_string(index=False))
    return "\n".join(lines)
