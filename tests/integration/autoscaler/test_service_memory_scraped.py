"""The per-service GPU memory metric as an HPA's or KEDA's Prometheus scrapes it from a real
autoscaler: uvicorn serving it, a real nats-server, a replica's grant, latency samples and
its node's metrics consumed from JetStream."""

from __future__ import annotations

import asyncio

from crater.autoscaler.app import AutoscalerSettings, build
from crater.contracts import GpuMetrics, LatencySamplesReported, NodeMetricsReported
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.probe.test_probe_over_nats import grant
from tests.support.scrape import scrape, served, value


def node_report(used_mb: int) -> NodeMetricsReported:
    return NodeMetricsReported(
        node_id="t4-01",
        cpu_utilization_percent=5,
        memory_used_mb=1,
        memory_total_mb=2,
        gpus=[
            GpuMetrics(
                index=0, utilization_percent=80, memory_used_mb=used_mb, memory_total_mb=16000
            )
        ],
    )


async def test_the_service_mean_follows_its_replicas_cards(fresh_nats: NatsServer) -> None:
    service, app = build(AutoscalerSettings(nats_url=fresh_nats.url))
    async with served(app) as http:
        for _ in range(250):
            if service.leadership is not None and service.leadership.leading.is_set():
                break
            await asyncio.sleep(0.02)
        replica = grant("alloc-chat-0", "t4-01", [0]).model_copy(update={"task_id": "chat-0"})
        await publish(service.broker, replica)
        await publish(service.broker, node_report(12000))
        await publish(
            service.broker,
            LatencySamplesReported(
                service="chat", replica_id="chat-0", latencies_ms=[90.0] * 20, replicas=1
            ),
        )
        ratio = None
        for _ in range(200):
            ratio = value(
                await scrape(http), "crater_inference_gpu_memory_usage_ratio", service="chat"
            )
            if ratio == 0.75:
                break
            await asyncio.sleep(0.05)
        assert ratio == 0.75
        # The next node report moves it, with no latency sample in between.
        await publish(service.broker, node_report(4000))
        for _ in range(200):
            ratio = value(
                await scrape(http), "crater_inference_gpu_memory_usage_ratio", service="chat"
            )
            if ratio == 0.25:
                break
            await asyncio.sleep(0.05)
        assert ratio == 0.25
