"""A task id the scheduler knows, submitted again on the bus under a new event id, is refused
aloud (task.rejected, duplicate) and the known task goes on; a redelivery stays silent. A
fleet keeps a replica template while any of its tasks is stored. Real nats-server, real
database (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio

import nats
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    AntiAffinity,
    NodeTopologyReported,
    QuerySubjects,
    ReplicasRequested,
    TaskProfiled,
    TaskRejected,
    TasksAnswer,
    TasksQuery,
    TaskStatus,
    TaskStatusReported,
    TaskType,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_scheduler_over_nats import profiled
from tests.support.events import EventTap, publish_raw
from tests.support.topologies import node


async def statuses(nats_url: str) -> dict[str, TaskStatus]:
    connection = await nats.connect(nats_url)
    try:
        reply = await connection.request(
            QuerySubjects.TASKS, TasksQuery().model_dump_json().encode(), timeout=5
        )
    finally:
        await connection.close()
    return {t.task_id: t.status for t in TasksAnswer.model_validate_json(reply.data).tasks}


def replica(task_id: str, service: str) -> TaskProfiled:
    event = profiled(task_id, gpus=1, gpu_mb=20000)
    request = event.task.model_copy(
        update={"task_type": TaskType.INFERENCE, "anti_affinity": AntiAffinity(group=service)}
    )
    return event.model_copy(update={"task": request})


async def test_a_known_task_id_submitted_again_is_refused_and_the_task_goes_on(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=4)))
        first = profiled("train-7", gpus=1)
        await publish(service.broker, first)
        [granted] = await tap.wait_for(AllocationGranted)
        running = TaskStatusReported(
            task_id="train-7", status=TaskStatus.RUNNING, allocation_id=granted.allocation_id
        )
        await publish(service.broker, running)
        # Its own consumer: wait until the report is in, so the status below is known.
        for _ in range(100):
            if (await statuses(fresh_nats.url)).get("train-7") is TaskStatus.RUNNING:
                break
            await asyncio.sleep(0.05)

        # Same id, a new body (two GPUs), a new event id: what bypassed the gateway.
        await publish(service.broker, profiled("train-7", gpus=2))
        [refused] = await tap.wait_for(TaskRejected)
        assert refused.duplicate
        assert refused.task_id == "train-7"
        [error] = refused.errors
        assert error.field == "task_id"
        assert "status running" in error.reason
        assert "unchanged" in error.reason

        # A redelivery of the first submission (same event id, past JetStream's duplicate
        # window) is not a new submission: nothing at all.
        await publish_raw(
            fresh_nats.url, "crater.v1.task.profiled", first.model_dump_json().encode()
        )
        await publish(service.broker, profiled("marker", gpus=1))
        await tap.wait_for(AllocationGranted, lambda g: g.task_id == "marker")
        assert len(tap.of(TaskRejected)) == 1
        assert [g.task_id for g in tap.of(AllocationGranted)] == ["train-7", "marker"]
        assert (await statuses(fresh_nats.url))["train-7"] is TaskStatus.RUNNING
        # The known task is untouched: it still holds one GPU, and ends as reported.
        assert service.state.scheduler.allocations["train-7"].gpu_ids == tuple(granted.gpu_ids)

        done = TaskStatusReported(
            task_id="train-7", status=TaskStatus.SUCCEEDED, allocation_id=granted.allocation_id
        )
        await publish(service.broker, done)
        await tap.wait_for(AllocationReleased, lambda r: r.task_id == "train-7")
        # An ended task's id is not reused either.
        await publish(service.broker, profiled("train-7", gpus=1))
        [_, again] = await tap.wait_for(TaskRejected, count=2)
        assert again.duplicate
        assert "status succeeded" in again.errors[0].reason
        await asyncio.sleep(0.3)
        assert [g.task_id for g in tap.of(AllocationGranted)] == ["train-7", "marker"]
        assert (await statuses(fresh_nats.url))["train-7"] is TaskStatus.SUCCEEDED


async def test_a_fleet_keeps_its_template_after_the_template_replica_ended(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        for name in ("rtx-01", "rtx-02", "rtx-03"):
            await publish(service.broker, NodeTopologyReported(node=node(name, gpus=4)))
        await publish(service.broker, replica("chat-0", "chat"))
        [first] = await tap.wait_for(AllocationGranted)
        ended = TaskStatusReported(
            task_id="chat-0", status=TaskStatus.SUCCEEDED, allocation_id=first.allocation_id
        )
        await publish(service.broker, ended)
        await tap.wait_for(AllocationReleased)

        # The autoscaler names no template (or one the scheduler never stored): the fleet's
        # latest task (anti_affinity.group = service) is copied, ended or not.
        for ask in (
            ReplicasRequested(service="chat", task_ids=["chat-1"], reason="p95"),
            ReplicasRequested(
                service="chat", task_ids=["chat-2"], template_task_id="gone", reason="p95"
            ),
        ):
            await publish(service.broker, ask)
        granted = await tap.wait_for(AllocationGranted, count=3)
        assert sorted(g.task_id for g in granted) == ["chat-0", "chat-1", "chat-2"]
        assert not tap.of(TaskRejected)

        # A fleet Crater never stored: refused, naming the field, the service and why.
        await publish(
            service.broker, ReplicasRequested(service="embed", task_ids=["embed-1"], reason="p95")
        )
        [refused] = await tap.wait_for(TaskRejected)
        assert not refused.duplicate
        [error] = refused.errors
        assert error.field == "template_task_id"
        assert "'embed'" in error.reason
        assert "none was named" in error.reason
        assert "None" not in error.reason

        # A new request naming a replica that exists: refused as a duplicate, not re-placed.
        await publish(
            service.broker,
            ReplicasRequested(
                service="chat", task_ids=["chat-1"], template_task_id="chat-1", reason="p95"
            ),
        )
        [_, duplicate] = await tap.wait_for(TaskRejected, count=2)
        assert duplicate.duplicate
        assert duplicate.task_id == "chat-1"
        assert duplicate.errors[0].field == "task_id"
        assert "status scheduled" in duplicate.errors[0].reason
        await asyncio.sleep(0.3)
        assert len(tap.of(AllocationGranted)) == 3
