"""The tests' EventTap counts an event as JetStream keeps it: once per Nats-Msg-Id, though core
NATS delivers every publish (two replicas' relays publishing the same outbox row)."""

from __future__ import annotations

import pytest
from faststream.nats import NatsBroker

from crater.contracts import Subjects, TaskStatus, TaskStatusReported
from crater.runtime.bus import publish
from tests.support.events import EventTap

pytestmark = pytest.mark.integration


async def test_a_repeated_publish_is_one_event_as_jetstream_keeps_one(
    broker: NatsBroker, tap: EventTap
) -> None:
    first = TaskStatusReported(task_id="t1", status=TaskStatus.RUNNING)
    other = TaskStatusReported(task_id="t2", status=TaskStatus.RUNNING)
    for event in (first, first, other):
        await publish(broker, event)
    await tap.wait_for(TaskStatusReported, count=2)
    await tap.connection.flush()
    assert len([m for m in tap.raw if m.subject == Subjects.TASK_STATUS.subject]) == 3
    assert [e.task_id for e in tap.of(TaskStatusReported)] == ["t1", "t2"]
    assert [m.headers["Nats-Msg-Id"] for m in tap.repeats] == [str(first.event_id)]
    info = await broker.connection.jetstream().stream_info(Subjects.TASK_STATUS.stream.name)
    assert info.state.messages == 2  # what the tap counts is what the stream holds
