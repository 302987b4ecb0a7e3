"""The operators' queries on the delivery log (`crater webhooks` list, retry, replay; a
task's deliveries for the console, `crater.v1.query.webhooks`)."""

from __future__ import annotations

import builtins
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, or_, select, true, update

from crater.callback.adapters import tables
from crater.callback.adapters.log_base import LogBase
from crater.callback.adapters.records import NO_ENDPOINT, SETTLED, DeliveryRow, d, utc
from crater.callback.domain.retry import DeliveryState
from crater.contracts import (
    WebhookDeliveriesAnswer,
    WebhookDeliveriesQuery,
    WebhookDeliveryRecord,
)


class Operations(LogBase):
    """The operators' side (`crater webhooks`)."""

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
        return await self._rows(and_(true(), *_filters(state, task_id, endpoint, since)), limit)

    async def to_replay(
        self,
        since: datetime,
        *,
        state: str | None = None,
        endpoint: str | None = None,
        task_id: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[DeliveryRow]:
        """What `replay` with these arguments would send again now, newest first (sends
        nothing)."""
        now = datetime.now(UTC)
        due = or_(
            d.state.in_(SETTLED),
            and_(d.state == DeliveryState.PENDING.value, d.next_attempt_at > now),
        )
        return await self._rows(and_(_replayed(since, state, endpoint, task_id), due), limit)

    async def _rows(self, condition: Any, limit: int) -> builtins.list[DeliveryRow]:
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
        query = query.where(condition)
        async with self.sessions() as session:
            rows = (await session.execute(query.order_by(d.id.desc()).limit(limit))).all()
        found = []
        for row in rows:
            values = dict(row._mapping)
            for key in ("created_at", "updated_at", "next_attempt_at"):
                values[key] = utc(values[key])
            found.append(DeliveryRow(**values))
        return found

    async def of_task(self, query: WebhookDeliveriesQuery) -> WebhookDeliveriesAnswer:
        """A task's deliveries, newest first (`crater.v1.query.webhooks`)."""
        rows = await self.list(task_id=query.task_id, limit=query.limit)
        return WebhookDeliveriesAnswer(
            task_id=query.task_id,
            deliveries=[
                WebhookDeliveryRecord(
                    delivery_id=r.id,
                    webhook_id=r.webhook_id,
                    endpoint=r.endpoint,
                    task_status=r.task_status,
                    event_type=r.event_type,
                    state=DeliveryState(r.state).value,
                    attempts=r.attempts,
                    round=r.round,
                    last_status_code=r.last_status_code,
                    last_error=r.last_error,
                    created_at=r.created_at,
                    updated_at=r.updated_at,
                    next_attempt_at=r.next_attempt_at,
                )
                for r in rows
            ],
        )

    async def retry(self, delivery_id: int, max_attempts: int) -> bool:
        """Send one delivery again now: a settled one starts a new round of `max_attempts`
        attempts (same webhook-id); a pending one is due at once. False if there is none (a
        superseded one is never sent)."""
        async with self.sessions() as session:
            found = await session.scalar(
                select(d.id).where(
                    d.id == delivery_id,
                    d.endpoint != NO_ENDPOINT,
                    d.state != DeliveryState.SUPERSEDED.value,
                )
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
        return await self._reopen(_replayed(since, state, endpoint, task_id), max_attempts)

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


def _replayed(since: datetime, state: str | None, endpoint: str | None, task_id: str | None) -> Any:
    """The deliveries a replay reopens (those with an endpoint)."""
    return and_(*_filters(state, task_id, endpoint, since), d.endpoint != NO_ENDPOINT)


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
