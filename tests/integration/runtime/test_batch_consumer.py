"""The batch consumer on a real nats-server (crater.runtime.batches): a pull batch handled in
one call; a poisoned message in it fails alone (the others acked once, never delivered again);
one span per batch linked to each message's trace context, which the handler gets with the
message; metrics per batch; started and stopped by the leader's gate. Its refusals of bad
input are the per-message subscriber's: test_poison_messages.py runs each case on both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from uuid import uuid4

import pytest
from faststream.nats import NatsBroker
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from crater.contracts import (
    Event,
    MessageDeadLettered,
    Streams,
    Subjects,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.batches import (
    BatchConsumer,
    Outcome,
    Received,
    batch_durable,
    batch_durable_stream,
)
from crater.runtime.bus import DeliveryPolicy, ensure_streams, make_broker, publish_raw
from crater.runtime.leadership import LeaderGate
from crater.runtime.nats_connection import NatsConnection
from crater.runtime.nats_server import NatsServer
from crater.runtime.telemetry import make_registry
from tests.support.events import EventTap
from tests.support.profiles import small_training

pytestmark = pytest.mark.integration

LIMIT = 3
CONSUMER = "batchtest-task-status"
TRACE_A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_B = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass
class Consumer:
    broker: NatsBroker
    registry: CollectorRegistry
    spans: InMemorySpanExporter
    consumer: BatchConsumer[TaskStatusReported]
    batches: list[list[str]] = field(default_factory=list)
    traces: dict[str, str | None] = field(default_factory=dict)
    handled: list[str] = field(default_factory=list)


@pytest.fixture
async def consumer(fresh_nats: NatsServer) -> AsyncIterator[Consumer]:
    """A batch consumer of task.status that fails the task ids starting `poison`; not yet
    started (the broker is)."""
    await ensure_streams(NatsConnection(fresh_nats.url))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = make_registry()
    broker, _ = make_broker(
        NatsConnection(fresh_nats.url),
        "batchtest",
        registry,
        provider,
        DeliveryPolicy(max_deliveries=LIMIT, redelivery_delay_seconds=0.2),
    )

    @batch_durable(broker, Subjects.TASK_STATUS, "batchtest", batch=16)
    async def on_statuses(received: list[Received[TaskStatusReported]]) -> list[Outcome]:
        state.batches.append([r.event.task_id for r in received])
        outcomes: list[Outcome] = []
        for r in received:
            state.traces[r.event.task_id] = r.trace.traceparent if r.trace else None
            if r.event.task_id.startswith("poison"):
                outcomes.append(RuntimeError(f"cannot apply {r.event.task_id}"))
                continue
            state.handled.append(r.event.task_id)
            outcomes.append(None)
        return outcomes

    state = Consumer(broker, registry, exporter, on_statuses)
    await broker.start()
    try:
        yield state
    finally:
        await state.consumer.stop()
        await broker.stop()


async def send(broker: NatsBroker, task_id: str, traceparent: str | None = None) -> None:
    event = TaskStatusReported(task_id=task_id, status=TaskStatus.RUNNING)
    await publish_raw(
        broker,
        subject=Subjects.TASK_STATUS.subject,
        stream=Subjects.TASK_STATUS.stream.name,
        payload=event.model_dump_json().encode(),
        event_id=str(event.event_id),
        traceparent=traceparent,
    )


async def send_bytes(broker: NatsBroker, body: bytes, **headers: str) -> None:
    """Straight to JetStream, with exactly `headers` (no middleware adds a trace context)."""
    await broker.connection.jetstream().publish(
        Subjects.TASK_STATUS.subject, body, headers={"content-type": "application/json", **headers}
    )


def status(task_id: str) -> bytes:
    return TaskStatusReported(task_id=task_id, status=TaskStatus.RUNNING).model_dump_json().encode()


async def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_a_poisoned_message_fails_alone_and_the_rest_of_its_batch_is_acked_once(
    consumer: Consumer, tap: EventTap
) -> None:
    # All stored before the consumer starts: its first fetch takes them as one batch.
    await send(consumer.broker, "good-1")
    await send(consumer.broker, "poison-1")
    await send(consumer.broker, "good-2")
    await send_bytes(consumer.broker, b'{"task_id": "bad", "status": "asleep"}')
    await send(consumer.broker, "good-3")
    await consumer.consumer.start()

    [letter] = await tap.wait_for(MessageDeadLettered, lambda e: e.error_class == "RuntimeError")
    await tap.wait_for(MessageDeadLettered, lambda e: e.error_class == "ValidationError")
    await asyncio.sleep(1.0)  # time for a redelivery of the good ones, were there one

    # the invalid message never reaches the handler; the valid ones come in one call, in order
    assert consumer.batches[0] == ["good-1", "poison-1", "good-2", "good-3"]
    # the poisoned one comes again alone, until the limit; the good ones once each
    assert consumer.batches[1:] == [["poison-1"]] * (LIMIT - 1)
    assert consumer.handled == ["good-1", "good-2", "good-3"]
    assert letter.consumer == CONSUMER
    assert letter.deliveries == LIMIT
    assert letter.kind == "apply"
    registry = consumer.registry
    count = "crater_batch_consumed_messages_total"
    assert sample(registry, count, consumer=CONSUMER, outcome="acked") == 3
    assert sample(registry, count, consumer=CONSUMER, outcome="nacked") == LIMIT - 1
    assert sample(registry, count, consumer=CONSUMER, outcome="terminated") == 2
    assert sample(registry, "crater_batch_size_messages_count", consumer=CONSUMER) == LIMIT
    assert sample(registry, "crater_batch_size_messages_sum", consumer=CONSUMER) == 5 + LIMIT - 1


async def test_one_span_per_batch_linked_to_each_message_and_each_keeps_its_context(
    consumer: Consumer,
) -> None:
    await send_bytes(consumer.broker, status("traced-a"), traceparent=TRACE_A)
    await send_bytes(consumer.broker, status("traced-b"), traceparent=TRACE_B)
    await send_bytes(consumer.broker, status("untraced"))
    await consumer.consumer.start()
    await eventually(lambda: len(consumer.handled) == 3)

    # Stored before the start, they usually come as one batch; a loaded machine's first fetch
    # may return before the others arrive: one span per batch then, whatever the split.
    assert [m for batch in consumer.batches for m in batch] == ["traced-a", "traced-b", "untraced"]
    # each message's own context, for what the handler publishes in consequence
    assert consumer.traces["traced-a"] == TRACE_A
    assert consumer.traces["traced-b"] == TRACE_B
    assert consumer.traces["untraced"] is None
    spans = [s for s in consumer.spans.get_finished_spans() if s.name == f"{CONSUMER} process"]
    assert len(spans) == len(consumer.batches)
    for span, batch in zip(spans, consumer.batches, strict=True):
        assert span.attributes is not None
        assert span.attributes["messaging.batch.message_count"] == len(batch)
    linked = [f"{link.context.trace_id:032x}" for span in spans for link in span.links]
    assert sorted(linked) == sorted([TRACE_A.split("-")[1], TRACE_B.split("-")[1]])
    # one span for each batch, not one per message
    consumed = [s for s in consumer.spans.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert consumed == spans


async def test_the_gate_starts_and_stops_it_and_a_stopped_consumer_takes_nothing(
    consumer: Consumer,
) -> None:
    gate = LeaderGate(consumer.broker)
    gate.add(consumer.consumer)
    assert ("CRATER_TASKS", CONSUMER) in gate.durables()

    await gate.open()
    await send(consumer.broker, "while-leading")
    await eventually(lambda: consumer.handled == ["while-leading"])

    await gate.close()
    await send(consumer.broker, "while-standing-by")
    await asyncio.sleep(1.5)
    assert consumer.handled == ["while-leading"]  # kept in the stream for the next leader

    await gate.open()
    await eventually(lambda: consumer.handled == ["while-leading", "while-standing-by"])
    await gate.close()


async def test_a_stream_consumer_hands_over_the_subjects_it_reads_in_order_and_skips_the_rest(
    consumer: Consumer,
) -> None:
    """`batch_durable_stream`: every subject of the stream in stream order; a subject it has
    no model for is acked unread (counted `skipped`); a body that breaks its subject's model
    is refused alone, as on a channel consumer."""
    broker = consumer.broker
    seen: list[tuple[str, str]] = []

    @batch_durable_stream(
        broker,
        Streams.TASKS,
        "batchtest",
        {Subjects.TASK_STATUS.subject: TaskStatusReported},
        batch=16,
    )
    async def on_tasks(received: list[Received[Event]]) -> list[Outcome]:
        for r in received:
            assert isinstance(r.event, TaskStatusReported)
            seen.append((r.event.task_id, r.event.status.value))
        return [None] * len(received)

    other = small_training("x")
    for n in range(5):
        await send(broker, f"t{n}")
        await publish_raw(  # another subject of the stream: nothing to read there
            broker,
            subject=Subjects.TASK_PROFILED.subject,
            stream=Streams.TASKS.name,
            payload=other.model_copy(update={"event_id": uuid4()}).model_dump_json().encode(),
            event_id=str(uuid4()),
            traceparent=None,
        )
    await send_bytes(broker, b'{"task_id": 7}')  # task.status, but not one
    await on_tasks.start()
    try:
        await eventually(lambda: len(seen) == 5)
        await eventually(
            lambda: (
                sample(
                    consumer.registry,
                    "crater_batch_consumed_messages_total",
                    consumer="batchtest-tasks",
                    outcome="skipped",
                )
                == 5
            )
        )
        await eventually(
            lambda: (
                sample(
                    consumer.registry,
                    "crater_batch_consumed_messages_total",
                    consumer="batchtest-tasks",
                    outcome="terminated",
                )
                == 1
            )
        )
        assert seen == [(f"t{n}", "running") for n in range(5)]
        info = await broker.connection.jetstream().consumer_info(
            Streams.TASKS.name, "batchtest-tasks"
        )
        assert (info.num_pending, info.num_ack_pending) == (0, 0)
    finally:
        await on_tasks.stop()


@pytest.mark.parametrize("linger", [0.0, 1.5])
async def test_a_lingering_batch_waits_for_messages_that_come_spread_out(
    consumer: Consumer, linger: float
) -> None:
    """With `linger`, a batch short of its size waits that long from its first message for
    more (heartbeats: one commit for many); without, each goes as it comes."""
    consumer.consumer.linger = linger
    await consumer.consumer.start()
    for k in range(4):
        await send(consumer.broker, f"spread-{k}")
        await asyncio.sleep(0.15)
    await eventually(lambda: len(consumer.handled) == 4)
    if linger:
        assert consumer.batches == [[f"spread-{k}" for k in range(4)]]
    else:
        assert len(consumer.batches) > 1


async def test_a_full_batch_does_not_linger(consumer: Consumer) -> None:
    consumer.consumer.linger = 30.0
    for k in range(16):  # the batch size: stored before the consumer starts
        await send(consumer.broker, f"full-{k}")
    started = time.monotonic()
    await consumer.consumer.start()
    await eventually(lambda: len(consumer.handled) == 16, timeout=10.0)
    assert time.monotonic() - started < 10.0
    assert consumer.batches == [[f"full-{k}" for k in range(16)]]


async def test_a_consumer_may_have_two_large_batches_unacked(consumer: Consumer) -> None:
    """The puller asks for two batches at once: JetStream's default cap on unacked messages
    (1,000) must not cut them short, and a small batch keeps the default."""

    @batch_durable(consumer.broker, Subjects.TASK_STATUS, "batchtest", batch=600, name="big")
    async def on_big(received: list[Received[TaskStatusReported]]) -> list[Outcome]:
        return [None] * len(received)

    await on_big.start()
    await consumer.consumer.start()
    try:
        js = consumer.broker.connection.jetstream()
        big = await js.consumer_info(Streams.TASKS.name, on_big.durable_name)
        small = await js.consumer_info(Streams.TASKS.name, consumer.consumer.durable_name)
        assert (big.config.max_ack_pending, small.config.max_ack_pending) == (1200, 1000)
    finally:
        await on_big.stop()
