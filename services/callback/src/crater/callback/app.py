"""Callback wiring: task and allocation lifecycle events -> webhooks to AllData.

One durable consumer per lifecycle subject; each message is delivered (with retries) inside
its handler and acked after the delivery log commits. Deliveries of one task are serialised
by a per-task lock, which keeps them in order within a subject and in arrival order across
subjects. Strict cross-stream order (a TaskPending on CRATER_TASKS that the scheduler emitted
before an AllocationGranted on CRATER_ALLOCATIONS, consumed late) is NOT guaranteed yet: a
later issue must order by a per-task sequence the scheduler stamps on its events (holding
back gaps), or consume both subjects through one ordered consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path

from faststream.asgi import AsgiFastStream
from faststream.nats.annotations import NatsMessage
from pydantic import Field, SecretStr, field_validator

from crater.callback.adapters import tables
from crater.callback.adapters.sender import WebhookSender
from crater.callback.adapters.store import DeliveryLog
from crater.callback.delivery import Deliverer, WebhookMetrics
from crater.callback.domain.payload import LifecycleEvent
from crater.callback.domain.retry import RetryPolicy
from crater.contracts import (
    AllocationGranted,
    Subjects,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskStatusReported,
)
from crater.runtime.bus import durable
from crater.runtime.db import make_engine, make_session_factory, upgrade_to_head_async
from crater.runtime.outbox import OutboxRelay
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings

MIGRATIONS_DIR = Path(__file__).parent / "adapters" / "migrations"
# A third of JetStream's default 30 s ack wait: a message being retried is never redelivered
# to another replica while its handler still works on it.
HEARTBEAT_SECONDS = 10.0

log = logging.getLogger("crater.callback")


class CallbackSettings(ServiceSettings):
    """Own settings from CRATER_CALLBACK_<NAME> (CRATER_CALLBACK_WEBHOOK_URL, ...)."""

    service = "callback"

    webhook_url: str | None = Field(
        default=None,
        max_length=512,
        description="AllData's webhook endpoint; unset: deliveries are recorded as skipped.",
    )
    webhook_username: str = Field(default="", description="HTTP Basic auth user.")
    webhook_password: SecretStr = Field(default=SecretStr(""), description="HTTP Basic auth.")
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    max_attempts: int = Field(default=5, ge=1, le=100, description="POSTs before dead letter.")
    initial_backoff_seconds: float = Field(default=0.5, ge=0, le=300)
    max_backoff_seconds: float = Field(
        default=5.0, ge=0, le=300, description="Cap on one wait between attempts."
    )
    retry_seed: int | None = Field(default=None, description="Seed the backoff jitter.")

    @field_validator("webhook_url")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return value.strip()


@contextlib.asynccontextmanager
async def heartbeat(message: NatsMessage, every: float = HEARTBEAT_SECONDS) -> AsyncIterator[None]:
    """Tell JetStream the message is still being worked on while retries and waits go on."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await message.in_progress()
            except Exception:  # a lost connection: the redelivery is harmless, carry on
                log.debug("could not extend the ack deadline", exc_info=True)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def build(settings: CallbackSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or CallbackSettings()
    service = create_service("callback", settings)
    # httpx logs every request at INFO: too chatty for a per-event path (metrics count them).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    engine = make_engine(settings.database_url)
    sessions = make_session_factory(engine)
    relay = OutboxRelay(sessions, tables.outbox, service.broker)
    sender = (
        WebhookSender(
            settings.webhook_url,
            settings.webhook_username,
            settings.webhook_password.get_secret_value(),
            settings.webhook_timeout_seconds,
        )
        if settings.webhook_url
        else None
    )
    deliverer = Deliverer(
        delivery_log=DeliveryLog(sessions),
        sender=sender,
        policy=RetryPolicy(
            max_attempts=settings.max_attempts,
            initial_backoff_seconds=settings.initial_backoff_seconds,
            max_backoff_seconds=settings.max_backoff_seconds,
        ),
        rng=random.Random(settings.retry_seed),
        metrics=WebhookMetrics(service.registry),
        on_commit=relay.wake,
    )

    async def deliver(event: LifecycleEvent, message: NatsMessage) -> None:
        async with heartbeat(message):
            await deliverer.deliver(event)

    batch = settings.consumer_batch
    broker, name = service.broker, service.name

    # Handlers name their message `event` (rejections report field paths below it).
    @durable(broker, Subjects.ALLOCATION_GRANTED, name, batch=batch)
    async def on_allocation_granted(event: AllocationGranted, message: NatsMessage) -> None:
        await deliver(event, message)

    @durable(broker, Subjects.TASK_PENDING, name, batch=batch)
    async def on_task_pending(event: TaskPending, message: NatsMessage) -> None:
        await deliver(event, message)

    @durable(broker, Subjects.TASK_REJECTED, name, batch=batch)
    async def on_task_rejected(event: TaskRejected, message: NatsMessage) -> None:
        await deliver(event, message)

    @durable(broker, Subjects.TASK_PREEMPTED, name, batch=batch)
    async def on_task_preempted(event: TaskPreempted, message: NatsMessage) -> None:
        await deliver(event, message)

    @durable(broker, Subjects.TASK_STATUS, name, batch=batch)
    async def on_task_status(event: TaskStatusReported, message: NatsMessage) -> None:
        await deliver(event, message)

    async def migrate() -> None:
        if settings.migrate_on_start:
            await upgrade_to_head_async(settings.database_url, MIGRATIONS_DIR)

    async def start_relay() -> None:
        if sender is None:
            # Said once here; each skipped delivery is still recorded in the delivery log.
            log.warning(
                "CRATER_CALLBACK_WEBHOOK_URL is unset: webhooks are recorded as skipped, not sent"
            )
        relay.start()  # after the broker connects: the relay publishes through it

    async def release() -> None:
        if sender is not None:
            await sender.aclose()
        await engine.dispose()

    service.on_startup.append(migrate)
    service.after_startup.append(start_relay)
    service.on_shutdown.append(relay.stop)
    app = service.asgi()
    app.after_shutdown(release)  # after the consumers stop: none still needs the database
    return service, app


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.callback.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
