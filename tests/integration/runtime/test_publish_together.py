"""Concurrent publishes sent together (crater.runtime.bus.PublishTogether) on a real
nats-server: each caller returns once JetStream holds its own message, in far fewer batches
than callers; one caller's failure or departure is its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faststream.nats import NatsBroker

from crater.contracts import Subjects, TaskStatus, TaskStatusReported
from crater.runtime import bus
from crater.runtime.bus import PublishTogether

pytestmark = pytest.mark.integration


def report(n: int) -> TaskStatusReported:
    return TaskStatusReported(task_id=f"t{n}", status=TaskStatus.RUNNING)


async def stored(broker: NatsBroker) -> int:
    info = await broker.connection.jetstream().stream_info(Subjects.TASK_STATUS.stream.name)
    return int(info.state.messages)


async def test_concurrent_callers_each_return_once_their_message_is_stored(
    broker: NatsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    real = bus.publish_batch

    async def counted(broker: Any, messages: Any, *args: Any) -> Any:
        batches.append(len(messages))
        return await real(broker, messages, *args)

    monkeypatch.setattr(bus, "publish_batch", counted)
    together = PublishTogether(broker, max_batch=64)
    await asyncio.gather(*(together.publish(report(n)) for n in range(300)))
    assert await stored(broker) == 300
    assert sum(batches) == 300
    assert len(batches) < 300 / 4, batches
    assert max(batches) <= 64


async def test_a_caller_that_leaves_takes_nothing_with_it_and_a_failure_is_its_own(
    broker: NatsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = bus.publish_batch
    gate = asyncio.Event()

    async def slow(broker: Any, messages: Any, *args: Any) -> Any:
        await gate.wait()
        outcomes = await real(broker, messages, *args)
        # The bus refuses t3's: only its caller hears it.
        return [
            TimeoutError("no ack") if b'"t3"' in m.payload else o
            for m, o in zip(messages, outcomes, strict=True)
        ]

    monkeypatch.setattr(bus, "publish_batch", slow)
    together = PublishTogether(broker)
    first = asyncio.create_task(together.publish(report(0)))  # it sends the first batch
    await asyncio.sleep(0.05)
    others = [asyncio.create_task(together.publish(report(n))) for n in range(1, 6)]
    await asyncio.sleep(0.05)
    first.cancel()  # its client hung up while its batch was under way
    gate.set()
    outcomes = await asyncio.gather(*others, return_exceptions=True)
    assert [type(o).__name__ for o in outcomes] == [
        "NoneType",
        "NoneType",
        "TimeoutError",
        "NoneType",
        "NoneType",
    ]
    assert await stored(broker) == 6  # the departed caller's message went all the same
