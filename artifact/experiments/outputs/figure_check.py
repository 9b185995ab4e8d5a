"""What makes a saved figure readable at a glance, checked on the figure itself (matplotlib's renderer gives
every box): `check_figure(fig)` returns one line per problem, [] for a readable figure.

- overlap: no legend or text box overlaps a title or an axes other than its own, no two titles overlap each
  other (a figure's suptitle, supxlabel and supylabel and the panels' titles), no two legends overlap;
- size: no text smaller than MIN_FONT_PT points at the saved DPI (DPI, what figures.save writes; a point is
  1/72 inch, so 8 pt is 11 px in the saved PNG);
- width: the saved PNG (figures.save: bbox_inches="tight") is at most MAX_WIDTH_PX pixels wide;
- legend: every plotted data series has a legend entry: lines drawn in data coordinates (not axhline/axvline
  references), scatter collections, error bars and bar groups, matched by label to the entries of the figure's
  legends (an axes legend or a figure legend; series that share a label share its entry).

figures.save runs it on every figure it writes and prints what it finds; tests/test_figures_readable.py holds
every notebook's figure to it."""

from __future__ import annotations

import io
import struct
from itertools import combinations

from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

DPI = 100  # what figures.save writes a figure at
MIN_FONT_PT = 8.0
MAX_WIDTH_PX = 1800
TOLERANCE_PX = 1.0  # boxes that share an edge do not overlap


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">II", png[16:24])


def render(fig, dpi: float) -> bytes:
    """The PNG figures.save writes (bbox_inches="tight"); the figure is drawn, so its layout is final."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _overlap(a: Bbox, b: Bbox) -> bool:
    return (
        min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE_PX and min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE_PX
    )


def _shown(t: Text) -> bool:
    return t.get_visible() and bool(t.get_text().strip()) and t.figure is not None


def _name(t: Text, limit: int = 40) -> str:
    s = " ".join(t.get_text().split())
    return repr(s if len(s) <= limit else s[: limit - 3] + "...")


def _axes_name(fig, ax: Axes) -> str:
    t = next((t for t in (ax.title, ax._left_title, ax._right_title) if _shown(t)), None)
    return f"axes {fig.axes.index(ax)}" + (f" ({_name(t)})" if t is not None else "")


def _titles(fig) -> list[tuple[Text, Axes | None]]:
    """The figure's title and labels (suptitle, supxlabel, supylabel) and every panel's titles."""
    out = [(t, None) for t in (fig._suptitle, fig._supxlabel, fig._supylabel) if t is not None and _shown(t)]
    for ax in fig.axes:
        if ax.get_visible():
            out += [(t, ax) for t in (ax.title, ax._left_title, ax._right_title) if _shown(t)]
    return out


def _legends(fig) -> list[tuple[Legend, Axes | None]]:
    out = [(lg, None) for lg in fig.legends if lg.get_visible()]
    return out + [
        (ax.get_legend(), ax)
        for ax in fig.axes
        if ax.get_visible() and ax.get_legend() is not None and ax.get_legend().get_visible()
    ]


def _text_boxes(fig, skip: set) -> list[tuple[Text, Axes | None]]:
    out = []
    for t in fig.findobj(Text):
        if id(t) in skip or not _shown(t) or t.get_bbox_patch() is None:
            continue
        ax = t.axes if isinstance(t.axes, Axes) else None
        out.append((t, ax))
    return out


def overlaps(fig) -> list[str]:
    """Legends and text boxes over a title or another axes; titles over each other or another axes; legends
    over each other. The figure must be drawn (check_figure draws it)."""
    r = fig.canvas.get_renderer()
    titles = [(t, ax, t.get_window_extent(r)) for t, ax in _titles(fig)]
    legends = [(lg, ax, lg.get_window_extent(r)) for lg, ax in _legends(fig)]
    legend_texts = {id(t) for lg, _, _ in legends for t in [*lg.get_texts(), lg.get_title()]}
    boxes = [
        (t, ax, t.get_bbox_patch().get_window_extent(r))
        for t, ax in _text_boxes(fig, legend_texts | {id(t) for t, _, _ in titles})
    ]
    axes = [(ax, ax.get_window_extent(r)) for ax in fig.axes if ax.get_visible()]

    def others(owner, box):  # the axes a box is not part of (a twin shares its host's place)
        return [
            (ax, b)
            for ax, b in axes
            if ax is not owner and not (owner is not None and b.bounds == box.bounds)
        ]

    out = []
    for (t1, _, b1), (t2, _, b2) in combinations(titles, 2):
        if _overlap(b1, b2):
            out.append(f"overlap: title {_name(t1)} overlaps title {_name(t2)}")
    for t, owner, b in titles:
        own = owner.get_window_extent(r) if owner is not None else None
        for ax, ab in others(owner, own):
            if _overlap(b, ab):
                out.append(f"overlap: title {_name(t)} overlaps {_axes_name(fig, ax)}")
    for kind, items in (("legend", legends), ("text box", boxes)):
        for art, owner, b in items:
            what = (
                f"legend ({_name(art.get_texts()[0])}, ...)"
                if kind == "legend" and art.get_texts()
                else f"{kind} {_name(art)}"
                if kind == "text box"
                else "legend"
            )
            for t, _, tb in titles:
                if _overlap(b, tb):
                    out.append(f"overlap: {what} overlaps title {_name(t)}")
            own = owner.get_window_extent(r) if owner is not None else None
            for ax, ab in others(owner, own):
                if _overlap(b, ab):
                    out.append(f"overlap: {what} overlaps {_axes_name(fig, ax)}")
    for (_, _, b1), (_, _, b2) in combinations(legends, 2):
        if _overlap(b1, b2):
            out.append("overlap: two legends overlap")
    return out


def small_text(fig, dpi: float, min_pt: float = MIN_FONT_PT) -> list[str]:
    """Visible text smaller than min_pt points (at `dpi`: pt x dpi / 72 pixels)."""
    out, seen = [], set()
    for t in fig.findobj(Text):
        if not _shown(t) or t.get_fontsize() >= min_pt - 1e-9:
            continue
        key = (t.get_text(), t.get_fontsize())
        if key not in seen:
            seen.add(key)
            out.append(
                f"size: {_name(t)} is {t.get_fontsize():g} pt ({t.get_fontsize() * dpi / 72:.1f} px at "
                f"{dpi:g} dpi), under {min_pt:g} pt"
            )
    return out


def _has_label(label: str | None, entries: set[str]) -> bool:
    return bool(label) and not label.startswith("_") and label in entries


def unlabelled_series(fig) -> list[str]:
    """Data series with no legend entry: lines in data coordinates, scatters, error bars, bar groups."""
    entries = {t.get_text() for lg, _ in _legends(fig) for t in lg.get_texts()}
    out = []
    for ax in fig.axes:
        where = _axes_name(fig, ax)
        parts = set()
        bar_errors = {id(c.errorbar) for c in ax.containers if isinstance(c, BarContainer) and c.errorbar}
        for c in ax.containers:
            parts |= {id(a) for a in c.get_children()}
            if id(c) in bar_errors:  # a bar's error bars: part of the bar's entry
                continue
            if isinstance(c, (ErrorbarContainer, BarContainer)) and not _has_label(c.get_label(), entries):
                kind = "error bars" if isinstance(c, ErrorbarContainer) else "bars"
                out.append(f"legend: {kind} {c.get_label()!r} in {where} have no legend entry")
        for line in ax.lines:
            if id(line) in parts or not line.get_visible() or line.get_transform() != ax.transData:
                continue
            if len(line.get_xdata()) == 0:
                continue
            if not _has_label(line.get_label(), entries):
                out.append(
                    f"legend: line {line.get_label()!r} ({_style(line)}) in {where} has no legend entry"
                )
        for c in ax.collections:
            if id(c) in parts or not c.get_visible() or not isinstance(c, PathCollection):
                continue
            if not _has_label(c.get_label(), entries):
                out.append(f"legend: scatter {c.get_label()!r} in {where} has no legend entry")
    return out


def _style(line: Line2D) -> str:
    from matplotlib.colors import to_hex

    return f"{to_hex(line.get_color())} {line.get_linestyle()} {line.get_marker()}"


def check_figure(
    fig,
    dpi: float | None = None,
    max_width_px: int = MAX_WIDTH_PX,
    min_pt: float = MIN_FONT_PT,
    png: bytes | None = None,
) -> list[str]:
    """Every problem of `fig` as saved at `dpi` (DPI): overlap, size, width and legend, one line each.
    `png`: the figure as already saved at `dpi` (figures.save), else it is rendered here."""
    dpi = DPI if dpi is None else dpi
    width, _ = png_size(png if png is not None else render(fig, dpi))
    fig.canvas.draw()  # the layout at the figure's own dpi: the boxes the checks compare
    out = overlaps(fig) + small_text(fig, dpi, min_pt)
    if width > max_width_px:
        out.append(f"width: {width} px at {dpi:g} dpi, over {max_width_px} px")
    return out + unlabelled_series(fig)
