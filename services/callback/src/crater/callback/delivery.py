"""The delivery loop: sends due deliveries from the log, in order per task and endpoint,
concurrently across tasks and endpoints, with retries scheduled in the log (never slept on
in a consumer), a circuit breaker per endpoint, and every attempt recorded.

Per endpoint at most `max_in_flight` POSTs run at once; a task's next delivery to an endpoint
only becomes due once the earlier one is settled (delivered or dead-lettered), which the log's
`due` query enforces, so order holds across replicas and restarts too. Claiming is where the
guard (domain/lifecycle.py) judges a delivery for good: one that would tell a second end,
something after the end, or something out of order is superseded instead of sent.

Batched: one transaction finds and claims the due deliveries of every endpoint with room (while
POSTs are under way, once a quarter of its slots are free: `Route.claim_at`); the attempts
that finish while a commit is under way are recorded together in the next one (a POST's task
ends once its attempt is committed). A crash between a POST and its commit leaves
the claim to lapse: the delivery goes again with the same webhook-id, which receivers drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from crater.callback.adapters.sender import Response, WebhookSender
from crater.callback.adapters.store import Attempt, DeliveryLog, Due, Settlement
from crater.callback.domain.breaker import CircuitBreaker
from crater.callback.domain.lifecycle import Superseded
from crater.callback.domain.payload import render
from crater.callback.domain.retry import (
    DeliveryState,
    Outcome,
    RetryPolicy,
    classify,
    delay_before_retry,
    state_after,
)
from crater.contracts import WebhookDeadLettered, WebhookDelivered, derived_event_id
from crater.runtime.telemetry import current_trace_context

log = logging.getLogger("crater.callback")


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter(
            "crater_webhook_attempts",
            "Webhook POSTs, by endpoint and verdict (delivered, retry, give_up).",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.failures = Counter(
            "crater_webhook_failures",
            "Failed webhook POSTs, by endpoint and reason (timeout, connection, http_<code>).",
            ["endpoint", "reason"],
            registry=registry,
        )
        self.latency = Histogram(
            "crater_webhook_latency_seconds",
            "Time from sending a webhook to its response (or timeout), by endpoint.",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry,
        )
        self.deliveries = Counter(
            "crater_webhook_deliveries",
            "Settled webhook deliveries, by endpoint and final state (delivered, dead, skipped).",
            ["endpoint", "state"],
            registry=registry,
        )
        self.backlog = Gauge(
            "crater_webhook_backlog",
            "Deliveries pending (due or waiting for a retry), by endpoint.",
            ["endpoint"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "crater_webhook_in_flight",
            "Webhook POSTs under way, by endpoint.",
            ["endpoint"],
            registry=registry,
        )
        self.superseded = Counter(
            "crater_webhook_superseded",
            "Deliveries recorded and never sent, by endpoint and reason (second_end, after_end, "
            "out_of_order, no_grant, repeat, ended): AllData must not hear them "
            "(domain/lifecycle.py).",
            ["endpoint", "reason"],
            registry=registry,
        )
        self.circuit_open = Gauge(
            "crater_webhook_circuit_open",
            "1 while the endpoint's circuit breaker holds deliveries back.",
            ["endpoint"],
            registry=registry,
        )

    def count_superseded(self, endpoint: str, reason: Superseded) -> None:
        self.superseded.labels(endpoint=endpoint, reason=reason.value).inc()


@dataclass
class Route:
    """One endpoint as the loop drives it."""

    sender: WebhookSender
    breaker: CircuitBreaker
    max_in_flight: int
    in_flight: dict[int, asyncio.Task[None]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.sender.endpoint

    @property
    def claim_at(self) -> int:
        """Free slots worth a claim while POSTs are under way: a quarter of the endpoint's
        (at least one). Each finished POST wakes the loop; claiming on each would be one
        transaction per webhook under load (issue #19), and the POSTs still under way keep
        the endpoint busy meanwhile. With none under way, any free slot is claimed."""
        return max(1, self.max_in_flight // 4)


class Dispatcher:
    def __init__(
        self,
        *,
        delivery_log: DeliveryLog,
        routes: Sequence[Route],
        policy: RetryPolicy,
        rng: random.Random,
        metrics: WebhookMetrics,
        claim_seconds: float,
        poll_seconds: float = 1.0,
        backlog_seconds: float = 5.0,
        on_commit: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = delivery_log
        self.routes = {route.name: route for route in routes}
        self.policy = policy
        self.rng = rng
        self.metrics = metrics
        self.claim_seconds = claim_seconds
        self.poll_seconds = poll_seconds
        self.backlog_seconds = backlog_seconds
        self.on_commit = on_commit  # wakes the outbox relay
        self.clock = clock
        self.owner = str(uuid.uuid4())  # this replica's claims
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._backlog_at = float("-inf")
        # Attempts waiting for the next commit, and the task committing them.
        self._unrecorded: list[tuple[Settlement, asyncio.Future[bool]]] = []
        self._recording: asyncio.Task[None] | None = None
        self._settling: set[asyncio.Task[None]] = set()  # POSTs done, attempts not committed
        for route in routes:
            metrics.circuit_open.labels(endpoint=route.name).set(0)
            metrics.in_flight.labels(endpoint=route.name).set(0)

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="webhook-dispatcher")

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Start nothing more; let POSTs under way finish for `grace_seconds`, then abandon
        the rest and release their claims (they go again, same webhook-id, on restart)."""
        self._stopping = True
        self.wake()
        if self._task is not None:
            await self._task
            self._task = None
        pending = [t for route in self.routes.values() for t in route.in_flight.values()]
        if pending:
            await asyncio.wait(pending, timeout=grace_seconds)
        await self.abandon()

    async def abandon(self) -> None:
        """Cancel every POST under way without recording it, then release the claims."""
        for route in self.routes.values():
            ids = list(route.in_flight)
            tasks = list(route.in_flight.values())
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self._recording is not None:  # attempts already made are still recorded
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._recording
            for task in list(self._settling):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            with contextlib.suppress(Exception):
                await self.log.release(ids, self.owner)

    async def aclose(self) -> None:
        for route in self.routes.values():
            await route.sender.aclose()

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self.dispatch()
                await self._refresh_backlog()
            except Exception:
                log.exception("webhook dispatch failed; retrying")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_seconds):
                    await self._wake.wait()
            self._wake.clear()

    async def _refresh_backlog(self) -> None:
        if self.clock() - self._backlog_at < self.backlog_seconds:
            return
        self._backlog_at = self.clock()
        backlog = await self.log.backlog()
        for name in self.routes:
            self.metrics.backlog.labels(endpoint=name).set(backlog.get(name, 0))

    async def dispatch(self) -> int:
        """Start every delivery that may go now; how many were started."""
        now = datetime.now(UTC)
        until = now + timedelta(seconds=self.claim_seconds)
        wanted: dict[str, int] = {}
        for route in self.routes.values():
            free = route.max_in_flight - len(route.in_flight)
            if route.in_flight and free < route.claim_at:
                continue  # claimed when more POSTs are over: one transaction for several
            allowance = route.breaker.allowance(self.clock())
            self.metrics.circuit_open.labels(endpoint=route.name).set(int(allowance == 0))
            if allowance is not None:
                free = min(free, allowance)
            if free > 0:
                wanted[route.name] = free
        if not wanted or self._stopping:
            return 0
        busy = [i for route in self.routes.values() for i in route.in_flight]
        claim = await self.log.claim_due(wanted, self.owner, now, until, exclude=busy)
        if claim.superseded:
            self.wake()  # their tasks' next deliveries may be due now
        for delivery in claim.due:
            route = self.routes[delivery.endpoint]
            route.breaker.started(self.clock())
            route.in_flight[delivery.id] = asyncio.create_task(self._send(route, delivery))
        for name in wanted:
            self.metrics.in_flight.labels(endpoint=name).set(len(self.routes[name].in_flight))
        return len(claim.due)

    async def _record(self, settlement: Settlement) -> bool:
        """Record an attempt in the next commit, with whatever else finished meanwhile; True
        once committed, False if the claim was lost before."""
        committed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._unrecorded.append((settlement, committed))
        if self._recording is None or self._recording.done():
            self._recording = asyncio.create_task(self._record_batches())
        # Shielded: a POST task cancelled now still has its attempt recorded.
        return await asyncio.shield(committed)

    async def _record_batches(self) -> None:
        while self._unrecorded:
            batch, self._unrecorded = self._unrecorded, []
            try:
                recorded = await self.log.record_many(self.owner, [s for s, _ in batch])
            except Exception as error:
                for _, committed in batch:
                    if not committed.done():
                        committed.set_exception(error)
                continue
            for settlement, committed in batch:
                if not committed.done():
                    committed.set_result(settlement.delivery_id in recorded)

    async def _send(self, route: Route, delivery: Due) -> None:
        try:
            await self._attempt(route, delivery)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("webhook %s: recording the attempt failed", delivery.webhook_id)
        finally:
            self._posted(route, delivery)
            self.wake()  # the task's next delivery may be due now

    def _posted(self, route: Route, delivery: Due) -> None:
        """The POST is over: its slot is free for another (the endpoint's limit is on POSTs
        under way), while its attempt waits for the next commit; until then the delivery
        stays claimed, so nobody sends it again meanwhile, and its task's next one waits."""
        task = route.in_flight.pop(delivery.id, None)
        if task is not None and not task.done():
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
        self.metrics.in_flight.labels(endpoint=route.name).set(len(route.in_flight))

    async def _attempt(self, route: Route, delivery: Due) -> None:
        rendered = render(delivery.payload, delivery.format)
        response = await route.sender.post(rendered.body, delivery.webhook_id, rendered.headers)
        self._posted(route, delivery)
        self.wake()
        now = datetime.now(UTC)
        number = delivery.attempts + 1
        verdict = classify(response.status_code, response.retry_after, now)
        endpoint = route.name
        self.metrics.attempts.labels(endpoint=endpoint, outcome=verdict.outcome.value).inc()
        self.metrics.latency.labels(endpoint=endpoint).observe(response.latency_ms / 1000.0)
        if verdict.outcome is not Outcome.DELIVERED:
            self.metrics.failures.labels(endpoint=endpoint, reason=failure_reason(response)).inc()
        attempt = Attempt(
            number, verdict.outcome, response.status_code, response.latency_ms, response.error
        )
        state = state_after(self.policy, verdict, number, delivery.attempt_limit)
        next_at: datetime | None = None
        events: tuple[WebhookDelivered | WebhookDeadLettered, ...] = ()
        if state is DeliveryState.PENDING:
            delay = delay_before_retry(self.policy, number, verdict, self.rng)
            next_at = now + timedelta(seconds=delay)
            log.debug(
                "webhook %s for %s: attempt %d failed (%s); next in %.2f s",
                delivery.webhook_id,
                delivery.task_id,
                number,
                response.error,
                delay,
            )
        elif state is DeliveryState.DELIVERED:
            events = (delivered(delivery, number, response),)
        else:
            events = (dead_lettered(delivery, number, response.error or "gave up"),)
        # The breaker hears of the endpoint's health: only "not now" answers count against it.
        if verdict.outcome is Outcome.RETRY:
            if route.breaker.failed(self.clock()):
                log.warning(
                    "endpoint %s: %d consecutive failures, holding deliveries for %.0f s",
                    endpoint,
                    route.breaker.failures,
                    route.breaker.current_cooldown,
                )
                self.metrics.circuit_open.labels(endpoint=endpoint).set(1)
        elif route.breaker.succeeded():
            self.metrics.circuit_open.labels(endpoint=endpoint).set(0)
            moved = await self.log.pull_forward(endpoint, now)
            log.info("endpoint %s is back; %d waiting deliveries are due now", endpoint, moved)
        if not await self._record(Settlement(delivery.id, attempt, state, next_at, events)):
            log.warning("webhook %s: claim lost before recording its attempt", delivery.webhook_id)
            return
        if events:
            self.on_commit()
            self.metrics.deliveries.labels(endpoint=endpoint, state=state.value).inc()
        if state is DeliveryState.DEAD:
            log.warning(
                "webhook %s for %s to %s dead-lettered after %d attempts: %s",
                delivery.webhook_id,
                delivery.task_id,
                endpoint,
                number,
                response.error,
            )


def failure_reason(response: Response) -> str:
    if response.status_code is not None:
        return f"http_{response.status_code}"
    if response.error and response.error.startswith("timeout"):
        return "timeout"
    return "connection"


# Derived ids: settling one delivery twice publishes one outcome event (JetStream de-dup);
# an operator's retry or replay is another round, with ids of its own.


def _outcome_id(delivery: Due, what: str) -> UUID:
    suffix = f":{delivery.round}" if delivery.round else ""
    return derived_event_id(UUID(delivery.webhook_id), f"{what}:{delivery.endpoint}{suffix}")


def delivered(delivery: Due, attempts: int, response: Response) -> WebhookDelivered:
    assert response.status_code is not None
    return WebhookDelivered(
        event_id=_outcome_id(delivery, "webhook-delivered"),
        trace=current_trace_context(),
        webhook_id=delivery.webhook_id,
        source_event_id=UUID(delivery.webhook_id),
        task_id=delivery.task_id,
        task_status=delivery.task_status,
        endpoint=delivery.endpoint,
        status_code=response.status_code,
        attempts=attempts,
        latency_ms=response.latency_ms,
    )


def dead_lettered(delivery: Due, attempts: int, last_error: str) -> WebhookDeadLettered:
    return WebhookDeadLettered(
        event_id=_outcome_id(delivery, "webhook-dead-lettered"),
        trace=current_trace_context(),
        webhook_id=delivery.webhook_id,
        source_event_id=UUID(delivery.webhook_id),
        task_id=delivery.task_id,
        task_status=delivery.task_status,
        endpoint=delivery.endpoint,
        attempts=attempts,
        last_error=last_error,
    )
