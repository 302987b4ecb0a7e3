"""The per node and card series the probe exports (`NodeSeries`), rendered from the node
metrics reports it publishes: names, labels, units and values, and their bound."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from crater.contracts import GpuMetrics, NodeMetricsReported
from crater.contracts.nodes import DiskMetrics
from crater.probe.service_layer.metrics import MIB, ProbeMetrics, sm_utilization_variance
from crater.probe.sim.fleet import open_fleet
from crater.probe.sim.simulation import FleetSimulator


def report(
    node: str = "a100-01", utilizations: tuple[float, ...] = (90.0, 10.0)
) -> NodeMetricsReported:
    return NodeMetricsReported(
        node_id=node,
        cpu_utilization_percent=42.0,
        memory_used_mb=1024,
        memory_total_mb=4096,
        gpus=[
            GpuMetrics(
                index=i,
                utilization_percent=u,
                memory_used_mb=20480,
                memory_total_mb=81920,
                temperature_c=61.5,
                power_w=250.0,
                sm_clock_mhz=1410,
                ecc_errors_corrected=3,
                ecc_errors_uncorrected=0,
            )
            for i, u in enumerate(utilizations)
        ],
        numa_cpu_utilization_percent={0: 40.0, 1: 44.0},
        numa_memory_bandwidth_gbps={0: 12.5},
        disks=[
            DiskMetrics(
                name="nvme0n1",
                read_mb_s=100.0,
                write_mb_s=10.0,
                read_iops=800.0,
                write_iops=80.0,
                in_flight=4,
                wait_ms=0.25,
            )
        ],
    )


def registry_with(*reports: NodeMetricsReported, max_nodes: int = 100) -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry, max_nodes)
    for r in reports:
        metrics.series.add(r)
    metrics.series.end_round()
    return registry


def test_every_card_and_node_figure_is_a_series_in_base_units() -> None:
    registry = registry_with(report())
    value = registry.get_sample_value
    card = {"node": "a100-01", "gpu": "0"}
    assert value("crater_gpu_utilization_percent", card) == 90.0
    assert value("crater_gpu_memory_used_bytes", card) == 20480 * MIB
    assert value("crater_gpu_memory_total_bytes", card) == 81920 * MIB
    assert value("crater_gpu_memory_usage_rate", card) == 0.25  # of the physical card
    assert value("crater_gpu_temperature_celsius", card) == 61.5
    assert value("crater_gpu_power_watts", card) == 250.0
    assert value("crater_gpu_sm_clock_hertz", card) == 1.41e9
    assert value("crater_gpu_ecc_errors_total", {**card, "kind": "corrected"}) == 3
    assert value("crater_gpu_ecc_errors_total", {**card, "kind": "uncorrected"}) == 0
    node = {"node": "a100-01"}
    # utilisations 0.9 and 0.1: mean 0.5, variance 0.16
    assert value("crater_gpu_sm_utilization_variance", node) == pytest.approx(0.16)
    assert value("crater_node_cpu_utilization_percent", node) == 42.0
    assert value("crater_node_numa_cpu_utilization_percent", {**node, "numa": "1"}) == 44.0
    assert value("crater_node_memory_used_bytes", node) == 1024 * MIB
    assert value("crater_node_memory_total_bytes", node) == 4096 * MIB
    bandwidth = "crater_node_numa_memory_bandwidth_bytes_per_second"
    assert value(bandwidth, {**node, "numa": "0"}) == 12.5e9
    assert value(bandwidth, {**node, "numa": "1"}) is None  # not measured: no series
    disk = {**node, "disk": "nvme0n1"}
    assert value("crater_node_disk_read_bytes_per_second", disk) == 100 * MIB
    assert value("crater_node_disk_write_bytes_per_second", disk) == 10 * MIB
    assert value("crater_node_disk_reads_per_second", disk) == 800.0
    assert value("crater_node_disk_writes_per_second", disk) == 80.0
    assert value("crater_node_disk_io_in_flight", disk) == 4
    assert value("crater_data_transfer_wait_time_ms", disk) == 0.25


def test_figures_a_node_does_not_report_have_no_series() -> None:
    bare = NodeMetricsReported(
        node_id="cpu-01",
        cpu_utilization_percent=5.0,
        memory_used_mb=1,
        memory_total_mb=2,
        gpus=[GpuMetrics(index=0, utilization_percent=0, memory_used_mb=0, memory_total_mb=0)],
    )
    registry = registry_with(bare)
    card = {"node": "cpu-01", "gpu": "0"}
    assert registry.get_sample_value("crater_gpu_memory_usage_rate", card) == 0.0
    for name in ("crater_gpu_temperature_celsius", "crater_gpu_power_watts"):
        assert registry.get_sample_value(name, card) is None
    assert (
        registry.get_sample_value("crater_gpu_ecc_errors_total", {**card, "kind": "corrected"})
        is None
    )
    assert sm_utilization_variance(bare.model_copy(update={"gpus": []})) is None


def test_a_node_that_stops_reporting_leaves_with_the_next_round() -> None:
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    metrics.series.add(report("a100-01"))
    metrics.series.add(report("a100-02"))
    metrics.series.end_round()
    metrics.series.add(report("a100-01"))
    metrics.series.end_round()
    node = "crater_node_cpu_utilization_percent"
    assert registry.get_sample_value(node, {"node": "a100-01"}) == 42.0
    assert registry.get_sample_value(node, {"node": "a100-02"}) is None
    # A round that failed part way updates what it reached and drops nothing.
    metrics.series.add(report("a100-02"))
    metrics.series.end_round(complete=False)
    assert registry.get_sample_value(node, {"node": "a100-01"}) == 42.0
    assert registry.get_sample_value(node, {"node": "a100-02"}) == 42.0


def test_at_most_max_nodes_are_exported_and_the_rest_counted() -> None:
    registry = registry_with(*(report(f"n-{i:02d}") for i in range(5)), max_nodes=3)
    node = "crater_node_cpu_utilization_percent"
    exported = [i for i in range(5) if registry.get_sample_value(node, {"node": f"n-{i:02d}"})]
    assert exported == [0, 1, 2]  # the first by node id
    assert registry.get_sample_value("crater_probe_nodes_not_exported") == 2
    text = generate_latest(registry).decode()
    assert text.count("crater_gpu_utilization_percent{") == 3 * 2  # two cards a node


def test_a_simulated_fleet_reports_every_figure_of_every_node() -> None:
    """The same series per simulated node as a local probe exports for its own."""
    fleet = open_fleet(None, seed=42)
    simulator = FleetSimulator(fleet.nodes, fleet.seed)
    reports = simulator.step()
    registry = registry_with(*reports, max_nodes=1000)
    for r in reports:
        node = {"node": r.node_id}
        assert registry.get_sample_value("crater_node_cpu_utilization_percent", node) is not None
        for numa in r.numa_cpu_utilization_percent:
            bandwidth = registry.get_sample_value(
                "crater_node_numa_memory_bandwidth_bytes_per_second", {**node, "numa": str(numa)}
            )
            assert bandwidth is not None
            assert bandwidth >= 0
        for d in r.disks:
            wait = registry.get_sample_value(
                "crater_data_transfer_wait_time_ms", {**node, "disk": d.name}
            )
            assert wait is not None
            assert wait > 0
        for g in r.gpus:
            card = {**node, "gpu": str(g.index)}
            clock = registry.get_sample_value("crater_gpu_sm_clock_hertz", card)
            assert clock is not None
            assert clock >= 210e6
            assert registry.get_sample_value("crater_gpu_power_watts", card) is not None
        if r.gpus:
            assert registry.get_sample_value("crater_gpu_sm_utilization_variance", node) is not None
