"""Delivery, retries and the delivery log on a real database (SQLite and PostgreSQL), with
the HTTP side played by httpx's mock transport."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from prometheus_client import CollectorRegistry
from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from crater.callback.adapters import tables
from crater.callback.adapters.sender import WebhookSender
from crater.callback.adapters.store import DeliveryLog
from crater.callback.app import MIGRATIONS_DIR
from crater.callback.delivery import Deliverer, WebhookMetrics
from crater.callback.domain.retry import DeliveryState, RetryPolicy
from crater.contracts import WebhookDeadLettered, WebhookDelivered
from crater.runtime.db import make_engine, make_session_factory, upgrade_to_head_async
from tests.support.lifecycle import granted, pending

Reply = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    await upgrade_to_head_async(database_url, MIGRATIONS_DIR)
    engine = make_engine(database_url)
    yield engine
    await engine.dispose()


class Harness:
    def __init__(self, engine: AsyncEngine, replies: list[Reply] | None, max_attempts: int):
        self.engine = engine
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []
        self.replies = replies
        self.registry = CollectorRegistry()
        sender = None
        if replies is not None:
            sender = WebhookSender(
                "http://alldata/hooks", "alldata", "s3cret", 1.0, httpx.MockTransport(self.reply)
            )
        self.deliverer = Deliverer(
            delivery_log=DeliveryLog(make_session_factory(engine)),
            sender=sender,
            policy=RetryPolicy(max_attempts=max_attempts, initial_backoff_seconds=0.2),
            rng=random.Random(3),
            metrics=WebhookMetrics(self.registry),
            sleep=self.sleep,
        )

    def reply(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert self.replies is not None
        return self.replies[min(len(self.requests), len(self.replies)) - 1](request)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)  # recorded, not waited: the test stays fast

    async def rows(self, table: Any) -> list[Any]:
        async with self.engine.connect() as connection:
            order = list(table.primary_key.columns)
            return list((await connection.execute(select(table).order_by(*order))).all())

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


def status(code: int, **headers: str) -> Reply:
    return lambda request: httpx.Response(code, headers=headers, text=f"status {code}")


def timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("no answer", request=request)


async def test_migrations_create_exactly_the_tables_the_code_uses(engine: AsyncEngine) -> None:
    def differences(connection: Connection) -> list[Any]:
        context = MigrationContext.configure(
            connection, opts={"version_table": "callback_alembic_version"}
        )
        return [
            diff
            for diff in compare_metadata(context, tables.metadata)
            # Other services' tables may share the database; only ours must match.
            if not (diff[0] == "remove_table" and not diff[1].name.startswith("callback_"))
        ]

    async with engine.connect() as connection:
        assert await connection.run_sync(differences) == []


async def test_delivered_on_first_attempt_and_settled_with_outbox_event(
    engine: AsyncEngine,
) -> None:
    harness = Harness(engine, [status(200)], max_attempts=5)
    event = granted("train-1")
    assert await harness.deliverer.deliver(event) is DeliveryState.DELIVERED

    [request] = harness.requests
    assert request.headers["webhook-id"] == str(event.event_id)
    assert json.loads(request.content)["status"] == "scheduled"
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.webhook_id, delivery.task_id, delivery.task_status) == (
        str(event.event_id),
        "train-1",
        "scheduled",
    )
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == ("delivered", 1, 200)
    assert delivery.event_type == "AllocationGranted"
    assert json.loads(delivery.payload) == json.loads(request.content)
    [attempt] = await harness.rows(tables.attempts)
    assert (attempt.attempt, attempt.outcome, attempt.status_code) == (1, "delivered", 200)
    [outbox] = await harness.rows(tables.outbox)
    published = WebhookDelivered.model_validate_json(outbox.payload)
    assert published.webhook_id == str(event.event_id)
    assert (published.status_code, published.attempts, published.endpoint) == (
        200,
        1,
        "http://alldata/hooks",
    )
    assert outbox.subject == "crater.v1.webhook.delivered"
    assert [row.event_id for row in await harness.rows(tables.inbox)] == [str(event.event_id)]
    labels = {"endpoint": "http://alldata/hooks"}
    assert harness.metric("crater_webhook_attempts_total", outcome="delivered", **labels) == 1
    assert harness.metric("crater_webhook_latency_seconds_count") == 1

    # The same event again (a redelivery): settled already, nothing is POSTed.
    assert await harness.deliverer.deliver(event) is None
    assert len(harness.requests) == 1
    assert len(await harness.rows(tables.outbox)) == 1


async def test_retryable_failures_back_off_then_deliver(engine: AsyncEngine) -> None:
    harness = Harness(
        engine, [timeout, status(503, **{"Retry-After": "3"}), status(202)], max_attempts=5
    )
    assert await harness.deliverer.deliver(pending("wait-1")) is DeliveryState.DELIVERED
    assert len(harness.requests) == 3
    assert {r.headers["webhook-id"] for r in harness.requests} == {
        harness.requests[0].headers["webhook-id"]
    }
    assert harness.sleeps[1] == 3.0  # Retry-After outweighs the 0.2-0.4 s backoff
    assert 0.1 <= harness.sleeps[0] <= 0.2
    attempts = await harness.rows(tables.attempts)
    assert [(a.outcome, a.status_code) for a in attempts] == [
        ("retry", None),
        ("retry", 503),
        ("delivered", 202),
    ]
    assert attempts[0].error == "timeout: ReadTimeout"
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.state, delivery.attempts) == ("delivered", 3)


async def test_exhausted_retries_dead_letter(engine: AsyncEngine) -> None:
    harness = Harness(engine, [status(500)], max_attempts=3)
    assert await harness.deliverer.deliver(granted("doomed")) is DeliveryState.DEAD
    assert len(harness.requests) == 3
    assert len(harness.sleeps) == 2
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == ("dead", 3, 500)
    [outbox] = await harness.rows(tables.outbox)
    dead = WebhookDeadLettered.model_validate_json(outbox.payload)
    assert (dead.task_id, dead.attempts, dead.last_error) == ("doomed", 3, "HTTP 500: status 500")


async def test_client_errors_dead_letter_at_once(engine: AsyncEngine) -> None:
    harness = Harness(engine, [status(422)], max_attempts=5)
    assert await harness.deliverer.deliver(granted("bad")) is DeliveryState.DEAD
    assert len(harness.requests) == 1
    assert harness.sleeps == []


async def test_redelivery_after_a_crash_continues_the_attempt_count(engine: AsyncEngine) -> None:
    first = Harness(engine, [status(503)], max_attempts=2)
    event = granted("crashy")
    # The first attempt is committed, then the process "dies" during the backoff.
    first.deliverer.sleep = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="crash"):
        await first.deliverer.deliver(event)

    second = Harness(engine, [status(503)], max_attempts=2)
    assert await second.deliverer.deliver(event) is DeliveryState.DEAD
    assert len(second.requests) == 1  # the second and last attempt of two
    [delivery] = await second.rows(tables.deliveries)
    assert delivery.attempts == 2


async def test_no_endpoint_records_skipped(engine: AsyncEngine) -> None:
    harness = Harness(engine, None, max_attempts=5)
    assert await harness.deliverer.deliver(granted("quiet")) is DeliveryState.SKIPPED
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.state, delivery.attempts, delivery.endpoint) == ("skipped", 0, "")
    assert await harness.rows(tables.outbox) == []
    assert await harness.deliverer.deliver(granted("quiet")) is DeliveryState.SKIPPED  # new id


async def crash(seconds: float) -> None:
    raise RuntimeError("crash")
