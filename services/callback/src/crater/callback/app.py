"""Callback wiring: task and allocation lifecycle events -> webhooks to AllData.

One durable consumer per lifecycle subject; each handler only records the event's deliveries
(one per endpoint that wants it, due now) with its inbox mark and returns, so the message is
acked right after that commit and the bus is never held by a slow or absent receiver. The
delivery loop (`delivery.Dispatcher`) sends due deliveries, retries on a schedule that can
reach hours, and settles each with an outcome event through the outbox.

Order: deliveries of one task to one endpoint go in the order they were recorded, which is
the order the consumers took the events in. Strict cross-stream order (a TaskPending on
CRATER_TASKS emitted before an AllocationGranted on CRATER_ALLOCATIONS but consumed late) is
NOT guaranteed yet: that needs a per-task sequence stamped by the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path

from faststream.asgi import AsgiFastStream
from pydantic import Field, SecretStr, field_validator, model_validator

from crater.callback.adapters import tables
from crater.callback.adapters.sender import WebhookSender
from crater.callback.adapters.store import DeliveryLog
from crater.callback.delivery import Dispatcher, Route, WebhookMetrics
from crater.callback.domain.breaker import CircuitBreaker
from crater.callback.domain.endpoints import Endpoint, load_endpoints
from crater.callback.domain.payload import LifecycleEvent, webhook_body
from crater.callback.domain.retry import RetryPolicy
from crater.callback.domain.signing import decode_secret
from crater.contracts import (
    AllocationGranted,
    Subjects,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskStatusReported,
    WebhookBody,
)
from crater.runtime.bus import durable
from crater.runtime.outbox import OutboxRelay
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings

MIGRATIONS_DIR = Path(__file__).parent / "adapters" / "migrations"

log = logging.getLogger("crater.callback")


class CallbackSettings(ServiceSettings):
    """Own settings from CRATER_CALLBACK_<NAME> (CRATER_CALLBACK_WEBHOOK_URL, ...)."""

    service = "callback"

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
            )
        ]

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            initial_backoff_seconds=self.initial_backoff_seconds,
            max_backoff_seconds=self.max_backoff_seconds,
        )


class TaskLocks:
    """One asyncio.Lock per task id, dropped when nobody holds or waits for it.

    asyncio.Lock wakes waiters first come, first served, so events of one task that reach
    `hold` in consumption order are delivered in that order.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, task_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(task_id, (asyncio.Lock(), 0))
        self._locks[task_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[task_id]
            if users == 1:
                del self._locks[task_id]
            else:
                self._locks[task_id] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


class Recorder:
    """What the consumers do: record an event's deliveries and wake the delivery loop.

    The messages of a pulled batch are handled concurrently, so the recording of one task's
    events is serialised (in the order the handlers start, which is consumption order): the
    ids they get, and so the order they are sent in, follow the events.
    """

    def __init__(
        self, delivery_log: DeliveryLog, endpoints: list[Endpoint], dispatcher: Dispatcher
    ) -> None:
        self.log = delivery_log
        self.endpoints = endpoints
        self.dispatcher = dispatcher
        self.locks = TaskLocks()

    async def record(self, event: LifecycleEvent) -> int | None:
        body = webhook_body(event)
        event_type = type(event).__name__
        async with self.locks.hold(body.task_id):
            created = await self._enqueue(event, body.task_id, body.status.value, event_type, body)
        if created:
            self.dispatcher.wake()
        return created

    async def _enqueue(
        self, event: LifecycleEvent, task_id: str, status: str, event_type: str, body: WebhookBody
    ) -> int | None:
        return await self.log.enqueue(
            source_event_id=event.event_id,
            endpoints=[e.name for e in self.endpoints if e.wants(event_type, status)],
            task_id=task_id,
            task_status=status,
            event_type=event_type,
            payload=body.encode().decode(),
            configured=bool(self.endpoints),
        )


def build(settings: CallbackSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or CallbackSettings()
    service = create_service("callback", settings)
    # httpx logs every request at INFO: too chatty for a per-event path (metrics count them).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    endpoints = settings.endpoints()
    sessions = service.database(MIGRATIONS_DIR)
    relay = OutboxRelay(sessions, tables.outbox, service.broker)
    delivery_log = DeliveryLog(sessions)
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
        metrics=WebhookMetrics(service.registry),
        claim_seconds=settings.claim_seconds or longest_timeout + 10.0,
        poll_seconds=settings.poll_seconds,
        on_commit=relay.wake,
    )
    recorder = Recorder(delivery_log, endpoints, dispatcher)
    service.state = dispatcher

    batch = settings.consumer_batch
    broker, name = service.broker, service.name

    # Handlers name their message `event` (rejections report field paths below it).
    @durable(broker, Subjects.ALLOCATION_GRANTED, name, batch=batch)
    async def on_allocation_granted(event: AllocationGranted) -> None:
        await recorder.record(event)

    @durable(broker, Subjects.TASK_PENDING, name, batch=batch)
    async def on_task_pending(event: TaskPending) -> None:
        await recorder.record(event)

    @durable(broker, Subjects.TASK_REJECTED, name, batch=batch)
    async def on_task_rejected(event: TaskRejected) -> None:
        await recorder.record(event)

    @durable(broker, Subjects.TASK_PREEMPTED, name, batch=batch)
    async def on_task_preempted(event: TaskPreempted) -> None:
        await recorder.record(event)

    @durable(broker, Subjects.TASK_STATUS, name, batch=batch)
    async def on_task_status(event: TaskStatusReported) -> None:
        await recorder.record(event)

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
