"""GET /api/v1/tasks/{task_id} over a real stack (nats-server, the scheduler with its
database, the gateway): a placed task's allocations carry the environment its grant handed
it, so AllData can inject it into the pod after the `scheduled` webhook."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    NodeTopologyReported,
    TaskEnded,
    TaskStatus,
    TaskStatusReported,
)
from crater.gateway.app import GatewaySettings
from crater.gateway.app import build as build_gateway
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings
from crater.scheduler.app import build as build_scheduler
from tests.integration.scheduler.test_scheduler_over_nats import profiled
from tests.support.events import EventTap
from tests.support.topologies import node


@pytest.fixture
async def gateway(fresh_nats: NatsServer) -> AsyncIterator[httpx.AsyncClient]:
    app = build_gateway(GatewaySettings(nats_url=fresh_nats.url, query_timeout_seconds=5))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
    ):
        yield http


async def test_a_placed_tasks_environment_is_read_back_over_http(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, gateway: httpx.AsyncClient
) -> None:
    settings = SchedulerSettings(
        nats_url=fresh_nats.url,
        database_url=database_url,
        gateway_url="https://crater.example",
        reservation_timeout_ms=45_000,
    )
    service, app = build_scheduler(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=2)))
        await publish(service.broker, profiled("placed", gpus=2))
        [granted] = await tap.wait_for(AllocationGranted)

        response = await gateway.get("/api/v1/tasks/placed")
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["status"], body["node"], body["gpu_ids"]) == ("scheduled", "n1", [0, 1])
        [held] = body["allocations"]
        assert held["allocation_id"] == granted.allocation_id
        assert (held["node"], held["gpu_ids"], held["cpu_cores"]) == (
            "n1",
            [0, 1],
            granted.cpu_cores,
        )
        assert held["memory_mb"] == granted.memory_mb
        assert held["environment"] == granted.environment
        env = held["environment"]
        assert env["CRATER_CPU_CORES"] == "4"
        assert env["CRATER_CPU_CORE_IDS"] == ",".join(map(str, granted.cpu_cores))
        assert env["CRATER_GATEWAY_URL"] == "https://crater.example"
        assert env["CRATER_ALLOCATION_ID"] == granted.allocation_id

        # once it ends it holds nothing: no environment to hand out any more
        done = TaskStatusReported(
            task_id="placed", allocation_id=granted.allocation_id, status=TaskStatus.SUCCEEDED
        )
        await publish(service.broker, done)
        await tap.wait_for(TaskEnded)
        body = (await gateway.get("/api/v1/tasks/placed")).json()
        assert body["allocations"] == []
        assert [a["allocation_id"] for a in body["history"]] == [granted.allocation_id]
