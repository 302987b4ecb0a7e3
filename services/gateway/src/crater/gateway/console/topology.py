"""A node's topology as an SVG drawing, made here in Python: one column per NUMA node with
its CPUs, memory, GPUs and disks, the inter-socket link, and the GPUs' NVLink links (pairs
as arcs, an all-to-all fabric as one NVSwitch bar). `crater topology-export` writes the same
graph as Graphviz DOT; rendering DOT needs the Graphviz binary, which a gateway image need not
carry, so the console draws its own. Colours come from the console's stylesheet (classes)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from html import escape

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


def _text(x: float, y: float, text: str, css: str = "t-label", anchor: str = "start") -> str:
    return (
        f'<text x="{x:.0f}" y="{y:.0f}" class="{css}" text-anchor="{anchor}">{escape(text)}</text>'
    )


def _box(x: float, y: float, w: float, h: float, css: str) -> str:
    return f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h:.0f}" rx="6" class="{css}"/>'


def short_model(model: str) -> str:
    return model.removeprefix("NVIDIA ").removeprefix("Tesla ")


def _gpu(x: float, y: float, gpu: Gpu, used: GpuMetrics | None) -> list[str]:
    w = COLUMN - 20
    parts = [
        _box(x, y, w, BOX, "t-gpu"),
        _text(x + 8, y + 15, f"GPU {gpu.index} · {short_model(gpu.model)}"),
    ]
    detail = gib(gpu.memory_mb)
    if gpu.mig_enabled:
        detail += " · MIG on"
    if used is not None:
        share = used.memory_used_mb / used.memory_total_mb if used.memory_total_mb else 0.0
        detail += f" · {used.utilization_percent:.0f} % busy · {share:.0%} memory"
        parts.append(
            f'<rect x="{x + 1:.0f}" y="{y + BOX - 5:.0f}" width="{(w - 2) * min(share, 1):.0f}" '
            'height="4" class="t-used"/>'
        )
    parts.append(_text(x + 8, y + 29, detail, "t-small"))
    return parts


def _disk(x: float, y: float, disk: Disk) -> list[str]:
    kind = "NVMe" if disk.nvme else "HDD" if disk.rotational else "SSD"
    gb = disk.capacity_gb
    size = f"{gb / 1000:.1f} TB" if gb >= 1000 else f"{gb} GB"
    return [
        _box(x, y, COLUMN - 20, BOX - 6, "t-disk"),
        _text(x + 8, y + 19, f"{disk.name} · {kind} {size} · {disk.mount_path or 'not mounted'}"),
    ]


def topology_svg(node: NodeTopology, metrics: NodeMetricsReported | None = None) -> Markup:
    """The drawing, ready to put in a page (every text escaped)."""
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
    width = max(width, MARGIN * 2 + 8 * len(title))  # the title's room
    body: list[str] = [_text(MARGIN, 24, title, "t-title")]
    anchors: dict[int, tuple[float, float, int]] = {}  # GPU: (left x, middle y, column)
    cpu_boxes: list[tuple[float, float]] = []
    for i, col in enumerate(cols):
        x = MARGIN + i * (COLUMN + GAP)
        frame_h = height - TOP + 6 - 14
        body.append(_box(x - 6, TOP - 22, COLUMN + 2 - 10 + 12, frame_h, "t-numa"))
        body.append(_text(x, TOP - 6, col.title, "t-head"))
        body.append(_box(x, TOP, COLUMN - 20, BOX, "t-cpu"))
        body.append(_text(x + 8, TOP + 22, f"CPU · {col.cpu}"[:44]))
        cpu_boxes.append((x, TOP + BOX / 2))
        y = TOP + ROW
        if col.memory:
            body.append(_box(x, y, COLUMN - 20, BOX - 6, "t-mem"))
            body.append(_text(x + 8, y + 19, f"Memory · {col.memory}"))
        y += ROW
        for gpu in col.gpus:
            body += _gpu(x, y, gpu, used.get(gpu.index))
            anchors[gpu.index] = (x, y + BOX / 2, i)
            y += ROW
        for disk in col.disks:
            body += _disk(x, y, disk)
            y += ROW
    for (ax, ay), (bx, by) in itertools.pairwise(cpu_boxes):
        body.append(
            f'<line x1="{ax + COLUMN - 20:.0f}" y1="{ay:.0f}" x2="{bx:.0f}" y2="{by:.0f}" '
            'class="t-socket"/>'
        )
        body.append(_text((ax + COLUMN - 20 + bx) / 2, ay - 6, "inter-socket", "t-small", "middle"))
    body += _nvlinks(anchors, pairs, fabric)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="topology" role="img" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}">'
        f"<title>{escape(node.node_id)} topology</title>{''.join(body)}</svg>"
    )
    return Markup(svg)  # every text above went through escape()


def _nvlinks(
    anchors: dict[int, tuple[float, float, int]],
    pairs: list[tuple[int, int]],
    fabric: bool,
) -> list[str]:
    right = COLUMN - 20
    if fabric:
        # between the first two columns (or right of the only one): each GPU's nearest side
        bar = MARGIN + COLUMN - 20 + (GAP + 20) / 2 - 6
        ys = [y for _, y, _ in anchors.values()]
        parts = [
            f'<rect x="{bar:.0f}" y="{min(ys) - 14:.0f}" width="12" '
            f'height="{max(ys) - min(ys) + 28:.0f}" rx="4" class="t-switch"/>',
            _text(bar + 6, min(ys) - 20, "NVSwitch", "t-small", "middle"),
        ]
        for x, y, column in anchors.values():
            start, end = (x + right, bar) if column == 0 else (x, bar + 12)
            parts.append(
                f'<line x1="{start:.0f}" y1="{y:.0f}" x2="{end:.0f}" y2="{y:.0f}" '
                'class="t-nvlink"/>'
            )
        return parts
    parts = []
    for k, (a, b) in enumerate(pairs):
        if a not in anchors or b not in anchors:
            continue
        (ax, ay, ac), (bx, by, bc) = anchors[a], anchors[b]
        if ac == bc:
            bulge = ax + right + 14 + 8 * (k % 6)
            path = (
                f"M{ax + right:.0f},{ay:.0f} C{bulge:.0f},{ay:.0f} {bulge:.0f},{by:.0f} "
                f"{bx + right:.0f},{by:.0f}"
            )
        else:
            (ax, ay), (bx, by) = sorted([(ax, ay), (bx, by)])
            path = (
                f"M{ax + right:.0f},{ay:.0f} C{bx - 30:.0f},{ay:.0f} "
                f"{ax + right + 30:.0f},{by:.0f} {bx:.0f},{by:.0f}"
            )
        parts.append(f'<path d="{path}" class="t-nvlink"/>')
    return parts
