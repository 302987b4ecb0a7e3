"""Gangs, cancellation through the gateway, and preemption state across a restart: the
scheduler service and the gateway on a real nats-server and a real database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Confidence,
    NodeTopologyReported,
    ResourcePrediction,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.gateway.app import GatewaySettings
from crater.gateway.app import build as build_gateway
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.support.events import EventTap
from tests.support.topologies import node

PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=20000,
    host_memory_mb=8000,
    confidence=Confidence.MEDIUM,
    method="test",
    dataloader_num_workers=2,
    dataloader_prefetch_factor=2,
)


def profiled(task_id: str, gpus: int, **extra: Any) -> TaskProfiled:
    request = TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training",
            "model_config": {"name": "m"},
            "resource_requirements": {
                "gpu": {"count": gpus, "memory_mb": 40000},
                "cpu": {"cores": 4},
                "memory": {"capacity_mb": 8000},
            },
            **extra,
        }
    )
    return TaskProfiled(task=request, prediction=PREDICTION)


@asynccontextmanager
async def gateway(nats_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = build_gateway(GatewaySettings(nats_url=nats_url, query_timeout_seconds=5))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
    ):
        yield http


async def nodes_known(service: Any, count: int) -> None:
    """Topology and tasks come on separate consumers: let the nodes land first."""
    for _ in range(100):
        if len(service.state.scheduler.cluster) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the scheduler never saw {count} nodes")


async def status_of(http: httpx.AsyncClient, task_id: str, wanted: str) -> dict[str, Any]:
    for _ in range(100):
        body: dict[str, Any] = (await http.get(f"/api/v1/tasks/{task_id}")).json()
        if body.get("status") == wanted:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"{task_id} never became {wanted}: {body}")


async def test_a_gang_is_placed_whole_and_cancelled_whole_through_the_gateway(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        for name in ("n1", "n2"):
            await publish(service.broker, NodeTopologyReported(node=node(name, gpus=4)))
        await nodes_known(service, 2)
        await publish(service.broker, profiled("ddp", gpus=4, gang_size=2))
        members = await tap.wait_for(AllocationGranted, count=2)
        assert sorted((g.gang_index, g.gang_size) for g in members) == [(0, 2), (1, 2)]
        assert {g.node for g in members} == {"n1", "n2"}

        await publish(service.broker, profiled("waits", gpus=4))
        [pending] = await tap.wait_for(TaskPending)
        assert pending.task_id == "waits"

    # a new process: the gang comes back whole from the database
    service, app = build(settings)
    async with TestApp(app), gateway(fresh_nats.url) as http:
        gang = service.state.scheduler.allocations["ddp"]
        assert sorted((m.gang_index, m.node) for m in gang.members()) == [(0, "n1"), (1, "n2")]
        assert [n.whole_gpus_free for n in service.state.scheduler.cluster.nodes] == [0, 0]

        unknown = await http.post("/api/v1/tasks/nobody/cancel")
        assert unknown.status_code == 404
        assert "nobody" in unknown.json()["detail"]

        cancelled = await http.post("/api/v1/tasks/waits/cancel")
        assert cancelled.status_code == 202
        assert cancelled.json()["previous"] == "pending"
        await status_of(http, "waits", "cancelled")
        assert "waits" not in service.state.scheduler.pending

        assert (await http.delete("/api/v1/tasks/ddp")).status_code == 202
        released = await tap.wait_for(AllocationReleased, count=2)
        assert {(r.node, r.reason) for r in released} == {("n1", "cancelled"), ("n2", "cancelled")}
        await status_of(http, "ddp", "cancelled")
        again = await http.post("/api/v1/tasks/ddp/cancel")
        assert again.status_code == 409
        assert "cancelled" in again.json()["detail"]


async def test_preemption_in_flight_survives_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, grace_period_seconds=600
    )
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=4)))
        await nodes_known(service, 1)
        await publish(service.broker, profiled("victim", gpus=4, priority=100, preemptible=True))
        await tap.wait_for(AllocationGranted)
        running = TaskStatusReported(task_id="victim", status=TaskStatus.RUNNING)
        await publish(service.broker, running)
        await publish(service.broker, profiled("urgent", gpus=4, priority="high"))
        [preempted] = await tap.wait_for(TaskPreempted)
        assert preempted.must_stop_by is not None

    service, app = build(settings)
    async with TestApp(app):
        scheduler = service.state.scheduler
        assert scheduler.allocations["victim"].yield_by == preempted.must_stop_by
        assert scheduler.pending["urgent"].nominated_node == "n1"
        # news that changes the queue: the victim is not asked twice
        await publish(service.broker, NodeTopologyReported(node=node("n2", gpus=1)))
        await nodes_known(service, 2)
        await publish(service.broker, profiled("small", gpus=1))
        await tap.wait_for(AllocationGranted, lambda g: g.task_id == "small")
        assert len(tap.of(TaskPreempted)) == 1
        stopped = TaskStatusReported(task_id="victim", status=TaskStatus.CANCELLED)
        await publish(service.broker, stopped)
        [released] = await tap.wait_for(AllocationReleased)
        assert released.reason == "preempted"
        [placed] = await tap.wait_for(AllocationGranted, lambda g: g.task_id == "urgent")
        assert placed.node == "n1"
