"""A task cancelled through the gateway while still being profiled, and a gang preempting:
the scheduler service and the gateway on a real nats-server and a real database, across a
restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    NodeTopologyReported,
    TaskEnded,
    TaskPreempted,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_gang_cancel_over_nats import (
    gateway,
    nodes_known,
    profiled,
    status_of,
)
from tests.support.events import EventTap
from tests.support.scheduler import leading
from tests.support.topologies import node


def granted_to(task_id: str) -> Callable[[AllocationGranted], bool]:
    return lambda grant: grant.task_id == task_id


async def test_a_task_cancelled_while_being_profiled_ends_cancelled_and_never_placed(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    arrival = profiled("early", gpus=1)
    service, app = build(settings)
    async with TestApp(app), gateway(fresh_nats.url) as http:
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=4)))
        await nodes_known(service, 1)
        body = arrival.task.model_dump(mode="json", by_alias=True)
        assert (await http.post("/api/v1/schedule", json=body)).status_code == 202
        # no predictor runs here: the scheduler has not heard of the task
        assert (await http.get("/api/v1/tasks/early")).status_code == 404
        cancelled = await http.post("/api/v1/tasks/early/cancel")
        assert cancelled.status_code == 202, cancelled.text
        assert cancelled.json()["previous"] == "submitted"
        unknown = await http.delete("/api/v1/tasks/never-submitted")
        assert unknown.status_code == 404
        await tap.wait_for(TaskStatusReported, lambda s: s.task_id == "early")
        for _ in range(100):
            if "early" in service.state.scheduler.early_cancels:
                break
            await asyncio.sleep(0.05)
        assert service.state.scheduler.early_cancels == {"early": False}

    # a new process remembers the cancel; the profile comes late, as from the predictor
    service, app = build(settings)
    async with TestApp(app), gateway(fresh_nats.url) as http:
        # restored from its table, or, when the first process stopped before that commit
        # landed, redelivered (it was never acked)
        for _ in range(200):
            if "early" in service.state.scheduler.early_cancels:
                break
            await asyncio.sleep(0.05)
        assert service.state.scheduler.early_cancels == {"early": False}
        await publish(service.broker, arrival)
        [ended] = await tap.wait_for(TaskEnded, lambda e: e.task_id == "early")
        assert (ended.status, ended.allocation_id) == (TaskStatus.CANCELLED, None)
        summary = await status_of(http, "early", "cancelled")
        assert "never placed" in summary["reason"]
        assert not tap.of(AllocationGranted, lambda g: g.task_id == "early")
        again = await http.post("/api/v1/tasks/early/cancel")
        assert again.status_code == 409


async def test_a_gang_preempts_across_nodes_and_its_nomination_survives_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, grace_period_seconds=600
    )
    service, app = build(settings)
    async with TestApp(app):
        for name in ("n1", "n2"):
            await publish(service.broker, NodeTopologyReported(node=node(name, gpus=4)))
        await nodes_known(service, 2)
        for victim in ("low-1", "low-2"):
            await publish(service.broker, profiled(victim, gpus=4, priority=100, preemptible=True))
            await tap.wait_for(AllocationGranted, granted_to(victim))
            running = TaskStatusReported(task_id=victim, status=TaskStatus.RUNNING)
            await publish(service.broker, running)
        await publish(service.broker, profiled("ddp", gpus=4, gang_size=2, priority="high"))
        preempted = await tap.wait_for(TaskPreempted, count=2)
        assert sorted((p.task_id, p.node) for p in preempted) == [("low-1", "n1"), ("low-2", "n2")]

    service, app = build(settings)
    async with TestApp(app):
        await leading(service)
        assert service.state.scheduler.pending["ddp"].nominated == ("n1", "n2")
        for victim in ("low-1", "low-2"):
            stopped = TaskStatusReported(task_id=victim, status=TaskStatus.CANCELLED)
            await publish(service.broker, stopped)
        members = await tap.wait_for(AllocationGranted, lambda g: g.task_id == "ddp", count=2)
        assert sorted((g.gang_index, g.node) for g in members) == [(0, "n1"), (1, "n2")]
        assert len(tap.of(TaskPreempted)) == 2
