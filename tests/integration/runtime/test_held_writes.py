"""Held writes (crater.runtime.writes) sent grouped leave the tables exactly as the same
writes sent one by one, in fewer statements (real SQLite)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    event,
    insert,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from crater.runtime.writes import HeldWrites, Rows

pytestmark = pytest.mark.integration

metadata = MetaData()
parents = Table(
    "parents",
    metadata,
    Column("id", String(8), primary_key=True),
    Column("value", Integer, nullable=False),
    Column("note", String(16)),
)
children = Table(
    "children",
    metadata,
    Column("id", String(8), primary_key=True),
    Column("parent", String(8), ForeignKey("parents.id"), nullable=False),
    Column("value", Integer, nullable=False),
)
ADD_PARENT = insert(parents)
SET_PARENT = update(parents).where(parents.c.id == bindparam("b_id"))
ADD_CHILD = insert(children)
SET_CHILD = update(children).where(children.c.id == bindparam("b_id"))
# Every child of a parent: which children exist is not known to the writer.
BUMP_CHILDREN = update(children).where(children.c.parent == bindparam("b_parent"))

Write = tuple[Any, dict[str, Any], tuple[Rows, ...]]


@pytest.fixture
async def engine(tmp_path: Any) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'w.db'}")

    @event.listens_for(engine.sync_engine, "connect")
    def _foreign_keys(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA foreign_keys=ON")

    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    yield engine
    await engine.dispose()


def random_writes(rng: random.Random, count: int) -> list[Write]:
    """Inserts, updates of one row and updates of many, interleaved as a batch of decisions
    interleaves them; a child is inserted after its parent, as a task's allocation is."""
    writes: list[Write] = []
    made_parents: list[str] = []
    made_children: list[str] = []
    for n in range(count):
        kind = rng.choice(["parent", "child", "set-parent", "set-child", "bump", "note"])
        if kind == "parent" or not made_parents:
            pid = f"p{n}"
            made_parents.append(pid)
            writes.append((ADD_PARENT, {"id": pid, "value": n}, (Rows("parents", pid),)))
        elif kind == "child":
            cid, pid = f"c{n}", rng.choice(made_parents)
            made_children.append(cid)
            params = {"id": cid, "parent": pid, "value": n}
            writes.append((ADD_CHILD, params, (Rows("children", cid), Rows("parents", pid))))
        elif kind == "set-parent":
            pid = rng.choice(made_parents)
            writes.append((SET_PARENT, {"b_id": pid, "value": n}, (Rows("parents", pid),)))
        elif kind == "note":  # other parameter names: another executemany
            pid = rng.choice(made_parents)
            params = {"b_id": pid, "value": n, "note": f"n{n}"}
            writes.append((SET_PARENT, params, (Rows("parents", pid),)))
        elif kind == "set-child" and made_children:
            cid = rng.choice(made_children)
            writes.append((SET_CHILD, {"b_id": cid, "value": n}, (Rows("children", cid),)))
        else:
            pid = rng.choice(made_parents)
            params = {"b_parent": pid, "value": n}
            writes.append((BUMP_CHILDREN, params, (Rows("children"),)))
    return writes


async def tables(engine: AsyncEngine) -> tuple[list[Any], list[Any]]:
    async with engine.connect() as connection:
        parent_rows = (await connection.execute(select(parents).order_by(parents.c.id))).all()
        child_rows = (await connection.execute(select(children).order_by(children.c.id))).all()
    return [tuple(r) for r in parent_rows], [tuple(r) for r in child_rows]


async def clear(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(children.delete())
        await connection.execute(parents.delete())


@pytest.mark.parametrize("seed", range(8))
async def test_grouped_writes_leave_what_the_same_writes_in_order_leave(
    engine: AsyncEngine, seed: int
) -> None:
    writes = random_writes(random.Random(seed), 120)
    async with engine.begin() as connection:
        for statement, params, _ in writes:
            await connection.execute(statement, params)
    one_by_one = await tables(engine)
    await clear(engine)

    statements: list[int] = []

    @event.listens_for(engine.sync_engine, "before_execute")
    def _count(*_: Any) -> None:
        statements.append(1)

    held = HeldWrites()
    for statement, params, touched in writes:
        held.add(statement, params, *touched)
    assert len(held) == len(writes)
    async with engine.begin() as connection:
        await held.flush(connection)
    event.remove(engine.sync_engine, "before_execute", _count)
    assert await tables(engine) == one_by_one
    assert len(held) == 0
    assert len(statements) < len(writes) / 2, "grouped into executemany calls"


async def test_two_writes_to_one_row_keep_their_order_across_statements(
    engine: AsyncEngine,
) -> None:
    held = HeldWrites()
    held.add(ADD_PARENT, {"id": "a", "value": 1}, Rows("parents", "a"))
    held.add(SET_PARENT, {"b_id": "a", "value": 2, "note": "x"}, Rows("parents", "a"))
    held.add(ADD_PARENT, {"id": "b", "value": 1}, Rows("parents", "b"))  # joins the first
    held.add(SET_PARENT, {"b_id": "a", "value": 3, "note": "y"}, Rows("parents", "a"))
    held.add(ADD_CHILD, {"id": "c", "parent": "b", "value": 1}, Rows("children", "c"))
    held.add(BUMP_CHILDREN, {"b_parent": "b", "value": 9}, Rows("children"))
    held.add(SET_CHILD, {"b_id": "c", "value": 5}, Rows("children", "c"))  # after the bump
    async with engine.begin() as connection:
        await held.flush(connection)
    assert await tables(engine) == (
        [("a", 3, "y"), ("b", 1, None)],
        [("c", "b", 5)],
    )
