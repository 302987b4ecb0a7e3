"""A waiting task's start estimate told on `task.estimated` (issue 27, item 3: the estimate
in the webhooks) over a real nats-server and database (SQLite and PostgreSQL): once the task
has waited the interval, numbered among its events (after its `pending`, before its grant),
and not again while it does not move."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskPending,
    TaskStartEstimated,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from crater.scheduler.service_layer import handlers as stage_of_handlers
from crater.scheduler.service_layer.handlers import SchedulerService
from tests.integration.scheduler.test_time_limits_over_nats import stating
from tests.support.events import EventTap
from tests.support.topologies import node


async def next_look(core: SchedulerService, broker: object) -> list[object]:
    """Wait out the interval, move the core's clock with a heartbeat, and return what the
    look its commit starts tells."""
    before = core.telling
    await asyncio.sleep(core.tell_interval + 0.1)
    heartbeat = NodeHealthReported(
        node_id="a100-01", condition=NodeCondition.READY, score=100, occurred_at=datetime.now(UTC)
    )
    await publish(broker, heartbeat)  # type: ignore[arg-type]
    for _ in range(200):
        if core.telling is not before and core.telling is not None:
            return list(await core.telling)
        await asyncio.sleep(0.05)
    raise AssertionError("no look at the estimates after the interval")


async def test_a_waiting_tasks_estimate_is_told_in_its_order_and_not_again_unless_it_moves(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(
        nats_url=fresh_nats.url,
        database_url=database_url,
        estimate_interval_seconds=0,
        estimate_tell_interval_seconds=1,
    )
    service, app = build(settings)
    core: SchedulerService = service.state
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=4)))
        await publish(service.broker, stating("job", 4, expected_run_seconds=600))
        [granted] = await tap.wait_for(AllocationGranted)
        await publish(service.broker, stating("next", 4, expected_run_seconds=60))
        [pending] = await tap.wait_for(TaskPending)

        told = await next_look(core, service.broker)
        [estimate] = await tap.wait_for(TaskStartEstimated)
        assert [e.event_id for e in told] == [estimate.event_id]  # type: ignore[attr-defined]
        assert (estimate.task_id, estimate.queue_position, estimate.pool) == ("next", 1, "default")
        assert estimate.estimated_start_at == granted.occurred_at + timedelta(seconds=600)
        assert "position 1 in pool default" in estimate.estimate
        assert estimate.task_sequence is not None
        assert pending.task_sequence is not None
        assert estimate.task_sequence.previous == pending.task_sequence.number

        assert await next_look(core, service.broker) == []  # the same estimate: no news
        core.tell_interval = 0  # no more looks of its own from here
        core.told.clear()  # forgotten: news again, but a process that does not lead tells none
        epoch, core.epoch = core.epoch, None
        assert await core.tell_estimates() == []
        core.epoch = epoch

        done = TaskStatusReported(
            task_id="job", status=TaskStatus.SUCCEEDED, occurred_at=datetime.now(UTC)
        )
        await publish(service.broker, done)
        [_, second] = await tap.wait_for(AllocationGranted, count=2)
        assert second.task_id == "next"
        assert second.task_sequence is not None
        assert second.task_sequence.previous == estimate.task_sequence.number
        assert len(tap.of(TaskStartEstimated)) == 1


async def test_an_estimate_whose_staging_fails_is_told_on_the_next_look(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, monkeypatch: Any
) -> None:
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, estimate_interval_seconds=0
    )
    service, app = build(settings)
    core: SchedulerService = service.state
    core.tell_interval = 0  # no looks of its own: the test looks, with the stage broken first
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=4)))
        await publish(service.broker, stating("job", 4, expected_run_seconds=600))
        await tap.wait_for(AllocationGranted)
        await publish(service.broker, stating("next", 4, expected_run_seconds=60))
        await tap.wait_for(TaskPending)
        assert core.sequencer._last  # the task's numbers so far

        staged = stage_of_handlers.stage

        async def broken(*_: Any, **__: Any) -> None:
            raise RuntimeError("the database went away")

        monkeypatch.setattr(stage_of_handlers, "stage", broken)
        assert await core.tell_estimates() == []  # logged: nothing told, nothing kept as told
        assert core.told == {}
        assert core.sequencer._last == {}  # the rolled-back numbers are forgotten
        monkeypatch.setattr(stage_of_handlers, "stage", staged)
        [told] = await core.tell_estimates()
        assert told.task_id == "next"  # type: ignore[attr-defined]
        [estimate] = await tap.wait_for(TaskStartEstimated)
        assert estimate.task_sequence is not None
        assert estimate.task_sequence.previous is None  # its previous number was forgotten
