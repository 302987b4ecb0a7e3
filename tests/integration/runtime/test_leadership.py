"""Leader election on a real nats-server's key-value store (crater.runtime.leadership), and
consumers refusing what a deposed leader publishes (the Crater-Epoch header)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.js.kv import KeyValue

from crater.contracts import MessageRejected, Subjects, TaskStatus, TaskStatusReported
from crater.runtime.bus import DeliveryPolicy, durable, ensure_streams, make_broker, publish_raw
from crater.runtime.leadership import (
    LEASES_BUCKET,
    Deposed,
    Leadership,
    Lease,
    LeaseTiming,
    epoch_header,
)
from crater.runtime.nats_connection import NatsConnection
from crater.runtime.nats_server import NatsServer
from crater.runtime.telemetry import make_registry, make_tracer_provider
from tests.support.events import EventTap

pytestmark = pytest.mark.integration

QUICK = LeaseTiming(duration_seconds=0.8, renew_seconds=0.2, retry_seconds=0.1)


@pytest.fixture
async def bucket(fresh_nats: NatsServer) -> AsyncIterator[KeyValue]:
    connection = await nats.connect(fresh_nats.url)
    yield await connection.jetstream().create_key_value(bucket=LEASES_BUCKET, history=1)
    await connection.close()


async def test_one_of_two_leads_and_the_other_takes_over_when_renewals_stop(
    bucket: KeyValue,
) -> None:
    first, second = Lease(bucket, "svc", "first", QUICK), Lease(bucket, "svc", "second", QUICK)
    epoch = await first.acquire()
    waiting = asyncio.create_task(second.acquire())
    for _ in range(8):  # two whole leases, renewed: the standby waits
        await asyncio.sleep(0.2)
        await first.renew()
    assert not waiting.done()

    stopped = time.monotonic()  # the leader dies: no renewal, no release
    taken = await asyncio.wait_for(waiting, timeout=5)
    elapsed = time.monotonic() - stopped
    assert taken > epoch  # the epoch only grows
    assert QUICK.duration_seconds <= elapsed < QUICK.duration_seconds + 0.6
    with pytest.raises(Deposed, match=f"epoch {epoch} lost the lease"):
        await first.renew()  # a late renewal of the deposed leader is refused
    assert first.epoch is None


async def test_a_released_lease_is_taken_at_once(bucket: KeyValue) -> None:
    first, second = Lease(bucket, "svc", "first", QUICK), Lease(bucket, "svc", "second", QUICK)
    await first.acquire()
    waiting = asyncio.create_task(second.acquire())
    await asyncio.sleep(0.3)
    released = time.monotonic()
    await first.release()
    await asyncio.wait_for(waiting, timeout=5)
    assert time.monotonic() - released < QUICK.duration_seconds


async def test_two_started_at_once_never_both_lead(bucket: KeyValue) -> None:
    leases = [Lease(bucket, "svc", f"p{i}", QUICK) for i in range(4)]
    tasks = [asyncio.create_task(lease.acquire()) for lease in leases]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    [winner] = [lease for lease, task in zip(leases, tasks, strict=True) if task in done]
    for _ in range(10):  # two whole leases, renewed: nobody else leads meanwhile
        await winner.renew()
        await asyncio.sleep(0.15)
    assert all(not task.done() for task in pending)
    for task in pending:
        task.cancel()


async def test_leadership_steps_down_when_deposed_and_competes_again(bucket: KeyValue) -> None:
    events: list[str] = []

    async def lead(epoch: int) -> None:
        events.append(f"lead {epoch}")

    async def step_down() -> None:
        events.append("step down")

    lease = Lease(bucket, "svc", "me", QUICK)
    leadership = Leadership(lease, lead, step_down)
    await leadership.start()
    assert leadership.epoch is not None
    first = leadership.epoch
    # A rival writes the key (as a standby that saw the lease lapse would): the next renewal
    # finds it deposed; it steps down, then takes the lease again once the rival stops.
    entry = await bucket.get("svc")
    await bucket.update("svc", b'{"holder": "rival"}', last=entry.revision)
    for _ in range(50):
        if "step down" in events and leadership.epoch is not None:
            break
        await asyncio.sleep(0.1)
    assert events[:2] == [f"lead {first}", "step down"]
    assert leadership.epoch is not None
    assert leadership.epoch > first
    await leadership.stop()
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await bucket.get("svc")  # released on a clean stop


async def test_a_consumer_refuses_what_a_deposed_leader_publishes(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    await ensure_streams(NatsConnection(fresh_nats.url))
    broker, _ = make_broker(
        NatsConnection(fresh_nats.url), "callback", make_registry(), make_tracer_provider("t", None)
    )
    seen: list[str] = []

    @durable(broker, Subjects.TASK_STATUS, "callback")
    async def on_status(event: TaskStatusReported) -> None:
        seen.append(event.task_id)

    async def send(task_id: str, epoch: int | None) -> None:
        event = TaskStatusReported(task_id=task_id, status=TaskStatus.RUNNING)
        await publish_raw(
            broker,
            subject=Subjects.TASK_STATUS.subject,
            stream=Subjects.TASK_STATUS.stream.name,
            payload=event.model_dump_json().encode(),
            event_id=str(event.event_id),
            traceparent=None,
            extra_headers=epoch_header("scheduler", epoch) if epoch else None,
        )

    await broker.start()
    try:
        await send("from-7", 7)
        await send("from-9", 9)
        await send("late-from-7", 7)  # the deposed leader of epoch 7, not yet aware
        await send("unstamped", None)
        [rejected] = await tap.wait_for(
            MessageRejected, lambda r: r.subject == Subjects.TASK_STATUS.subject
        )
        for _ in range(50):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.1)
        assert seen == ["from-7", "from-9", "unstamped"]
        [error] = rejected.errors
        assert error.field == "headers.Crater-Epoch"
        # Stored after epoch 9's message (its second): published once succeeded.
        assert "deposed scheduler leader: epoch 7, stored in CRATER_TASKS at 3, " in error.reason
        assert "after epoch 9's message at 2" in error.reason
    finally:
        await broker.stop()


async def test_an_older_leaders_message_consumed_after_a_newer_ones_is_taken(
    fresh_nats: NatsServer,
) -> None:
    # The leader's host lost: a message the old leader published while it led, taken by a
    # consumer replica on that host, comes again (ack wait) after the new leader's. It was
    # stored before the new leader's first message, so it is taken, not refused as a zombie's.
    await ensure_streams(NatsConnection(fresh_nats.url))
    broker, _ = make_broker(
        NatsConnection(fresh_nats.url),
        "callback",
        make_registry(),
        make_tracer_provider("t", None),
        DeliveryPolicy(redelivery_delay_seconds=0.2),
    )
    seen: list[str] = []
    failed: list[str] = []

    @durable(broker, Subjects.TASK_STATUS, "callback")
    async def on_status(event: TaskStatusReported) -> None:
        if event.task_id == "from-7" and not failed:
            failed.append(event.task_id)
            raise RuntimeError("the replica that took it was lost")
        seen.append(event.task_id)

    async def send(task_id: str, epoch: int) -> None:
        event = TaskStatusReported(task_id=task_id, status=TaskStatus.RUNNING)
        await publish_raw(
            broker,
            subject=Subjects.TASK_STATUS.subject,
            stream=Subjects.TASK_STATUS.stream.name,
            payload=event.model_dump_json().encode(),
            event_id=str(event.event_id),
            traceparent=None,
            extra_headers=epoch_header("scheduler", epoch),
        )

    await broker.start()
    try:
        await send("from-7", 7)
        await send("from-9", 9)
        for _ in range(100):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.1)
        assert failed == ["from-7"]
        assert seen == ["from-9", "from-7"]
    finally:
        await broker.stop()
