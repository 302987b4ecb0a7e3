"""Recording deliveries: the consumers' side, each event's deliveries with its inbox mark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, select

from crater.callback.adapters import tables
from crater.callback.adapters.log_base import LogBase
from crater.callback.adapters.records import NO_ENDPOINT, Enqueued, _superseded_values, d, t
from crater.callback.adapters.task_records import _lock_tasks, _move, _record_ends, _released
from crater.callback.domain.lifecycle import (
    WHILE_RUNNING,
    Candidate,
    End,
    Superseded,
    Told,
    end_after,
    repeats,
    verdict,
)
from crater.callback.domain.ordering import Placement, Recorded, place
from crater.callback.domain.payload import WebhookFormat
from crater.callback.domain.retry import DeliveryState


class Recording(LogBase):
    """The consumers' side: recording deliveries."""

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
