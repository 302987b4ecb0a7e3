"""One task's webhooks in the order its events were emitted, though they travel on two
streams (task.* on CRATER_TASKS, allocation.* on CRATER_ALLOCATIONS) and reach the callback
in another order. Real nats-server, real database, the reference receiver over HTTP."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from faststream import TestApp
from sqlalchemy import Column, Integer, MetaData, String, Table, select

from crater.callback.app import CallbackSettings, build
from crater.contracts import (
    AllocationReleased,
    Event,
    ReleaseReason,
    TaskSequence,
    TaskStartEstimated,
    TaskStatus,
    TaskStatusReported,
    WebhookDelivered,
)
from crater.runtime.bus import publish
from crater.runtime.db import make_engine, make_session_factory
from crater.runtime.nats_server import NatsServer
from crater.runtime.outbox import TaskSequencer, outbox_table, stage
from tests.integration.callback.conftest import PASSWORD, USERNAME, ServedReceiver
from tests.integration.callback.sequenced import Numbering, report
from tests.support.events import EventTap
from tests.support.lifecycle import OCCURRED, ended, granted, pending, preempted


def settings(nats: NatsServer, database_url: str, url: str, **fields: object) -> CallbackSettings:
    values: dict[str, object] = {
        "nats_url": nats.url,
        "database_url": database_url,
        "webhook_url": url,
        "webhook_username": USERNAME,
        "webhook_password": PASSWORD,
        "poll_seconds": 0.05,
        "order_wait_seconds": 20.0,
        # These tests read Crater's fields (sequence, release_reason) from the typed body.
        "webhook_format": "crater",
    }
    return CallbackSettings.model_validate(values | fields)


def released(task_id: str, reason: ReleaseReason) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=f"alloc-{task_id}",
        task_id=task_id,
        node="gpu-01",
        gpu_ids=[0, 1],
        cpu_cores=[0, 1, 2, 3],
        reason=reason,
        occurred_at=OCCURRED,
    )


def statuses(receiver: ServedReceiver, task_id: str) -> list[str]:
    return [d.body["status"] for d in receiver.state.deliveries if d.body["task_id"] == task_id]


async def test_a_tasks_events_published_out_of_order_on_two_streams_arrive_in_order(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    numbered = Numbering()
    emitted: list[Event] = [
        numbered(pending("t1")),  # task.pending (CRATER_TASKS)
        numbered(granted("t1")),  # allocation.granted (CRATER_ALLOCATIONS)
        report("t1"),  # task.status from the node, about the grant's allocation
        numbered(preempted("t1")),  # task.preempted
        numbered(released("t1", ReleaseReason.PREEMPTED)),  # allocation.released: a link
        numbered(ended("t1", TaskStatus.FAILED, "preempted")),  # task.ended
    ]
    service, app = build(settings(fresh_nats, database_url, receiver.url))
    async with TestApp(app):
        # Everything after the first arrives first, each stream in its own order.
        for event in reversed(emitted[1:]):
            await publish(service.broker, event)
        await asyncio.sleep(1.0)
        assert receiver.state.deliveries == []  # held: the task's first event is missing
        await publish(service.broker, emitted[0])
        await tap.wait_for(WebhookDelivered, count=5, timeout=10)

    assert statuses(receiver, "t1") == ["pending", "scheduled", "running", "preempted", "failed"]
    [end] = [d.body for d in receiver.state.deliveries if d.body["release_reason"]]
    assert end["release_reason"] == "preempted"
    assert end["sequence"] == emitted[5].task_sequence.number  # type: ignore[attr-defined]


async def test_an_expired_reservation_is_told_as_failed_after_the_grant(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    numbered = Numbering()
    grant = numbered(granted("late-start"))
    expiry = numbered(released("late-start", ReleaseReason.EXPIRED))
    end = numbered(ended("late-start", TaskStatus.FAILED, "expired")).model_copy(
        update={"reason": "the task never reported running within its reservation"}
    )
    service, app = build(settings(fresh_nats, database_url, receiver.url))
    async with TestApp(app):
        await publish(service.broker, expiry)
        await publish(service.broker, end)
        await asyncio.sleep(0.3)
        await publish(service.broker, grant)
        await tap.wait_for(WebhookDelivered, count=2, timeout=10)

    assert statuses(receiver, "late-start") == ["scheduled", "failed"]
    body = receiver.state.deliveries[-1].body
    assert body["release_reason"] == "expired"
    assert "never reported running" in body["reason"]


async def test_a_lost_earlier_event_delays_its_task_for_the_order_wait_only(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    numbered = Numbering()
    numbered(pending("orphan"))  # numbered, never published: lost on the way
    grant = numbered(granted("orphan"))
    # An order wait long beside a loaded machine's delivery time (a CI run took 1.4 s for
    # the other task's), so "not held up" is told apart from "held up" by seconds.
    service, app = build(settings(fresh_nats, database_url, receiver.url, order_wait_seconds=5.0))
    async with TestApp(app):
        started = time.monotonic()
        await publish(service.broker, grant)
        await publish(service.broker, granted("other"))  # another task is not held up
        [other] = await tap.wait_for(WebhookDelivered, lambda e: e.task_id == "other")
        assert time.monotonic() - started < 4.0
        await tap.wait_for(WebhookDelivered, lambda e: e.task_id == "orphan", timeout=15)
        waited = time.monotonic() - started

    assert waited >= 4.9
    assert statuses(receiver, "orphan") == ["scheduled"]
    assert other.task_id == "other"


async def test_the_scheduler_numbers_each_tasks_events_across_transactions(
    database_url: str,
) -> None:
    """The stamp the callback relies on: numbers grow per task over every transaction and
    across a restart (read from the outbox), each naming the task's previous one."""
    metadata = MetaData()
    outbox = outbox_table(metadata, "seqtest")
    Table("seqtest_other", metadata, Column("id", Integer, primary_key=True), Column("x", String))
    engine = make_engine(database_url)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    sessions = make_session_factory(engine)
    sequencer = TaskSequencer(outbox)

    async def emit(*events: Event) -> list[Event]:
        async with sessions() as session, session.begin():
            stamped = await sequencer.stamp(session, events)
            await stage(session, outbox, *stamped)
        return stamped

    first = await emit(pending("a"), granted("b"), report("b"))
    second = await emit(granted("a"))
    sequencer.reset()  # as after a restart
    third = await emit(released("a", ReleaseReason.SUCCEEDED))
    async with sessions() as session:
        stored = (await session.scalars(select(outbox.c.payload).order_by(outbox.c.id))).all()
    await engine.dispose()

    sequences = [getattr(e, "task_sequence", None) for e in (*first, *second, *third)]
    assert sequences == [
        TaskSequence(number=1, previous=None),
        TaskSequence(number=2, previous=None),
        None,  # a node's report is not the scheduler's to number
        TaskSequence(number=4, previous=1),
        TaskSequence(number=5, previous=None),  # restarted: the previous is not known
    ]
    assert isinstance(third[0], AllocationReleased)
    assert TaskStatusReported.model_validate_json(stored[2]).allocation_id == "alloc-b"


async def test_a_start_estimate_reaches_alldata_between_the_pending_and_the_grant(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    numbered = Numbering()
    waits = numbered(pending("queued"))
    estimate = numbered(
        TaskStartEstimated(
            task_id="queued",
            pool="default",
            queue_position=2,
            estimated_start_at=OCCURRED + timedelta(seconds=300),
            estimate="estimated to start in 300 s (position 2 in pool default)",
            occurred_at=OCCURRED,
        )
    )
    grant = numbered(granted("queued"))
    service, app = build(settings(fresh_nats, database_url, receiver.url))
    async with TestApp(app):
        # The grant (another stream) comes first: it waits for the estimate before it.
        await publish(service.broker, waits)
        await publish(service.broker, grant)
        await asyncio.sleep(0.5)
        await publish(service.broker, estimate)
        await tap.wait_for(WebhookDelivered, count=3, timeout=10)

    assert statuses(receiver, "queued") == ["pending", "pending", "scheduled"]
    told = receiver.state.deliveries[1]
    assert (told.body["queue_position"], told.body["estimated_start_at"]) == (
        2,
        "2025-05-01T12:05:00Z",
    )
    assert told.body["reason"] == "estimated to start in 300 s (position 2 in pool default)"
    assert told.body["sequence"] == estimate.task_sequence.number  # type: ignore[union-attr]
    assert "queue_position" not in receiver.state.deliveries[0].body
