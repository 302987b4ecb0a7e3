"""The delivery log in the database: one row per (source event, endpoint), one per attempt.

The consumers only record deliveries (pending, due now) together with their inbox mark, and
ack after that commit; the delivery loop claims due deliveries, sends them, and commits each
attempt with the delivery's new state (and, once settled, its outcome event in the outbox) in
one transaction. A claim lapses after a while, so a crashed replica's deliveries are sent again
by whoever comes next, with the same webhook-id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import async_sessionmaker

from crater.callback.adapters import tables
from crater.callback.domain.retry import DeliveryState, Outcome
from crater.contracts import Event
from crater.runtime.outbox import first_delivery, stage

CONSUMER = "callback"
NO_ENDPOINT = ""  # the endpoint recorded for deliveries skipped because none is configured

d = tables.deliveries.c
SETTLED = (DeliveryState.DELIVERED.value, DeliveryState.DEAD.value)


@dataclass(frozen=True)
class Attempt:
    """One POST and what came of it; `status_code` None: no response (timeout, connection)."""

    number: int
    outcome: Outcome
    status_code: int | None
    latency_ms: float
    error: str | None


@dataclass(frozen=True)
class Due:
    """A delivery the loop may send now: the head of its (task, endpoint) queue."""

    id: int
    webhook_id: str
    endpoint: str
    task_id: str
    task_status: str
    payload: str
    attempts: int
    round: int
    attempt_limit: int | None


@dataclass(frozen=True)
class DeliveryRow:
    """A delivery as operators see it (`crater webhooks list`)."""

    id: int
    webhook_id: str
    endpoint: str
    task_id: str
    task_status: str
    event_type: str
    state: str
    attempts: int
    round: int
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    next_attempt_at: datetime | None


def utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every time stored here is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


class DeliveryLog:
    def __init__(self, sessions: async_sessionmaker[Any], consumer: str = CONSUMER) -> None:
        self.sessions = sessions
        self.consumer = consumer

    # The consumers' side -------------------------------------------------------------------

    async def enqueue(
        self,
        *,
        source_event_id: UUID,
        endpoints: Sequence[str],
        task_id: str,
        task_status: str,
        event_type: str,
        payload: str,
        configured: bool = True,
    ) -> int | None:
        """Record the event's deliveries, due now, with its inbox mark; None if this consumer
        saw the event before (nothing written). With no endpoint configured at all, one
        delivery is recorded as skipped. Returns how many deliveries were created."""
        webhook_id = str(source_event_id)
        now = datetime.now(UTC)
        async with self.sessions() as session:
            if not await first_delivery(session, tables.inbox, self.consumer, source_event_id):
                await session.rollback()
                return None
            existing = set(
                (await session.scalars(select(d.endpoint).where(d.webhook_id == webhook_id))).all()
            )
            common = {
                "webhook_id": webhook_id,
                "task_id": task_id,
                "task_status": task_status,
                "event_type": event_type,
                "attempts": 0,
                "round": 0,
                "payload": payload,
                "created_at": now,
                "updated_at": now,
            }
            if configured:
                rows = [
                    common
                    | {
                        "endpoint": name,
                        "state": DeliveryState.PENDING.value,
                        "next_attempt_at": now,
                    }
                    for name in endpoints
                    if name not in existing
                ]
            else:
                rows = [
                    common
                    | {
                        "endpoint": NO_ENDPOINT,
                        "state": DeliveryState.SKIPPED.value,
                        "completed_at": now,
                    }
                ]
            if rows:
                await session.execute(insert(tables.deliveries), rows)
            await session.commit()
            return len(rows)

    # The delivery loop's side --------------------------------------------------------------

    async def due(
        self, endpoint: str, now: datetime, limit: int, exclude: Sequence[int] = ()
    ) -> list[Due]:
        """Up to `limit` deliveries to `endpoint` that may go now, oldest first: pending, due,
        unclaimed (or their claim lapsed), and with no earlier pending delivery of their task
        to this endpoint (a task's deliveries go one after another, in order)."""
        if limit <= 0:
            return []
        earlier = tables.deliveries.alias("earlier")
        blocked = (
            select(earlier.c.id)
            .where(
                earlier.c.task_id == d.task_id,
                earlier.c.endpoint == d.endpoint,
                earlier.c.state == DeliveryState.PENDING.value,
                earlier.c.id < d.id,
            )
            .exists()
        )
        query = (
            select(
                d.id,
                d.webhook_id,
                d.endpoint,
                d.task_id,
                d.task_status,
                d.payload,
                d.attempts,
                d.round,
                d.attempt_limit,
            )
            .where(
                d.endpoint == endpoint,
                d.state == DeliveryState.PENDING.value,
                d.next_attempt_at <= now,
                or_(d.claimed_until.is_(None), d.claimed_until < now),
                ~blocked,
            )
            .order_by(d.id)
            .limit(limit + len(exclude))
        )
        skip = set(exclude)
        async with self.sessions() as session:
            rows = (await session.execute(query)).all()
        return [Due(*row) for row in rows if row.id not in skip][:limit]

    async def claim(
        self, ids: Sequence[int], owner: str, now: datetime, until: datetime
    ) -> set[int]:
        """Claim these deliveries for `owner` until `until`; the ids actually claimed (another
        replica may have taken some since they were read)."""
        if not ids:
            return set()
        async with self.sessions() as session:
            result = await session.execute(
                update(tables.deliveries)
                .where(
                    d.id.in_(list(ids)),
                    d.state == DeliveryState.PENDING.value,
                    or_(d.claimed_until.is_(None), d.claimed_until < now),
                )
                .values(claimed_by=owner, claimed_until=until)
                .returning(d.id)
            )
            claimed = {int(row_id) for (row_id,) in result.all()}
            await session.commit()
        return claimed

    async def release(self, ids: Sequence[int], owner: str) -> None:
        """Give up claims without an attempt (the service stops): due again at once."""
        if not ids:
            return
        async with self.sessions() as session:
            await session.execute(
                update(tables.deliveries)
                .where(d.id.in_(list(ids)), d.claimed_by == owner)
                .values(claimed_by=None, claimed_until=None)
            )
            await session.commit()

    async def record(
        self,
        delivery_id: int,
        owner: str,
        attempt: Attempt,
        state: DeliveryState,
        next_attempt_at: datetime | None = None,
        events: tuple[Event, ...] = (),
    ) -> bool:
        """One attempt, the delivery's new state and (when settled) its outcome events, in one
        transaction. False, with nothing written, if the claim was lost meanwhile."""
        now = datetime.now(UTC)
        final = state.is_final
        async with self.sessions() as session:
            result = await session.execute(
                update(tables.deliveries)
                .where(
                    d.id == delivery_id,
                    d.claimed_by == owner,
                    d.state == DeliveryState.PENDING.value,
                )
                .values(
                    state=state.value,
                    attempts=attempt.number,
                    last_status_code=attempt.status_code,
                    last_error=attempt.error,
                    updated_at=now,
                    completed_at=now if final else None,
                    next_attempt_at=None if final else next_attempt_at,
                    claimed_by=None,
                    claimed_until=None,
                )
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                await session.rollback()
                return False
            await session.execute(
                insert(tables.attempts).values(
                    delivery_id=delivery_id,
                    attempt=attempt.number,
                    outcome=attempt.outcome.value,
                    status_code=attempt.status_code,
                    latency_ms=attempt.latency_ms,
                    error=attempt.error,
                    attempted_at=now,
                )
            )
            await stage(session, tables.outbox, *events)
            await session.commit()
            return True

    async def pull_forward(self, endpoint: str, now: datetime) -> int:
        """The endpoint is back: what waits in backoff for it is due now."""
        async with self.sessions() as session:
            result = await session.execute(
                update(tables.deliveries)
                .where(
                    d.endpoint == endpoint,
                    d.state == DeliveryState.PENDING.value,
                    d.next_attempt_at > now,
                )
                .values(next_attempt_at=now)
            )
            await session.commit()
            return int(result.rowcount)  # type: ignore[attr-defined]

    async def backlog(self) -> dict[str, int]:
        """Pending deliveries per endpoint."""
        async with self.sessions() as session:
            rows = (
                await session.execute(
                    select(d.endpoint, func.count())
                    .where(d.state == DeliveryState.PENDING.value)
                    .group_by(d.endpoint)
                )
            ).all()
        return {endpoint: int(count) for endpoint, count in rows}

    # The operators' side -------------------------------------------------------------------

    async def list(
        self,
        *,
        state: str | None = None,
        task_id: str | None = None,
        endpoint: str | None = None,
        since: datetime | None = None,
        limit: int = 50,
    ) -> list[DeliveryRow]:
        """Deliveries, newest first."""
        query = select(
            d.id,
            d.webhook_id,
            d.endpoint,
            d.task_id,
            d.task_status,
            d.event_type,
            d.state,
            d.attempts,
            d.round,
            d.last_status_code,
            d.last_error,
            d.created_at,
            d.updated_at,
            d.next_attempt_at,
        )
        query = query.where(*_filters(state, task_id, endpoint, since))
        async with self.sessions() as session:
            rows = (await session.execute(query.order_by(d.id.desc()).limit(limit))).all()
        found = []
        for row in rows:
            values = dict(row._mapping)
            for key in ("created_at", "updated_at", "next_attempt_at"):
                values[key] = utc(values[key])
            found.append(DeliveryRow(**values))
        return found

    async def retry(self, delivery_id: int, max_attempts: int) -> bool:
        """Send one delivery again now: a settled one starts a new round of `max_attempts`
        attempts (same webhook-id); a pending one is due at once. False if there is none."""
        async with self.sessions() as session:
            found = await session.scalar(
                select(d.id).where(d.id == delivery_id, d.endpoint != NO_ENDPOINT)
            )
        if found is None:
            return False
        await self._reopen(d.id == delivery_id, max_attempts)
        return True

    async def replay(
        self,
        since: datetime,
        max_attempts: int,
        *,
        state: str | None = None,
        endpoint: str | None = None,
        task_id: str | None = None,
    ) -> int:
        """Send again every delivery recorded since `since` (one with an endpoint): how many."""
        condition = and_(*_filters(state, task_id, endpoint, since), d.endpoint != NO_ENDPOINT)
        return await self._reopen(condition, max_attempts)

    async def _reopen(self, condition: Any, max_attempts: int) -> int:
        now = datetime.now(UTC)
        async with self.sessions() as session:
            settled = await session.execute(
                update(tables.deliveries)
                .where(condition, d.state.in_(SETTLED))
                .values(
                    state=DeliveryState.PENDING.value,
                    round=d.round + 1,
                    attempt_limit=d.attempts + max_attempts,
                    next_attempt_at=now,
                    completed_at=None,
                    updated_at=now,
                )
            )
            waiting = await session.execute(
                update(tables.deliveries)
                .where(condition, d.state == DeliveryState.PENDING.value, d.next_attempt_at > now)
                .values(next_attempt_at=now, updated_at=now)
            )
            await session.commit()
        return int(settled.rowcount) + int(waiting.rowcount)  # type: ignore[attr-defined]


def _filters(
    state: str | None, task_id: str | None, endpoint: str | None, since: datetime | None
) -> list[Any]:
    filters: list[Any] = []
    if state is not None:
        filters.append(d.state == state)
    if task_id is not None:
        filters.append(d.task_id == task_id)
    if endpoint is not None:
        filters.append(d.endpoint == endpoint)
    if since is not None:
        filters.append(d.created_at >= since)
    return filters
