"""The inbox mark (`first_delivery`, and `first_deliveries` for a batch) under a race: two
transactions marking one event id at once, as a redelivery racing its first delivery or two
fuzzed messages sharing an id did (the 100k fuzz run dead-lettered grants on the predictor's
IntegrityError). Exactly one is first; neither fails. On a SQLite file and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import MetaData, Table, event
from sqlalchemy.ext.asyncio import AsyncEngine

from crater.runtime.db import make_engine, make_session_factory
from crater.runtime.outbox import first_deliveries, first_delivery, inbox_table

pytestmark = pytest.mark.integration


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(database_url)
    yield engine
    await engine.dispose()


async def made_inbox(engine: AsyncEngine, owner: str) -> Table:
    metadata = MetaData()
    inbox = inbox_table(metadata, owner)
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return inbox


async def test_two_transactions_marking_one_id_at_once_make_one_first(engine: AsyncEngine) -> None:
    inbox = await made_inbox(engine, "race")
    sessions = make_session_factory(engine)
    event_id = uuid4()
    both_read = asyncio.Barrier(2)

    async def mark() -> bool:
        async with sessions() as session, session.begin():
            await both_read.wait()  # both transactions open before either marks
            first = await first_delivery(session, inbox, "predictor", event_id)
            await asyncio.sleep(0.05)  # hold the transaction: the other must wait or see it
            return first

    results = await asyncio.gather(mark(), mark())
    assert sorted(results) == [False, True]
    async with sessions() as session, session.begin():  # and afterwards: seen
        assert not await first_delivery(session, inbox, "predictor", event_id)
        assert await first_delivery(session, inbox, "scheduler", event_id)  # per consumer


async def test_two_batches_marking_overlapping_ids_at_once_make_each_first_once(
    engine: AsyncEngine,
) -> None:
    """`first_deliveries`: a batch's marks in one statement, and two transactions marking
    overlapping batches at once split each id's first delivery between them, neither
    failing on the key; an id twice in one batch is first once."""
    inbox = await made_inbox(engine, "batch_race")
    sessions = make_session_factory(engine)
    ids = [uuid4() for _ in range(6)]
    statements: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "batch_race_inbox" in statement:
            statements.append(statement)

    both_read = asyncio.Barrier(2)

    async def mark(batch: list[UUID]) -> list[bool]:
        async with sessions() as session, session.begin():
            await both_read.wait()
            firsts = await first_deliveries(session, inbox, [("scheduler", i) for i in batch])
            await asyncio.sleep(0.05)
            return firsts

    one, two = await asyncio.gather(mark(ids[:4]), mark([*ids[2:], ids[5]]))
    assert len(statements) == 2  # one statement a batch
    assert (one[:2], two[2:]) == ([True, True], [True, True, False])  # their own ids
    assert sorted([one[2], two[0]]) == [False, True]  # the shared ids: first once each
    assert sorted([one[3], two[1]]) == [False, True]
    async with sessions() as session, session.begin():  # and afterwards: all seen
        again = await first_deliveries(session, inbox, [("scheduler", i) for i in ids])
        assert again == [False] * 6
