"""A pull batch's unit of work (`each_once`, `all_once`): every event applied in one
transaction with its inbox mark, a redelivered one not applied again, and a bad one failing
alone while the others are kept. On a SQLite file and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID, uuid4

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from crater.runtime.db import make_engine, make_session_factory
from crater.runtime.outbox import inbox_table
from crater.runtime.unit_of_work import REDELIVERED, all_once, each_once

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Noted:
    event_id: UUID
    text: str


async def test_a_batch_is_one_commit_a_redelivery_is_skipped_and_a_bad_event_fails_alone(
    database_url: str,
) -> None:
    metadata = MetaData()
    inbox = inbox_table(metadata, "each_once")
    notes = Table(
        "each_once_notes", metadata, Column("n", Integer, primary_key=True), Column("text", String)
    )
    engine = make_engine(database_url)
    commits = 0

    @event.listens_for(engine.sync_engine, "commit")
    def counted(_connection: object) -> None:
        nonlocal commits
        commits += 1

    async def note(session: AsyncSession, noted: Noted) -> str:
        if noted.text == "poison":
            raise ValueError("this one cannot be applied")
        await session.execute(insert(notes).values(text=noted.text))
        return noted.text.upper()

    try:
        async with engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        sessions = make_session_factory(engine)
        first = [Noted(uuid4(), t) for t in ("a", "b", "c")]
        commits = 0
        assert await each_once(sessions, inbox, "svc", first, note) == ["A", "B", "C"]
        assert commits == 1  # one transaction for the batch

        again = Noted(uuid4(), "d")
        outcomes = await each_once(
            sessions, inbox, "svc", [first[0], again, Noted(uuid4(), "poison")], note
        )
        assert outcomes[:2] == [REDELIVERED, "D"]
        assert isinstance(outcomes[2], ValueError)  # alone: its message is delivered again

        async with sessions() as session:
            kept = (await session.scalars(select(notes.c.text).order_by(notes.c.n))).all()
        assert kept == ["a", "b", "c", "d"]  # nothing twice, nothing of the poisoned one
        # without an inbox (writes idempotent on their own), every event is applied
        assert await each_once(sessions, None, "svc", [again], note) == ["D"]
    finally:
        await engine.dispose()


async def test_all_once_hands_the_fresh_events_over_at_once_and_falls_back_alone(
    database_url: str,
) -> None:
    metadata = MetaData()
    inbox = inbox_table(metadata, "all_once")
    notes = Table(
        "all_once_notes", metadata, Column("n", Integer, primary_key=True), Column("text", String)
    )
    engine = make_engine(database_url)
    handed: list[list[str]] = []

    async def note_all(session: AsyncSession, batch: Sequence[Noted]) -> list[str]:
        handed.append([n.text for n in batch])
        if any(n.text == "poison" for n in batch):
            raise ValueError("this one cannot be applied")
        await session.execute(insert(notes), [{"text": n.text} for n in batch])
        return [n.text.upper() for n in batch]

    try:
        async with engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        sessions = make_session_factory(engine)
        a, b = Noted(uuid4(), "a"), Noted(uuid4(), "b")
        # the same event twice in one batch is applied once; the batch is handed over whole
        assert await all_once(sessions, inbox, "svc", [a, b, a], note_all) == [
            "A",
            "B",
            REDELIVERED,
        ]
        assert handed == [["a", "b"]]
        handed.clear()
        c = Noted(uuid4(), "c")
        outcomes = await all_once(
            sessions, inbox, "svc", [b, c, Noted(uuid4(), "poison")], note_all
        )
        assert outcomes[:2] == [REDELIVERED, "C"]
        assert isinstance(outcomes[2], ValueError)
        assert handed == [["c", "poison"], ["c"], ["poison"]]  # the batch, then each alone
        async with sessions() as session:
            kept = (await session.scalars(select(notes.c.text).order_by(notes.c.n))).all()
        assert kept == ["a", "b", "c"]
    finally:
        await engine.dispose()
