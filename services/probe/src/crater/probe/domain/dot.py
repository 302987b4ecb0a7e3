"""A node's topology as a Graphviz graph (`crater topology-export --format dot`).

One cluster per NUMA node holding its CPUs, memory and the GPUs and disks attached to it;
PCIe edges from each device to its NUMA node, NVLink edges between GPUs, and dashed
inter-socket links (GPUs that all reach each other meet at one NVLink fabric vertex), so the
GPU-CPU-memory-SSD path of a placement can be read off the picture.
"""

from __future__ import annotations

from collections.abc import Sequence

from crater.contracts import Disk, Gpu, NodeSummary, NodeTopology
from crater.probe.domain.cpulist import format_cpulist
from crater.probe.domain.topology import gpu_model_label

NVLINK_COLOR = "#76b900"
UNKNOWN_NUMA = "host"
NVSWITCH = "nvswitch"
GPU_FILL = "#d5f5d5"
CPU_FILL = "#dbe9f6"
MEMORY_FILL = "#fdf0d5"
DISK_FILL = "#eeeeee"


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _attrs(attrs: dict[str, str | int]) -> str:
    return ", ".join(f"{k}={_quote(str(v))}" for k, v in attrs.items())


def _vertex(vertex_id: str, indent: str = "  ", **attrs: str | int) -> str:
    return f"{indent}{_quote(vertex_id)} [{_attrs(attrs)}];"


def _edge(a: str, b: str, **attrs: str | int) -> str:
    return f"  {_quote(a)} -- {_quote(b)} [{_attrs(attrs)}];"


def _gib(mb: int) -> str:
    return f"{mb / 1024:.0f} GiB"


def _gpu_id(gpu: Gpu) -> str:
    return f"gpu{gpu.index}"


def _disk_id(disk: Disk) -> str:
    return f"disk_{disk.name}"


def _gpu_vertex(gpu: Gpu, indent: str) -> str:
    lines = [f"GPU {gpu.index}", gpu_model_label(gpu.model) or gpu.model, _gib(gpu.memory_mb)]
    if gpu.pci_bus_id:
        lines.append(gpu.pci_bus_id)
    if gpu.pcie_generation_max and gpu.pcie_width_max:
        link = f"PCIe gen{gpu.pcie_generation_max} x{gpu.pcie_width_max}"
        if gpu.pcie_bandwidth_gbps:  # what placement checks a bandwidth ask against
            link += f", {gpu.pcie_bandwidth_gbps:.1f} GB/s measured"
        lines.append(link)
    if gpu.mig_capable:
        lines.append("MIG capable")
    return _vertex(_gpu_id(gpu), indent, label="\n".join(lines), fillcolor=GPU_FILL)


def _disk_vertex(disk: Disk, indent: str) -> str:
    kind = "NVMe" if disk.nvme else ("HDD" if disk.rotational else "SSD")
    lines = [disk.name, f"{kind} {disk.capacity_gb} GB"]
    if disk.model:
        lines.append(disk.model)
    if disk.mount_path:
        lines.append(disk.mount_path)
    return _vertex(
        _disk_id(disk), indent, label="\n".join(lines), shape="cylinder", fillcolor=DISK_FILL
    )


def disk_bus(disk: Disk) -> str:
    if disk.nvme:
        return "PCIe"
    if disk.name.startswith("sd"):
        return "SATA/SAS"
    if disk.name.startswith("vd"):
        return "virtio"
    return "I/O"


def nvlink_pairs(node: NodeTopology) -> list[tuple[int, int]]:
    """Each NVLink connection once, whichever side reported it, between GPUs that exist."""
    present = {g.index for g in node.gpus}
    pairs = {
        (min(g.index, peer), max(g.index, peer))
        for g in node.gpus
        for peer in g.nvlink_peers
        if peer in present and peer != g.index
    }
    return sorted(pairs)


def topology_to_dot(node: NodeTopology) -> str:
    numa_ids = [n.id for n in node.numa_nodes]
    single = numa_ids[0] if len(numa_ids) == 1 else None

    def home(numa: int | None) -> str:
        if numa is not None and numa in numa_ids:
            return f"numa{numa}"
        # On a one-NUMA machine "unknown" can only mean that node.
        return f"numa{single}" if single is not None else UNKNOWN_NUMA

    gpus_at: dict[str, list[Gpu]] = {}
    for gpu in node.gpus:
        gpus_at.setdefault(home(gpu.numa_node), []).append(gpu)
    disks_at: dict[str, list[Disk]] = {}
    for disk in node.disks:
        disks_at.setdefault(home(disk.numa_node), []).append(disk)

    cpu = node.cpu
    title = (
        f"{node.node_id} ({node.hostname}, pool {node.pool})\n"
        f"{cpu.model} x{cpu.sockets}: {cpu.cores} cores / {cpu.threads} threads, "
        f"{_gib(node.memory_mb)}"
    )
    lines = [
        f"graph {_quote(node.node_id)} {{",
        f"  graph [{_attrs({'label': title, 'labelloc': 't', 'fontname': 'Helvetica'})}];",
        f"  node [{_attrs({'shape': 'box', 'style': 'rounded,filled', 'fontname': 'Helvetica'})}];",
        f"  edge [{_attrs({'fontname': 'Helvetica', 'fontsize': 10})}];",
    ]

    socket_per_numa = cpu.sockets == len(node.numa_nodes)
    for numa in node.numa_nodes:
        nid = f"numa{numa.id}"
        socket = f"socket {numa.id}, " if socket_per_numa else ""
        cpus = format_cpulist(numa.cpus) or "no CPUs"
        lines.append(f"  subgraph {_quote('cluster_' + nid)} {{")
        lines.append(f"    graph [{_attrs({'label': f'NUMA node {numa.id}', 'style': 'dashed'})}];")
        lines.append(
            _vertex(
                nid,
                "    ",
                label=f"CPU ({socket}{len(numa.cpus)} threads)\n{cpus}",
                fillcolor=CPU_FILL,
            )
        )
        lines.append(
            _vertex(
                f"mem{numa.id}",
                "    ",
                label=f"Memory\n{_gib(numa.memory_mb)}",
                shape="cylinder",
                fillcolor=MEMORY_FILL,
            )
        )
        lines.extend(_gpu_vertex(g, "    ") for g in gpus_at.get(nid, []))
        lines.extend(_disk_vertex(d, "    ") for d in disks_at.get(nid, []))
        lines.append("  }")

    if UNKNOWN_NUMA in gpus_at or UNKNOWN_NUMA in disks_at:
        lines.append(_vertex(UNKNOWN_NUMA, label="PCIe root (NUMA unknown)"))
        lines.extend(_gpu_vertex(g, "  ") for g in gpus_at.get(UNKNOWN_NUMA, []))
        lines.extend(_disk_vertex(d, "  ") for d in disks_at.get(UNKNOWN_NUMA, []))
        lines.extend(_edge(UNKNOWN_NUMA, f"numa{n}", style="dotted") for n in numa_ids)

    lines.extend(_edge(f"numa{n}", f"mem{n}", label="DDR") for n in numa_ids)
    for i, a in enumerate(numa_ids):
        for b in numa_ids[i + 1 :]:
            lines.append(_edge(f"numa{a}", f"numa{b}", label="inter-socket", style="dashed"))
    for where, gpus in gpus_at.items():
        lines.extend(_edge(where, _gpu_id(g), label="PCIe") for g in gpus)
    for where, disks in disks_at.items():
        lines.extend(_edge(where, _disk_id(d), label=disk_bus(d)) for d in disks)
    pairs = nvlink_pairs(node)
    count = len(node.gpus)
    if count >= 3 and len(pairs) == count * (count - 1) // 2:
        # Every card reaches every other: an NVSwitch fabric. One hub reads better than
        # n(n-1)/2 crossing edges and is what the hardware is.
        lines.append(
            _vertex(
                NVSWITCH,
                label=f"NVLink fabric\n(all-to-all, {count} GPUs)",
                shape="hexagon",
                fillcolor=GPU_FILL,
            )
        )
        lines.extend(
            _edge(_gpu_id(g), NVSWITCH, label="NVLink", color=NVLINK_COLOR, penwidth=2)
            for g in node.gpus
        )
    else:
        lines.extend(
            _edge(f"gpu{a}", f"gpu{b}", label="NVLink", color=NVLINK_COLOR, penwidth=2)
            for a, b in pairs
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- the cluster's network fabric (`crater fabric-export`) ---------------------------------

UNPLACED = "no declared place"


def fabric_dot(nodes: Sequence[NodeSummary]) -> str:
    """The nodes the scheduler knows, nested by their place in the network fabric (spine,
    leaf, NVLink domain: `NodeTopology.fabric`) as Graphviz clusters, each node with its
    free and total GPUs; nodes that declare no place in a cluster of their own. A leaf is
    read within its spine (two leaves named alike under two spines are two leaves), so
    cluster ids carry the path from the spine down."""
    tree: dict[tuple[str, ...], list[NodeSummary]] = {}
    for node in sorted(nodes, key=lambda n: n.node_id):
        place = node.fabric
        path: tuple[str, ...] = (
            tuple(
                f"{level} {name}"
                for level, name in (
                    ("spine", place.spine),
                    ("leaf", place.leaf),
                    ("NVLink domain", place.nvlink_domain),
                )
                if name
            )
            if place is not None
            else ()
        )
        tree.setdefault(path or (UNPLACED,), []).append(node)
    title: dict[str, str | int] = {
        "label": "network fabric",
        "labelloc": "t",
        "fontname": "Helvetica",
    }
    lines = [
        "graph fabric {",
        f"  graph [{_attrs(title)}];",
        f"  node [{_attrs({'shape': 'box', 'style': 'rounded,filled', 'fontname': 'Helvetica'})}];",
    ]
    opened: tuple[str, ...] = ()
    for path in sorted(tree):
        shared = 0
        while shared < min(len(opened), len(path)) and opened[shared] == path[shared]:
            shared += 1
        lines.extend("  " * (depth + 1) + "}" for depth in reversed(range(shared, len(opened))))
        for depth in range(shared, len(path)):
            indent = "  " * (depth + 1)
            cluster = "cluster_" + "/".join(path[: depth + 1])
            lines.append(f"{indent}subgraph {_quote(cluster)} {{")
            lines.append(f"{indent}  graph [{_attrs({'label': path[depth], 'style': 'dashed'})}];")
        indent = "  " * (len(path) + 1)
        for node in tree[path]:
            label = f"{node.node_id}\n{node.gpus_free}/{node.gpus_total} GPUs free"
            if node.gpu_model:
                label += f"\n{node.gpu_model}"
            lines.append(_vertex(node.node_id, indent, label=label, fillcolor=GPU_FILL))
        opened = path
    lines.extend("  " * (depth + 1) + "}" for depth in reversed(range(len(opened))))
    lines.append("}")
    return "\n".join(lines) + "\n"
