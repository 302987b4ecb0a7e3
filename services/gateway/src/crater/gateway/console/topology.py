"""A node's topology drawn in Python: one column per NUMA node with its CPUs, memory, GPUs and
disks, the inter-socket link, and the GPUs' NVLink links (pairs as arcs, an all-to-all fabric as
one NVSwitch bar). `layout` places the shapes; `topology_svg` writes them for the console and
`crater topology-export --png` paints the same shapes with matplotlib, so neither needs the
Graphviz binary (`topology-export` still writes Graphviz DOT for those who have it). Shapes are
named by style class; the console's stylesheet and the PNG palette give the colours."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from html import escape
from typing import Literal

from markupsafe import Markup

from crater.contracts import Disk, Gpu, GpuMetrics, NodeMetricsReported, NodeTopology
from crater.gateway.console.views import mib

COLUMN = 250  # width of a NUMA node's column
GAP = 80  # between columns: room for NVLink arcs
MARGIN = 20
TOP = 56  # below the title
ROW = 44  # a device box and the space under it
BOX = 36  # a device box's height
UNKNOWN = -1  # the column of devices whose NUMA node is not known
TITLE_CHAR = 8  # about one title character's width, to leave the title room
CORNER = {"t-switch": 4}  # corner radius where it is not 6

Anchor = Literal["start", "middle"]


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    css: str


@dataclass(frozen=True)
class Text:
    x: float
    y: float  # the baseline
    text: str
    css: str = "t-label"
    anchor: Anchor = "start"


@dataclass(frozen=True)
class Line:
    x1: float
    y1: float
    x2: float
    y2: float
    css: str


@dataclass(frozen=True)
class Curve:
    """A cubic Bézier from `start` to `end` pulled towards the two controls."""

    start: tuple[float, float]
    control1: tuple[float, float]
    control2: tuple[float, float]
    end: tuple[float, float]
    css: str = "t-nvlink"


Shape = Rect | Text | Line | Curve


@dataclass(frozen=True)
class Drawing:
    node_id: str
    width: float
    height: float
    shapes: list[Shape]


@dataclass
class Column:
    numa: int
    title: str
    cpu: str
    memory: str
    gpus: list[Gpu] = field(default_factory=list)
    disks: list[Disk] = field(default_factory=list)


def cpulist(cpus: list[int]) -> str:
    """0-15,32-47: runs of consecutive CPUs."""
    runs: list[str] = []
    ordered = sorted(cpus)
    start = previous = ordered[0] if ordered else 0
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == previous + 1:
            previous = cpu
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if cpu is not None:
            start = previous = cpu
    return ",".join(runs) if ordered else "none"


def gib(mb: int) -> str:
    return mib(mb)


def nvlink_pairs(node: NodeTopology) -> list[tuple[int, int]]:
    present = {g.index for g in node.gpus}
    return sorted(
        {
            (min(g.index, p), max(g.index, p))
            for g in node.gpus
            for p in g.nvlink_peers
            if p in present and p != g.index
        }
    )


def columns(node: NodeTopology) -> list[Column]:
    ids = [n.id for n in node.numa_nodes]
    single = ids[0] if len(ids) == 1 else None
    found = {
        n.id: Column(
            n.id, f"NUMA node {n.id}", f"{len(n.cpus)} CPUs: {cpulist(n.cpus)}", gib(n.memory_mb)
        )
        for n in node.numa_nodes
    }

    def home(numa: int | None) -> Column:
        key = numa if numa in found else single if single is not None else UNKNOWN
        if key not in found:
            found[UNKNOWN] = Column(UNKNOWN, "NUMA node unknown", "PCIe root", "")
        return found[key]

    for gpu in node.gpus:
        home(gpu.numa_node).gpus.append(gpu)
    for disk in node.disks:
        home(disk.numa_node).disks.append(disk)
    return [found[k] for k in sorted(found, key=lambda k: (k == UNKNOWN, k))]


def short_model(model: str) -> str:
    return model.removeprefix("NVIDIA ").removeprefix("Tesla ")


def _gpu(x: float, y: float, gpu: Gpu, used: GpuMetrics | None) -> list[Shape]:
    w = COLUMN - 20
    shapes: list[Shape] = [
        Rect(x, y, w, BOX, "t-gpu"),
        Text(x + 8, y + 15, f"GPU {gpu.index} · {short_model(gpu.model)}"),
    ]
    detail = gib(gpu.memory_mb)
    if gpu.mig_enabled:
        detail += " · MIG on"
    if used is not None:
        share = used.memory_used_mb / used.memory_total_mb if used.memory_total_mb else 0.0
        detail += f" · {used.utilization_percent:.0f} % busy · {share:.0%} memory"
        shapes.append(Rect(x + 1, y + BOX - 5, (w - 2) * min(share, 1), 4, "t-used"))
    shapes.append(Text(x + 8, y + 29, detail, "t-small"))
    return shapes


def _disk(x: float, y: float, disk: Disk) -> list[Shape]:
    kind = "NVMe" if disk.nvme else "HDD" if disk.rotational else "SSD"
    gb = disk.capacity_gb
    size = f"{gb / 1000:.1f} TB" if gb >= 1000 else f"{gb} GB"
    return [
        Rect(x, y, COLUMN - 20, BOX - 6, "t-disk"),
        Text(x + 8, y + 19, f"{disk.name} · {kind} {size} · {disk.mount_path or 'not mounted'}"),
    ]


def layout(node: NodeTopology, metrics: NodeMetricsReported | None = None) -> Drawing:
    """Every shape of the drawing, placed (y grows downwards, as in SVG)."""
    cols = columns(node)
    used = {g.index: g for g in (metrics.gpus if metrics else [])}
    pairs = nvlink_pairs(node)
    count = len(node.gpus)
    fabric = count >= 3 and len(pairs) == count * (count - 1) // 2
    rows = max((len(c.gpus) + len(c.disks) for c in cols), default=0)
    height = TOP + 2 * ROW + rows * ROW + 20
    cpu = node.cpu
    title = (
        f"{node.node_id} · pool {node.pool} · {cpu.model} x{cpu.sockets}: {cpu.cores} cores / "
        f"{cpu.threads} threads · {gib(node.memory_mb)}"
    )
    width = MARGIN * 2 + len(cols) * COLUMN + (len(cols) - 1) * GAP
    if fabric and len(cols) == 1:
        width += GAP  # the fabric right of the one column
    width = max(width, MARGIN * 2 + TITLE_CHAR * len(title))  # the title's room
    shapes: list[Shape] = [Text(MARGIN, 24, title, "t-title")]
    anchors: dict[int, tuple[float, float, int]] = {}  # GPU: (left x, middle y, column)
    cpu_boxes: list[tuple[float, float]] = []
    for i, col in enumerate(cols):
        x = MARGIN + i * (COLUMN + GAP)
        frame_h = height - TOP + 6 - 14
        shapes.append(Rect(x - 6, TOP - 22, COLUMN + 2 - 10 + 12, frame_h, "t-numa"))
        shapes.append(Text(x, TOP - 6, col.title, "t-head"))
        shapes.append(Rect(x, TOP, COLUMN - 20, BOX, "t-cpu"))
        shapes.append(Text(x + 8, TOP + 22, f"CPU · {col.cpu}"[:44]))
        cpu_boxes.append((x, TOP + BOX / 2))
        y = TOP + ROW
        if col.memory:
            shapes.append(Rect(x, y, COLUMN - 20, BOX - 6, "t-mem"))
            shapes.append(Text(x + 8, y + 19, f"Memory · {col.memory}"))
        y += ROW
        for gpu in col.gpus:
            shapes += _gpu(x, y, gpu, used.get(gpu.index))
            anchors[gpu.index] = (x, y + BOX / 2, i)
            y += ROW
        for disk in col.disks:
            shapes += _disk(x, y, disk)
            y += ROW
    for (ax, ay), (bx, by) in itertools.pairwise(cpu_boxes):
        shapes.append(Line(ax + COLUMN - 20, ay, bx, by, "t-socket"))
        shapes.append(
            Text((ax + COLUMN - 20 + bx) / 2, ay - 6, "inter-socket", "t-small", "middle")
        )
    shapes += _nvlinks(anchors, pairs, fabric)
    return Drawing(node.node_id, width, height, shapes)


def _nvlinks(
    anchors: dict[int, tuple[float, float, int]],
    pairs: list[tuple[int, int]],
    fabric: bool,
) -> list[Shape]:
    right = COLUMN - 20
    if fabric:
        # between the first two columns (or right of the only one): each GPU's nearest side
        bar = MARGIN + COLUMN - 20 + (GAP + 20) / 2 - 6
        ys = [y for _, y, _ in anchors.values()]
        shapes: list[Shape] = [
            Rect(bar, min(ys) - 14, 12, max(ys) - min(ys) + 28, "t-switch"),
            Text(bar + 6, min(ys) - 20, "NVSwitch", "t-small", "middle"),
        ]
        for x, y, column in anchors.values():
            start, end = (x + right, bar) if column == 0 else (x, bar + 12)
            shapes.append(Line(start, y, end, y, "t-nvlink"))
        return shapes
    shapes = []
    for k, (a, b) in enumerate(pairs):
        if a not in anchors or b not in anchors:
            continue
        (ax, ay, ac), (bx, by, bc) = anchors[a], anchors[b]
        if ac == bc:
            bulge = ax + right + 14 + 8 * (k % 6)
            shapes.append(Curve((ax + right, ay), (bulge, ay), (bulge, by), (bx + right, by)))
        else:
            (ax, ay), (bx, by) = sorted([(ax, ay), (bx, by)])
            shapes.append(Curve((ax + right, ay), (bx - 30, ay), (ax + right + 30, by), (bx, by)))
    return shapes


def _svg(shape: Shape) -> str:
    match shape:
        case Rect(x, y, w, h, css):
            rounded = "" if css == "t-used" else f'rx="{CORNER.get(css, 6)}" '
            return (
                f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h:.0f}" '
                f'{rounded}class="{css}"/>'
            )
        case Text(x, y, text, css, anchor):
            return (
                f'<text x="{x:.0f}" y="{y:.0f}" class="{css}" text-anchor="{anchor}">'
                f"{escape(text)}</text>"
            )
        case Line(x1, y1, x2, y2, css):
            return f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" class="{css}"/>'
        case Curve((sx, sy), (ax, ay), (bx, by), (ex, ey), css):
            path = f"M{sx:.0f},{sy:.0f} C{ax:.0f},{ay:.0f} {bx:.0f},{by:.0f} {ex:.0f},{ey:.0f}"
            return f'<path d="{path}" class="{css}"/>'
    raise TypeError(shape)


def topology_svg(node: NodeTopology, metrics: NodeMetricsReported | None = None) -> Markup:
    """The drawing, ready to put in a page (every text escaped)."""
    drawing = layout(node, metrics)
    w, h = drawing.width, drawing.height
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="topology" role="img" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" width="{w:.0f}" height="{h:.0f}">'
        f"<title>{escape(node.node_id)} topology</title>"
        f"{''.join(_svg(s) for s in drawing.shapes)}</svg>"
    )
    return Markup(svg)  # every text above went through escape()
