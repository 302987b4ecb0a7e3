"""The callback answers `crater.v1.query.webhooks`: a task's deliveries from its log."""

from __future__ import annotations

import nats
from faststream import TestApp

from crater.callback.app import build
from crater.contracts import (
    QuerySubjects,
    WebhookDelivered,
    WebhookDeliveriesAnswer,
    WebhookDeliveriesQuery,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.callback.conftest import ServedReceiver
from tests.integration.callback.test_callback_over_nats import settings
from tests.support.events import EventTap
from tests.support.lifecycle import granted


async def ask(url: str, task_id: str) -> WebhookDeliveriesAnswer:
    connection = await nats.connect(url)
    try:
        query = WebhookDeliveriesQuery(task_id=task_id).model_dump_json().encode()
        reply = await connection.request(QuerySubjects.WEBHOOKS, query, timeout=5)
        return WebhookDeliveriesAnswer.model_validate_json(reply.data)
    finally:
        await connection.close()


async def test_a_tasks_deliveries_with_their_outcome(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url, receiver.url))
    async with TestApp(app):
        event = granted("train-1")
        await publish(service.broker, event)
        await tap.wait_for(WebhookDelivered)
        answer = await ask(fresh_nats.url, "train-1")
        for _ in range(20):  # the delivery's settlement commits as the event goes out
            if answer.deliveries and answer.deliveries[0].state == "delivered":
                break
            answer = await ask(fresh_nats.url, "train-1")
        [delivery] = answer.deliveries
        assert (delivery.task_status, delivery.state, delivery.attempts) == (
            "scheduled",
            "delivered",
            1,
        )
        assert delivery.last_status_code == 200
        assert delivery.webhook_id == str(event.event_id)
        assert (await ask(fresh_nats.url, "other")).deliveries == []
