"""`crater topology-export --png`: the console's topology drawing painted with matplotlib, so a
PNG needs no Graphviz binary. The shapes and their places come from the console's `layout`
(one drawing for both); this module only gives each style class its colours, as the console's
stylesheet does for the SVG."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crater.contracts import NodeTopology
from crater.gateway.console.topology import Curve, Drawing, Line, Rect, Shape, Text, layout

if TYPE_CHECKING:
    from matplotlib.axes import Axes

INK = "#1d2330"
MUTED = "#687286"
NVLINK = "#1f9d55"
SCALE = 2.0  # pixels per layout unit: sharp text
MAX_WIDTH = 2400  # pixels: a many-NUMA node is drawn smaller rather than wider
DPI = 100


@dataclass(frozen=True)
class Style:
    fill: str = "none"
    stroke: str = "none"
    width: float = 1.0
    dashes: tuple[float, float] | None = None
    alpha: float = 1.0


@dataclass(frozen=True)
class Font:
    size: float = 11.5  # DejaVu Sans runs wider than the console's system font at 14 px
    color: str = INK
    weight: str = "normal"


# The console stylesheet's classes (console/static/console.css: font 14px), in matplotlib's terms.
STYLES = {
    "t-numa": Style(stroke="#b7bfcc", dashes=(5, 4)),
    "t-cpu": Style(fill="#eef8ee", stroke="#9fcfa4"),
    "t-mem": Style(fill="#fff6e5", stroke="#e6c37c"),
    "t-gpu": Style(fill="#e9f1ff", stroke="#93b2ee"),
    "t-disk": Style(fill="#f3ecfb", stroke="#c2a6e6"),
    "t-used": Style(fill="#2a5bd7", alpha=0.55),
    "t-switch": Style(fill=NVLINK),
    "t-nvlink": Style(stroke=NVLINK, width=2),
    "t-socket": Style(stroke="#8d97ab", width=2, dashes=(6, 4)),
}
FONTS = {
    "t-title": Font(size=13, weight="bold"),
    "t-head": Font(color=MUTED, weight="bold"),
    "t-label": Font(),
    "t-small": Font(size=10, color=MUTED),
}


def draw_topology_png(node: NodeTopology, path: Path) -> tuple[int, int]:
    """Paint `node`'s drawing to `path`; its size in pixels."""
    return paint(layout(node), path)


def paint(drawing: Drawing, path: Path) -> tuple[int, int]:
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    from matplotlib import pyplot as plt

    scale = min(SCALE, MAX_WIDTH / drawing.width)
    width, height = round(drawing.width * scale), round(drawing.height * scale)
    figure = plt.figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    try:
        axes = figure.add_axes((0.0, 0.0, 1.0, 1.0))
        axes.set_xlim(0, drawing.width)
        axes.set_ylim(drawing.height, 0)  # y grows downwards, as in the layout
        axes.axis("off")
        for order, shape in enumerate(drawing.shapes):
            _paint(axes, shape, order, scale)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=DPI, facecolor="white")
    finally:
        plt.close(figure)
    return width, height


def _line_args(style: Style, scale: float) -> dict[str, Any]:
    # CSS pixels to points (72 per inch at DPI pixels per inch)
    args: dict[str, Any] = {"linewidth": style.width * scale * 72 / DPI, "alpha": style.alpha}
    if style.dashes is not None:
        args["linestyle"] = (0, style.dashes)
    return args


def _paint(axes: Axes, shape: Shape, order: int, scale: float) -> None:
    from matplotlib.patches import FancyBboxPatch, PathPatch
    from matplotlib.path import Path as MplPath

    match shape:
        case Rect(x, y, w, h, css):
            style = STYLES[css]
            rounding = 0 if css == "t-used" else min(6.0, w / 2, h / 2)
            axes.add_patch(
                FancyBboxPatch(
                    (x + rounding, y + rounding),
                    max(w - 2 * rounding, 0),
                    max(h - 2 * rounding, 0),
                    boxstyle=f"round,pad={rounding}",
                    facecolor=style.fill,
                    edgecolor=style.stroke,
                    zorder=order,
                    **_line_args(style, scale),
                )
            )
        case Text(x, y, text, css, anchor):
            font = FONTS[css]
            axes.text(
                x,
                y,
                text,
                fontsize=font.size * scale * 72 / DPI,  # CSS pixels to points
                color=font.color,
                fontweight=font.weight,
                horizontalalignment="center" if anchor == "middle" else "left",
                verticalalignment="baseline",
                zorder=order + 10_000,  # text over every line
            )
        case Line(x1, y1, x2, y2, css):
            style = STYLES[css]
            axes.plot(
                [x1, x2], [y1, y2], color=style.stroke, zorder=order, **_line_args(style, scale)
            )
        case Curve(start, control1, control2, end, css):
            style = STYLES[css]
            codes = [MplPath.MOVETO, MplPath.CURVE4, MplPath.CURVE4, MplPath.CURVE4]
            axes.add_patch(
                PathPatch(
                    MplPath([start, control1, control2, end], codes),
                    facecolor="none",
                    edgecolor=style.stroke,
                    zorder=order,
                    **_line_args(style, scale),
                )
            )
