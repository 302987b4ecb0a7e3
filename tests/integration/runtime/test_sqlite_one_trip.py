"""The SQLite engine Crater makes (`make_engine`): each statement is one trip to aiosqlite's
thread, and what it returns is what sqlite3 returned (rows, counts, ids, RETURNING, errors,
streamed results), on a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from crater.runtime.db import make_engine

pytestmark = pytest.mark.integration

metadata = MetaData()
items = Table(
    "items",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(16), nullable=False, unique=True),
    Column("size", Integer, nullable=False),
)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'one-trip.db'}")
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    yield engine
    await engine.dispose()


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call sent to an aiosqlite thread, by name."""
    sent: list[str] = []
    original = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(getattr(fn, "__name__", repr(fn)))
        return await original(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    return sent


async def test_a_statement_is_one_trip_to_the_sqlite_thread(
    engine: AsyncEngine, trips: list[str]
) -> None:
    async with engine.begin() as connection:
        await connection.execute(insert(items).values(name="a", size=1))
        trips.clear()
        assert (await connection.execute(select(items.c.name, items.c.size))).all() == [("a", 1)]
        assert len(trips) == 1  # SQLAlchemy's own adapter: cursor, execute, fetchall, close
        trips.clear()
        await connection.execute(update(items).values(size=2))
        assert len(trips) == 1


async def test_rows_counts_and_ids_are_sqlite3s(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        first = await connection.execute(insert(items).values(name="a", size=1))
        assert first.inserted_primary_key == (1,)  # lastrowid
        many = await connection.execute(
            insert(items), [{"name": n, "size": s} for n, s in (("b", 2), ("c", 3), ("d", 4))]
        )
        assert many.rowcount == 3  # executemany
        changed = await connection.execute(update(items).where(items.c.size > 2).values(size=0))
        assert changed.rowcount == 2
        returned = await connection.execute(
            insert(items).values(name="e", size=5).returning(items.c.id, items.c.name)
        )
        assert returned.all() == [(5, "e")]
        assert await connection.scalar(select(func.count()).select_from(items)) == 5
        assert (await connection.execute(text("SELECT 1 WHERE 0"))).all() == []
        nothing = await connection.execute(update(items).where(items.c.name == "z").values(size=1))
        assert nothing.rowcount == 0


async def test_errors_are_sqlalchemys_and_the_transaction_rolls_back(
    engine: AsyncEngine,
) -> None:
    async with engine.connect() as connection:
        await connection.execute(insert(items).values(name="a", size=1))
        with pytest.raises(IntegrityError, match="UNIQUE"):
            await connection.execute(insert(items).values(name="a", size=2))
        await connection.rollback()
        with pytest.raises(OperationalError, match="no such table"):
            await connection.execute(text("SELECT * FROM missing"))
    async with engine.connect() as connection:  # the connection is usable again, nothing kept
        assert await connection.scalar(select(func.count()).select_from(items)) == 0


async def test_streamed_results_still_come_in_parts(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(insert(items), [{"name": f"n{i}", "size": i} for i in range(50)])
    async with engine.connect() as connection:
        streamed = await connection.stream(select(items.c.size).order_by(items.c.id))
        sizes = [row.size async for row in streamed]
    assert sizes == list(range(50))
