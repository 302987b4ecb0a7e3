"""Transactional outbox and inbox.

A handler stages the events its state change causes in the same transaction as the change
(outbox); a relay publishes them after commit, with the event id as `Nats-Msg-Id`, so a crash
between commit and publish re-publishes and JetStream drops the duplicate. Consumers record
each event id they processed in the same transaction (inbox), so a redelivery does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from faststream.nats import NatsBroker
from sqlalchemy import (
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from crater.contracts import Event, TaskEvent, TaskSequence
from crater.contracts.catalog import channel_for
from crater.runtime.bus import Outgoing, encode, publish_batch, subject_of
from crater.runtime.db import insert_absent_returning, insert_if_absent, one_writer
from crater.runtime.telemetry import current_trace_context

log = logging.getLogger("crater.outbox")
# Values in one IN (...) list: well under SQLite's oldest bound parameter limit (999).
IN_LIST_LIMIT = 500


def outbox_table(metadata: MetaData, owner: str) -> Table:
    return Table(
        f"{owner}_outbox",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("event_id", String(36), nullable=False, unique=True),
        Column("subject", String(255), nullable=False),
        Column("stream", String(64), nullable=False),
        Column("payload", Text, nullable=False),
        Column("traceparent", String(64), nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("published_at", DateTime(timezone=True), nullable=True, index=True),
    )


def inbox_table(metadata: MetaData, owner: str) -> Table:
    return Table(
        f"{owner}_inbox",
        metadata,
        Column("consumer", String(64), primary_key=True),
        Column("event_id", String(36), primary_key=True),
        Column("processed_at", DateTime(timezone=True), nullable=False),
    )


async def stage(session: AsyncSession | AsyncConnection, outbox: Table, *events: Event) -> None:
    """Add events to the outbox inside the caller's transaction."""
    if not events:
        return
    now = datetime.now(UTC)
    # The handler's span becomes the events' parent, so the relay continues the same trace.
    context = current_trace_context()
    if context is not None:
        events = tuple(e if e.trace else e.model_copy(update={"trace": context}) for e in events)
    await session.execute(
        insert(outbox),
        [
            {
                "event_id": str(e.event_id),
                "subject": subject_of(e),
                "stream": channel_for(type(e)).stream.name,
                "payload": encode(e).decode(),
                "traceparent": e.trace.traceparent if e.trace else None,
                "created_at": now,
            }
            for e in events
        ],
    )


class TaskSequencer:
    """Stamps the task events a producer stages with their `task_sequence`, so a consumer of
    several subjects and streams can deliver one task's events in the order they were emitted.

    The number is the outbox's largest id, read in the staging transaction, plus the event's
    place among the task events staged: every staged event is an outbox row, so numbers grow
    across transactions and restarts with no counter to store. `previous` (the task's last
    number) is remembered while the producer runs, for the `remember` most recent tasks;
    after a restart or a `reset` a task's next event says None (not known) instead.
    """

    def __init__(self, outbox: Table, remember: int = 100_000) -> None:
        self.outbox = outbox
        self.remember = remember
        self._last: OrderedDict[str, int] = OrderedDict()

    async def stamp(
        self, session: AsyncSession | AsyncConnection, events: Sequence[Event]
    ) -> list[Event]:
        """`events` with their task events numbered, in order; call it in the transaction that
        stages them, right before `stage`."""
        if not any(_unstamped(e) for e in events):
            return list(events)
        number = await session.scalar(select(func.max(self.outbox.c.id))) or 0
        stamped: list[Event] = []
        for event in events:
            if _unstamped(event):
                number += 1
                task_id = str(getattr(event, "task_id"))  # noqa: B009 - every task event has one
                sequence = TaskSequence(number=number, previous=self._last.pop(task_id, None))
                self._last[task_id] = number
                if len(self._last) > self.remember:
                    self._last.popitem(last=False)
                event = event.model_copy(update={"task_sequence": sequence})
            stamped.append(event)
        return stamped

    def reset(self) -> None:
        """Forget every task's last number (the transaction that used them rolled back)."""
        self._last.clear()


def _unstamped(event: Event) -> bool:
    return isinstance(event, TaskEvent) and event.task_sequence is None


async def first_delivery(
    session: AsyncSession | AsyncConnection, inbox: Table, consumer: str, event_id: UUID
) -> bool:
    """True the first time `consumer` sees `event_id`; records it in the caller's transaction.

    One statement, `INSERT ... ON CONFLICT DO NOTHING`: two transactions marking one id at
    once (a redelivery racing its first delivery, or two messages carrying the same id) do
    not both read "unseen" and then collide on the key: the second finds the mark (it waits
    for the first's commit) and is told it is not the first."""
    values = {"consumer": consumer, "event_id": str(event_id), "processed_at": datetime.now(UTC)}
    return await insert_if_absent(session, inbox, values)


async def first_deliveries(
    session: AsyncSession | AsyncConnection, inbox: Table, deliveries: Sequence[tuple[str, UUID]]
) -> list[bool]:
    """`first_delivery` for many (consumer, event id) pairs in one statement, not one each:
    True for each pair seen for the first time (an id repeated in `deliveries` is True once);
    records the new ones in the caller's transaction. As `first_delivery`, `INSERT ... ON
    CONFLICT DO NOTHING` (here RETURNING the pairs that went in): two transactions marking
    one id at once do not both read "unseen" and then collide on the key."""
    if not deliveries:
        return []
    keys = [(consumer, str(event_id)) for consumer, event_id in deliveries]
    now = datetime.now(UTC)
    new = await insert_absent_returning(
        session,
        inbox,
        [{"consumer": c, "event_id": e, "processed_at": now} for c, e in dict.fromkeys(keys)],
        ("consumer", "event_id"),
    )
    firsts: list[bool] = []
    for key in keys:
        firsts.append(key in new)
        new.discard(key)  # the same id again in this batch: not the first
    return firsts


class OutboxRelay:
    """Publishes staged events in order; woken after each commit, and polling for leftovers."""

    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        outbox: Table,
        broker: NatsBroker,
        poll_seconds: float = 1.0,
        batch: int = 256,
    ) -> None:
        self.sessions = sessions
        self.outbox = outbox
        self.broker = broker
        self.poll_seconds = poll_seconds
        self.batch = batch
        # Built once: the relay runs it after every commit.
        self.pending = (
            select(outbox).where(outbox.c.published_at.is_(None)).order_by(outbox.c.id).limit(batch)
        )
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # A leader's epoch (crater.runtime.leadership), stamped on all it publishes.
        self.headers: dict[str, str] = {}

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="outbox-relay")

    async def stop(self, flush: bool = True) -> None:
        """Stop after the batch in flight, then publish what is left (unless `flush` is
        False: a deposed leader leaves it to the new one).

        Stopped by a flag, not by cancelling: on Python 3.11 `asyncio.wait_for` (which nats-py
        uses for every publish ack) can swallow a cancel that lands as its awaitable completes
        (CPython gh-86296), and the stop would then wait for ever.
        """
        self._stopping = True
        self.wake()
        if self._task is not None:
            await self._task
            self._task = None
        if flush:
            await self.publish_pending()

    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_seconds):
                    await self._wake.wait()
            self._wake.clear()
            try:
                while not self._stopping and await self.publish_pending() == self.batch:
                    pass
            except Exception:
                log.exception("outbox relay failed; retrying")
                await asyncio.sleep(self.poll_seconds)

    async def publish_pending(self) -> int:
        """Publish up to one batch; returns how many were published."""
        async with self.sessions() as session:
            # Core statements only: the connection skips the ORM session's per-statement work.
            connection = await session.connection()
            rows = (await connection.execute(self.pending)).all()
            if not rows:
                return 0
            # The whole batch in flight at once, straight on the connection, acks awaited
            # together: one round trip, not one per row. Sent in row order, so they go out on
            # the wire in that order. A row whose ack failed stays unpublished and goes again
            # next time; the id it carries as Nats-Msg-Id lets JetStream drop it if it had in
            # fact arrived.
            outcomes = await publish_batch(
                self.broker,
                [
                    Outgoing(
                        subject=row.subject,
                        stream=row.stream,
                        payload=row.payload.encode(),
                        event_id=row.event_id,
                        traceparent=row.traceparent,
                    )
                    for row in rows
                ],
                self.headers,
            )
            published = [
                row.id for row, outcome in zip(rows, outcomes, strict=True) if outcome is None
            ]
            if published:
                async with one_writer(self.sessions):  # the read took no lock (pysqlite)
                    await connection.execute(
                        update(self.outbox)
                        .where(self.outbox.c.id.in_(published))
                        .values(published_at=datetime.now(UTC))
                    )
                    await session.commit()
            failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if failed is not None:
                raise failed
            return len(rows)
