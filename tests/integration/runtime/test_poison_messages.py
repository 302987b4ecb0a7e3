"""Poison messages on a real nats-server: each kind is refused with its reason and moved to
the dead-letter stream (at once when it cannot be decoded, after the delivery limit when its
handling keeps failing), while the good messages behind it are handled and the consumer
keeps running. Each test of a consumer runs twice, with the same outcomes: on FastStream's
per-message subscriber (`durable`) and on a batch consumer (`batch_durable`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors
import pytest
from faststream import TestApp
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.manager import JetStreamManager
from prometheus_client import CollectorRegistry
from sqlalchemy import Column, MetaData, String, Table, insert, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from typer.testing import CliRunner

from crater.cli import dead_letters as dead_letters_cli
from crater.cli.main import app as cli
from crater.contracts import (
    MessageDeadLettered,
    MessageRejected,
    MessageReplayed,
    Subjects,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    TaskSubmitted,
)
from crater.runtime.batches import Outcome, Received, batch_durable
from crater.runtime.bus import (
    MAX_DELIVER_MARGIN,
    DeliveryPolicy,
    durable,
    encode,
    ensure_streams,
    publish,
)
from crater.runtime.nats_server import NatsServer
from crater.runtime.service import Service, create_service
from crater.runtime.settings import ServiceSettings
from tests.support.events import EventTap, publish_raw

SUBJECT = Subjects.TASK_STATUS.subject
LIMIT = 3
OUTAGE_LIMIT = 6  # deliveries while a dependency is unreachable
JSON = {"content-type": "application/json"}


class Poisoned(Exception):
    """Stands in for an error that repeats on every delivery (a UniqueViolation)."""


@dataclass
class Consumer:
    service: Service
    handled: list[str] = field(default_factory=list)
    attempts: dict[str, list[float]] = field(default_factory=dict)
    refuse: bool = True  # task ids starting `poison` fail while set
    outage: int = 0  # task ids starting `outage` fail this many times as if the db were down


def report(task_id: str, message: str | None = None) -> TaskStatusReported:
    return TaskStatusReported(task_id=task_id, status=TaskStatus.RUNNING, message=message)


@pytest.fixture(params=["each", "batch"])
def kind(request: pytest.FixtureRequest) -> str:
    """How the consumer takes its messages: one at a time (`durable`), or a pull batch at a
    time (`batch_durable`)."""
    return str(request.param)


def consumer(
    nats: NatsServer,
    kind: str,
    store: Table | None = None,
    engine: AsyncEngine | None = None,
) -> Consumer:
    """A service with one durable consumer (`kind`): it refuses task ids starting `poison`,
    and stores each report in `store` when given one."""
    settings = ServiceSettings(
        nats_url=nats.url,
        max_deliveries=LIMIT,
        max_outage_deliveries=OUTAGE_LIMIT,
        redelivery_delay_seconds=0.2,
    )
    service = create_service("poisontest", settings)
    state = Consumer(service)

    async def apply(event: TaskStatusReported) -> None:
        state.attempts.setdefault(event.task_id, []).append(time.monotonic())
        if state.refuse and event.task_id.startswith("poison"):
            raise Poisoned(f"duplicate key value violates unique constraint ({event.task_id})")
        if event.task_id.startswith("outage") and len(state.attempts[event.task_id]) <= (
            state.outage
        ):
            down = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
            raise OperationalError("INSERT INTO reports ...", {}, down)
        if store is not None and engine is not None:
            async with engine.begin() as connection:
                await connection.execute(
                    insert(store).values(task_id=event.task_id, message=event.message)
                )
        state.handled.append(event.task_id)

    if kind == "each":

        @durable(service.broker, Subjects.TASK_STATUS, service.name, batch=8)
        async def on_status(event: TaskStatusReported) -> None:
            await apply(event)

    else:

        @batch_durable(service.broker, Subjects.TASK_STATUS, service.name, batch=8)
        async def on_statuses(received: list[Received[TaskStatusReported]]) -> list[Outcome]:
            outcomes: list[Outcome] = []
            for one in received:
                try:
                    await apply(one.event)
                    outcomes.append(None)
                except Exception as error:
                    outcomes.append(error)
            return outcomes

        service.consume(on_statuses)

    return state


async def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_undecodable_messages_are_dead_lettered_at_once(
    fresh_nats: NatsServer, tap: EventTap, kind: str
) -> None:
    state = consumer(fresh_nats, kind)
    async with TestApp(state.service.asgi()):
        deep = b"[" * 1000 + b"]" * 1000
        await publish_raw(fresh_nats.url, SUBJECT, deep, **JSON)
        await publish_raw(fresh_nats.url, SUBJECT, b"{not json", **JSON)
        await publish_raw(fresh_nats.url, SUBJECT, b'{"task_id": "\xff\xfe"}', **JSON)
        await publish_raw(fresh_nats.url, SUBJECT, b'{"task_id": "t", "status": "asleep"}')
        await publish(state.service.broker, report("after-poison"))

        letters = await tap.wait_for(MessageDeadLettered, count=4)
        rejected = await tap.wait_for(MessageRejected, count=4)
        await eventually(lambda: state.handled == ["after-poison"])

    assert [letter.kind for letter in letters] == ["decode"] * 4
    assert [letter.deliveries for letter in letters] == [1] * 4  # never retried
    assert [letter.error_class for letter in letters] == [
        "TooDeep",
        "JSONDecodeError",
        "UnicodeDecodeError",
        "ValidationError",
    ]
    assert letters[0].payload == deep.decode()
    assert letters[0].consumer == "poisontest-task-status"
    assert letters[0].stream == "CRATER_TASKS"
    assert letters[0].stream_sequence == 1
    assert letters[0].headers["content-type"] == "application/json"
    assert letters[2].payload is None
    assert letters[2].payload_base64 is not None
    reasons = [r.errors[0] for r in rejected]
    assert reasons[0].field == "body"
    assert "nested 1000 levels deep; at most 64" in reasons[0].reason
    assert "not valid JSON" in reasons[1].reason
    assert "not UTF-8" in reasons[2].reason
    assert reasons[3].field == "status"
    assert [r.dead_letter_id for r in rejected] == [str(x.event_id) for x in letters]
    registry = state.service.registry
    assert (
        sample(registry, "crater_messages_decode_refused_total", subject=SUBJECT, reason="TooDeep")
        == 1
    )
    assert (
        sample(
            registry,
            "crater_messages_dead_lettered_total",
            subject=SUBJECT,
            consumer="poisontest-task-status",
            reason="TooDeep",
        )
        == 1
    )
    assert sample(registry, "crater_messages_rejected_total", subject=SUBJECT) == 4


async def test_a_message_whose_handling_always_fails_is_dead_lettered_after_the_limit(
    fresh_nats: NatsServer, tap: EventTap, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    caplog.set_level(logging.DEBUG)
    state = consumer(fresh_nats, kind)
    async with TestApp(state.service.asgi()):
        await publish(state.service.broker, report("poison-1"))
        await publish(state.service.broker, report("good-1"))
        await publish(state.service.broker, report("good-2"))
        # the good ones behind it are handled while it waits to be redelivered
        await eventually(lambda: state.handled == ["good-1", "good-2"])
        assert len(state.attempts["poison-1"]) < LIMIT
        [letter] = await tap.wait_for(MessageDeadLettered)
        [rejected] = await tap.wait_for(MessageRejected)
        await publish(state.service.broker, report("good-3"))
        await eventually(lambda: state.handled[-1:] == ["good-3"])  # still consuming
        await asyncio.sleep(1.0)  # time for a redelivery, were there one

    attempts = state.attempts["poison-1"]
    assert len(attempts) == LIMIT  # never delivered again once dead-lettered
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    policy = DeliveryPolicy(max_deliveries=LIMIT, redelivery_delay_seconds=0.2)
    assert gaps[0] >= policy.redelivery_delay(1) * 0.9  # a delay, not a hot loop
    assert gaps[1] >= policy.redelivery_delay(2) * 0.9  # and a growing one
    assert letter.kind == "apply"
    assert letter.deliveries == LIMIT
    assert letter.error_class == "Poisoned"
    assert json.loads(letter.payload or "")["task_id"] == "poison-1"
    assert letter.headers["Nats-Msg-Id"] == str(json.loads(letter.payload or "")["event_id"])
    assert rejected.kind == "apply"
    assert rejected.error_class == "Poisoned"
    assert rejected.errors[0].field == "body"
    assert "duplicate key value violates unique constraint" in rejected.errors[0].reason
    assert f"on each of {LIMIT} deliveries" in rejected.errors[0].reason
    registry = state.service.registry
    assert sample(registry, "crater_messages_redelivered_total", subject=SUBJECT) == LIMIT - 1
    assert (
        sample(
            registry,
            "crater_messages_dead_lettered_total",
            subject=SUBJECT,
            consumer="poisontest-task-status",
            reason="Poisoned",
        )
        == 1
    )
    # The log of a poison message is bounded: a line per delivery, nothing in between.
    about_it = [r for r in caplog.records if "Poisoned" in r.getMessage() or r.exc_info]
    assert len(about_it) <= LIMIT + 1, [r.getMessage() for r in about_it]
    assert sum(len(r.getMessage()) for r in caplog.records if r.name == "crater.bus") < 8000


async def test_a_message_that_fails_while_the_database_is_down_is_kept_past_the_limit(
    fresh_nats: NatsServer, tap: EventTap, kind: str
) -> None:
    """Five failures in a row (more than the poison limit) because the database cannot be
    reached: the message is not the fault, so it is retried and handled once it is back."""
    state = consumer(fresh_nats, kind)
    state.outage = LIMIT + 2
    async with TestApp(state.service.asgi()):
        await publish(state.service.broker, report("outage-1"))
        await eventually(lambda: state.handled == ["outage-1"], timeout=40)
    assert len(state.attempts["outage-1"]) == LIMIT + 3
    assert not tap.of(MessageDeadLettered)


@pytest.fixture
async def postgres_url(postgres_server: str | None) -> AsyncIterator[str]:
    from tests.support.databases import fresh_postgres_database

    if postgres_server is None:
        pytest.skip("no PostgreSQL: set CRATER_TEST_DATABASE_URL or run a Docker engine")
    async with fresh_postgres_database(postgres_server) as url:
        yield url


@pytest.mark.postgres
async def test_a_nul_byte_is_refused_by_name_before_it_reaches_postgresql(
    fresh_nats: NatsServer, tap: EventTap, postgres_url: str, kind: str
) -> None:
    metadata = MetaData()
    store = Table(
        "reports",
        metadata,
        Column("task_id", String, primary_key=True),
        Column("message", String),
    )
    engine = create_async_engine(postgres_url)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    try:
        state = consumer(fresh_nats, kind, store, engine)
        async with TestApp(state.service.asgi()):
            await publish(state.service.broker, report("nul", message="half\x00way"))
            await publish(state.service.broker, report("fine", message="all text"))
            [letter] = await tap.wait_for(MessageDeadLettered)
            [rejected] = await tap.wait_for(MessageRejected)
            await eventually(lambda: "fine" in state.handled)
        async with engine.connect() as connection:
            stored = (await connection.execute(select(store.c.task_id))).scalars().all()
    finally:
        await engine.dispose()

    assert stored == ["fine"]
    # Refused before any handler ran (crater.runtime.jsondepth.check_json_text), naming the
    # field: no delivery fails against PostgreSQL's refusal of the byte any more.
    assert "nul" not in state.attempts
    assert letter.kind == "decode"
    assert letter.deliveries == 1
    assert letter.error_class == "NotText"
    [error] = rejected.errors
    assert error.field == "message"
    assert "NUL character" in error.reason
    # what was received is kept exactly: the JSON escape of the NUL byte
    assert "half\\u0000way" in (letter.payload or "")


async def test_a_message_that_cannot_be_dead_lettered_is_handed_back_not_lost(
    fresh_nats: NatsServer, tap: EventTap, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    state = consumer(fresh_nats, kind)
    async with TestApp(state.service.asgi()):
        connection = await nats.connect(fresh_nats.url)
        try:
            await connection.jetstream().delete_stream("CRATER_DEAD_LETTERS")  # NATS trouble
            await publish_raw(fresh_nats.url, SUBJECT, b"{not json", **JSON)
            # a publish to the missing stream is retried as transient ("no responders", as
            # during a leader election) for about 20 s before it fails: give it room
            await eventually(lambda: "could not dead-letter" in caplog.text, timeout=60.0)
            assert tap.of(MessageRejected) == []  # not refused yet: nothing kept to show
            await ensure_streams(fresh_nats.url)  # the stream is back
            # (the tap hears the failed attempt too: a core subscription, not the stream)
            await tap.wait_for(MessageDeadLettered, lambda e: e.deliveries >= 2)
            await tap.wait_for(MessageRejected)
        finally:
            await connection.close()
        [kept] = [
            json.loads(line)
            for line in (await cli_run("list", "--json", "--nats-url", fresh_nats.url)).splitlines()
        ]

    assert kept["deliveries"] >= 2  # the same message, delivered again, kept this time
    assert kept["stream_sequence"] == 1
    assert kept["error_class"] == "JSONDecodeError"


def dead_letters(*args: str, exit_code: int = 0) -> str:
    """`crater dead-letters ARGS` as a user runs it; its output (on a wide terminal)."""
    dead_letters_cli.console.width = 240
    result = CliRunner().invoke(cli, ["dead-letters", *args])
    assert result.exit_code == exit_code, result.output
    return result.output


async def test_dead_letters_are_listed_shown_and_replayed_by_the_cli(
    fresh_nats: NatsServer, tap: EventTap, kind: str
) -> None:
    state = consumer(fresh_nats, kind)
    url = ("--nats-url", fresh_nats.url)
    async with TestApp(state.service.asgi()):
        plain = encode(report("poison-a")).decode()
        await publish_raw(fresh_nats.url, SUBJECT, plain.encode(), **JSON, **{"x-origin": "t"})
        deduplicated = report("poison-b")
        await publish(state.service.broker, deduplicated)
        await publish_raw(fresh_nats.url, SUBJECT, b"[" * 100 + b"]" * 100, **JSON)
        await tap.wait_for(MessageDeadLettered, count=3)

        listed = [json.loads(line) for line in (await cli_run("list", "--json", *url)).splitlines()]
        assert [x["id"] for x in listed] == [3, 2, 1]  # newest first
        assert {x["error_class"] for x in listed} == {"Poisoned", "TooDeep"}
        assert all(x["service"] == "poisontest" for x in listed)
        assert all("payload" not in x for x in listed)  # `show` has it
        table = await cli_run("list", *url)
        assert "poisontest-task-status" in table
        assert "nested 100 levels deep" in table
        # by the order they were published in CRATER_TASKS
        by_origin = {x["stream_sequence"]: x["id"] for x in listed}
        ids = {"poison-a": by_origin[1], "poison-b": by_origin[2], "deep": by_origin[3]}

        shown = json.loads(await cli_run("show", str(ids["poison-a"]), "--json", *url))
        assert shown["payload"] == plain
        assert shown["headers"]["x-origin"] == "t"
        assert shown["deliveries"] == LIMIT
        human = await cli_run("show", str(ids["poison-a"]), *url)
        assert f"deliveries {LIMIT}" in human
        assert '"task_id": "poison-a"' in human

        state.refuse = False  # the bug is fixed: replaying now succeeds
        replayed = json.loads(await cli_run("replay", str(ids["poison-a"]), "--json", *url))
        assert replayed["duplicate"] is False
        assert replayed["stream"] == "CRATER_TASKS"
        await eventually(lambda: "poison-a" in state.handled)

        # Its original Nats-Msg-Id is kept: inside the duplicate window JetStream drops it.
        again = await cli_run("replay", str(ids["poison-b"]), *url)
        assert "dropped by CRATER_TASKS as a duplicate" in again
        assert "poison-b" not in state.handled

        # --all: every letter never replayed; the deep one is refused again, at once.
        everything = await cli_run("replay", "--all", "--json", *url)
        assert [json.loads(line)["dead_letter_sequence"] for line in everything.splitlines()] == [
            ids["deep"]
        ]
        await tap.wait_for(MessageDeadLettered, count=4)
        pending = await cli_run("list", "--pending", "--json", *url)
        assert [json.loads(line)["error_class"] for line in pending.splitlines()] == ["TooDeep"]
        records = await tap.wait_for(MessageReplayed, count=3)
        assert [r.duplicate for r in records] == [False, True, False]


async def test_an_empty_dead_letter_stream_lists_nothing(fresh_nats: NatsServer) -> None:
    """What every fresh Crater has (`crater up`): the stream, and no letter in it yet. Its
    first sequence is 0, which JetStream refuses to get (a bad request, once an exit 70)."""
    await ensure_streams(fresh_nats.url)
    url = ("--nats-url", fresh_nats.url)
    assert (await cli_run("list", "--json", *url)).strip() == ""
    assert (await cli_run("list", *url)).splitlines()[0].split()[:2] == ["id", "when"]
    assert "nothing to replay" in await cli_run("replay", "--all", *url)


async def cli_run(*args: str, exit_code: int = 0) -> str:
    # The CLI runs its own event loop, as it does for a user: off this test's loop.
    return await asyncio.to_thread(lambda: dead_letters(*args, exit_code=exit_code))


async def test_a_payload_too_large_for_its_dead_letter_is_replayed_from_its_stream(
    fresh_nats: NatsServer, tap: EventTap, kind: str
) -> None:
    state = consumer(fresh_nats, kind)
    url = ("--nats-url", fresh_nats.url)
    # 200 KB of control characters: JSON-escaped (\u0001) it would be 1.2 MB, past the limit
    body = b"\x01" * 200_000
    async with TestApp(state.service.asgi()):
        await publish_raw(fresh_nats.url, SUBJECT, body, **JSON)
        [letter] = await tap.wait_for(MessageDeadLettered)
        assert letter.payload_omitted
        assert letter.payload is None
        assert letter.payload_base64 is None
        assert letter.payload_bytes == len(body)
        shown = await cli_run("show", "1", *url)
        assert "too large to keep here: CRATER_TASKS #1" in shown

        replayed = json.loads(await cli_run("replay", "1", "--json", *url))
        assert replayed["stream_sequence"] == 2  # read from CRATER_TASKS #1, published again
        again = await tap.wait_for(MessageDeadLettered, count=2)
        assert again[1].stream_sequence == 2
        assert again[1].payload_bytes == len(body)

        connection = await nats.connect(fresh_nats.url)
        try:
            await connection.jetstream().delete_msg("CRATER_TASKS", 2)
        finally:
            await connection.close()
        gone = await cli_run("replay", "--all", *url, exit_code=1)
        assert "CRATER_TASKS no longer holds #2" in gone


async def test_a_service_refuses_deep_json_at_once_and_its_consumers_have_a_backstop(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path
) -> None:
    """The issue's case on a real service: 1,000-level JSON on task.submitted looped in the
    predictor (RecursionError); now it is dead-lettered on its first delivery."""
    from crater.predictor.app import PredictorSettings, build

    settings = PredictorSettings(
        nats_url=fresh_nats.url,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'predictor.db'}",
        max_deliveries=4,
    )
    service, app = build(settings)
    async with TestApp(app):
        deep = b'{"task_id": "deep", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
        await publish_raw(fresh_nats.url, Subjects.TASK_SUBMITTED.subject, deep, **JSON)
        await publish(service.broker, TaskSubmitted.from_request(request("after-deep")))
        [letter] = await tap.wait_for(MessageDeadLettered)
        [rejected] = await tap.wait_for(MessageRejected)
        await tap.wait_for(TaskProfiled, lambda e: e.task.task_id == "after-deep")
        connection = await nats.connect(fresh_nats.url)
        try:
            info = await connection.jetstream().consumer_info(
                "CRATER_TASKS", "predictor-task-submitted"
            )
        finally:
            await connection.close()

    assert letter.consumer == "predictor-task-submitted"
    assert letter.service == "predictor"
    assert letter.deliveries == 1
    assert "nested 1001 levels deep" in rejected.errors[0].reason
    # JetStream's own, above ours (the outage limit is the larger)
    assert info.config.max_deliver == settings.max_outage_deliveries + MAX_DELIVER_MARGIN


def request(task_id: str) -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "inference",
            "model_config": {"name": "gpt2"},
            "resource_requirements": {"gpu": {"count": 1, "memory_mb": 8000}},
        }
    )


async def made_before_the_limit(js: JetStreamContext) -> None:
    """The test consumer's durable, as every durable consumer was created before the
    delivery limit: no max_deliver."""
    await js.add_consumer(
        "CRATER_TASKS",
        ConsumerConfig(
            durable_name="poisontest-task-status",
            filter_subject=SUBJECT,
            ack_policy=AckPolicy.EXPLICIT,
        ),
    )


async def test_a_consumer_created_before_the_limit_gets_the_backstop_on_start(
    fresh_nats: NatsServer, kind: str
) -> None:
    await ensure_streams(fresh_nats.url)
    connection = await nats.connect(fresh_nats.url)
    try:
        js = connection.jetstream()
        await made_before_the_limit(js)
        state = consumer(fresh_nats, kind)
        async with TestApp(state.service.asgi()):
            await publish(state.service.broker, report("still-consumed"))
            await eventually(lambda: state.handled == ["still-consumed"])
        info = await js.consumer_info("CRATER_TASKS", "poisontest-task-status")
    finally:
        await connection.close()

    assert info.config.max_deliver == OUTAGE_LIMIT + MAX_DELIVER_MARGIN
    assert info.config.filter_subject == SUBJECT  # the rest as it was


async def test_a_jetstream_api_timeout_on_start_is_retried_not_fatal(
    fresh_nats: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loaded cluster let the consumer-info call time out and the service exited (seen in
    # the failover test under a parallel suite); it is retried as streams are awaited.
    await ensure_streams(fresh_nats.url)
    connection = await nats.connect(fresh_nats.url)
    try:
        js = connection.jetstream()
        await made_before_the_limit(js)
        real = JetStreamManager.consumer_info
        timeouts = [nats.errors.TimeoutError(), nats.errors.TimeoutError()]

        async def flaky(self: JetStreamManager, *args: object, **kwargs: object) -> object:
            if timeouts:
                raise timeouts.pop()
            return await real(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(JetStreamManager, "consumer_info", flaky)
        state = consumer(fresh_nats, "each")
        async with TestApp(state.service.asgi()):
            await publish(state.service.broker, report("consumed"))
            await eventually(lambda: state.handled == ["consumed"])
        monkeypatch.undo()
        info = await js.consumer_info("CRATER_TASKS", "poisontest-task-status")
    finally:
        await connection.close()

    assert timeouts == []
    assert info.config.max_deliver == OUTAGE_LIMIT + MAX_DELIVER_MARGIN
