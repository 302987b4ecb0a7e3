"""Each task's order and lifecycle records: its locked row and end, its events' places."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select, true, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from crater.callback.adapters import tables
from crater.callback.adapters.records import d, k, t
from crater.callback.domain.lifecycle import End
from crater.callback.domain.ordering import Placement
from crater.callback.domain.retry import DeliveryState
from crater.runtime.db import take_write_lock


async def _insert_ignoring_existing(session: AsyncSession, rows: list[dict[str, Any]]) -> None:
    """Create the tasks' rows that are not there yet (another replica may create one now)."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        await session.execute(
            postgresql.insert(tables.tasks).on_conflict_do_nothing(index_elements=["task_id"]),
            rows,
        )
    elif dialect == "sqlite":
        await session.execute(
            sqlite.insert(tables.tasks).on_conflict_do_nothing(index_elements=["task_id"]),
            rows,
        )
    else:  # pragma: no cover - the two databases Crater runs on are above
        raise NotImplementedError(f"no insert-or-ignore for {dialect}")


async def _lock_tasks(
    session: AsyncSession, task_ids: Sequence[str], create: bool = False
) -> dict[str, End | None]:
    """Lock the tasks' rows (PostgreSQL: FOR UPDATE, in task id order, so two transactions
    never wait on each other in a circle; SQLite: the database's write lock, taken first)
    and read their ends.
    What this transaction reads of the tasks afterwards includes whatever a transaction that
    held them committed."""
    if not task_ids:
        return {}
    await take_write_lock(session)
    if create:
        await _insert_ignoring_existing(session, [{"task_id": x} for x in sorted(task_ids)])
    rows = (
        await session.execute(
            select(k.task_id, k.end_event_id, k.end_position)
            .where(k.task_id.in_(list(task_ids)))
            .order_by(k.task_id)
            .with_for_update()
        )
    ).all()
    return {
        row.task_id: End(row.end_event_id, row.end_position)
        if row.end_event_id is not None
        else None
        for row in rows
    }


async def _released(session: AsyncSession, task_ids: Sequence[str]) -> dict[tuple[str, str], int]:
    """Per (task, endpoint), the highest position of a lifecycle delivery already released."""
    if not task_ids:
        return {}
    rows = (
        await session.execute(
            select(d.task_id, d.endpoint, func.max(d.position))
            .where(
                d.task_id.in_(list(task_ids)),
                d.released_at.is_not(None),
                d.lifecycle == true(),
            )
            .group_by(d.task_id, d.endpoint)
        )
    ).all()
    return {(task_id, endpoint): int(top) for task_id, endpoint, top in rows}


async def _record_ends(
    session: AsyncSession, ended: Mapping[str, tuple[End, str]], now: datetime
) -> None:
    if not ended:
        return
    await session.execute(
        update(tables.tasks)
        .where(k.task_id == bindparam("ended_task"))
        .values(
            end_event_id=bindparam("end_id"),
            end_position=bindparam("end_at"),
            end_status=bindparam("status"),
            ended_at=now,
        ),
        [
            {
                "ended_task": task_id,
                "end_id": end.event_id,
                "end_at": end.position,
                "status": status,
            }
            for task_id, (end, status) in ended.items()
        ],
    )


async def _move(session: AsyncSession, moved: dict[str, Placement]) -> None:
    """Earlier events that moved or went free, and their pending deliveries (rare: only when
    an event completes a waiting one's predecessors)."""
    for event_id, placement in moved.items():
        await session.execute(
            update(tables.task_events)
            .where(t.event_id == event_id)
            .values(position=placement.position, waiting=placement.waiting)
        )
        values: dict[str, Any] = {"position": placement.position}
        if not placement.waiting:
            values["held_until"] = None
        await session.execute(
            update(tables.deliveries)
            .where(d.webhook_id == event_id, d.state == DeliveryState.PENDING.value)
            .values(**values)
        )
