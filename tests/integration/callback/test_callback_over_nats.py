"""The callback as it runs: a real nats-server, a real database, the reference receiver
served over HTTP; lifecycle events go in on the bus, webhooks come out."""

from __future__ import annotations

import json
import uuid

from faststream import TestApp
from sqlalchemy import select

from crater.callback.adapters import tables
from crater.callback.app import CallbackSettings, build
from crater.contracts import MessageRejected, TaskStatus, WebhookDeadLettered, WebhookDelivered
from crater.runtime.bus import encode, publish, subject_of
from crater.runtime.db import make_engine
from crater.runtime.nats_server import NatsServer
from tests.integration.callback.conftest import PASSWORD, USERNAME, ServedReceiver
from tests.support.events import EventTap, publish_raw
from tests.support.lifecycle import ended, granted, pending, status


def settings(
    nats: NatsServer, database_url: str, url: str, **overrides: object
) -> CallbackSettings:
    fields: dict[str, object] = {
        "nats_url": nats.url,
        "database_url": database_url,
        "webhook_url": url,
        "webhook_username": USERNAME,
        "webhook_password": PASSWORD,
        "webhook_timeout_seconds": 2.0,
        "initial_backoff_seconds": 0.05,
        "max_backoff_seconds": 0.2,
        "retry_seed": 1,
        "poll_seconds": 0.05,
        "claim_seconds": 3.0,
        "breaker_cooldown_seconds": 0.3,
    }
    fields.update(overrides)
    return CallbackSettings.model_validate(fields)


async def test_granted_allocation_reaches_alldata_as_scheduled_with_basic_auth(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url, receiver.url))
    async with TestApp(app):
        event = granted("train-1")
        await publish(service.broker, event)
        [delivered] = await tap.wait_for(WebhookDelivered)

    assert (delivered.task_id, delivered.task_status, delivered.status_code) == (
        "train-1",
        "scheduled",
        200,
    )
    assert delivered.webhook_id == str(event.event_id)
    assert delivered.attempts == 1
    [got] = receiver.state.deliveries  # the receiver only records what passed Basic auth
    assert got.webhook_id == str(event.event_id)
    assert got.path == "/hooks/crater"
    assert got.body["status"] == "scheduled"
    assert got.body["allocated_resources"]["gpu_ids"] == ["0", "1"]  # alldata, the default
    assert got.body["allocated_resources"]["node"] == "gpu-01"
    engine = make_engine(database_url)
    async with engine.connect() as connection:
        [row] = (await connection.execute(select(tables.deliveries))).all()
    await engine.dispose()
    assert (row.state, row.attempts, row.last_status_code) == ("delivered", 1, 200)


async def test_wrong_credentials_dead_letter_without_a_retry_storm(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    wrong = settings(fresh_nats, database_url, receiver.url, webhook_password="guess")
    service, app = build(wrong)
    async with TestApp(app):
        await publish(service.broker, granted("train-2"))
        [dead] = await tap.wait_for(WebhookDeadLettered)

    assert dead.task_id == "train-2"
    assert dead.attempts == 1
    assert dead.last_error.startswith("HTTP 401")
    assert receiver.state.unauthorized == 1
    assert receiver.state.deliveries == []
    assert tap.of(WebhookDelivered) == []


async def test_a_redelivered_event_is_posted_once(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url, receiver.url))
    async with TestApp(app):
        event = granted("train-3")
        # The same event under two message ids: JetStream cannot drop the copy, the inbox must.
        for _ in range(2):
            msg_id = {"Nats-Msg-Id": str(uuid.uuid4())}
            await publish_raw(fresh_nats.url, subject_of(event), encode(event), **msg_id)
        await publish(service.broker, granted("train-4"))  # behind both copies
        await tap.wait_for(WebhookDelivered, count=2)

    assert sorted(d.body["task_id"] for d in receiver.state.deliveries) == ["train-3", "train-4"]
    assert receiver.state.duplicates == 0  # not even a second POST for the receiver to drop
    assert len(tap.of(WebhookDelivered, lambda e: e.task_id == "train-3")) == 1


async def test_one_tasks_webhooks_arrive_in_the_order_of_its_events(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url, receiver.url))
    async with TestApp(app):
        emitted = [
            pending("train-5"),
            status("train-5", TaskStatus.RUNNING),
            status("train-5", TaskStatus.FAILED),  # a node's view: not a webhook any more
            status("train-5", TaskStatus.RUNNING),
            ended("train-5", TaskStatus.SUCCEEDED),  # the scheduler's end is the one told
        ]
        for event in emitted:
            await publish(service.broker, event)
        await tap.wait_for(WebhookDelivered, count=4)

    got = [d.body["status"] for d in receiver.state.deliveries]
    assert got == ["pending", "running", "running", "succeeded"]


async def test_malformed_input_is_rejected_and_consuming_goes_on(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url, receiver.url))
    async with TestApp(app):
        subject = subject_of(granted())
        await publish_raw(fresh_nats.url, subject, b"{not json")
        wrong_type = granted("bad").model_dump(mode="json") | {"gpu_ids": "zero"}
        await publish_raw(fresh_nats.url, subject, json.dumps(wrong_type).encode())
        await publish(service.broker, granted("after-bad-input"))

        rejected = await tap.wait_for(MessageRejected, count=2)
        [delivered] = await tap.wait_for(WebhookDelivered)

    assert {r.consumer for r in rejected} == {"callback"}
    assert {r.subject for r in rejected} == {subject}
    assert "not valid JSON" in rejected[0].errors[0].reason
    assert rejected[1].errors[0].field == "gpu_ids"
    assert delivered.task_id == "after-bad-input"
    assert [d.body["task_id"] for d in receiver.state.deliveries] == ["after-bad-input"]
