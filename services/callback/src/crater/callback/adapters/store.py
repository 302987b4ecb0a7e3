"""The delivery log in the database: one row per (source event, endpoint), one per attempt.

The consumers only record deliveries (pending, due now) together with their inbox mark, and
ack after that commit; the delivery loop claims due deliveries, sends them, and commits each
attempt with the delivery's new state (and, once settled, its outcome event in the outbox) in
one transaction. A claim lapses after a while, so a crashed replica's deliveries are sent again
by whoever comes next, with the same webhook-id.

What AllData is told (domain/lifecycle.py): each task has a row (`callback_tasks`) with its
end; recording and claiming lock the rows of their tasks first, and judge each lifecycle
delivery against the end and what was already released to its endpoint (`released_at`). A
delivery ruled out is `superseded`, with its reason, and never sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from crater.callback.adapters import tables
from crater.callback.adapters.records import (
    CONSUMER,
    NO_ENDPOINT,
    SETTLED,
    TERMINAL_STATUSES,
    Attempt,
    Claimed,
    DeliveryRow,
    Due,
    Enqueued,
    Settlement,
    SupersededHook,
    _superseded_reason,
    _superseded_values,
    d,
    t,
    utc,
)
from crater.callback.adapters.task_records import _lock_tasks, _move, _record_ends, _released
from crater.callback.domain.lifecycle import (
    WHILE_RUNNING,
    Candidate,
    End,
    Superseded,
    Told,
    attempt_before,
    end_after,
    repeats,
    verdict,
)
from crater.callback.domain.ordering import Placement, Recorded, place
from crater.callback.domain.payload import WebhookFormat, with_attempt
from crater.callback.domain.retry import DeliveryState
from crater.contracts import Event
from crater.runtime.outbox import stage

__all__ = [
    "CONSUMER",
    "NO_ENDPOINT",
    "Attempt",
    "Claimed",
    "DeliveryLog",
    "DeliveryRow",
    "Due",
    "Enqueued",
    "Settlement",
    "SupersededHook",
    "utc",
]


class DeliveryLog:
    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        consumer: str = CONSUMER,
        on_superseded: SupersededHook | None = None,
    ) -> None:
        self.sessions = sessions
        self.consumer = consumer
        self.on_superseded = on_superseded
        # SQLite has one writer at a time and makes the others poll, sleeping up to 100 ms
        # a try: this process's writers (consumers, delivery loop) queue here instead.
        bind = sessions.kw.get("bind")
        self._one_writer = bind is not None and bind.dialect.name == "sqlite"
        self._write_lock = asyncio.Lock()

    def _writing(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._write_lock if self._one_writer else contextlib.nullcontext()

    # The consumers' side -------------------------------------------------------------------

    async def enqueue(self, **fields: Any) -> int | None:
        """Record one event's deliveries (the fields of `Enqueued`); see `enqueue_many`."""
        [created] = await self.enqueue_many([Enqueued(**fields)])
        return created

    async def enqueue_many(self, events: Sequence[Enqueued]) -> list[int | None]:
        """Record the events' deliveries, due now, each with its inbox mark, in one
        transaction and in the order given; per event, how many deliveries were created, or
        None if this consumer saw it before (nothing written). With no endpoint configured at
        all, one delivery is recorded as skipped.

        Each event takes its place among its task's events (`order`: its sequence number and
        allocation; domain/ordering.py). While an earlier one is missing, its deliveries are
        held, `hold_seconds` at most; the task's held ones it completes go free. The first
        terminal event recorded is the task's end; a delivery the guard already rules out
        (domain/lifecycle.py) is recorded superseded, never sent. The tasks' rows are locked
        first, so another replica's recording or release of the same task waits. A handful of
        statements per batch, not per event: on a busy machine each round trip costs.
        """
        if not events:
            return []
        now = datetime.now(UTC)
        ids = list(dict.fromkeys(str(e.source_event_id) for e in events))
        task_ids = list(dict.fromkeys(e.task_id for e in events))
        superseded: list[tuple[str, Superseded]] = []
        async with self._writing(), self.sessions() as session:
            ends = await _lock_tasks(session, task_ids, create=True)
            seen = set(
                (
                    await session.scalars(
                        select(tables.inbox.c.event_id).where(
                            tables.inbox.c.consumer == self.consumer,
                            tables.inbox.c.event_id.in_(ids),
                        )
                    )
                ).all()
            )
            existing = {
                (row.webhook_id, row.endpoint)
                for row in (
                    await session.execute(
                        select(d.webhook_id, d.endpoint).where(d.webhook_id.in_(ids))
                    )
                ).all()
            }
            tasks: dict[str, list[Recorded]] = {task_id: [] for task_id in task_ids}
            for r in (
                await session.execute(select(tables.task_events).where(t.task_id.in_(task_ids)))
            ).all():
                tasks[r.task_id].append(
                    Recorded(
                        r.event_id,
                        r.number,
                        r.previous,
                        r.allocation_id,
                        r.grants,
                        r.position,
                        r.waiting,
                        event_type=r.event_type,
                    )
                )
            released = await _released(session, task_ids)
            created: list[int | None] = []
            inbox_rows: list[dict[str, Any]] = []
            event_rows: list[dict[str, Any]] = []
            delivery_rows: list[dict[str, Any]] = []
            moved: dict[str, Placement] = {}
            ended: dict[str, tuple[End, str]] = {}
            for event in events:
                webhook_id = str(event.source_event_id)
                if webhook_id in seen:
                    created.append(None)
                    continue
                seen.add(webhook_id)
                inbox_rows.append(
                    {"consumer": self.consumer, "event_id": webhook_id, "processed_at": now}
                )
                order = replace(
                    event.order or Recorded(webhook_id),
                    ends=event.ends,
                    event_type=event.event_type,
                )
                repeat = repeats(tasks[event.task_id], order)
                placed, changes = place(tasks[event.task_id], order)
                moved.update(changes)
                event_rows.append(
                    {
                        "event_id": webhook_id,
                        "task_id": event.task_id,
                        "event_type": event.event_type,
                        "number": placed.number,
                        "previous": placed.previous,
                        "allocation_id": placed.allocation_id,
                        "grants": placed.grants,
                        "position": placed.position,
                        "waiting": placed.waiting,
                        "recorded_at": now,
                        "attempt": event.attempt,
                    }
                )
                candidate = Candidate(
                    webhook_id,
                    placed.position,
                    ends=event.ends,
                    placed=not (placed.reports and placed.waiting),
                    repeat=repeat,
                    while_running=event.event_type in WHILE_RUNNING,
                )
                end = ends.get(event.task_id)
                new_end = end_after(end, candidate) if event.lifecycle else end
                if new_end is not None and new_end != end:
                    ends[event.task_id] = new_end
                    ended[event.task_id] = (new_end, event.task_status)
                rows = _delivery_rows(event, placed, now, existing)
                for row in rows:
                    if not event.lifecycle or row["state"] != DeliveryState.PENDING.value:
                        continue
                    key = (event.task_id, row["endpoint"])
                    told = Told(ends.get(event.task_id), released.get(key))
                    why = verdict(told, candidate, releasing=False)
                    if why is not None:
                        row.update(_superseded_values(why, told.end, now))
                        superseded.append((row["endpoint"], why))
                delivery_rows += rows
                created.append(len(rows))
            if inbox_rows:
                await session.execute(insert(tables.inbox), inbox_rows)
                await session.execute(insert(tables.task_events), event_rows)
            if delivery_rows:
                await session.execute(insert(tables.deliveries), delivery_rows)
            await _move(session, moved)
            await _record_ends(session, ended, now)
            await session.commit()
        self._tell_superseded(superseded)
        return created

    def _tell_superseded(self, superseded: Iterable[tuple[str, Superseded]]) -> None:
        if self.on_superseded is None:
            return
        for endpoint, why in superseded:
            self.on_superseded(endpoint, why)

    # The delivery loop's side --------------------------------------------------------------

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


def _delivery_rows(
    event: Enqueued, placed: Recorded, now: datetime, existing: set[tuple[str, str]]
) -> list[dict[str, Any]]:
    """The event's new deliveries, every row with the same keys (one multi-row insert)."""
    webhook_id = str(event.source_event_id)
    common = {
        "webhook_id": webhook_id,
        "task_id": event.task_id,
        "task_status": event.task_status,
        "event_type": event.event_type,
        "attempts": 0,
        "round": 0,
        "payload": event.payload,
        "created_at": now,
        "updated_at": now,
        "position": placed.position,
        "lifecycle": event.lifecycle,
        "last_error": None,
        "completed_at": None,
        "next_attempt_at": None,
        "held_until": None,
        "format": WebhookFormat.ALLDATA.value,
    }
    if not event.configured:
        return [
            common
            | {"endpoint": NO_ENDPOINT, "state": DeliveryState.SKIPPED.value, "completed_at": now}
        ]
    # A refused duplicate submission waits for nothing of the task it is not part of.
    waits = placed.waiting and event.lifecycle
    return [
        common
        | {
            "endpoint": name,
            "format": WebhookFormat(event.formats.get(name, WebhookFormat.ALLDATA)).value,
            "state": DeliveryState.PENDING.value,
            "next_attempt_at": now,
            "held_until": now + timedelta(seconds=event.hold_seconds) if waits else None,
        }
        for name in event.endpoints
        if (webhook_id, name) not in existing
    ]


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
