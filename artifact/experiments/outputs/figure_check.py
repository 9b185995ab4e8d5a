"""What makes a saved figure readable at a glance, checked on the figure itself (matplotlib's renderer gives
every box): `check_figure(fig)` returns one line per problem, [] for a readable figure.

- overlap: no legend or text box overlaps a title or an axes other than its own, no two titles overlap each
  other (a figure's suptitle, supxlabel and supylabel and the panels' titles), no two legends overlap;
- size: no text smaller than MIN_FONT_PT points at the saved DPI (DPI, what figures.save writes; a point is
  1/72 inch, so 8 pt is 11 px in the saved PNG);
- width: the saved PNG (figures.save: bbox_inches="tight") is at most MAX_WIDTH_PX pixels wide;
- legend: every plotted data series has a legend entry: lines drawn in data coordinates (not axhline/axvline
  references), scatter collections, error bars and bar groups, matched by label to the entries of the figure's
  legends (an axes legend or a figure legend; series that share a label share its entry);
- hidden: no labelled line lies under a line drawn over it (hidden_series; drawn over: later in its axes'
  draw order, by zorder then as added): hidden when, inside its axes, every point of its path lies within
  HIDDEN_PX saved pixels of the upper line's path, the upper line solid or in its dashes and at least as wide,
  and each of its markers within HIDDEN_PX of the upper line's same marker at least as big, or inside a
  bigger filled one. Error bars count by their data line (and their label). A pair passes when a label
  says that they coincide: the word "coincide" ("coincides", "coincident") or a free-standing "="
  ("demand = last_step", "(= last_step)"; not "b=1");
- covered: no value printed on a heatmap (a text inside an axes holding an image or a mesh) lies under a line
  (a plotted line, contour or line collection, dashes taken as solid) whose drawn width crosses the text's
  box, or under a marker (a line's, a scatter's) whose box overlaps it by over TOLERANCE_PX
  (covered_cell_text). A text drawn above the stroke still shows it through its glyphs; only a text drawn
  above it in an opaque box hides it.

figures.save runs it on every figure it writes and prints what it finds; tests/test_figures_readable.py holds
every notebook's figure to it."""

from __future__ import annotations

import io
import re
import struct
from itertools import combinations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.cbook import STEP_LOOKUP_MAP
from matplotlib.collections import LineCollection, PathCollection, QuadMesh
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.contour import ContourSet
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

DPI = 100  # what figures.save writes a figure at
MIN_FONT_PT = 8.0
MAX_WIDTH_PX = 1800
TOLERANCE_PX = 1.0  # boxes that share an edge do not overlap
HIDDEN_PX = 3.0  # a line that near one drawn over it, all along, is hidden (2 line widths at 1.5 pt)
# a label saying that two series coincide: the word, or a free-standing "="
SAYS_COINCIDE = re.compile(r"coincid|(?:^|[\s(])=(?:\s|$)", re.IGNORECASE)
_NONE = ("None", "none", "", " ", None)  # no line style, no marker


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


# --- hidden series, covered cell text ---------------------------------------------------------------------
def _has_line(line: Line2D) -> bool:
    return line.get_linestyle() not in _NONE and line.get_linewidth() > 0


def _has_marker(line: Line2D) -> bool:
    return line.get_marker() not in _NONE and line.get_markersize() > 0


def _draw_order(ax: Axes) -> dict[int, int]:
    """Each child's place in the order its axes draws them (Axes.draw: by zorder, then as added)."""
    return {id(a): k for k, a in enumerate(sorted(ax.get_children(), key=lambda a: a.get_zorder()))}


def _lines(ax: Axes) -> list[tuple[Line2D, str]]:
    """The axes' visible lines and their labels (an error bar's data line: its container's; none: "_")."""
    named = {id(c.lines[0]): c.get_label() for c in ax.containers if isinstance(c, ErrorbarContainer)}
    return [(ln, str(named.get(id(ln), ln.get_label()) or "_")) for ln in ax.lines if ln.get_visible()]


def _label(line: Line2D, label: str) -> str:
    return f"line {label!r}" if label and label[0] != "_" else f"an unlabelled line ({_style(line)})"


def _drawn(line: Line2D, steps: bool = True) -> np.ndarray:
    """A line's points in display pixels: its path (with its draw style's steps), or (steps=False) markers."""
    xy = line.get_xydata()
    xy = np.column_stack(STEP_LOOKUP_MAP[line.get_drawstyle()](*xy.T)) if steps else xy
    return line.get_transform().transform(xy)


def _segments(xy: np.ndarray) -> np.ndarray:
    """(M, 2, 2): a polyline's segments; a non-finite point breaks it, a lone point is one of length 0."""
    ok = np.isfinite(xy).all(axis=1)
    both = ok[:-1] & ok[1:]
    alone = ok & ~np.r_[False, both] & ~np.r_[both, False]
    return np.concatenate([np.stack([xy[:-1][both], xy[1:][both]], 1), _dots(xy[alone])])


def _dots(xy: np.ndarray) -> np.ndarray:
    """Points as segments of length 0."""
    return np.repeat(xy[:, None], 2, axis=1)


def _distance(points: np.ndarray, segs: np.ndarray) -> np.ndarray:
    """Each point's distance to the nearest segment (inf where there is none)."""
    out, a, d = np.full(len(points), np.inf), segs[:, 0], segs[:, 1] - segs[:, 0]
    for i in range(0, len(points) if len(segs) else 0, 256):
        rel = points[i : i + 256, None] - a[None]
        t = np.clip((rel * d).sum(axis=2) / np.maximum((d * d).sum(axis=1), 1e-12), 0, 1)
        out[i : i + 256] = np.hypot(*(rel - t[..., None] * d).transpose(2, 0, 1)).min(axis=1)
    return out


def _radii(line: Line2D, px: float) -> tuple[float, float]:
    """A line's marker in pixels: the radius its fill covers (0 if unfilled), and the radius it reaches."""
    m = MarkerStyle(line.get_marker())
    pts = np.concatenate(m.get_path().transformed(m.get_transform()).to_polygons(closed_only=False))
    size, edge = line.get_markersize() * px, line.get_markeredgewidth() * px / 2
    filled = m.is_filled() and line.get_fillstyle() == "full" and to_rgba(line.get_markerfacecolor())[3] == 1
    inner = _distance(np.zeros((1, 2)), _segments(np.r_[pts, pts[:1]]))[0] * size + edge if filled else 0.0
    return inner, np.hypot(*pts.T).max() * size + edge


def _under(a: Line2D, b: Line2D, tol: float, area: Bbox) -> bool:
    """Whether b, drawn over a, covers all that a draws inside its axes (the module's rule)."""

    def shown(p):  # what a draws: its finite points, inside its axes where it is clipped to them
        p = p[np.isfinite(p).all(axis=1)]
        return p[((p >= area.p0) & (p <= area.p1)).all(axis=1)] if a.get_clip_on() else p

    path, marks = np.empty((0, 2)), np.empty((0, 2))
    if _has_line(a):  # points along a's path, tol apart
        segs = _segments(_drawn(a))
        n = np.ceil(np.hypot(*(segs[:, 1] - segs[:, 0]).T) / tol).astype(int) + 2
        path = shown(np.concatenate([np.linspace(s[0], s[1], k) for s, k in zip(segs, n)] + [path]))
    if _has_marker(a):
        marks = shown(_drawn(a, False))
    if not len(path) + len(marks):  # a draws nothing here
        return False
    if len(path):  # b's line as wide, solid or in a's dashes (a shows through other gaps), all along a's
        on = b.get_linestyle() in ("-", a.get_linestyle()) and b.get_linewidth() >= a.get_linewidth()
        if not (_has_line(b) and on and (_distance(path, _segments(_drawn(b))) <= tol).all()):
            return False
    if len(marks):  # on each of a's markers: b's same marker as big, or a filled one it fits inside
        at, px = _distance(marks, _dots(_drawn(b, False))), a.figure.dpi / 72
        same = b.get_marker() == a.get_marker() and b.get_markersize() >= a.get_markersize()
        if not (
            _has_marker(b)
            and (same and (at <= tol).all() or (at + _radii(a, px)[1] <= _radii(b, px)[0]).all())
        ):
            return False
    return True


def hidden_series(fig, dpi: float = DPI) -> list[str]:
    """Labelled lines that a line drawn over them covers (the module's rule). The figure must be drawn."""
    tol, out = HIDDEN_PX * fig.dpi / dpi, []
    for ax in (ax for ax in fig.axes if ax.get_visible()):
        order, area, lines = _draw_order(ax), ax.get_window_extent().padded(tol), _lines(ax)
        for a, la in (x for x in lines if x[1][0] != "_" and not SAYS_COINCIDE.search(x[1])):
            for b, lb in lines:
                if order[id(b)] > order[id(a)] and not SAYS_COINCIDE.search(lb) and _under(a, b, tol, area):
                    out.append(
                        f"hidden: {_label(a, la)} in {_axes_name(fig, ax)} lies under {_label(b, lb)}, drawn "
                        f"over it within {HIDDEN_PX:g} px all along: give one its own line style or marker, "
                        "or say in a label that they coincide"
                    )
                    break
    return out


def _strokes(ax: Axes, px: float):
    """What may cover a printed value, each part as (artist, name, segments, half their width) in display
    pixels (a marker: a segment of length 0, half as wide as the marker reaches): lines and their markers,
    contours, line collections, scatters."""
    for ln, label in _lines(ax):
        if _has_line(ln):
            yield ln, _label(ln, label), _segments(_drawn(ln)), ln.get_linewidth() * px / 2
        if _has_marker(ln):
            yield ln, _label(ln, label), _dots(_drawn(ln, False)), _radii(ln, px)[1]
    for c in (c for c in ax.collections if c.get_visible()):
        lw = max(c.get_linewidths(), default=0) * px / 2
        if isinstance(c, PathCollection):
            half = np.sqrt(max(c.get_sizes(), default=0)) * px / 2 + lw
            yield (
                c,
                f"scatter {c.get_label()!r}",
                _dots(c.get_offset_transform().transform(c.get_offsets())),
                half,
            )
        elif isinstance(c, LineCollection) or isinstance(c, ContourSet) and not c.filled:
            paths = [
                c.get_transform().transform_path(p).to_polygons(closed_only=False) for p in c.get_paths()
            ]
            segs = np.concatenate([_segments(xy) for polys in paths for xy in polys] + [np.empty((0, 2, 2))])
            level = isinstance(c, ContourSet) and f"contour at {', '.join(f'{v:g}' for v in c.levels)}"
            yield c, level or f"lines {c.get_label()!r}", segs, lw


def _crosses(segs: np.ndarray, box: Bbox) -> bool:
    """Whether any segment enters the box (Liang-Barsky clipping, all segments at once)."""
    p, d = segs[:, 0], segs[:, 1] - segs[:, 0]
    lo, hi = np.zeros(len(p)), np.ones(len(p))
    for k in (0, 1):
        with np.errstate(divide="ignore", invalid="ignore"):
            t1, t2 = (box.p0[k] - p[:, k]) / d[:, k], (box.p1[k] - p[:, k]) / d[:, k]
        flat, outside = d[:, k] == 0, (p[:, k] < box.p0[k]) | (p[:, k] > box.p1[k])
        lo = np.where(flat, np.where(outside, np.inf, lo), np.maximum(lo, np.minimum(t1, t2)))
        hi = np.where(flat, hi, np.minimum(hi, np.maximum(t1, t2)))
    return bool((lo <= hi).any())


def _clears(t: Text, artist, order: dict[int, int]) -> bool:
    """A text drawn above the artist in an opaque box hides what lies under it."""
    box = t.get_bbox_patch()
    opaque = box is not None and box.get_visible() and box.get_fill() and to_rgba(box.get_facecolor())[3] == 1
    return opaque and order[id(t)] > order[id(artist)]


def covered_cell_text(fig) -> list[str]:
    """Values printed on a heatmap under a line or a marker (the module's rule). The figure must be drawn."""
    r, out = fig.canvas.get_renderer(), []
    for ax in fig.axes:
        if not ax.get_visible() or not (ax.images or any(isinstance(c, QuadMesh) for c in ax.collections)):
            continue
        area, order, hits = ax.get_window_extent(r), _draw_order(ax), {}
        texts = [(t, t.get_window_extent(r)) for t in ax.texts if _shown(t)]
        for art, name, segs, half in _strokes(ax, fig.dpi / 72):
            for t, b in texts:
                inside = area.contains(*(b.p0 + b.p1) / 2)  # a value printed in the cells
                if inside and not _clears(t, art, order) and _crosses(segs, b.padded(half - TOLERANCE_PX)):
                    hits.setdefault(name, {})[id(t)] = _name(t)
        for name, hit in hits.items():
            shown = ", ".join(list(hit.values())[:4]) + (", ..." if len(hit) > 4 else "")
            out.append(
                f"covered: {name} in {_axes_name(fig, ax)} is drawn over {len(hit)} printed "
                f"value{'s' * (len(hit) > 1)} ({shown})"
            )
    return out


def check_figure(
    fig,
    dpi: float | None = None,
    max_width_px: int = MAX_WIDTH_PX,
    min_pt: float = MIN_FONT_PT,
    png: bytes | None = None,
) -> list[str]:
    """Every problem of `fig` as saved at `dpi` (DPI): overlap, size, width, legend, hidden and covered, one
    line each.
    `png`: the figure as already saved at `dpi` (figures.save), else it is rendered here."""
    dpi = DPI if dpi is None else dpi
    width, _ = png_size(png if png is not None else render(fig, dpi))
    fig.canvas.draw()  # the layout at the figure's own dpi: the boxes the checks compare
    out = overlaps(fig) + small_text(fig, dpi, min_pt)
    if width > max_width_px:
        out.append(f"width: {width} px at {dpi:g} dpi, over {max_width_px} px")
    return out + unlabelled_series(fig) + hidden_series(fig, dpi) + covered_cell_text(fig)
