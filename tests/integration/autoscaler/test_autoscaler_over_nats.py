"""The autoscaler as it runs: a real nats-server, a real durable JetStream consumer."""

from __future__ import annotations

import asyncio
import json

import pytest
from faststream import TestApp
from prometheus_client import generate_latest

from crater.autoscaler.app import AutoscalerSettings, build
from crater.contracts import (
    LatencySamplesReported,
    MessageRejected,
    ScaleDecided,
    ScaleDirection,
    Subjects,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.support.events import EventTap, publish_raw


def slow(service: str, replicas: int = 2) -> LatencySamplesReported:
    return LatencySamplesReported(
        service=service,
        replica_id="r-0",
        latencies_ms=[180.0] * 10 + [450.0] * 10,
        gpu_memory_pressure=0.93,
        replicas=replicas,
    )


@pytest.mark.parametrize(
    ("strategy", "desired"),
    # rule: ceil(2 x 450 / 200), capped at x2; demand: 2 x 0.93 / 0.8, with the queue.
    [("rule", 4), ("demand", 3)],
)
async def test_samples_over_the_line_yield_a_scale_out_decision(
    fresh_nats: NatsServer, tap: EventTap, strategy: str, desired: int
) -> None:
    service, app = build(AutoscalerSettings(nats_url=fresh_nats.url, strategy=strategy))
    async with TestApp(app):
        event = slow("chat")
        await publish(service.broker, event)
        [decision] = await tap.wait_for(ScaleDecided)
        assert decision.service == "chat"
        assert decision.direction is ScaleDirection.OUT
        assert (decision.current_replicas, decision.desired_replicas) == (2, desired)
        assert decision.p95_latency_ms == 450.0
        assert decision.gpu_memory_pressure == 0.93
        assert decision.samples == 20
        # The decision continues the sample's trace.
        assert decision.trace is not None

        # The tap can see the decision before JetStream's ack reaches the handler.
        counted = 'crater_scale_decisions_total{direction="out",service="chat"} 1.0'
        for _ in range(100):
            metrics = generate_latest(service.registry).decode()
            if counted in metrics:
                break
            await asyncio.sleep(0.02)
        assert counted in metrics
        assert 'crater_inference_latency_p95{service="chat"} 0.45' in metrics
        assert 'crater_gpu_memory_pressure{service="chat"} 0.93' in metrics


async def test_malformed_samples_are_rejected_and_consuming_goes_on(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    service, app = build(AutoscalerSettings(nats_url=fresh_nats.url))
    async with TestApp(app):
        subject = Subjects.INFERENCE_LATENCY.subject
        await publish_raw(fresh_nats.url, subject, b"{not json")
        bad = {"service": "chat", "latencies_ms": [], "gpu_memory_pressure": 1.5}
        await publish_raw(fresh_nats.url, subject, json.dumps(bad).encode())
        await publish(service.broker, slow("after-bad-input"))

        rejected = await tap.wait_for(MessageRejected, count=2)
        assert all(r.consumer == "autoscaler" for r in rejected)
        by_body = {r.payload_excerpt: {e.field for e in r.errors} for r in rejected}
        assert by_body["{not json"] == {"body"}
        assert by_body[json.dumps(bad)] == {"latencies_ms", "gpu_memory_pressure"}
        [decision] = await tap.wait_for(ScaleDecided)
        assert decision.service == "after-bad-input"
