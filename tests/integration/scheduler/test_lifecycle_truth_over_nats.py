"""The scheduler as it runs (real nats-server, SQLite and PostgreSQL): reservations armed from
the stream, a future-dated event refused, a retried attempt and a waiting task's announced
state kept across a restart, and the same heartbeat decided twice without a broken outbox."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    MessageRejected,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    Priority,
    RestartPolicy,
    TaskEnded,
    TaskPending,
    TaskProfiled,
    TasksQuery,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_scheduler_over_nats import profiled
from tests.support.events import EventTap
from tests.support.scheduler import leading
from tests.support.topologies import node


async def until(condition: object, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_a_grant_is_armed_when_read_back_and_a_future_event_is_refused(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=2)))
        await publish(service.broker, profiled("armed", gpus=1))
        [granted] = await tap.wait_for(AllocationGranted)
        core = service.state.scheduler
        # the relay published it and the scheduler read its own grant back
        await until(lambda: core.allocations["armed"].armed)
        expires = core.allocations["armed"].expires_at
        assert expires >= granted.reservation_expires_at
        lifetime = timedelta(milliseconds=settings.reservation_timeout_ms)
        assert expires - datetime.now(UTC) <= lifetime

        clock = core.clock
        future = NodeHealthReported(
            occurred_at=datetime.now(UTC) + timedelta(days=5 * 365),
            node_id="n1",
            condition=NodeCondition.NOT_READY,
            score=0,
        )
        await publish(service.broker, future)
        [refused] = await tap.wait_for(
            MessageRejected, lambda r: r.errors[0].field == "occurred_at"
        )
        assert "ahead of the scheduler's clock" in refused.errors[0].reason
        assert core.clock == clock  # never moved
        assert core.cluster.get("n1").condition is NodeCondition.READY  # type: ignore[union-attr]

    # after a restart the reservation is still armed, with the same end
    service, app = build(settings)
    async with TestApp(app):
        await leading(service)
        restored = service.state.scheduler.allocations["armed"]
        assert restored.armed
        assert restored.expires_at == expires


async def test_a_retried_attempt_and_an_announced_wait_survive_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    retry = RestartPolicy(when=["failure"], max_attempts=2, backoff_seconds=3600)
    task = profiled("flaky", gpus=1)
    flaky = TaskProfiled(
        task=task.task.model_copy(update={"restart_policy": retry}), prediction=task.prediction
    )
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=1)))
        await publish(service.broker, flaky)
        [first] = await tap.wait_for(AllocationGranted)
        await publish(service.broker, profiled("waiter", gpus=1))
        [waits] = await tap.wait_for(TaskPending, lambda p: p.task_id == "waiter")
        await publish(
            service.broker,
            TaskStatusReported(
                task_id="flaky", status=TaskStatus.FAILED, allocation_id=first.allocation_id
            ),
        )
        # (a first attempt may have waited too, when the task was read before the node)
        [retried] = await tap.wait_for(
            TaskPending, lambda p: p.task_id == "flaky" and p.attempt == 2
        )
        assert retried.reasons[0].code == "Retrying"
        # the waiter takes the card while flaky waits out its hour of backoff
        [_, second] = await tap.wait_for(AllocationGranted, count=2)
        assert second.task_id == "waiter"
        # each attempt is in the task's history
        answer = await service.state.tasks(TasksQuery(task_id="flaky", limit=1))
        [summary] = answer
        assert (summary.status, summary.attempt) == (TaskStatus.PENDING, 2)
        assert [(h.attempt, h.release_reason) for h in summary.history] == [(1, "failed")]
        assert summary.reason is not None
        assert "attempt 2 of 2" in summary.reason

    service, app = build(settings)
    async with TestApp(app):
        core = service.state.scheduler
        flaky_again = core.pending["flaky"]
        assert flaky_again.attempt == 2
        assert flaky_again.not_before is not None
        assert flaky_again.announced_kind == frozenset({"RestartBackoff"})
        # a heartbeat retries everything after the restart: no second pending for flaky
        await publish(
            service.broker,
            NodeHealthReported(node_id="n1", condition=NodeCondition.READY, score=100),
        )
        await asyncio.sleep(1.0)
        assert len(tap.of(TaskPending, lambda p: p.task_id == "flaky" and p.attempt == 2)) == 1
        assert not waits.attempt > 1
        # cancelled while it waits for its second attempt: it ends, cancelled, once
        await publish(
            service.broker, TaskStatusReported(task_id="flaky", status=TaskStatus.CANCELLED)
        )
        [ended] = await tap.wait_for(TaskEnded, lambda e: e.task_id == "flaky")
        assert (ended.status, ended.attempt) == (TaskStatus.CANCELLED, 2)


async def test_the_same_heartbeat_decided_twice_stages_nothing_twice(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    """A heartbeat delivered again after a crash between commit and ack (telemetry has no
    inbox): the decisions it repeats are left out, the batch commits."""
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, grace_period_seconds=2
    )
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("n1", gpus=8)))
        for i in range(2):
            low = profiled(f"low-{i}", gpus=4)
            low = TaskProfiled(
                task=low.task.model_copy(update={"priority": Priority.LOW, "preemptible": True}),
                prediction=low.prediction,
            )
            await publish(service.broker, low)
        await tap.wait_for(AllocationGranted, count=2)
        big = profiled("big", gpus=8)
        big = TaskProfiled(
            task=big.task.model_copy(update={"priority": Priority.HIGH}), prediction=big.prediction
        )
        await publish(service.broker, big)
        allocations = service.state.scheduler.allocations
        await until(lambda: all(allocations[f"low-{i}"].yield_by for i in range(2)))
        await asyncio.sleep(2.5)  # the grace period is over: the next heartbeat takes it back
        beat = NodeHealthReported(node_id="n1", condition=NodeCondition.READY, score=100)
        core = service.state
        before = copy.deepcopy(core.scheduler)
        first = await core.handle(beat, "node-health")
        assert [type(d).__name__ for d in first].count("TaskEnded") == 2
        # decided again from the same state, as when a delivery is repeated: the very same
        # decisions come out, and are left out of the outbox instead of breaking its key
        core.scheduler = before
        assert await core.handle(beat, "node-health") == []
        assert service.state.metrics.repeated_decisions._value.get() == len(first)
        [granted] = await tap.wait_for(AllocationGranted, lambda g: g.task_id == "big")
        assert granted.gpu_ids == list(range(8))
        # and twice in one batch: decided once
        twice = NodeHealthReported(node_id="n1", condition=NodeCondition.READY, score=100)
        a, b = await asyncio.gather(
            core.handle(twice, "node-health"), core.handle(twice, "node-health")
        )
        assert b == [] or a == []
