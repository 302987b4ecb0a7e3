"""The retry schedule: each attempt recorded with its delivery's next state; the backlog."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from crater.callback.adapters import tables
from crater.callback.adapters.log_base import LogBase
from crater.callback.adapters.records import Attempt, Settlement, d
from crater.callback.domain.retry import DeliveryState
from crater.contracts import Event
from crater.runtime.outbox import stage


class Schedule(LogBase):
    """The delivery loop's side: recording attempts and when each delivery goes next."""

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
        settlement = Settlement(delivery_id, attempt, state, next_attempt_at, events)
        return delivery_id in await self.record_many(owner, [settlement])

    async def record_many(self, owner: str, settlements: Sequence[Settlement]) -> set[int]:
        """Several attempts, each with its delivery's new state and outcome events, in one
        transaction; the ids recorded (not those whose claim was lost meanwhile)."""
        if not settlements:
            return set()
        now = datetime.now(UTC)
        async with self._writing(), self.sessions() as session:
            held = set(
                (
                    await session.scalars(
                        select(d.id)
                        .where(
                            d.id.in_([s.delivery_id for s in settlements]),
                            d.claimed_by == owner,
                            d.state == DeliveryState.PENDING.value,
                        )
                        .with_for_update()
                    )
                ).all()
            )
            recorded = [s for s in settlements if s.delivery_id in held]
            if not recorded:
                await session.rollback()
                return set()
            result = await session.execute(
                update(tables.deliveries)
                .where(
                    d.id == bindparam("settled_id"),
                    d.claimed_by == owner,
                    d.state == DeliveryState.PENDING.value,
                )
                .values(
                    state=bindparam("new_state"),
                    attempts=bindparam("number"),
                    last_status_code=bindparam("status_code"),
                    last_error=bindparam("error"),
                    updated_at=now,
                    completed_at=bindparam("completed"),
                    next_attempt_at=bindparam("next_at"),
                    claimed_by=None,
                    claimed_until=None,
                ),
                [
                    {
                        "settled_id": s.delivery_id,
                        "new_state": s.state.value,
                        "number": s.attempt.number,
                        "status_code": s.attempt.status_code,
                        "error": s.attempt.error,
                        "completed": now if s.state.is_final else None,
                        "next_at": None if s.state.is_final else s.next_attempt_at,
                    }
                    for s in recorded
                ],
            )
            # A claim lapsed and was taken between the look and the write (SQLite: the look
            # locks nothing). asyncpg reports no count for a batch (-1): there the look's
            # FOR UPDATE already holds the rows.
            if result.rowcount not in (-1, len(recorded)):  # type: ignore[attr-defined]
                await session.rollback()
                recorded = []
            else:
                await self._record_attempts(session, recorded, now)
        if recorded or len(settlements) == 1:
            return {s.delivery_id for s in recorded}
        done: set[int] = set()  # one by one: only the lost claims stay unrecorded
        for s in settlements:
            done |= await self.record_many(owner, [s])
        return done

    @staticmethod
    async def _record_attempts(
        session: AsyncSession, recorded: Sequence[Settlement], now: datetime
    ) -> None:
        await session.execute(
            insert(tables.attempts),
            [
                {
                    "delivery_id": s.delivery_id,
                    "attempt": s.attempt.number,
                    "outcome": s.attempt.outcome.value,
                    "status_code": s.attempt.status_code,
                    "latency_ms": s.attempt.latency_ms,
                    "error": s.attempt.error,
                    "attempted_at": now,
                }
                for s in recorded
            ],
        )
        await stage(session, tables.outbox, *(e for s in recorded for e in s.events))
        await session.commit()

    async def pull_forward(self, endpoint: str, now: datetime) -> int:
        """The endpoint is back: what waits in backoff for it is due now."""
        async with self._writing(), self.sessions() as session:
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
