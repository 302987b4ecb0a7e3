"""A launcher runs the task, over a real stack (nats-server, the scheduler with its database,
the gateway): it confirms the allocation with its reservation token, heartbeats, and reports
the end; wrong, expired and spent tokens are refused by name; a silent launcher's task fails
saying so; reports forged on the bus change nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    MessageRejected,
    NodeCondition,
    NodeHealthReported,
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


def scheduler_settings(nats_url: str, database_url: str, **extra: Any) -> SchedulerSettings:
    return SchedulerSettings(
        nats_url=nats_url, database_url=database_url, token_secret="launcher-secret", **extra
    )


@contextlib.asynccontextmanager
async def node_heartbeats(broker: Any, node_id: str) -> AsyncIterator[None]:
    """The node's probe beating every half second: it runs the scheduler's clock."""

    async def beat() -> None:
        while True:
            health = NodeHealthReported(node_id=node_id, condition=NodeCondition.READY, score=100)
            await publish(broker, health)
            await asyncio.sleep(0.5)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_launcher_confirms_and_reports_the_end_and_bad_tokens_are_refused(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, gateway: httpx.AsyncClient
) -> None:
    service, app = build_scheduler(scheduler_settings(fresh_nats.url, database_url))
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=2)))
        await publish(service.broker, profiled("launched", gpus=1))
        await publish(service.broker, profiled("neighbour", gpus=1))
        grants = await tap.wait_for(AllocationGranted, count=2)
        granted = next(g for g in grants if g.task_id == "launched")
        other = next(g for g in grants if g.task_id == "neighbour")
        url = f"/api/v1/allocations/{granted.allocation_id}"
        token = granted.reservation_token

        # the token is handed to the task and shown with its allocation
        assert granted.environment["CRATER_RESERVATION_TOKEN"] == token
        [held] = (await gateway.get("/api/v1/tasks/launched")).json()["allocations"]
        assert held["reservation_token"] == token

        # wrong tokens: another allocation's, a forged signature, not a token at all
        for wrong, said in (
            (other.reservation_token, f"token of allocation {other.allocation_id!r}"),
            (token[:-4] + "0000", "forged"),
            ("nonsense", "malformed"),
        ):
            response = await gateway.post(f"{url}/confirm", json={"token": wrong})
            assert response.status_code == 403, response.text
            [error] = response.json()["detail"]
            assert error["field"] == "token"
            assert said in error["reason"]
        response = await gateway.post(
            "/api/v1/allocations/alloc-0000000000000000/confirm", json={"token": token}
        )
        assert response.status_code == 403  # the token names its own allocation
        unknown = "v1.alloc-0000000000000000.1.00"
        response = await gateway.post(
            "/api/v1/allocations/alloc-0000000000000000/confirm", json={"token": unknown}
        )
        assert response.status_code == 404, response.text
        assert response.json()["detail"][0]["field"] == "allocation_id"
        response = await gateway.post(f"{url}/confirm", json={"tokn": token})
        assert response.status_code == 422
        response = await gateway.post(
            f"{url}/status", json={"token": token, "status": "running", "exit_code": 0}
        )
        assert response.status_code == 422
        assert response.json()["detail"][0]["field"] == "exit_code"
        assert not tap.of(TaskStatusReported)  # nothing refused was published

        # the right one: confirmed, the reservation holds
        response = await gateway.post(f"{url}/confirm", json={"token": token})
        assert response.status_code == 202, response.text
        assert response.json()["task_id"] == "launched"
        [confirmed] = await tap.wait_for(TaskStatusReported)
        assert confirmed.reservation_token == token
        for _ in range(50):
            summary = (await gateway.get("/api/v1/tasks/launched")).json()
            if summary["status"] == "running":
                break
            await asyncio.sleep(0.1)
        assert summary["status"] == "running"

        # the end, with its exit code and reason, out of memory (a failure of kind oom)
        response = await gateway.post(
            f"{url}/status",
            json={
                "token": token,
                "status": "failed",
                "exit_code": 137,
                "reason": "OOM killed",
                "out_of_memory": True,
            },
        )
        assert response.status_code == 202, response.text
        [ended] = await tap.wait_for(TaskEnded, lambda e: e.task_id == "launched")
        assert ended.status is TaskStatus.FAILED
        assert ended.reason == (
            "failed as its launcher reported out of memory (exit code 137): OOM killed"
        )
        assert [r.out_of_memory for r in tap.of(TaskStatusReported)] == [False, True]

        # spent: the allocation is released
        response = await gateway.post(f"{url}/confirm", json={"token": token})
        assert response.status_code == 409, response.text
        [error] = response.json()["detail"]
        assert error["field"] == "token"
        assert "no longer held: released (failed)" in error["reason"]


async def test_an_expired_reservation_is_refused_as_gone(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, gateway: httpx.AsyncClient
) -> None:
    settings = scheduler_settings(
        fresh_nats.url, database_url, reservation_timeout_ms=1000, confirmation_lag_seconds=0
    )
    service, app = build_scheduler(settings)
    async with TestApp(app), node_heartbeats(service.broker, "n1"):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=1)))
        await publish(service.broker, profiled("late", gpus=1))
        [granted] = await tap.wait_for(AllocationGranted)
        [ended] = await tap.wait_for(TaskEnded)
        assert ended.release_reason == "expired"
        response = await gateway.post(
            f"/api/v1/allocations/{granted.allocation_id}/confirm",
            json={"token": granted.reservation_token},
        )
        assert response.status_code == 410, response.text
        [error] = response.json()["detail"]
        assert error["field"] == "token"
        assert error["reason"].startswith("expired:")


async def test_a_silent_launcher_fails_its_task_and_forged_reports_change_nothing(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, gateway: httpx.AsyncClient
) -> None:
    settings = scheduler_settings(fresh_nats.url, database_url, confirmation_lag_seconds=0)
    service, app = build_scheduler(settings)
    async with TestApp(app), node_heartbeats(service.broker, "n1"):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=1)))
        await publish(service.broker, profiled("quiet", gpus=1))
        [granted] = await tap.wait_for(AllocationGranted)
        url = f"/api/v1/allocations/{granted.allocation_id}"
        token = granted.reservation_token
        response = await gateway.post(
            f"{url}/confirm", json={"token": token, "heartbeat_grace_seconds": 5}
        )
        assert response.status_code == 202, response.text

        # forged on the bus: without the token, and with another's; both refused by name
        for forged in (
            TaskStatusReported(
                task_id="quiet", allocation_id=granted.allocation_id, status=TaskStatus.SUCCEEDED
            ),
            TaskStatusReported(
                task_id="quiet",
                allocation_id=granted.allocation_id,
                status=TaskStatus.SUCCEEDED,
                reservation_token=token[:-6] + "abcdef",
            ),
        ):
            await publish(service.broker, forged)
        refused = await tap.wait_for(
            MessageRejected, lambda r: r.subject == "crater.v1.task.status", count=2
        )
        assert [r.errors[0].field for r in refused] == ["reservation_token"] * 2
        assert refused[0].errors[0].reason.startswith("missing")
        assert refused[1].errors[0].reason.startswith("forged")
        assert token not in refused[1].payload_excerpt  # the credential is not echoed
        assert not tap.of(TaskEnded)

        # heartbeats keep it for longer than its grace
        for _ in range(8):
            response = await gateway.post(
                f"{url}/status", json={"token": token, "status": "running"}
            )
            assert response.status_code == 202
            await asyncio.sleep(1)
        assert not tap.of(TaskEnded)
        beats = tap.of(TaskStatusReported, lambda r: r.reservation_token == token)
        # the confirmation is news (a webhook), the heartbeats after it are not
        assert [r.heartbeat for r in beats] == [False] + [True] * 8
        # then they stop: failed, saying why
        [ended] = await tap.wait_for(TaskEnded, timeout=15)
        assert ended.status is TaskStatus.FAILED
        assert ended.reason.startswith("no heartbeat for 5 s")
        assert (await gateway.get("/api/v1/tasks/quiet")).json()["status"] == "failed"


async def test_a_restarted_scheduler_still_holds_the_launcher_to_its_token(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, gateway: httpx.AsyncClient
) -> None:
    """The heartbeat grace is stored with the allocation: after a restart a report about it
    without the token is still refused, and the launcher's own end still counts."""
    settings = scheduler_settings(fresh_nats.url, database_url)
    service, app = build_scheduler(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=1)))
        await publish(service.broker, profiled("kept", gpus=1))
        [granted] = await tap.wait_for(AllocationGranted)
        url = f"/api/v1/allocations/{granted.allocation_id}"
        token = granted.reservation_token
        response = await gateway.post(
            f"{url}/confirm", json={"token": token, "heartbeat_grace_seconds": 300}
        )
        assert response.status_code == 202, response.text
        # the confirm committed before the process stops (30 s: a loaded CI machine took 5)
        for _ in range(300):
            status = (await gateway.get("/api/v1/tasks/kept")).json()["status"]
            if status == "running":
                break
            await asyncio.sleep(0.1)
        assert status == "running"

    service, app = build_scheduler(settings)  # the same database, a new process's state
    async with TestApp(app):
        core = service.state
        assert core.scheduler.allocations["kept"].heartbeat_grace == 300
        tokenless = TaskStatusReported(
            task_id="kept", allocation_id=granted.allocation_id, status=TaskStatus.FAILED
        )
        await publish(service.broker, tokenless)
        [refused] = await tap.wait_for(
            MessageRejected, lambda r: r.subject == "crater.v1.task.status"
        )
        assert refused.errors[0].reason.startswith("missing")
        response = await gateway.post(
            f"{url}/status", json={"token": token, "status": "succeeded", "exit_code": 0}
        )
        assert response.status_code == 202, response.text
        [ended] = await tap.wait_for(TaskEnded)
        assert ended.status is TaskStatus.SUCCEEDED
        assert ended.reason == "succeeded as its launcher reported (exit code 0)"
