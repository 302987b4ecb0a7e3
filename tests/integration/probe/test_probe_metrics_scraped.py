"""The probe's per node and card series as Prometheus scrapes them: uvicorn serving the app,
a real nats-server, the values those of the reports the probe published on the bus."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from crater.contracts import NodeMetricsReported
from crater.probe.app import ProbeSettings, build
from crater.probe.service_layer.metrics import MIB
from crater.runtime.nats_server import NatsServer
from tests.integration.probe.test_probe_over_nats import small_fleet
from tests.support.events import EventTap
from tests.support.scrape import Samples, scrape, series, served, value


async def scrape_after_first_metrics_round(http: httpx.AsyncClient) -> Samples:
    # The bus sees the reports while the round is still publishing; the gauges take them
    # when the round ends, which is when its duration is observed.
    for _ in range(200):
        samples = await scrape(http)
        if value(samples, "crater_probe_round_seconds_count", kind="metrics"):
            return samples
        await asyncio.sleep(0.05)
    raise AssertionError("the probe's first metrics round never ended")


async def test_a_fleet_probe_exports_each_simulated_nodes_published_figures(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path
) -> None:
    # One metrics round (on start) within the test: the scrape shows exactly what went out.
    settings = ProbeSettings(
        nats_url=fresh_nats.url,
        mode="fleet",
        fleet_file=small_fleet(tmp_path),
        metrics_interval_seconds=3600,
        health_interval_seconds=3600,
    )
    _, app = build(settings)
    async with served(app) as http:
        published = {r.node_id: r for r in await tap.wait_for(NodeMetricsReported, count=3)}
        samples = await scrape_after_first_metrics_round(http)
    assert set(published) == {"a100-01", "t4-01", "t4-02"}
    nodes = {dict(labels)["node"] for labels in series(samples, "crater_node_memory_total_bytes")}
    assert nodes == set(published)
    for node, report in published.items():
        assert value(samples, "crater_node_cpu_utilization_percent", node=node) == (
            report.cpu_utilization_percent
        )
        assert value(samples, "crater_node_memory_used_bytes", node=node) == (
            report.memory_used_mb * MIB
        )
        for numa, gbps in report.numa_memory_bandwidth_gbps.items():
            assert (
                value(
                    samples,
                    "crater_node_numa_memory_bandwidth_bytes_per_second",
                    node=node,
                    numa=str(numa),
                )
                == gbps * 1e9
            )
        for disk in report.disks:
            assert value(
                samples, "crater_data_transfer_wait_time_ms", node=node, disk=disk.name
            ) == (disk.wait_ms)
            assert value(samples, "crater_node_disk_io_in_flight", node=node, disk=disk.name) == (
                disk.in_flight
            )
        for gpu in report.gpus:
            card = {"node": node, "gpu": str(gpu.index)}
            assert (
                value(samples, "crater_gpu_utilization_percent", **card) == gpu.utilization_percent
            )
            assert (
                value(samples, "crater_gpu_memory_total_bytes", **card) == gpu.memory_total_mb * MIB
            )
            assert value(samples, "crater_gpu_memory_usage_rate", **card) == gpu.memory_pressure
            assert value(samples, "crater_gpu_temperature_celsius", **card) == gpu.temperature_c
            assert value(samples, "crater_gpu_ecc_errors_total", **card, kind="uncorrected") == (
                gpu.ecc_errors_uncorrected
            )
    assert len(series(samples, "crater_gpu_utilization_percent")) == 8 + 1 + 1  # DGX + 2 T4
    assert value(samples, "crater_probe_nodes_not_exported") == 0
