"""Delivering one lifecycle event to AllData: in order per task, retried, logged, settled.

The consumer handlers call `Deliverer.deliver`; it returns once the outcome is committed, so
the message is acked only after the delivery log knows what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Histogram

from crater.callback.adapters.sender import Response, WebhookSender
from crater.callback.adapters.store import Attempt, Delivery, DeliveryLog
from crater.callback.domain.payload import LifecycleEvent, webhook_body
from crater.callback.domain.retry import (
    DeliveryState,
    RetryPolicy,
    classify,
    delay_before_retry,
    state_after,
)
from crater.contracts import WebhookBody, WebhookDeadLettered, WebhookDelivered, derived_event_id
from crater.runtime.telemetry import current_trace_context

log = logging.getLogger("crater.callback")

NO_ENDPOINT = ""  # the endpoint recorded for deliveries skipped because none is configured


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


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter(
            "crater_webhook_attempts",
            "Webhook POSTs, by endpoint and verdict (delivered, retry, give_up).",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "crater_webhook_latency_seconds",
            "Time from sending a webhook to its response (or timeout).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry,
        )
        self.deliveries = Counter(
            "crater_webhook_deliveries",
            "Settled webhook deliveries, by endpoint and final state (delivered, dead, skipped).",
            ["endpoint", "state"],
            registry=registry,
        )


class Deliverer:
    def __init__(
        self,
        *,
        delivery_log: DeliveryLog,
        sender: WebhookSender | None,
        policy: RetryPolicy,
        rng: random.Random,
        metrics: WebhookMetrics,
        on_commit: Callable[[], None] = lambda: None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.log = delivery_log
        self.sender = sender
        self.policy = policy
        self.rng = rng
        self.metrics = metrics
        self.on_commit = on_commit  # wakes the outbox relay
        self.sleep = sleep
        self.locks = TaskLocks()

    async def deliver(self, event: LifecycleEvent) -> DeliveryState | None:
        """Deliver `event`'s webhook; the final state, or None if it was settled before."""
        body = webhook_body(event)
        # Serialise per task: the consumers of different subjects run side by side.
        async with self.locks.hold(body.task_id):
            endpoint = self.sender.endpoint if self.sender else NO_ENDPOINT
            delivery = await self.log.open(
                webhook_id=str(event.event_id),
                endpoint=endpoint,
                task_id=body.task_id,
                task_status=body.status.value,
                event_type=type(event).__name__,
                payload=body.encode().decode(),
            )
            if delivery.state.is_final:
                log.debug("webhook %s already %s", event.event_id, delivery.state)
                return None
            if self.sender is None:
                return await self._skip(event, delivery)
            return await self._attempt_until_settled(event, body, delivery, self.sender)

    async def _skip(self, event: LifecycleEvent, delivery: Delivery) -> DeliveryState | None:
        if not await self.log.finish(delivery.id, event.event_id, DeliveryState.SKIPPED):
            return None
        self.metrics.deliveries.labels(endpoint=NO_ENDPOINT, state="skipped").inc()
        return DeliveryState.SKIPPED

    async def _attempt_until_settled(
        self, event: LifecycleEvent, body: WebhookBody, delivery: Delivery, sender: WebhookSender
    ) -> DeliveryState | None:
        payload = body.encode()
        webhook_id = str(event.event_id)
        number = delivery.attempts
        if number >= self.policy.max_attempts:
            # Redelivered after a crash that followed the last attempt: settle, do not POST.
            last_error = delivery.last_error or "attempts exhausted"
            dead = dead_lettered(event, body, sender.endpoint, number, last_error)
            return await self._settle(event, delivery, DeliveryState.DEAD, None, dead)
        while True:
            number += 1
            response = await sender.post(payload, webhook_id)
            verdict = classify(response.status_code, response.retry_after, datetime.now(UTC))
            outcome = verdict.outcome.value
            self.metrics.attempts.labels(endpoint=sender.endpoint, outcome=outcome).inc()
            self.metrics.latency.observe(response.latency_ms / 1000.0)
            attempt = Attempt(
                number, verdict.outcome, response.status_code, response.latency_ms, response.error
            )
            state = state_after(self.policy, verdict, number)
            if state is DeliveryState.PENDING:
                await self.log.record_attempt(delivery.id, attempt)
                delay = delay_before_retry(self.policy, number, verdict, self.rng)
                log.info(
                    "webhook %s for %s: attempt %d failed (%s); retrying in %.2f s",
                    webhook_id,
                    body.task_id,
                    number,
                    response.error,
                    delay,
                )
                await self.sleep(delay)
                continue
            settled: WebhookDelivered | WebhookDeadLettered
            if state is DeliveryState.DELIVERED:
                settled = delivered(event, body, sender.endpoint, number, response)
            else:
                error = response.error or "gave up"
                settled = dead_lettered(event, body, sender.endpoint, number, error)
            return await self._settle(event, delivery, state, attempt, settled)

    async def _settle(
        self,
        event: LifecycleEvent,
        delivery: Delivery,
        state: DeliveryState,
        attempt: Attempt | None,
        outcome: WebhookDelivered | WebhookDeadLettered,
    ) -> DeliveryState | None:
        if not await self.log.finish(delivery.id, event.event_id, state, attempt, (outcome,)):
            return None
        self.on_commit()
        self.metrics.deliveries.labels(endpoint=outcome.endpoint, state=state.value).inc()
        if isinstance(outcome, WebhookDeadLettered):
            log.warning(
                "webhook %s for %s dead-lettered after %d attempts: %s",
                outcome.webhook_id,
                outcome.task_id,
                outcome.attempts,
                outcome.last_error,
            )
        return state


# Derived ids: settling one delivery twice publishes one outcome event (JetStream de-dup).


def delivered(
    event: LifecycleEvent, body: WebhookBody, endpoint: str, attempts: int, response: Response
) -> WebhookDelivered:
    assert response.status_code is not None
    return WebhookDelivered(
        event_id=derived_event_id(event.event_id, f"webhook-delivered:{endpoint}"),
        trace=current_trace_context(),
        webhook_id=str(event.event_id),
        source_event_id=event.event_id,
        task_id=body.task_id,
        task_status=body.status.value,
        endpoint=endpoint,
        status_code=response.status_code,
        attempts=attempts,
        latency_ms=response.latency_ms,
    )


def dead_lettered(
    event: LifecycleEvent, body: WebhookBody, endpoint: str, attempts: int, last_error: str
) -> WebhookDeadLettered:
    return WebhookDeadLettered(
        event_id=derived_event_id(event.event_id, f"webhook-dead-lettered:{endpoint}"),
        trace=current_trace_context(),
        webhook_id=str(event.event_id),
        source_event_id=event.event_id,
        task_id=body.task_id,
        task_status=body.status.value,
        endpoint=endpoint,
        attempts=attempts,
        last_error=last_error,
    )
