"""One consumed event's transaction, written once for every stateful service: the inbox mark
(was this event handled here before?), the handler's writes, and the events it stages in the
outbox, committed together or not at all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, TypeVar
from uuid import UUID

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from crater.contracts import Event
from crater.runtime.db import write_transaction
from crater.runtime.outbox import first_deliveries, first_delivery, stage


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
    async with write_transaction(sessions) as session:
        first = await first_delivery(session, inbox, consumer, event_id)
        yield UnitOfWork(session, first, outbox)


class Redelivered(Enum):
    """The outcome of an event this consumer handled before: nothing was applied."""

    REDELIVERED = "redelivered"


REDELIVERED = Redelivered.REDELIVERED


class _Keyed(Protocol):
    @property
    def event_id(self) -> UUID: ...


K = TypeVar("K", bound=_Keyed)
R = TypeVar("R")


async def each_once(
    sessions: async_sessionmaker[Any],
    inbox: Table | None,
    consumer: str,
    events: Sequence[K],
    apply: Callable[[AsyncSession, K], Awaitable[R]],
) -> list[R | Redelivered | BaseException]:
    """A pull batch's unit of work: `apply` to each of `events` in order, all in one
    transaction, each with its inbox mark (one handled here before is `REDELIVERED`, and
    nothing is applied; no `inbox`: for writes that are idempotent on their own). One commit
    for the batch instead of one each. If that transaction fails, each event is applied again
    in a transaction of its own, so a bad event fails only itself: its outcome is the error
    (its message alone is delivered again)."""

    async def one_by_one(session: AsyncSession, fresh: Sequence[K]) -> list[R]:
        return [await apply(session, event) for event in fresh]

    return await all_once(sessions, inbox, consumer, events, one_by_one)


async def all_once(
    sessions: async_sessionmaker[Any],
    inbox: Table | None,
    consumer: str,
    events: Sequence[K],
    apply_all: Callable[[AsyncSession, Sequence[K]], Awaitable[Sequence[R]]],
) -> list[R | Redelivered | BaseException]:
    """`each_once` for a handler that applies a whole batch at once (a few statements for
    the batch, not a few per event): `apply_all` gets the events handled here for the first
    time, in order, and returns one result each, as if it had applied them one after another
    in that order. The inbox check is one statement for the batch (`first_deliveries`: an id
    twice in the batch is first once). If the transaction fails, each event is applied alone
    in its own transaction (`apply_all` with one event), so only a bad one fails."""
    if not events:  # nothing to open a transaction for (a batch of reports none of them kept)
        return []
    try:
        async with write_transaction(sessions) as session:
            if inbox is None:
                firsts = [True] * len(events)
            elif len(events) == 1:  # one statement that waits out a racing first delivery
                firsts = [await first_delivery(session, inbox, consumer, events[0].event_id)]
            else:
                keys = [(consumer, event.event_id) for event in events]
                firsts = await first_deliveries(session, inbox, keys)
            fresh = [event for event, first in zip(events, firsts, strict=True) if first]
            applied = list(await apply_all(session, fresh)) if fresh else []
            if len(applied) != len(fresh):
                raise RuntimeError(f"{len(applied)} results for {len(fresh)} events")
            results = iter(applied)
            return [next(results) if first else REDELIVERED for first in firsts]
    except Exception as error:
        if len(events) == 1:
            return [error]
    alone: list[R | Redelivered | BaseException] = []
    for event in events:
        alone += await all_once(sessions, inbox, consumer, [event], apply_all)
    return alone
