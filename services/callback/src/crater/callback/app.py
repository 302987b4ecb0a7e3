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

A tenant's budget passed (`crater.v1.tenant.budget_exceeded`, from the predictor) is a
webhook too, on a consumer of its own: queued per tenant, outside any task's order.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from faststream.asgi import AsgiFastStream
from pydantic import Field, SecretStr, field_validator, model_validator

from crater.callback.adapters import tables
from crater.callback.adapters.sender import WebhookSender
from crater.callback.adapters.store import DeliveryLog
from crater.callback.delivery import Dispatcher, Route, WebhookMetrics
from crater.callback.domain.breaker import CircuitBreaker
from crater.callback.domain.endpoints import Endpoint, load_endpoints
from crater.callback.domain.payload import WebhookFormat
from crater.callback.domain.retry import RetryPolicy
from crater.callback.domain.signing import decode_secret
from crater.callback.service_layer.recorder import (
    CONSUMED,
    LIFECYCLE_CHANNELS,
    NUMBERED_ELSEWHERE,
    Recorder,
    order_of,
)
from crater.contracts import (
    Event,
    QuerySubjects,
    Streams,
    Subjects,
    TenantBudgetExceeded,
    WebhookDeliveriesAnswer,
    WebhookDeliveriesQuery,
)
from crater.runtime.batches import Outcome, Received, batch_durable_stream
from crater.runtime.bus import durable
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

    def unsafe_defaults(self) -> list[str]:
        """Unsigned webhooks, and Basic auth with an empty password, per endpoint."""
        if self.endpoints_file:
            try:
                endpoints = load_endpoints(self.endpoints_file)
            except (OSError, ValueError):
                return []  # build() reports the file's own error
            secret, password = "secret", "password"
            where = f"{self.variable('endpoints_file')} {self.endpoints_file}, endpoint "
        else:
            endpoints = self.endpoints()
            secret = f"{self.variable('webhook_secret')} (or _FILE)"
            password = f"{self.variable('webhook_password')} (or _FILE)"
            where = "endpoint "
        unsafe = []
        for endpoint in endpoints:
            if endpoint.secret is None:
                unsafe.append(f"{where}{endpoint.name}: unsigned webhooks: set {secret}")
            if endpoint.username and not endpoint.password.get_secret_value():
                unsafe.append(
                    f"{where}{endpoint.name}: Basic auth user {endpoint.username!r} with an "
                    f"empty password: set {password}"
                )
        return unsafe

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


__all__ = [
    "LIFECYCLE_CHANNELS",
    "MIGRATIONS_DIR",
    "NUMBERED_ELSEWHERE",
    "CallbackSettings",
    "Recorder",
    "build",
    "create_app",
    "main",
    "order_of",
]


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

    # One consumer per stream, so a stream's events are recorded in the order published; a
    # pull batch at a time (crater.runtime.batches), in the recorder's group commit.
    @batch_durable_stream(broker, Streams.TASKS, name, CONSUMED, batch=batch)
    async def on_task_events(received: list[Received[Event]]) -> list[Outcome]:
        return await recorder.record_batch([r.event for r in received])

    @batch_durable_stream(broker, Streams.ALLOCATIONS, name, CONSUMED, batch=batch)
    async def on_allocation_events(received: list[Received[Event]]) -> list[Outcome]:
        return await recorder.record_batch([r.event for r in received])

    service.consume(on_task_events)
    service.consume(on_allocation_events)

    # Any replica answers from the shared log: the first answer is taken.
    @broker.subscriber(QuerySubjects.WEBHOOKS, title="callback-query-webhooks")
    async def on_webhooks_query(event: WebhookDeliveriesQuery) -> WebhookDeliveriesAnswer:
        return await delivery_log.of_task(event)

    # A tenant's budget passed: a webhook of its own (queued per tenant, not per task).
    @durable(broker, Subjects.TENANT_BUDGET_EXCEEDED, name, batch=batch)
    async def on_budget_exceeded(event: TenantBudgetExceeded) -> None:
        await recorder.record_budget(event)

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
