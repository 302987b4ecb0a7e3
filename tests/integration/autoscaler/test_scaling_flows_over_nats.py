"""The autoscaler's other inputs and outputs over a real nats-server: GPU pressure from the
probe's metrics for the GPUs a replica holds, warm-pool and cold replica requests, and a
scale-in that drains before it asks for the release."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from faststream import TestApp

from crater.autoscaler.app import AutoscalerSettings, build
from crater.autoscaler.domain import Autoscaler
from crater.contracts import (
    AllocationGranted,
    GpuMetrics,
    LatencySamplesReported,
    NodeMetricsReported,
    ReplicaDrained,
    ReplicaReleaseRequested,
    ReplicasRequested,
    ScaleDecided,
    ScaleDirection,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.support.events import EventTap


def granted(task_id: str, node: str, gpus: list[int]) -> AllocationGranted:
    return AllocationGranted(
        allocation_id=f"alloc-{task_id}",
        task_id=task_id,
        node=node,
        pool="inference",
        tenant="default",
        gpu_ids=gpus,
        gpu_memory_mb=20_000,
        cpu_cores=[0, 1],
        numa_node=0,
        memory_mb=8_192,
        checkpoint_path=None,
        reservation_token="token",
        reservation_expires_at=datetime.now(UTC) + timedelta(seconds=30),
        score=1.0,
        explanation="test",
        environment={},
    )


async def until(condition: object, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not callable(condition) or not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_pressure_from_node_metrics_and_replica_requests(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    # The rule's count (2 -> 4), so that two go cold beside the standby asked for.
    settings = AutoscalerSettings(nats_url=fresh_nats.url, warm_pool_size=1, strategy="rule")
    service, app = build(settings)
    autoscaler: Autoscaler = service.state
    async with TestApp(app):
        await publish(service.broker, granted("chat-0", "gpu-node-1", [2, 3]))
        await publish(
            service.broker,
            NodeMetricsReported(
                node_id="gpu-node-1",
                cpu_utilization_percent=30,
                memory_used_mb=1_000,
                memory_total_mb=10_000,
                gpus=[
                    GpuMetrics(
                        index=i, utilization_percent=90, memory_used_mb=used, memory_total_mb=80_000
                    )
                    for i, used in [(0, 1_000), (2, 40_000), (3, 76_000)]
                ],
            ),
        )
        await until(lambda: autoscaler.gpu_pressure_of("chat-0") == 0.95)
        # The replica itself reports little pressure; its GPUs say otherwise.
        sample = LatencySamplesReported(
            service="chat",
            replica_id="chat-0",
            latencies_ms=[450.0] * 20,
            gpu_memory_pressure=0.2,
            replicas=2,
        )
        await publish(service.broker, sample)
        [decision] = await tap.wait_for(ScaleDecided)
        assert decision.direction is ScaleDirection.OUT
        assert decision.gpu_memory_pressure == 0.95
        assert decision.pressure_source == "node-metrics"
        assert (decision.current_replicas, decision.desired_replicas) == (2, 4)
        requests = await tap.wait_for(ReplicasRequested, count=2)
        cold = next(r for r in requests if not r.standby)
        standby = next(r for r in requests if r.standby)
        assert len(cold.task_ids) == 2
        assert cold.decision_id == decision.event_id
        assert cold.template_task_id == "chat-0"  # copies a placed replica's request
        assert len(standby.task_ids) == 1


async def test_scale_in_drains_then_asks_for_the_release(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    # The drain flow, not the sizing: no margin, so the calm samples' mean is a scale-in.
    settings = AutoscalerSettings(
        nats_url=fresh_nats.url, stabilisation_seconds=0, scale_in_margin=0.0
    )
    service, app = build(settings)
    async with TestApp(app):
        now = datetime.now(UTC)
        # Both replicas busy first (pressure 0.5), then both calm: the newest goes.
        steps = [(0.0, "embed-a", 0.5), (0.1, "embed-b", 0.5), (0.2, "embed-a", 0.1)]
        for offset, replica, pressure in [*steps, (0.3, "embed-b", 0.1)]:
            await publish(
                service.broker,
                LatencySamplesReported(
                    occurred_at=now + timedelta(seconds=offset),
                    service="embed",
                    replica_id=replica,
                    latencies_ms=[30.0] * 20,
                    gpu_memory_pressure=pressure,
                    replicas=2,
                ),
            )
        [decision] = await tap.wait_for(ScaleDecided)
        assert decision.direction is ScaleDirection.IN
        assert decision.drain_replicas == ["embed-b"]
        assert tap.of(ReplicaReleaseRequested) == []  # nothing released before the drain
        await publish(service.broker, ReplicaDrained(service="embed", replica_id="embed-b"))
        [release] = await tap.wait_for(ReplicaReleaseRequested)
        assert (release.replica_id, release.task_id, release.drained) == (
            "embed-b",
            "embed-b",
            True,
        )
        assert release.decision_id == decision.event_id


async def test_queueing_not_prefill_decides_over_nats(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    """Long prompts' TTFT with nothing queued: no decision; the same TTFT with its queueing
    reported: a scale-out whose reason and p95 are the queue's (the field through the bus)."""
    settings = AutoscalerSettings(nats_url=fresh_nats.url, strategy="rule")
    service, app = build(settings)
    async with TestApp(app):
        now = datetime.now(UTC)

        async def report(offset: float, service_name: str, queue: list[float]) -> None:
            await publish(
                service.broker,
                LatencySamplesReported(
                    occurred_at=now + timedelta(seconds=offset),
                    service=service_name,
                    replica_id=f"{service_name}-1",
                    latencies_ms=[900.0] * 20,
                    queue_ms=queue,
                    gpu_memory_pressure=0.9,
                    replicas=2,
                ),
            )

        await report(0.0, "code", [0.0] * 20)  # all prefill
        await report(0.0, "chat", [700.0] * 20)  # 700 ms of it queued
        [decision] = await tap.wait_for(ScaleDecided)
        assert decision.service == "chat"
        assert decision.direction is ScaleDirection.OUT
        assert decision.p95_latency_ms == 700.0
        assert "queueing p95 700.0 ms > 200 ms" in decision.reason
        await asyncio.sleep(0.5)
        assert [d.service for d in tap.of(ScaleDecided)] == ["chat"]


async def test_a_backlog_forming_scales_out_over_nats(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    """Four replicas admitting 40 requests/s, none of them queued yet: the fleet whose
    backlog grows by 20/s (requests_waiting, through the bus) is scaled out, its reason naming
    the backlog; the one that does not report it gets no decision."""
    service, app = build(AutoscalerSettings(nats_url=fresh_nats.url))  # demand, as shipped
    async with TestApp(app):
        now = datetime.now(UTC)
        for t in range(0, 20, 2):
            for name in ("code", "chat"):
                for i in range(4):
                    await publish(
                        service.broker,
                        LatencySamplesReported(
                            occurred_at=now + timedelta(seconds=t),
                            service=name,
                            replica_id=f"{name}-{i}",
                            latencies_ms=[90.0] * 20,
                            queue_ms=[0.0] * 20,
                            requests_waiting=5 * t if name == "code" else None,
                            gpu_memory_pressure=0.6,
                            replicas=4,
                        ),
                    )
        [decision] = await tap.wait_for(ScaleDecided)
        assert (decision.service, decision.direction) == ("code", ScaleDirection.OUT)
        assert "backlog growing" in decision.reason
        assert decision.desired_replicas > 4
        await asyncio.sleep(0.5)
        assert {d.service for d in tap.of(ScaleDecided)} == {"code"}


async def test_a_tpot_slo_set_in_the_settings_scales_out_over_nats(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    """CRATER_AUTOSCALER_SCALE_OUT_TPOT_MS set: replicas whose decoding slows (tpot_ms through
    the bus) are scaled out in proportion; nothing waits and the load alone asks for none."""
    settings = AutoscalerSettings(nats_url=fresh_nats.url, scale_out_tpot_ms=50.0)
    service, app = build(settings)
    async with TestApp(app):
        now = datetime.now(UTC)
        for i in range(4):
            await publish(
                service.broker,
                LatencySamplesReported(
                    occurred_at=now,
                    service="chat",
                    replica_id=f"chat-{i}",
                    latencies_ms=[60.0] * 20,
                    queue_ms=[0.0] * 20,
                    tpot_ms=[80.0] * 20,
                    gpu_memory_pressure=0.6,
                    replicas=4,
                ),
            )
        [decision] = await tap.wait_for(ScaleDecided)
        assert (decision.direction, decision.desired_replicas) == (ScaleDirection.OUT, 7)
        assert "TPOT p95 80.0 ms > 50 ms" in decision.reason
