"""One consumed event's transaction, written once for every stateful service: the inbox mark
(was this event handled here before?), the handler's writes, and the events it stages in the
outbox, committed together or not at all."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from crater.contracts import Event
from crater.runtime.outbox import first_delivery, stage


@dataclass
class UnitOfWork:
    """The open transaction: `first` is False for an event this consumer handled before (a
    redelivery: its inbox mark is there, and the handler should write nothing)."""

    session: AsyncSession
    first: bool
    outbox: Table | None = None

    async def stage(self, *events: Event) -> None:
        """Add `events` to the outbox in this transaction; the relay publishes them after the
        commit."""
        if self.outbox is None:
            raise ValueError("this unit of work has no outbox to stage events in")
        await stage(self.session, self.outbox, *events)


@asynccontextmanager
async def unit_of_work(
    sessions: async_sessionmaker[Any],
    inbox: Table,
    consumer: str,
    event_id: UUID,
    outbox: Table | None = None,
) -> AsyncIterator[UnitOfWork]:
    """A session and its transaction with `event_id` marked in `consumer`'s inbox; committed
    when the block ends, rolled back (the mark too, so the redelivery is handled) when it
    raises.

        async with unit_of_work(sessions, inbox, consumer, event.event_id, outbox) as work:
            if not work.first:
                return  # handled before
            ...  # read and write through work.session
            await work.stage(*decided)
    """
    async with sessions() as session, session.begin():
        first = await first_delivery(session, inbox, consumer, event_id)
        yield UnitOfWork(session, first, outbox)
