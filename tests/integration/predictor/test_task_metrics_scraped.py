"""Each held allocation's requested-against-used series as Prometheus scrapes them from a
real predictor (uvicorn, nats-server, SQLite and PostgreSQL): after a grant, its running
report, the task's own usage sample and a node reading; gone after the release."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from crater.contracts import (
    GpuMetrics,
    GpuUsage,
    NodeMetricsReported,
    TaskStatus,
    TaskStatusReported,
    TaskUsageReported,
    utc_now,
)
from crater.predictor.app import PredictorSettings, build
from crater.predictor.service_layer.usage import MIB
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.predictor.test_usage import grant, release
from tests.support.scrape import Samples, scrape, served, value

LABELS = {"task_id": "task-1", "allocation_id": "alloc-1", "tenant": "vision", "pool": "pool-a"}


async def scraped_until(http, wanted, timeout: float = 30.0) -> Samples:  # type: ignore[no-untyped-def]
    """Scrape until `wanted(samples)` holds (the gauges refresh every second)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        samples = await scrape(http)
        if wanted(samples):
            return samples
        assert asyncio.get_running_loop().time() < deadline, "the series never showed: " + str(
            {k: v for k, v in samples.items() if k[0].startswith("crater_task")}
        )
        await asyncio.sleep(0.2)


async def test_requested_against_used_per_task_after_real_events(
    fresh_nats: NatsServer, database_url: str
) -> None:
    settings = PredictorSettings(
        nats_url=fresh_nats.url, database_url=database_url, usage_refresh_seconds=1
    )
    service, app = build(settings)
    start = utc_now() - timedelta(seconds=90)
    granted = grant(1, "vision", "pool-a", gpus=2, milli=1000, at=start)
    async with served(app) as http:
        await publish(service.broker, granted)
        # Recorded before what follows it (the consumers run concurrently; in life a task's
        # reports come well after its grant).
        await scraped_until(
            http, lambda s: value(s, "crater_task_gpus_requested", **LABELS) is not None
        )
        await publish(
            service.broker,
            TaskStatusReported(
                occurred_at=start + timedelta(seconds=30),
                task_id="task-1",
                allocation_id="alloc-1",
                status=TaskStatus.RUNNING,
            ),
        )
        await publish(
            service.broker,
            TaskUsageReported(
                occurred_at=start + timedelta(seconds=60),
                task_id="task-1",
                allocation_id="alloc-1",
                interval_seconds=30,
                gpus=[
                    GpuUsage(
                        gpu_id=0,
                        utilization_percent=50,
                        memory_used_mb=20480,
                        memory_total_mb=81920,
                    ),
                    GpuUsage(
                        gpu_id=1,
                        utilization_percent=70,
                        memory_used_mb=30720,
                        memory_total_mb=81920,
                    ),
                ],
                host_memory_used_mb=4096,
                cpu_utilization_percent=75.0,
            ),
        )
        samples = await scraped_until(
            http,
            lambda s: (
                value(s, "crater_task_memory_used_bytes", **LABELS) is not None
                and value(s, "crater_task_run_seconds", **LABELS) is not None
            ),
        )
        assert value(samples, "crater_task_gpus_requested", **LABELS) == 2
        assert value(samples, "crater_task_gpu_utilization_percent", **LABELS) == 60
        assert value(samples, "crater_task_gpu_memory_requested_bytes", **LABELS) == 40960 * MIB
        # its fullest card: 30 GiB in use of the 40 GiB it reserved, of an 80 GiB card
        assert value(samples, "crater_task_gpu_memory_used_bytes", **LABELS) == 30720 * MIB
        assert value(samples, "crater_task_gpu_memory_request_usage_ratio", **LABELS) == 0.75
        assert value(samples, "crater_task_gpu_memory_card_usage_ratio", **LABELS) == 0.375
        assert value(samples, "crater_task_cpu_cores_requested", **LABELS) == 4
        assert value(samples, "crater_task_cpu_cores_used", **LABELS) == 3
        assert value(samples, "crater_task_memory_requested_bytes", **LABELS) == 16384 * MIB
        assert value(samples, "crater_task_memory_used_bytes", **LABELS) == 4096 * MIB
        run = value(samples, "crater_task_run_seconds", **LABELS)
        assert run is not None
        assert 55 <= run <= 90  # running since start + 30 s

        # A task that sent nothing of its own, on cards it holds whole and alone: the node's
        # reading stands in for its GPU memory.
        second = grant(2, "nlp", "pool-a", gpus=1, milli=1000, at=start)
        other = {"task_id": "task-2", "allocation_id": "alloc-2", "tenant": "nlp", "pool": "pool-a"}
        await publish(service.broker, second)
        await scraped_until(  # recorded: readings on its cards are kept from now on
            http, lambda s: value(s, "crater_task_gpus_requested", **other) is not None
        )
        await publish(
            service.broker,
            NodeMetricsReported(
                node_id=second.node,
                cpu_utilization_percent=10,
                memory_used_mb=1,
                memory_total_mb=2,
                gpus=[
                    GpuMetrics(
                        index=0, utilization_percent=90, memory_used_mb=8192, memory_total_mb=81920
                    )
                ],
            ),
        )
        samples = await scraped_until(
            http, lambda s: value(s, "crater_task_gpu_memory_used_bytes", **other) is not None
        )
        assert value(samples, "crater_task_gpu_memory_request_usage_ratio", **other) == 0.2
        assert value(samples, "crater_task_gpu_utilization_percent", **other) is None  # unmeasured
        assert value(samples, "crater_task_run_seconds", **other) is None  # not running yet

        await publish(service.broker, release(granted, utc_now()))
        samples = await scraped_until(
            http, lambda s: value(s, "crater_task_gpus_requested", **LABELS) is None
        )
        assert value(samples, "crater_task_gpus_requested", **other) == 1
        assert value(samples, "crater_predictor_allocations_not_exported") == 0
