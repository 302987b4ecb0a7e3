"""`crater probe`, `crater diagnose`, `crater topology-export`: what the probe sees, for
this machine or for a node of a simulated fleet."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from crater.contracts import NodeCondition, NodeMetricsReported, NodeTopology
from crater.probe.adapters.host import HostSampler
from crater.probe.adapters.nvml import GpuSampler
from crater.probe.adapters.sysfs import discover_local
from crater.probe.domain.dot import topology_to_dot
from crater.probe.domain.health import evaluate
from crater.probe.fleet import load_fleet

console = Console(highlight=False)

FleetOption = Annotated[
    Path | None,
    typer.Option(help="A fleet YAML for simulated nodes; default: the demo fleet."),
]
LOCAL = "local"


def _find(name: str, fleet: Path | None) -> tuple[NodeTopology, NodeMetricsReported | None]:
    """This machine (`local` or its node id), else a node of the simulated fleet."""
    local = discover_local()
    if name in (LOCAL, local.node_id):
        return local, _sample_local(local)
    for node in load_fleet(fleet):
        if node.node_id == name:
            return node, None
    raise typer.BadParameter(f"no node {name!r} here ({local.node_id}) or in the fleet")


def _sample_local(node: NodeTopology) -> NodeMetricsReported:
    cpu, used, total = HostSampler().sample()
    gpus = GpuSampler()
    if node.gpus:
        gpus.open()
    try:
        return NodeMetricsReported(
            node_id=node.node_id,
            cpu_utilization_percent=cpu,
            memory_used_mb=used,
            memory_total_mb=total,
            gpus=gpus.sample(),
        )
    finally:
        gpus.close()


def probe(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Discover this machine: CPUs, NUMA nodes, memory, disks, GPUs (NVML)."""
    node = discover_local()
    if as_json:
        console.print_json(node.model_dump_json())
        return
    cpu = node.cpu
    console.print(f"[bold]{node.node_id}[/bold]  fingerprint {node.fingerprint[:16]}")
    console.print(
        f"CPU  {cpu.model}: {cpu.sockets} socket(s), {cpu.cores} cores, {cpu.threads} threads; "
        f"flags {', '.join(cpu.flags) or '-'}"
    )
    for numa in node.numa_nodes:
        console.print(f"NUMA {numa.id}: {len(numa.cpus)} CPUs, {numa.memory_mb} MiB")
    console.print(f"memory {node.memory_mb} MiB")
    if not node.gpus:
        console.print("GPUs none: no NVIDIA GPU found on this machine")
    for gpu in node.gpus:
        console.print(
            f"GPU {gpu.index}: {gpu.model} {gpu.memory_mb} MiB, NUMA {gpu.numa_node}, "
            f"NVLink peers {gpu.nvlink_peers or '-'}"
        )
    for disk in node.disks:
        kind = "NVMe" if disk.nvme else "HDD" if disk.rotational else "SSD"
        console.print(
            f"disk {disk.name}: {kind} {disk.capacity_gb} GB {disk.model or ''} "
            f"NUMA {disk.numa_node} at {disk.mount_path or '-'}"
        )


def diagnose(
    node: Annotated[str, typer.Option("--node", help=f"A node id, or {LOCAL!r}.")] = LOCAL,
    fleet: FleetOption = None,
) -> None:
    """Every health check of a node, passed or failed, with the reason."""
    topology, metrics = _find(node, fleet)
    assessment = evaluate(topology, metrics)
    table = Table("check", "result", "detail")
    for result in assessment.results:
        verdict = "[green]pass[/green]" if result.passed else f"[red]{result.severity}[/red]"
        table.add_row(result.name, verdict, result.detail)
    console.print(table)
    console.print(
        f"{topology.node_id}: {assessment.condition.value}, health score {assessment.score}/100"
    )
    if assessment.condition is NodeCondition.NOT_READY:
        raise typer.Exit(1)


def topology_export(
    export_format: Annotated[str, typer.Option("--format", help="Only 'dot'.")] = "dot",
    node: Annotated[str, typer.Option("--node", help=f"A node id, or {LOCAL!r}.")] = LOCAL,
    fleet: FleetOption = None,
    output: Annotated[Path | None, typer.Option(help="Write DOT here, not stdout.")] = None,
    png: Annotated[Path | None, typer.Option(help="Also render a PNG (needs Graphviz).")] = None,
) -> None:
    """A node's GPU-NVLink-PCIe-CPU-memory-disk graph as Graphviz DOT."""
    if export_format != "dot":
        raise typer.BadParameter("only --format dot is supported")
    topology, _ = _find(node, fleet)
    dot = topology_to_dot(topology)
    if output is None:
        print(dot)
    else:
        output.write_text(dot)
    if png is not None:
        renderer = shutil.which("dot")
        if renderer is None:
            console.print("[red]Graphviz `dot` is not installed[/red]; apt-get install graphviz")
            raise typer.Exit(2)
        subprocess.run([renderer, "-Tpng", "-o", str(png)], input=dot.encode(), check=True)
        Console(stderr=True).print(f"wrote {png}")
