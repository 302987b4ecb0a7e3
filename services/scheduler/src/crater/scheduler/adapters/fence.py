"""The database's half of leader fencing: a row holding the epoch allowed to commit.

A new leader claims the row with its epoch (only upwards) before it loads the state; every
decision transaction first checks the row still holds its own epoch, with an UPDATE so that
it takes the row's lock: a takeover's claim waits for a commit in flight, and a commit after
the claim finds the higher epoch and is refused (Deposed). So two leaders never both commit,
whatever their clocks and however late the deposed one's transaction runs.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from crater.runtime.leadership import Deposed
from crater.scheduler.adapters.orm import leadership

NAME = "scheduler"


async def claim(connection: AsyncConnection, epoch: int, holder: str) -> None:
    """Make `epoch` the one allowed to commit; Deposed if a higher one holds the row."""
    moved = await connection.execute(
        update(leadership)
        .where(leadership.c.name == NAME, leadership.c.epoch < epoch)
        .values(epoch=epoch, holder=holder, since=datetime.now(UTC))
    )
    if moved.rowcount == 1:
        return
    held = (
        await connection.execute(select(leadership.c.epoch).where(leadership.c.name == NAME))
    ).scalar()
    if held is None:
        try:
            async with connection.begin_nested():
                await connection.execute(
                    insert(leadership).values(
                        name=NAME, epoch=epoch, holder=holder, since=datetime.now(UTC)
                    )
                )
            return
        except IntegrityError:  # another claimed it at the same moment: look again
            return await claim(connection, epoch, holder)
    if held != epoch:
        raise Deposed(f"the database's fence holds epoch {held}, above this leader's {epoch}")


async def check(connection: AsyncConnection, epoch: int | None) -> None:
    """In a decision's transaction, before anything is written: Deposed unless the fence
    holds `epoch` (None: this process does not lead)."""
    if epoch is None:
        raise Deposed("this scheduler does not lead: it may not commit decisions")
    held = await connection.execute(
        update(leadership)
        .where(leadership.c.name == NAME, leadership.c.epoch == epoch)
        .values(epoch=epoch)
    )
    if held.rowcount != 1:
        raise Deposed(
            f"the database's fence no longer holds epoch {epoch}: a newer leader took over"
        )
