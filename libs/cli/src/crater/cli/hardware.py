"""`crater probe`, `crater diagnose`, `crater topology-export`: what the probe sees, for
this machine or for a node of a simulated fleet."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from crater.cli.errors import NO, USAGE, CliError
from crater.cli.jetstream import DEFAULT_NATS, NatsOption, on_jetstream
from crater.cli.output import cli_console, emit_json
from crater.cli.output import table as print_table
from crater.contracts import (
    HealthCheck,
    NodeCondition,
    NodeHealthReported,
    NodeMetricsReported,
    NodeTopology,
)
from crater.probe.api import (
    Bounds,
    GpuSampler,
    HostSampler,
    discover_local,
    disks_wear,
    evaluate,
    load_fleet,
    measure_node,
    topology_to_dot,
)

console = cli_console()

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
    try:
        nodes = load_fleet(fleet)
    except ValueError as error:  # FleetError: the file is not a fleet
        raise CliError(f"{error}", USAGE) from None
    for node in nodes:
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


def probe(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Also measure memory bandwidth per NUMA node (one thread, all cores) and disk "
            "random-read IOPS and latency (queue depth 1, at depth; a few seconds; a temp file "
            "on each mounted disk).",
        ),
    ] = False,
    seconds: Annotated[
        float, typer.Option(min=0.05, max=60, help="--full: seconds per disk (memory: 1/3).")
    ] = 1.5,
    file_mb: Annotated[
        int, typer.Option(min=1, max=4096, help="--full: temp file size per disk, MiB.")
    ] = 64,
) -> None:
    """Discover this machine: CPUs, NUMA nodes, memory, disks, GPUs (NVML)."""
    node = discover_local()
    if full:
        progress = cli_console(stderr=True) if as_json else console
        bounds = Bounds(memory_seconds=seconds / 3, disk_file_mb=file_mb, disk_seconds=seconds)
        measured = measure_node(
            node,
            bounds=bounds,
            progress=lambda line: progress.print(f"[dim]measuring[/dim] {line}"),
        )
        node = measured.apply(node)
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
        bandwidth = (
            f", {numa.memory_bandwidth_gbps} GB/s copy, one thread (measured)"
            if numa.memory_bandwidth_gbps is not None
            else ""
        )
        if numa.memory_bandwidth_gbps_all_cores is not None:
            bandwidth += f", {numa.memory_bandwidth_gbps_all_cores} GB/s all cores (measured)"
        console.print(f"NUMA {numa.id}: {len(numa.cpus)} CPUs, {numa.memory_mb} MiB{bandwidth}")
    console.print(f"memory {node.memory_mb} MiB")
    if not node.gpus:
        console.print("GPUs none: no NVIDIA GPU found on this machine")
    for gpu in node.gpus:
        link = (
            f"PCIe Gen{gpu.pcie_generation_max} x{gpu.pcie_width_max}"
            if gpu.pcie_generation_max and gpu.pcie_width_max
            else "PCIe ?"
        )
        mig = "" if gpu.mig_enabled is None else f", MIG {'on' if gpu.mig_enabled else 'off'}"
        console.print(
            f"GPU {gpu.index}: {gpu.model} {gpu.memory_mb} MiB, {_numa(gpu.numa_node)}, "
            f"{link} under {gpu.pci_root or '?'}, NVLink peers {gpu.nvlink_peers or '-'}{mig}"
        )
    for disk in node.disks:
        kind = "NVMe" if disk.nvme else "HDD" if disk.rotational else "SSD"
        model = f" {disk.model}" if disk.model else ""
        console.print(
            f"disk {disk.name}: {kind} {disk.capacity_gb} GB{model}, {_numa(disk.numa_node)}, "
            f"under {disk.pci_root or 'no PCIe root found'}, "
            + (f"at {disk.mount_path}" if disk.mount_path else "not mounted")
        )
        if disk.random_read_iops is not None:
            console.print(
                f"  measured: {disk.random_read_iops:,.0f} random 4 KiB reads/s (QD1), "
                f"latency p50 {disk.read_latency_us_p50} us, p99 {disk.read_latency_us_p99} us"
            )
        if disk.random_read_iops_at_depth is not None:
            bound = ", a lower bound" if disk.random_read_iops_at_depth_source == "measured" else ""
            console.print(
                f"  at depth: {disk.random_read_iops_at_depth:,.0f} random 4 KiB reads/s "
                f"({disk.random_read_iops_at_depth_source}{bound})"
            )
    shared = _shared_roots(node)
    if shared:
        console.print(f"PCIe root complexes: {shared}")


def _numa(node: int | None) -> str:
    """`NUMA 1`, or what the kernel says when it does not tie the device to one."""
    return "NUMA node unknown" if node is None else f"NUMA {node}"


def _shared_roots(node: NodeTopology) -> str:
    """`pci0000:17: GPU 0, 1, nvme0n1; ...` for root complexes holding a GPU or a disk."""
    roots: dict[str, list[str]] = {}
    for gpu in node.gpus:
        if gpu.pci_root:
            roots.setdefault(gpu.pci_root, []).append(f"GPU {gpu.index}")
    for disk in node.disks:
        if disk.pci_root:
            roots.setdefault(disk.pci_root, []).append(disk.name)
    return "; ".join(f"{root}: {', '.join(devices)}" for root, devices in sorted(roots.items()))


def diagnose(
    node: Annotated[str, typer.Option("--node", help=f"A node id, or {LOCAL!r}.")] = LOCAL,
    fleet: Annotated[
        Path | None,
        typer.Option(
            help="Evaluate this fleet YAML's node (simulated, static) instead of asking the "
            "running Crater."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    nats_url: NatsOption = DEFAULT_NATS,
) -> None:
    """Every health check of a node, passed or failed, with the reason: this machine's as
    measured now (`local`), another node's as its probe last reported it to the running
    Crater (over NATS), or, with --fleet, a fleet file's simulated node. Exit 1 when the node
    is NotReady."""
    local = discover_local()
    if node in (LOCAL, local.node_id) or fleet is not None:
        topology, metrics = (local, _sample_local(local)) if fleet is None else _find(node, fleet)
        wear = None if topology.simulated else disks_wear(topology.disks)
        assessment = evaluate(topology, metrics, disk_wear=wear)
        report = NodeHealthReported(
            node_id=topology.node_id,
            condition=assessment.condition,
            score=assessment.score,
            checks=[
                HealthCheck(name=r.name, passed=r.passed, detail=r.detail)
                for r in assessment.results
            ],
        )
        source = "measured now" if fleet is None else f"simulated from {fleet}"
    else:
        report = running_health(node, nats_url)
        age = (datetime.now(UTC) - report.occurred_at).total_seconds()
        source = f"as its probe reported {age:.0f} s ago"
    if as_json:
        emit_json(report.model_dump_json())
    else:
        table = Table("check", "result", "detail")
        for check in report.checks:
            verdict = "[green]pass[/green]" if check.passed else "[red]fail[/red]"
            table.add_row(check.name, verdict, check.detail)
        print_table(table)
        console.print(
            f"{report.node_id}: {report.condition.value}, health score {report.score}/100 "
            f"({source})"
        )
    if report.condition is NodeCondition.NOT_READY:
        raise typer.Exit(NO)


def running_health(node: str, nats_url: str) -> NodeHealthReported:
    """The latest health report of `node` in the running Crater's stream."""
    from nats.js.errors import NotFoundError

    from crater.contracts import Streams, Subjects

    async def latest(js: Any) -> NodeHealthReported | None:
        try:
            message = await js.get_last_msg(
                Streams.NODE_TELEMETRY.name, Subjects.NODE_HEALTH.for_node(node)
            )
        except NotFoundError:
            return None
        return NodeHealthReported.model_validate_json(message.data)

    report = on_jetstream(nats_url, latest)
    if report is None:
        raise CliError(
            f"no health report from node {node!r} in the last hour: is its probe running? "
            "`crater list-nodes` shows the nodes Crater knows; --node local diagnoses this "
            "machine, --fleet FILE a simulated node."
        )
    return report


def topology_export(
    export_format: Annotated[str, typer.Option("--format", help="Only 'dot'.")] = "dot",
    node: Annotated[str, typer.Option("--node", help=f"A node id, or {LOCAL!r}.")] = LOCAL,
    fleet: FleetOption = None,
    output: Annotated[Path | None, typer.Option(help="Write DOT here, not stdout.")] = None,
    png: Annotated[
        Path | None, typer.Option(help="Also draw the topology as a PNG (no Graphviz needed).")
    ] = None,
) -> None:
    """A node's GPU-NVLink-PCIe-CPU-memory-disk graph as Graphviz DOT (and, with --png, drawn)."""
    if export_format != "dot":
        raise typer.BadParameter("only --format dot is supported")
    topology, _ = _find(node, fleet)
    dot = topology_to_dot(topology)
    if output is None:
        print(dot)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(dot)
    if png is not None:
        from crater.cli.topology_png import draw_topology_png

        width, height = draw_topology_png(topology, png)
        cli_console(stderr=True, highlight=True).print(f"wrote {png} ({width}x{height} px)")
