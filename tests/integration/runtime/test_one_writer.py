"""`one_writer` (and `write_transaction`, which takes it): a process's write transactions on
a SQLite file take turns in the event loop instead of meeting in SQLite's busy handler (which
sleeps in steps up to 100 ms and may sleep on after the lock is free). On PostgreSQL it takes
no lock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text

from crater.runtime.db import make_engine, make_session_factory, one_writer, write_transaction

pytestmark = pytest.mark.integration


async def test_a_second_writer_waits_for_the_first_to_commit_not_for_sqlite(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path}/writers.db")
    try:
        async with engine.begin() as connection:
            await connection.execute(text("CREATE TABLE written (name TEXT)"))
        sessions = make_session_factory(engine)
        wrote: list[str] = []
        first_wrote, release = asyncio.Event(), asyncio.Event()

        async def write(name: str, hold: bool) -> None:
            async with write_transaction(sessions) as session:
                # No busy handler: a write that met another's lock in SQLite would fail at
                # once ("database is locked") instead of waiting.
                await session.execute(text("PRAGMA busy_timeout=0"))
                await session.execute(text("INSERT INTO written VALUES (:name)"), {"name": name})
                wrote.append(name)
                if hold:
                    first_wrote.set()
                    await release.wait()

        first = asyncio.create_task(write("first", hold=True))
        await first_wrote.wait()
        second = asyncio.create_task(write("second", hold=False))
        # Time for the second's statements to reach SQLite (aiosqlite's thread) had it not
        # waited for its turn: there, with no busy handler, its write would fail at once.
        await asyncio.sleep(0.3)
        assert wrote == ["first"]
        assert not second.done()
        release.set()
        await asyncio.gather(first, second)
        assert wrote == ["first", "second"]
        async with sessions() as session:
            stored = (await session.execute(text("SELECT name FROM written"))).scalars().all()
        assert sorted(stored) == ["first", "second"]
    finally:
        await engine.dispose()


async def test_the_lock_is_per_database_and_none_on_postgresql(tmp_path: Path) -> None:
    one = make_engine(f"sqlite+aiosqlite:///{tmp_path}/one.db")
    other = make_engine(f"sqlite+aiosqlite:///{tmp_path}/other.db")
    postgres = make_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")  # never connected
    try:
        lock = one_writer(make_session_factory(one))
        assert one_writer(make_session_factory(one)) is lock  # every factory of the engine
        assert one_writer(make_session_factory(other)) is not lock
        async with one_writer(make_session_factory(postgres)):  # a no-op: nothing to wait on
            pass
        assert not isinstance(one_writer(make_session_factory(postgres)), asyncio.Lock)
    finally:
        for engine in (one, other, postgres):
            await engine.dispose()


async def test_a_write_transaction_that_fails_rolls_back_and_lets_the_next_writer_in(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path}/failing.db")
    try:
        async with engine.begin() as connection:
            await connection.execute(text("CREATE TABLE written (name TEXT)"))
        sessions = make_session_factory(engine)

        async def fail() -> None:
            async with write_transaction(sessions) as session:
                await session.execute(text("INSERT INTO written VALUES ('lost')"))
                raise RuntimeError("the disk is full")

        with pytest.raises(RuntimeError, match="the disk is full"):
            await fail()
        lock = one_writer(sessions)
        assert isinstance(lock, asyncio.Lock)
        assert not lock.locked()
        async with asyncio.timeout(5):  # the next writer is not left waiting
            async with write_transaction(sessions) as session:
                await session.execute(text("INSERT INTO written VALUES ('kept')"))
        async with sessions() as session:
            stored = (await session.execute(text("SELECT name FROM written"))).scalars().all()
        assert stored == ["kept"]
    finally:
        await engine.dispose()
