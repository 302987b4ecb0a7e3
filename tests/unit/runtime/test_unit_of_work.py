"""The unit of work: the inbox mark, the handler's writes and the staged events commit
together; a redelivery is told so; a failure leaves nothing, the mark included."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import Column, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import async_sessionmaker

from crater.contracts import TaskStatus, TaskStatusReported
from crater.runtime.db import make_engine, make_session_factory
from crater.runtime.outbox import inbox_table, outbox_table
from crater.runtime.unit_of_work import unit_of_work

metadata = MetaData()
inbox = inbox_table(metadata, "test")
outbox = outbox_table(metadata, "test")
things = Table("things", metadata, Column("name", String(32), primary_key=True))


async def count(sessions: async_sessionmaker[Any], table: Table) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(table)))


async def test_commits_the_mark_the_writes_and_the_outbox_together(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'uow.db'}")
    async with engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    sessions = make_session_factory(engine)
    event_id = uuid4()
    report = TaskStatusReported(task_id="t", status=TaskStatus.RUNNING)

    async with unit_of_work(sessions, inbox, "c", event_id, outbox) as work:
        assert work.first
        await work.session.execute(insert(things).values(name="one"))
        await work.stage(report)
    assert (await count(sessions, things), await count(sessions, outbox)) == (1, 1)
    assert await count(sessions, inbox) == 1

    async with unit_of_work(sessions, inbox, "c", event_id, outbox) as work:
        assert not work.first  # a redelivery
    async with unit_of_work(sessions, inbox, "other", event_id) as work:
        assert work.first  # another consumer's inbox
        with pytest.raises(ValueError, match="no outbox"):
            await work.stage(report)

    async def failing() -> None:
        async with unit_of_work(sessions, inbox, "c", uuid4(), outbox) as work:
            await work.session.execute(insert(things).values(name="two"))
            await work.stage(report.model_copy(update={"event_id": uuid4()}))
            raise RuntimeError("the handler failed")

    with pytest.raises(RuntimeError):
        await failing()
    assert (await count(sessions, things), await count(sessions, outbox)) == (1, 1)
    assert await count(sessions, inbox) == 2
    await engine.dispose()
