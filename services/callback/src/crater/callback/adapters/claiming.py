"""Claiming due deliveries: the delivery loop's side, judged by the lifecycle guard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from crater.callback.adapters import tables
from crater.callback.adapters.log_base import LogBase
from crater.callback.adapters.records import (
    TERMINAL_STATUSES,
    Claimed,
    Due,
    _superseded_reason,
    d,
    t,
)
from crater.callback.adapters.task_records import _lock_tasks, _released
from crater.callback.domain.lifecycle import (
    WHILE_RUNNING,
    Candidate,
    End,
    Superseded,
    Told,
    attempt_before,
    verdict,
)
from crater.callback.domain.payload import with_attempt
from crater.callback.domain.retry import DeliveryState


class Claiming(LogBase):
    """The delivery loop's side: finding, claiming and releasing due deliveries."""

    async def due(
        self, endpoint: str, now: datetime, limit: int, exclude: Sequence[int] = ()
    ) -> list[Due]:
        """Up to `limit` deliveries to `endpoint` that may go now, oldest first: pending, due,
        not held, unclaimed (or their claim lapsed), and with no pending delivery of their
        task to this endpoint placed before them (a task's deliveries go one after another,
        in order). The guard judges them when they are claimed."""
        if limit <= 0:
            return []
        async with self.sessions() as session:
            rows = (await session.execute(_due_query(endpoint, now, limit + len(exclude)))).all()
        skip = set(exclude)
        return [Due(*row) for row in rows if row.id not in skip][:limit]

    async def claim_due(
        self,
        wanted: Mapping[str, int],
        owner: str,
        now: datetime,
        until: datetime,
        exclude: Sequence[int] = (),
    ) -> Claimed:
        """Find and claim, in one transaction, up to `wanted[endpoint]` due deliveries per
        endpoint: the deliveries this replica now owns until `until`, and how many the guard
        superseded instead (their task's next ones may be due now)."""
        skip = set(exclude)
        async with self._writing(), self.sessions() as session:
            found: list[Due] = []
            for endpoint, limit in wanted.items():
                if limit <= 0:
                    continue
                rows = (await session.execute(_due_query(endpoint, now, limit + len(skip)))).all()
                found += [Due(*row) for row in rows if row.id not in skip][:limit]
            if not found:
                await session.rollback()
                return Claimed([], 0)
            task_ids = sorted({x.task_id for x in found})
            ids = [x.id for x in found]
            released = await _release(session, task_ids, ids, owner, now, until)
            await session.commit()
        self._tell_superseded(released.superseded)
        due = [
            replace(x, payload=released.payloads.get(x.id, x.payload))
            for x in found
            if x.id in released.claimed
        ]
        return Claimed(due, len(released.superseded))

    async def claim(
        self, ids: Sequence[int], owner: str, now: datetime, until: datetime
    ) -> set[int]:
        """Claim these deliveries for `owner` until `until` if they may go now, as
        `claim_due` does; the ids actually claimed (another replica may have taken some since
        they were read, or the guard superseded them)."""
        if not ids:
            return set()
        async with self._writing(), self.sessions() as session:
            task_ids = (
                await session.scalars(select(d.task_id).where(d.id.in_(list(ids))).distinct())
            ).all()
            released = await _release(session, sorted(task_ids), ids, owner, now, until)
            await session.commit()
        self._tell_superseded(released.superseded)
        return released.claimed

    async def release(self, ids: Sequence[int], owner: str) -> None:
        """Give up claims without an attempt (the service stops): due again at once."""
        if not ids:
            return
        async with self._writing(), self.sessions() as session:
            await session.execute(
                update(tables.deliveries)
                .where(d.id.in_(list(ids)), d.claimed_by == owner)
                .values(claimed_by=None, claimed_until=None)
            )
            await session.commit()


def _due(now: datetime) -> list[Any]:
    """What makes a delivery one that may go now (see `DeliveryLog.due`)."""
    earlier = tables.deliveries.alias("earlier")
    blocked = (
        select(earlier.c.id)
        .where(
            earlier.c.task_id == d.task_id,
            earlier.c.endpoint == d.endpoint,
            earlier.c.lifecycle == d.lifecycle,  # a refused duplicate is a queue of its own
            earlier.c.state == DeliveryState.PENDING.value,
            or_(
                earlier.c.position < d.position,
                and_(earlier.c.position == d.position, earlier.c.id < d.id),
            ),
        )
        .exists()
    )
    return [
        d.state == DeliveryState.PENDING.value,
        d.next_attempt_at <= now,
        or_(d.held_until.is_(None), d.held_until <= now),
        or_(d.claimed_until.is_(None), d.claimed_until < now),
        ~blocked,
    ]


def _due_query(endpoint: str, now: datetime, limit: int) -> Any:
    """Deliveries to `endpoint` that may go now, oldest first (see `DeliveryLog.due`)."""
    return (
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
            d.format,
        )
        .where(d.endpoint == endpoint, *_due(now))
        .order_by(d.id)
        .limit(limit)
    )


@dataclass(frozen=True)
class Released:
    """What one release did: the ids claimed, the (endpoint, reason) of each delivery
    superseded instead, and the bodies told their attempt on the way (by delivery id)."""

    claimed: set[int]
    superseded: list[tuple[str, Superseded]]
    payloads: dict[int, str]


async def _release(
    session: AsyncSession,
    task_ids: Sequence[str],
    ids: Sequence[int],
    owner: str,
    now: datetime,
    until: datetime,
) -> Released:
    """Claim those of `ids` that may still go now, judging each lifecycle delivery released
    for the first time (domain/lifecycle.py), and telling its body the attempt it belongs to
    if it does not say. The tasks' rows are locked first, then the deliveries are read again:
    a recording or release of the same task that committed meanwhile is seen."""
    ends = await _lock_tasks(session, task_ids)
    rows = (
        await session.execute(
            select(
                d.id,
                d.webhook_id,
                d.task_id,
                d.endpoint,
                d.task_status,
                d.event_type,
                d.position,
                d.lifecycle,
                d.released_at,
                d.payload,
                t.waiting,
                t.allocation_id,
                t.grants,
                t.attempt,
            )
            .outerjoin(tables.task_events, t.event_id == d.webhook_id)
            .where(d.id.in_(list(ids)), *_due(now))
            .order_by(d.position, d.id)
        )
    ).all()
    released = await _released(session, task_ids)
    keep: list[int] = []
    unsaid: list[Any] = []  # first releases whose event does not say its attempt
    superseded: dict[int, tuple[str, Superseded, End | None]] = {}
    for row in rows:
        if row.released_at is not None or not row.lifecycle:
            keep.append(row.id)  # a repeat keeps the place it was given; a duplicate has none
            continue
        key = (row.task_id, row.endpoint)
        told = Told(ends.get(row.task_id), released.get(key))
        waits_for_grant = bool(row.waiting) and row.allocation_id is not None and not row.grants
        candidate = Candidate(
            row.webhook_id,
            row.position,
            ends=row.task_status in TERMINAL_STATUSES,
            placed=not waits_for_grant,
            while_running=row.event_type in WHILE_RUNNING,
        )
        why = verdict(told, candidate, releasing=True)
        if why is None:
            keep.append(row.id)
            released[key] = max(released.get(key, row.position), row.position)
            if row.attempt is None:
                unsaid.append(row)
        else:
            superseded[row.id] = (row.endpoint, why, told.end)
    claimed = await _claim(session, keep, owner, now, until)
    payloads = await _tell_attempts(session, [r for r in unsaid if r.id in claimed])
    if superseded:
        await session.execute(
            update(tables.deliveries)
            .where(d.id == bindparam("superseded_id"), d.state == DeliveryState.PENDING.value)
            .values(
                state=bindparam("new_state"),
                last_error=bindparam("reason"),
                completed_at=now,
                updated_at=now,
                next_attempt_at=None,
                held_until=None,
            ),
            [
                {
                    "superseded_id": delivery_id,
                    "new_state": DeliveryState.SUPERSEDED.value,
                    "reason": _superseded_reason(why, end),
                }
                for delivery_id, (_, why, end) in superseded.items()
            ],
        )
    return Released(
        claimed, [(endpoint, why) for endpoint, why, _ in superseded.values()], payloads
    )


async def _tell_attempts(session: AsyncSession, rows: Sequence[Any]) -> dict[int, str]:
    """The bodies of deliveries about to be sent for the first time whose event does not say
    its attempt, told the attempt of the latest event before them in their task's order."""
    if not rows:
        return {}
    said: dict[str, list[tuple[int, int]]] = {}
    for task_id, position, attempt in (
        await session.execute(
            select(t.task_id, t.position, t.attempt).where(
                t.task_id.in_(sorted({r.task_id for r in rows})), t.attempt.is_not(None)
            )
        )
    ).all():
        said.setdefault(task_id, []).append((position, attempt))
    payloads: dict[int, str] = {}
    for row in rows:
        attempt = attempt_before(said.get(row.task_id, []), row.position)
        if attempt is not None:
            payloads[row.id] = with_attempt(row.payload, attempt)
    if payloads:
        await session.execute(
            update(tables.deliveries)
            .where(d.id == bindparam("told_id"))
            .values(payload=bindparam("told_payload")),
            [{"told_id": i, "told_payload": payload} for i, payload in payloads.items()],
        )
    return payloads


async def _claim(
    session: AsyncSession, ids: Sequence[int], owner: str, now: datetime, until: datetime
) -> set[int]:
    if not ids:
        return set()
    result = await session.execute(
        update(tables.deliveries)
        .where(
            d.id.in_(list(ids)),
            d.state == DeliveryState.PENDING.value,
            or_(d.claimed_until.is_(None), d.claimed_until < now),
        )
        .values(
            claimed_by=owner,
            claimed_until=until,
            released_at=func.coalesce(d.released_at, now),
        )
        .returning(d.id)
    )
    return {int(row_id) for (row_id,) in result.all()}
