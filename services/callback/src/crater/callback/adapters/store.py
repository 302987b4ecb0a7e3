"""The delivery log in the database: one row per (source event, endpoint), one per attempt.

Each attempt is committed as it happens, so the log tells the truth even after a crash; the
final state, the inbox mark and the outcome event (outbox) are committed together.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from crater.callback.adapters import tables
from crater.callback.domain.retry import DeliveryState, Outcome
from crater.contracts import Event
from crater.runtime.outbox import first_delivery, stage

CONSUMER = "callback"


@dataclass(frozen=True)
class Delivery:
    id: int
    state: DeliveryState
    attempts: int
    last_status_code: int | None
    last_error: str | None


@dataclass(frozen=True)
class Attempt:
    """One POST and what came of it; `status_code` None: no response (timeout, connection)."""

    number: int
    outcome: Outcome
    status_code: int | None
    latency_ms: float
    error: str | None


class DeliveryLog:
    def __init__(self, sessions: async_sessionmaker[Any], consumer: str = CONSUMER) -> None:
        self.sessions = sessions
        self.consumer = consumer

    async def open(
        self,
        *,
        webhook_id: str,
        endpoint: str,
        task_id: str,
        task_status: str,
        event_type: str,
        payload: str,
    ) -> Delivery:
        """The delivery of this event to this endpoint, created pending the first time."""
        async with self.sessions() as session:
            found = await self._find(session, webhook_id, endpoint)
            if found is not None:
                return found
            now = datetime.now(UTC)
            result = await session.execute(
                insert(tables.deliveries).values(
                    webhook_id=webhook_id,
                    endpoint=endpoint,
                    task_id=task_id,
                    task_status=task_status,
                    event_type=event_type,
                    state=DeliveryState.PENDING.value,
                    attempts=0,
                    payload=payload,
                    created_at=now,
                    updated_at=now,
                )
            )
            await session.commit()
            (delivery_id,) = result.inserted_primary_key or (None,)
            assert delivery_id is not None
            return Delivery(int(delivery_id), DeliveryState.PENDING, 0, None, None)

    async def record_attempt(self, delivery_id: int, attempt: Attempt) -> None:
        """A failed attempt that will be retried."""
        async with self.sessions() as session:
            await self._add_attempt(session, delivery_id, attempt)
            await session.commit()

    async def finish(
        self,
        delivery_id: int,
        source_event_id: UUID,
        state: DeliveryState,
        attempt: Attempt | None = None,
        events: tuple[Event, ...] = (),
    ) -> bool:
        """Settle the delivery: its last attempt, final state, inbox mark and outcome events in
        one transaction. False if another consumer settled this event first (nothing written).
        """
        async with self.sessions() as session:
            if not await first_delivery(session, tables.inbox, self.consumer, source_event_id):
                await session.rollback()
                return False
            if attempt is not None:
                await self._add_attempt(session, delivery_id, attempt)
            now = datetime.now(UTC)
            await session.execute(
                update(tables.deliveries)
                .where(tables.deliveries.c.id == delivery_id)
                .values(state=state.value, updated_at=now, completed_at=now)
            )
            await stage(session, tables.outbox, *events)
            await session.commit()
            return True

    async def _find(self, session: AsyncSession, webhook_id: str, endpoint: str) -> Delivery | None:
        d = tables.deliveries.c
        row = (
            await session.execute(
                select(d.id, d.state, d.attempts, d.last_status_code, d.last_error).where(
                    d.webhook_id == webhook_id, d.endpoint == endpoint
                )
            )
        ).first()
        if row is None:
            return None
        return Delivery(
            row.id, DeliveryState(row.state), row.attempts, row.last_status_code, row.last_error
        )

    async def _add_attempt(self, session: AsyncSession, delivery_id: int, attempt: Attempt) -> None:
        now = datetime.now(UTC)
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
        await session.execute(
            update(tables.deliveries)
            .where(tables.deliveries.c.id == delivery_id)
            .values(
                attempts=attempt.number,
                last_status_code=attempt.status_code,
                last_error=attempt.error,
                updated_at=now,
            )
        )
