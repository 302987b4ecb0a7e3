"""Delivery, retries and the delivery log on a real database (SQLite and PostgreSQL), with
the HTTP side played by httpx's mock transport."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from prometheus_client import CollectorRegistry
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy import select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from crater.callback.adapters import tables
from crater.callback.adapters.sender import WebhookSender
from crater.callback.adapters.store import DeliveryLog
from crater.callback.adapters.task_records import _lock_tasks
from crater.callback.app import MIGRATIONS_DIR
from crater.callback.delivery import Dispatcher, Route, WebhookMetrics
from crater.callback.domain.breaker import CircuitBreaker
from crater.callback.domain.lifecycle import ends_task, in_lifecycle
from crater.callback.domain.payload import render, webhook_body
from crater.callback.domain.retry import RetryPolicy
from crater.contracts import Event, TaskStatus, WebhookDeadLettered, WebhookDelivered
from crater.runtime.db import (
    alembic_config,
    make_engine,
    make_session_factory,
    upgrade_to_head_async,
)
from tests.support.lifecycle import ended, granted, pending

Reply = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    await upgrade_to_head_async(database_url, MIGRATIONS_DIR)
    engine = make_engine(database_url)
    yield engine
    await engine.dispose()


class Harness:
    """The delivery loop on a real database, HTTP answered by a mock transport."""

    def __init__(
        self,
        engine: AsyncEngine,
        replies: list[Reply],
        max_attempts: int = 5,
        backoff_seconds: float = 0.2,
    ):
        self.engine = engine
        self.requests: list[httpx.Request] = []
        self.replies = replies
        self.registry = CollectorRegistry()
        self.log = DeliveryLog(make_session_factory(engine))
        sender = WebhookSender(
            "http://alldata/hooks", "alldata", "s3cret", 1.0, httpx.MockTransport(self.reply)
        )
        self.dispatcher = Dispatcher(
            delivery_log=self.log,
            routes=[Route(sender, CircuitBreaker(failure_threshold=100), 8)],
            policy=RetryPolicy(max_attempts=max_attempts, initial_backoff_seconds=backoff_seconds),
            rng=random.Random(3),
            metrics=WebhookMetrics(self.registry),
            claim_seconds=5.0,
        )

    def reply(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.replies[min(len(self.requests), len(self.replies)) - 1](request)

    async def record(self, event: Any, format: str | None = None) -> int | None:
        body = webhook_body(event)
        return await self.log.enqueue(
            source_event_id=event.event_id,
            endpoints=["http://alldata/hooks"],
            formats={"http://alldata/hooks": format} if format else {},
            task_id=body.task_id,
            task_status=body.status.value,
            event_type=type(event).__name__,
            payload=body.encode().decode(),
            ends=ends_task(body),
            lifecycle=in_lifecycle(body),
        )

    async def run(self) -> None:
        """Dispatch until nothing is pending; retries are made due at once (no waiting)."""
        for _ in range(50):
            await self.dispatcher.dispatch()
            tasks = [t for r in self.dispatcher.routes.values() for t in r.in_flight.values()]
            if tasks:
                await asyncio.gather(*tasks)
                continue
            if not await self.make_due():
                return

    async def make_due(self) -> int:
        """Every pending delivery's next attempt is due now (a test does not wait for it)."""
        async with self.engine.begin() as connection:
            result = await connection.execute(
                update(tables.deliveries)
                .where(tables.deliveries.c.state == "pending")
                .values(next_attempt_at=datetime.now(UTC) - timedelta(seconds=1))
            )
            return int(result.rowcount)

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
    harness = Harness(engine, [status(200)])
    event = granted("train-1")
    assert await harness.record(event) == 1
    assert await harness.record(event) is None  # a redelivery records nothing
    await harness.run()

    [request] = harness.requests
    assert request.headers["webhook-id"] == str(event.event_id)
    assert json.loads(request.content)["status"] == "scheduled"
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == ("delivered", 1, 200)
    assert delivery.claimed_by is None
    # Recorded: Crater's body and the endpoint's format (the default, alldata), which
    # render exactly the bytes sent.
    assert delivery.format == "alldata"
    assert request.content == render(delivery.payload, delivery.format).body
    assert json.loads(request.content)["allocated_resources"]["gpu_ids"] == ["0", "1"]
    [attempt] = await harness.rows(tables.attempts)
    assert (attempt.attempt, attempt.outcome, attempt.status_code) == (1, "delivered", 200)
    [outbox] = await harness.rows(tables.outbox)
    published = WebhookDelivered.model_validate_json(outbox.payload)
    assert (published.webhook_id, published.attempts) == (str(event.event_id), 1)
    assert [row.event_id for row in await harness.rows(tables.inbox)] == [str(event.event_id)]
    labels = {"endpoint": "http://alldata/hooks"}
    assert harness.metric("crater_webhook_attempts_total", outcome="delivered", **labels) == 1
    assert harness.metric("crater_webhook_latency_seconds_count", **labels) == 1


async def test_retries_are_scheduled_in_the_log_and_keep_the_webhook_id(
    engine: AsyncEngine,
) -> None:
    replies = [timeout, status(503, **{"Retry-After": "3600"}), status(202)]
    # a backoff a loaded machine's next steps cannot outlast: "not due yet" must hold
    harness = Harness(engine, replies, backoff_seconds=1.5)
    await harness.record(pending("wait-1"))
    await harness.dispatcher.dispatch()
    await asyncio.gather(*harness.dispatcher.routes["http://alldata/hooks"].in_flight.values())
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.state, delivery.attempts) == ("pending", 1)
    assert delivery.next_attempt_at is not None  # waits in the log, nobody sleeps on it
    assert await harness.dispatcher.dispatch() == 0  # not due yet
    await harness.run()
    assert len(harness.requests) == 3
    assert len({r.headers["webhook-id"] for r in harness.requests}) == 1
    attempts = await harness.rows(tables.attempts)
    assert [(a.outcome, a.status_code) for a in attempts] == [
        ("retry", None),
        ("retry", 503),
        ("delivered", 202),
    ]
    labels = {"endpoint": "http://alldata/hooks"}
    assert harness.metric("crater_webhook_failures_total", reason="timeout", **labels) == 1
    assert harness.metric("crater_webhook_failures_total", reason="http_503", **labels) == 1


async def test_exhausted_retries_dead_letter_and_an_operator_retry_starts_a_round(
    engine: AsyncEngine,
) -> None:
    harness = Harness(engine, [status(500), status(500), status(500), status(200)], 3)
    await harness.record(granted("doomed"))
    await harness.run()
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == ("dead", 3, 500)
    [outbox] = await harness.rows(tables.outbox)
    dead = WebhookDeadLettered.model_validate_json(outbox.payload)
    assert (dead.task_id, dead.attempts, dead.last_error) == ("doomed", 3, "HTTP 500: status 500")

    assert await harness.log.retry(delivery.id, max_attempts=2)
    assert not await harness.log.retry(delivery.id + 100, max_attempts=2)
    await harness.run()
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.state, delivery.attempts, delivery.round) == ("delivered", 4, 1)
    outcomes = [row.subject for row in await harness.rows(tables.outbox)]
    assert outcomes == ["crater.v1.webhook.dead_lettered", "crater.v1.webhook.delivered"]


async def test_client_errors_dead_letter_at_once(engine: AsyncEngine) -> None:
    harness = Harness(engine, [status(422)])
    await harness.record(granted("bad"))
    await harness.run()
    assert len(harness.requests) == 1
    [delivery] = await harness.rows(tables.deliveries)
    assert delivery.state == "dead"


async def test_a_tasks_later_delivery_waits_for_the_earlier_one(engine: AsyncEngine) -> None:
    harness = Harness(engine, [status(503), status(200)])
    first, second, other = pending("t1"), granted("t1"), granted("t2")
    for event in (first, second, other):
        await harness.record(event)
    await harness.run()
    ids = [r.headers["webhook-id"] for r in harness.requests]
    # t1's grant waits for its pending (which failed once); t2 went meanwhile.
    assert ids.index(str(first.event_id)) < ids.index(str(other.event_id))
    assert ids[-1] == str(second.event_id)
    assert ids.count(str(first.event_id)) == 2


async def test_a_lapsed_claim_is_taken_over_and_sent_with_the_same_id(
    engine: AsyncEngine,
) -> None:
    crashed = Harness(engine, [status(200)])
    event = granted("crashy")
    await crashed.record(event)
    # A replica claims the delivery, then dies before recording an attempt.
    now = datetime.now(UTC)
    [due] = await crashed.log.due("http://alldata/hooks", now, 10)
    lease = timedelta(seconds=3)  # long enough to outlast a loaded machine's next step
    assert await crashed.log.claim([due.id], "dead-replica", now, now + lease)
    survivor = Harness(engine, [status(200)])
    assert await survivor.dispatcher.dispatch() == 0  # the claim still holds
    await asyncio.sleep((now + lease - datetime.now(UTC)).total_seconds() + 0.1)
    await survivor.run()
    [request] = survivor.requests
    assert request.headers["webhook-id"] == str(event.event_id)


async def test_a_claim_waits_while_another_replica_holds_the_task(
    engine: AsyncEngine, database_url: str
) -> None:
    """The guard reads what was released to a task and then claims on it: another replica's
    claim of the same task must wait until this one commits, or both could release out of
    order (SQLite took no lock before its first write, so the reads raced)."""
    harness = Harness(engine, [status(200)])
    await harness.record(granted("locked"))
    other_engine = make_engine(database_url)
    try:
        other = DeliveryLog(make_session_factory(other_engine))
        now = datetime.now(UTC)
        async with harness.log.sessions() as session:
            await _lock_tasks(session, ["locked"])
            claiming = asyncio.create_task(
                other.claim_due({"http://alldata/hooks": 5}, "other", now, now + timedelta(60))
            )
            await asyncio.sleep(0.5)
            assert not claiming.done(), "the other replica claimed a task this one holds"
            await session.commit()
        claimed = await asyncio.wait_for(claiming, 30)
        assert [x.task_id for x in claimed.due] == ["locked"]
    finally:
        await other_engine.dispose()


async def test_no_endpoint_records_skipped(engine: AsyncEngine) -> None:
    log = DeliveryLog(make_session_factory(engine))
    event: Event = granted("quiet")
    body = webhook_body(granted("quiet"))
    created = await log.enqueue(
        source_event_id=event.event_id,
        endpoints=[],
        task_id="quiet",
        task_status=body.status.value,
        event_type="AllocationGranted",
        payload=body.encode().decode(),
        configured=False,
    )
    assert created == 1
    [row] = await log.list()
    assert (row.state, row.endpoint) == ("skipped", "")


async def test_a_batch_of_attempts_is_claimed_and_recorded_in_few_commits(
    engine: AsyncEngine,
) -> None:
    harness = Harness(engine, [status(200)])
    events = [granted(f"batch-{n}") for n in range(8)]
    for event in events:
        await harness.record(event)
    commits: list[int] = []

    def count(_: object) -> None:
        commits.append(1)

    sqlalchemy_event.listen(engine.sync_engine, "commit", count)
    assert await harness.dispatcher.dispatch() == 8  # one claim for all eight
    await asyncio.gather(*harness.dispatcher.routes["http://alldata/hooks"].in_flight.values())
    sqlalchemy_event.remove(engine.sync_engine, "commit", count)

    assert len(harness.requests) == 8
    # One commit claims them; the attempts that finish together commit together.
    assert len(commits) <= 3
    rows = await harness.rows(tables.deliveries)
    assert {r.state for r in rows} == {"delivered"}
    assert len(await harness.rows(tables.attempts)) == 8
    assert len(await harness.rows(tables.outbox)) == 8


async def test_a_second_end_is_listed_superseded_with_its_reason_and_never_sent(
    engine: AsyncEngine,
) -> None:
    harness = Harness(engine, [status(200)])
    end, second = ended("twice"), ended("twice", TaskStatus.FAILED)
    assert await harness.record(end) == 1
    assert await harness.record(second) == 1  # recorded, not sent
    await harness.run()
    await harness.log.replay(datetime.now(UTC) - timedelta(hours=1), 3)  # an operator's replay
    await harness.run()

    assert [r.headers["webhook-id"] for r in harness.requests] == [str(end.event_id)] * 2
    [row] = await harness.log.list(state="superseded")
    assert (row.webhook_id, row.task_status, row.attempts) == (str(second.event_id), "failed", 0)
    assert row.last_error == (
        "superseded (second_end): the task's end was already recorded from another event; "
        f"the end is webhook {end.event_id}"
    )
    assert not await harness.log.retry(row.id, 3)  # never sent, not even by hand
    [(task_id, end_id, status_told)] = [
        (r.task_id, r.end_event_id, r.end_status) for r in await harness.rows(tables.tasks)
    ]
    assert (task_id, end_id, status_told) == ("twice", str(end.event_id), "succeeded")


async def test_upgrading_keeps_what_was_sent_in_its_place(database_url: str) -> None:
    """Revision 0004 on a log with deliveries: those already attempted count as released (a
    late event is judged against them), every task gets its row with the end it was first
    told, all are in the lifecycle."""
    config = alembic_config(database_url, MIGRATIONS_DIR)
    await asyncio.to_thread(command.upgrade, config, "0003")
    engine = make_engine(database_url)
    now = datetime.now(UTC)
    columns = (
        "webhook_id, endpoint, task_id, task_status, event_type, state, attempts, payload, "
        "created_at, updated_at, round, position"
    )
    async with engine.begin() as connection:
        told = (
            ("delivered", 1, "scheduled"),
            ("delivered", 1, "succeeded"),
            ("pending", 0, "failed"),
        )
        for n, (state, attempts, status_told) in enumerate(told):
            await connection.execute(
                text(
                    f"INSERT INTO callback_deliveries ({columns}) VALUES (:id, 'e', 'old', "
                    ":status, 'AllocationReleased', :state, :attempts, '{}', :now, :now, 0, :n)"
                ),
                {
                    "id": f"id-{n}",
                    "status": status_told,
                    "state": state,
                    "attempts": attempts,
                    "now": now,
                    "n": n,
                },
            )
    await asyncio.to_thread(command.upgrade, config, "head")
    d = tables.deliveries.c
    async with engine.connect() as connection:
        rows = (
            await connection.execute(
                select(d.webhook_id, d.released_at, d.lifecycle).order_by(d.webhook_id)
            )
        ).all()
        tasks = (await connection.execute(select(tables.tasks))).all()
    await asyncio.to_thread(command.downgrade, config, "0003")  # and back, losing nothing
    async with engine.connect() as connection:
        kept = await connection.scalar(text("SELECT count(*) FROM callback_deliveries"))
    await engine.dispose()

    assert [(r.webhook_id, r.released_at is not None, r.lifecycle) for r in rows] == [
        ("id-0", True, True),
        ("id-1", True, True),
        ("id-2", False, True),
    ]
    # The end already told (a release's 'succeeded') stays the task's end.
    assert [(k.task_id, k.end_event_id, k.end_position, k.end_status) for k in tasks] == [
        ("old", "id-1", 1, "succeeded")
    ]
    assert kept == 3


@pytest.mark.parametrize("format", ["alldata", "crater"])
async def test_every_attempt_of_a_delivery_sends_the_same_bytes_and_headers(
    engine: AsyncEngine, format: str
) -> None:
    harness = Harness(engine, [status(503), status(500), status(200)])
    event = granted("again", attempt=2)
    assert await harness.record(event, format) == 1
    await harness.run()

    assert len(harness.requests) == 3
    assert len({r.content for r in harness.requests}) == 1
    crater = [
        {k: v for k, v in r.headers.items() if k.startswith("crater-")} for r in harness.requests
    ]
    assert crater[0] == crater[1] == crater[2]
    assert (crater[0]["crater-format"], crater[0]["crater-attempt"]) == (format, "2")
    [delivery] = await harness.rows(tables.deliveries)
    assert (delivery.state, delivery.format) == ("delivered", format)


async def test_a_delivery_recorded_before_formats_is_sent_as_it_was(database_url: str) -> None:
    """Revision 0006 on a log with a pending delivery: it was recorded to be sent as Crater's
    typed body, and it still is, byte for byte (a retry or replay sends what was sent)."""
    config = alembic_config(database_url, MIGRATIONS_DIR)
    await asyncio.to_thread(command.upgrade, config, "0005")
    engine = make_engine(database_url)
    now = datetime.now(UTC)
    event = granted("before")
    payload = webhook_body(event).encode().decode()
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO callback_deliveries (webhook_id, endpoint, task_id, task_status, "
                "event_type, state, attempts, payload, created_at, updated_at, round, "
                "position, next_attempt_at, lifecycle) VALUES (:id, 'http://alldata/hooks', "
                "'before', 'scheduled', 'AllocationGranted', 'pending', 0, :payload, :now, "
                ":now, 0, 0, :now, true)"
            ),
            {"id": str(event.event_id), "payload": payload, "now": now},
        )
    await asyncio.to_thread(command.upgrade, config, "head")
    harness = Harness(engine, [status(200)])
    await harness.run()
    [request] = harness.requests
    [delivery] = await harness.rows(tables.deliveries)
    await asyncio.to_thread(command.downgrade, config, "0005")  # and back
    await engine.dispose()

    assert request.content == payload.encode()
    assert request.headers["crater-format"] == "crater"
    assert (delivery.state, delivery.format) == ("delivered", "crater")
