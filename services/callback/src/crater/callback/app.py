"""Callback wiring: task and allocation lifecycle events -> webhooks to AllData.

One durable consumer per stream (`crater.v1.task.>` on CRATER_TASKS, `crater.v1.allocation.>`
on CRATER_ALLOCATIONS), dispatching on the subject, so one stream's events are recorded in
the order they were published. Each handler only records the event's deliveries (one per
endpoint that wants it, due now) with its inbox mark and returns, so the message is acked
right after that commit and the bus is never held by a slow or absent receiver. The delivery
loop (`delivery.Dispatcher`) sends due deliveries, retries on a schedule that can reach
hours, and settles each with an outcome event through the outbox.

Order per task across the two streams: the scheduler numbers every lifecycle event it emits
(`task_sequence`); a delivery waits for its task's earlier events, at most
`order_wait_seconds` (domain/ordering.py has the rule). What AllData is told: exactly one
end per task (`task.ended`, or `task.rejected`), nothing after it and nothing out of order;
what would break that is recorded superseded, never sent (domain/lifecycle.py). Subjects
with no webhook (task.submitted, task.profiled, ...) are acked and skipped; numbered ones
with none (allocation.released) are recorded as links of their task's chain.
"""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

from faststream.asgi import AsgiFastStream
from faststream.nats.annotations import NatsMessage
from pydantic import Field, SecretStr, field_validator, model_validator

from crater.callback.adapters import tables
from crater.callback.adapters.sender import WebhookSender
from crater.callback.adapters.store import DeliveryLog, Enqueued
from crater.callback.delivery import Dispatcher, Route, WebhookMetrics
from crater.callback.domain.breaker import CircuitBreaker
from crater.callback.domain.endpoints import Endpoint, load_endpoints
from crater.callback.domain.lifecycle import ends_task, in_lifecycle
from crater.callback.domain.ordering import Recorded
from crater.callback.domain.payload import (
    LifecycleEvent,
    WebhookFormat,
    has_webhook,
    webhook_body,
)
from crater.callback.domain.retry import RetryPolicy
from crater.callback.domain.signing import decode_secret
from crater.contracts import (
    AllocationGranted,
    Channel,
    Streams,
    Subjects,
    TaskEvent,
    TaskStatusReported,
    TaskUnderutilized,
)
from crater.runtime.bus import durable_stream
from crater.runtime.outbox import OutboxRelay
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings

MIGRATIONS_DIR = Path(__file__).parent / "adapters" / "migrations"

log = logging.getLogger("crater.callback")


class CallbackSettings(ServiceSettings):
    """Own settings from CRATER_CALLBACK_<NAME> (CRATER_CALLBACK_WEBHOOK_URL, ...)."""

    service = "callback"
    default_port = 9105  # health and metrics when http_port is 0

    endpoints_file: str | None = Field(
        default=None,
        description="YAML file of endpoints (url, events, username, password, secret, ...); "
        "when set, the webhook_* endpoint settings are not used.",
    )
    webhook_url: str | None = Field(
        default=None,
        max_length=512,
        description="AllData's webhook endpoint; unset: deliveries are recorded as skipped.",
    )
    webhook_username: str = Field(default="", description="HTTP Basic auth user.")
    webhook_password: SecretStr = Field(default=SecretStr(""), description="HTTP Basic auth.")
    webhook_secret: SecretStr | None = Field(
        default=None, description="whsec_<base64>: sign payloads (Standard Webhooks)."
    )
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    webhook_format: WebhookFormat = Field(
        default=WebhookFormat.ALLDATA,
        description="Body format: alldata (exactly what AllData parses) or crater (the typed "
        "WebhookBody); the endpoints file sets it per endpoint (`format`).",
    )
    max_in_flight: int = Field(
        default=32, ge=1, le=1024, description="Concurrent POSTs per endpoint."
    )
    max_attempts: int = Field(default=20, ge=1, le=100, description="POSTs before dead letter.")
    initial_backoff_seconds: float = Field(default=1.0, ge=0, le=3600)
    max_backoff_seconds: float = Field(
        default=3600.0, ge=0, le=86400, description="Cap on one wait between attempts."
    )
    retry_seed: int | None = Field(default=None, description="Seed the backoff jitter.")
    breaker_failures: int = Field(
        default=5, ge=1, le=1000, description="Consecutive failures that open a breaker."
    )
    breaker_cooldown_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="Wait before a half-open probe."
    )
    breaker_max_cooldown_seconds: float = Field(default=600.0, gt=0, le=86400)
    claim_seconds: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="How long a replica's claim on a delivery holds (default: the longest "
        "endpoint timeout + 10 s); a crashed replica's deliveries go again after it.",
    )
    poll_seconds: float = Field(
        default=1.0, gt=0, le=60, description="How often the delivery loop looks for due work."
    )
    order_wait_seconds: float = Field(
        default=30.0,
        ge=0,
        le=86400,
        description="How long a task's webhook waits for an earlier event of the task that has "
        "not arrived (the scheduler numbers them); then it goes anyway.",
    )

    @field_validator("webhook_url", "endpoints_file")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return value.strip()

    @field_validator("webhook_secret")
    @classmethod
    def _valid_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        decode_secret(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _claim_outlasts_a_post(self) -> CallbackSettings:
        if self.claim_seconds is not None and self.claim_seconds <= self.webhook_timeout_seconds:
            raise ValueError("claim_seconds must exceed webhook_timeout_seconds")
        return self

    def endpoints(self) -> list[Endpoint]:
        """The endpoints file's endpoints, or the one of the webhook_* settings, or none."""
        if self.endpoints_file:
            return load_endpoints(self.endpoints_file)
        if not self.webhook_url:
            return []
        return [
            Endpoint(
                url=self.webhook_url,
                username=self.webhook_username,
                password=self.webhook_password,
                secret=self.webhook_secret,
                timeout_seconds=self.webhook_timeout_seconds,
                max_in_flight=self.max_in_flight,
                format=self.webhook_format,
            )
        ]

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            initial_backoff_seconds=self.initial_backoff_seconds,
            max_backoff_seconds=self.max_backoff_seconds,
        )


class StreamTurns:
    """Each stream's deliveries handed in by their consumer sequence: a handler waits for the
    previous delivery's, `patience` seconds at most (that one may have gone to another
    replica sharing the consumer, or come before this process started)."""

    def __init__(self, patience: float = 0.25) -> None:
        self.patience = patience
        self._last: dict[str, int] = {}
        self._waiting: dict[tuple[str, int], asyncio.Future[None]] = {}

    async def wait(self, stream: str, sequence: int) -> None:
        if sequence - 1 <= self._last.get(stream, 0):
            return
        key = (stream, sequence - 1)
        turn = self._waiting.get(key)
        if turn is None:
            turn = self._waiting[key] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.patience)
        except TimeoutError:
            self._waiting.pop(key, None)  # it went elsewhere: not waited for again

    def done(self, stream: str, sequence: int) -> None:
        self._last[stream] = max(self._last.get(stream, 0), sequence)
        turn = self._waiting.pop((stream, sequence), None)
        if turn is not None and not turn.done():
            turn.set_result(None)


def delivery_turn(message: NatsMessage) -> tuple[str, int] | None:
    """(stream, consumer sequence) of a JetStream delivery; None for any other message."""
    try:
        metadata = message.raw_message.metadata
    except Exception:  # not a JetStream message (an in-memory test broker)
        return None
    return metadata.stream, metadata.sequence.consumer


class Recorder:
    """What the consumers do: record an event's deliveries and wake the delivery loop.

    Group commit: the events handed in while a commit is under way are recorded together in
    the next one, in the order they came (each stream's consumption order, so one task's
    events of one stream keep theirs); a handler returns, and its message is acked, once its
    event is committed. If a batch fails, its events are recorded one by one, so one bad
    event fails only its own message (redelivered).
    """

    def __init__(
        self,
        delivery_log: DeliveryLog,
        endpoints: list[Endpoint],
        dispatcher: Dispatcher,
        order_wait_seconds: float = 30.0,
    ) -> None:
        self.log = delivery_log
        self.endpoints = endpoints
        self.dispatcher = dispatcher
        self.order_wait_seconds = order_wait_seconds
        self._unrecorded: list[tuple[Enqueued, asyncio.Future[int | None]]] = []
        self._recording: asyncio.Task[None] | None = None
        self.turns = StreamTurns()

    async def record(self, event: LifecycleEvent) -> int | None:
        """Record the event's deliveries: how many (0 for an event that is no webhook), or
        None if it was recorded before."""
        if not has_webhook(event):
            return 0
        return await self._committed(self._queue(self._enqueued(event)))

    async def _committed(self, committed: asyncio.Future[int | None]) -> int | None:
        created = await asyncio.shield(committed)
        if created:
            self.dispatcher.wake()
        return created

    def _queue(self, event: Enqueued) -> asyncio.Future[int | None]:
        """Hand the event to the next commit (its place in the batch is taken now)."""
        committed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._unrecorded.append((event, committed))
        if self._recording is None or self._recording.done():
            self._recording = asyncio.create_task(self._record_batches())
        return committed

    async def on_message(self, message: NatsMessage) -> None:
        """A message of a consumed stream: recorded if its subject is a lifecycle event.

        A pull batch is handled concurrently, and its handlers need not get here in order:
        each waits for its stream's previous delivery to be handed in first (`StreamTurns`).
        """
        turn = delivery_turn(message)
        if turn is not None:
            await self.turns.wait(*turn)
        try:
            committed = self._take(message)
        finally:
            if turn is not None:
                self.turns.done(*turn)
        if committed is not None:
            await self._committed(committed)

    def _take(self, message: NatsMessage) -> asyncio.Future[int | None] | None:
        subject = message.raw_message.subject
        channel = LIFECYCLE_CHANNELS.get(subject)
        if channel is not None:
            # A ValidationError is turned into a MessageRejected by the broker's middleware.
            event = channel.event.model_validate_json(message.body)
            if not has_webhook(event):  # type: ignore[arg-type]
                return None  # a node's terminal report: task.ended tells the end
            return self._queue(self._enqueued(event))  # type: ignore[arg-type]
        numbered = NUMBERED_ELSEWHERE.get(subject)
        if numbered is not None:
            # No webhook, but its number may be the previous of one that has: noted.
            noted = numbered.event.model_validate_json(message.body)
            return self._note(noted)  # type: ignore[arg-type]
        return None  # task.submitted, task.profiled, ...: nothing to tell AllData

    def _note(self, event: TaskEvent) -> asyncio.Future[int | None] | None:
        """A numbered task event with no webhook, recorded so it completes its chain."""
        sequence = event.task_sequence
        if sequence is None:
            return None
        task_id = str(getattr(event, "task_id"))  # noqa: B009 - every task event has one
        return self._queue(
            Enqueued(
                source_event_id=event.event_id,
                endpoints=[],
                task_id=task_id,
                task_status="",
                event_type=type(event).__name__,
                payload="",
                order=Recorded(str(event.event_id), sequence.number, sequence.previous),
            )
        )

    async def _record_batches(self) -> None:
        while self._unrecorded:
            batch, self._unrecorded = self._unrecorded, []
            try:
                created = await self.log.enqueue_many([event for event, _ in batch])
            except Exception:
                log.debug("recording %d events together failed; one by one", len(batch))
                await self._record_one_by_one(batch)
                continue
            for (_, committed), count in zip(batch, created, strict=True):
                if not committed.done():
                    committed.set_result(count)

    async def _record_one_by_one(
        self, batch: list[tuple[Enqueued, asyncio.Future[int | None]]]
    ) -> None:
        for event, committed in batch:
            try:
                [count] = await self.log.enqueue_many([event])
            except Exception as error:
                if not committed.done():
                    committed.set_exception(error)
                continue
            if not committed.done():
                committed.set_result(count)

    def _enqueued(self, event: LifecycleEvent) -> Enqueued:
        body = webhook_body(event)
        event_type = type(event).__name__
        status = body.status.value
        return Enqueued(
            source_event_id=event.event_id,
            endpoints=[e.name for e in self.endpoints if e.wants(event_type, status)],
            formats={e.name: e.format for e in self.endpoints},
            task_id=body.task_id,
            task_status=status,
            event_type=event_type,
            payload=body.encode().decode(),
            configured=bool(self.endpoints),
            order=order_of(event),
            hold_seconds=self.order_wait_seconds,
            ends=ends_task(body),
            lifecycle=in_lifecycle(body),
            attempt=body.attempt,
        )


# The subjects the callback turns into webhooks, and what each carries (of task.status, only
# `running`: payload.has_webhook).
LIFECYCLE_CHANNELS: dict[str, Channel] = {
    channel.subject: channel
    for channel in (
        Subjects.ALLOCATION_GRANTED,
        Subjects.TASK_PENDING,
        Subjects.TASK_ESCALATED,
        Subjects.TASK_REJECTED,
        Subjects.TASK_PREEMPTED,
        Subjects.TASK_ENDED,
        Subjects.TASK_STATUS,
        Subjects.TASK_UNDERUTILIZED,
    )
}


# Numbered task events on the consumed streams that AllData is not told of (allocation.released:
# the end, or the next attempt's `pending`, says what AllData needs): recorded all the same,
# as links in their task's chain.
NUMBERED_ELSEWHERE: dict[str, Channel] = {
    channel.subject: channel
    for channel in Subjects.ALL
    if channel.stream in (Streams.TASKS, Streams.ALLOCATIONS)
    and issubclass(channel.event, TaskEvent)
    and channel.subject not in LIFECYCLE_CHANNELS
}


def order_of(event: LifecycleEvent) -> Recorded:
    """What places the event among its task's events: the scheduler's number, or for a node's
    report, or an SLA breach, the allocation it is about (it comes after that allocation's
    grant)."""
    event_id = str(event.event_id)
    if isinstance(event, TaskStatusReported | TaskUnderutilized):
        return Recorded(event_id, allocation_id=event.allocation_id)
    sequence = event.task_sequence
    return Recorded(
        event_id,
        number=sequence.number if sequence else None,
        previous=sequence.previous if sequence else None,
        allocation_id=event.allocation_id if isinstance(event, AllocationGranted) else None,
        grants=isinstance(event, AllocationGranted),
    )


def build(settings: CallbackSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or CallbackSettings()
    service = create_service("callback", settings)
    # httpx logs every request at INFO: too chatty for a per-event path (metrics count them).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    endpoints = settings.endpoints()
    sessions = service.database(MIGRATIONS_DIR)
    relay = OutboxRelay(sessions, tables.outbox, service.broker)
    metrics = WebhookMetrics(service.registry)
    delivery_log = DeliveryLog(sessions, on_superseded=metrics.count_superseded)
    longest_timeout = max((e.timeout_seconds for e in endpoints), default=10.0)
    dispatcher = Dispatcher(
        delivery_log=delivery_log,
        routes=[
            Route(
                WebhookSender.for_endpoint(endpoint),
                CircuitBreaker(
                    failure_threshold=settings.breaker_failures,
                    cooldown_seconds=settings.breaker_cooldown_seconds,
                    max_cooldown_seconds=settings.breaker_max_cooldown_seconds,
                ),
                endpoint.max_in_flight,
            )
            for endpoint in endpoints
        ],
        policy=settings.policy(),
        rng=random.Random(settings.retry_seed),
        metrics=metrics,
        claim_seconds=settings.claim_seconds or longest_timeout + 10.0,
        poll_seconds=settings.poll_seconds,
        on_commit=relay.wake,
    )
    recorder = Recorder(delivery_log, endpoints, dispatcher, settings.order_wait_seconds)
    service.state = dispatcher

    batch = settings.consumer_batch
    broker, name = service.broker, service.name

    # One consumer per stream, so a stream's events are recorded in the order published.
    @durable_stream(broker, Streams.TASKS, name, batch=batch)
    async def on_task_event(message: NatsMessage) -> None:
        await recorder.on_message(message)

    @durable_stream(broker, Streams.ALLOCATIONS, name, batch=batch)
    async def on_allocation_event(message: NatsMessage) -> None:
        await recorder.on_message(message)

    async def start_loops() -> None:
        if not endpoints:
            # Said once here; each skipped delivery is still recorded in the delivery log.
            log.warning(
                "no webhook endpoint (CRATER_CALLBACK_WEBHOOK_URL, CRATER_CALLBACK_ENDPOINTS_FILE)"
                ": webhooks are recorded as skipped, not sent"
            )
        relay.start()  # after the broker connects: the relay publishes through it
        dispatcher.start()

    async def stop_loops() -> None:
        await dispatcher.stop()
        await relay.stop()

    service.after_startup.append(start_loops)
    service.on_shutdown.append(stop_loops)
    service.after_shutdown.append(dispatcher.aclose)
    app = service.asgi()
    return service, app


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.callback.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
