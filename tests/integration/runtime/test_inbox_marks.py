"""The inbox mark (`first_delivery`) under a race: two transactions marking one event id at
once, as a redelivery racing its first delivery or two fuzzed messages sharing an id did
(the 100k fuzz run dead-lettered grants on the predictor's IntegrityError). Exactly one is
first; neither fails. On a SQLite file and on PostgreSQL."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import pytest
from sqlalchemy import MetaData

from crater.runtime.db import make_engine, make_session_factory
from crater.runtime.outbox import first_delivery, inbox_table

pytestmark = pytest.mark.integration


async def test_two_transactions_marking_one_id_at_once_make_one_first(database_url: str) -> None:
    metadata = MetaData()
    inbox = inbox_table(metadata, "race")
    engine = make_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
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
    finally:
        await engine.dispose()
