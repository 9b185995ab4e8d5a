"""Figures: each policy's one look in every figure (`style`: colour, marker) and the greys of what is not a
policy, the paper's marks, the figure title naming the profile, one legend entry per label (`legend`,
`figure_legend`), and `save`, which writes a figure (<name>.png into outputs.paths.figures_dir) with the data
it drew (<name>.csv into outputs.paths.run_data_dir) and prints what outputs/figure_check.py finds unreadable
in it."""

from __future__ import annotations

import io
import math
import re
import zlib
from pathlib import Path

import seaborn as sns
from matplotlib.colors import to_hex, to_rgb
from scipy import stats

from artifact.experiments.criteria import paper, thresholds
from artifact.experiments.outputs.figure_check import DPI, check_figure
from artifact.experiments.outputs.paths import figures_dir, run_data_dir, short_path
from artifact.experiments.settings import CONTROL, Settings
from artifact.paths import atomic_write_bytes, atomic_write_text

_CB = sns.color_palette("colorblind").as_hex()  # seaborn's colour-blind-safe palette
# Each policy's (colour, marker, line style), the same in every figure; `style` draws its variants from it. A
# comparison "A over B" takes the look of its side that is not demand (the predictor); the A/A (demand over
# demand, or 07's stand-in) CONTROL_COLOR. What is not a policy (batch sizes, GPUs, a run's parts) is a grey.
POLICY_STYLE = {
    "demand": (_CB[0], "o", "-"),  # demand paging, LRU eviction
    "last_step": (_CB[1], "s", "-"),
    CONTROL: (_CB[5], "X", "-"),
    "interval_refresh": (_CB[4], "P", "-"),
    "cross_layer": (_CB[3], "D", "-"),
    "oracle": (_CB[2], "^", "-"),
    "TIDE released": (_CB[8], "*", "-"),
    "belady": ("#000000", "x", ":"),  # the floors (bounds, not prefetchers): black, told apart by line style
    "min": ("#000000", "v", "--"),
}
SPARE = (_CB[6], _CB[9])  # a policy of your own (docs/policies.md): one of these, chosen by its name
# the look of a series drawn wide and pale under those equal to it (demand: CONTROL makes the same loads)
UNDER = dict(lw=6, alpha=0.35, solid_capstyle="round", zorder=1)
# the A/A's series (demand over demand, or 07's stand-in): a grey no policy uses
CONTROL_COLOR = "dimgray"


def style(policy: str) -> dict:
    """A policy's look in every figure: dict(color, marker, ls). A variant (a spec with options after ':' or
    an eviction after '+': "last_step:lookahead=2", "demand+lrfu:lam=2") is drawn as its base policy, in a
    lighter shade, dashed, its marker hollow; a policy POLICY_STYLE lacks gets one of SPARE, by its name."""
    base = re.split(r"[:+]", policy, maxsplit=1)[0]
    color, marker, ls = POLICY_STYLE.get(base) or (SPARE[zlib.crc32(base.encode()) % len(SPARE)], "o", "-")
    if base == policy:
        return dict(color=color, marker=marker, ls=ls)
    return dict(color=to_hex([c + 0.45 * (1 - c) for c in to_rgb(color)]), marker=marker, ls="--", mfc="none")


def in_order(policies) -> list[str]:
    """The policies once each, in POLICY_STYLE's order of their base policies, each variant after its base
    (those of a base it lacks last, by name): the order a figure draws them in and its legend lists them."""
    order = list(POLICY_STYLE)
    base = {p: re.split(r"[:+]", p, maxsplit=1)[0] for p in set(policies)}
    return sorted(base, key=lambda p: (order.index(base[p]) if base[p] in order else len(order), base[p], p))


def grey(level: float) -> str:
    """The colour of a series that is not a policy: a grey, 0 the lightest (0.75) .. 1 the darkest (0.2),
    never the floors' black nor any policy's colour."""
    return to_hex([0.75 - 0.55 * level] * 3)


def batch_color(batch_size: int) -> str:
    """A batch size's grey, the same in every figure: darker as it doubles (1 the lightest, 32 and over the
    darkest)."""
    return grey(min(math.log2(max(batch_size, 1)) / 5, 1.0))


HARDWARE = {"cpu": grey(0.5), "a5000": grey(1.0), "h200": grey(0.3)}  # a hardware profile's grey
# settings.CONTROL in a figure: last_step's prediction on the host, no transfers (demand's loads + host time)
CONTROL_LABEL = f"{CONTROL} (demand's loads + host time)"
# what an interval is over (rules.Interval.unit), as a figure's title says it
INTERVAL_BASIS = {
    "runs": "pooled over runs",
    "run": "one run, widened by the stored runs' spread",
    "pairs": "within one run",
}
PAPER_STYLE = dict(color="crimson", lw=1.5, ls="--")  # how the paper's figures are marked on a plot
LEGEND_PT = 8  # the smallest text a figure has (figure_check.MIN_FONT_PT)


def title(fig, P: Settings, text: str, legend_columns: int = 0) -> None:
    """The figure's title, naming the profile, and with legend_columns > 0 the figure's one legend below the
    panels in that many columns (figure_legend). Constrained layout makes room for both."""
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    if legend_columns:
        figure_legend(fig, ncol=legend_columns)
    fig.suptitle(
        f"{text}  [profile {P.name}: {P.model if P.model == 'tiny' else 'checkpoint'}, {P.device}]",
        fontsize=11,
    )


CLIPPED = "interval runs off the axis (its end printed)"


def interval_fields(i) -> dict:
    """A ruled interval (rules.Interval) as a figure's data columns: diff_pct, low, high, interval (its
    basis), n."""
    return dict(diff_pct=i.mean, low=i.low, high=i.high, interval=i.unit, n=i.n)


def mark_margin(ax, what: str, unit: str = "%") -> None:
    """The +-margin band a claim reads its intervals against (thresholds.MARGIN, in the axis' `unit`),
    labelled "+-3<unit>: <what>"."""
    ax.axhspan(
        -thresholds.MARGIN,
        thresholds.MARGIN,
        color="gray",
        alpha=0.12,
        label=f"+-{thresholds.MARGIN:g}{unit}: {what}",
    )


def mark_zero(ax) -> None:
    """The dotted zero line of an A-over-B axis: no difference."""
    ax.axhline(0, color="black", lw=1, ls=":")


def mark_paper_04(ax, point: bool = True) -> list[float]:
    """The abstract's 04 figures on a demand-over-last_step axis (% tokens/s over C/W): its throughput gain
    (paper.FASTER_PCT, abstract: "improves throughput by ...") as a band over C/W 0.83-1.73
    (paper.FASTER_RANGE, where the abstract calls the advantage "significant"; drawing the band over that
    range is this artifact's reading), and with `point` its interval at C/W 0.43 (paper.AT_LOW, abstract:
    "falls to ... at C/W=0.43"); returns the y values drawn."""
    lo, hi = paper.FASTER_RANGE
    ax.fill_between(
        [lo, hi],
        *paper.FASTER_PCT,
        color=PAPER_STYLE["color"],
        alpha=0.15,
        label=f"abstract: +{paper.FASTER_PCT[0]}..+{paper.FASTER_PCT[1]}% (over C/W {lo}-{hi}: our reading)",
    )
    if not point:
        return list(paper.FASTER_PCT)
    low = paper.AT_LOW
    ax.errorbar(
        [low.cache_ratio],
        [low.diff_pct],
        yerr=[[low.diff_pct - low.ci_low], [low.ci_high - low.diff_pct]],
        fmt="D",
        color=PAPER_STYLE["color"],
        capsize=4,
        ms=5,
        label=f"paper at C/W {low.cache_ratio:g}: {paper.paired_text(low, '%')}",
    )
    return [*paper.FASTER_PCT, low.ci_low, low.ci_high]


def mean_interval(values) -> tuple[float, float]:
    """The mean of `values` and the half-width of its t interval (thresholds.CONFIDENCE, df = n - 1): what a
    figure's error bar around a mean shows (0 for fewer than two values)."""
    v = [float(x) for x in values if math.isfinite(x)]
    if not v:
        return math.nan, 0.0
    mean = sum(v) / len(v)
    if len(v) < 2:
        return mean, 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1))
    return mean, float(stats.t.ppf(0.5 + thresholds.CONFIDENCE / 2, len(v) - 1)) * sd / math.sqrt(len(v))


def interval_limits(
    keep, ends=(), room: float = 0.5, floor: float = 10.0, pad: float = 0.08
) -> tuple[float, float]:
    """The y range a reader needs: every value in `keep` (the means, the intervals a verdict is read from, the
    marks it is compared with), and of the other interval ends (`ends`: e.g. a single run's wide ones) no more
    than `room` x the span of `keep` (at least `floor`) beyond it; padded by `pad` of the span. mark_clipped
    marks what runs past it."""
    keep = [float(v) for v in keep if math.isfinite(v)]
    ends = [float(v) for v in ends if math.isfinite(v)]
    lo, hi = (min(keep), max(keep)) if keep else (-floor / 2, floor / 2)
    span = max(hi - lo, floor)
    lo = min([lo] + [max(v, lo - room * span) for v in ends])
    hi = max([hi] + [min(v, hi + room * span) for v in ends])
    return lo - pad * (hi - lo), hi + pad * (hi - lo)


def mark_clipped(ax, x, low, high, color, label: str = CLIPPED) -> int:
    """For each interval (x, low, high) that runs past ax's y limits: an arrow at the edge it crosses, with
    the interval's end printed beside it (LEGEND_PT). Call after the limits are final; returns how many
    ends."""
    y0, y1 = ax.get_ylim()
    x0, x1 = ax.get_xlim()
    n = 0
    for xi, lo, hi in zip(x, low, high):
        right = (xi - x0) / (x1 - x0) > 0.85  # near the right edge: print the end on the arrow's left
        for v, edge, marker, dy, va in ((hi, y1, "^", -3, "top"), (lo, y0, "v", 3, "bottom")):
            if (v > edge) if marker == "^" else (v < edge):
                ax.plot([xi], [edge], marker=marker, ms=7, color=color, ls="none", clip_on=False, label=label)
                ax.annotate(
                    f"{v:+.0f}",
                    (xi, edge),
                    xytext=(-5 if right else 5, dy),
                    textcoords="offset points",
                    ha="right" if right else "left",
                    va=va,
                    fontsize=LEGEND_PT,
                    color=color,
                )
                n += 1
    return n


def entries(axes) -> tuple[list, list[str]]:
    """(handles, labels) of every labelled artist of `axes`, one per label (the first drawn): series drawn in
    several panels, or in several calls, share one entry."""
    seen: dict = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    return list(seen.values()), list(seen)


def legend(ax, **kw):
    """The axes' legend, one entry per label, at LEGEND_PT unless kw says otherwise."""
    return ax.legend(*entries([ax]), **{"fontsize": LEGEND_PT, **kw})


def figure_legend(fig, ncol: int = 2, axes=None, **kw):
    """One legend for the whole figure (or for `axes`' series) below its panels (over no title and no axes),
    one entry per label."""
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    return fig.legend(
        *entries(fig.axes if axes is None else axes),
        **{"loc": "outside lower center", "ncol": ncol, "fontsize": LEGEND_PT, "frameon": False, **kw},
    )


def save(fig, df, P: Settings, name: str, log=print) -> tuple[Path, Path]:
    """Write <name>.png (dpi 100) into figures_dir(P) and <name>.csv into run_data_dir(P); returns both paths.
    What figure_check finds unreadable in the figure is logged after the "saved" line (the files are written
    either way)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    png = atomic_write_bytes(figures_dir(P) / f"{name}.png", buf.getvalue())
    csv = atomic_write_text(run_data_dir(P) / f"{name}.csv", df.to_csv(index=False))
    log(f"saved {short_path(png)} and {short_path(csv)}")
    for problem in check_figure(fig, DPI, png=buf.getvalue()):
        log(f"figure check: {name}: {problem}")
    return png, csv
