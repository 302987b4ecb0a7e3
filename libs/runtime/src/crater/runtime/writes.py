"""Writes held back and sent together: one executemany per statement instead of one round
trip per row.

A batch of decisions writes a few rows per event (a task inserted, its allocation, its
status); sent one by one that is tens of statements per event, each a round trip through the
driver (a thread hop for aiosqlite, a network one for asyncpg) costing more CPU than the
decision. Held here in order, they are sent as few executemany calls as keep the outcome the
same as in order:

- each write names the rows it touches (`Rows`: a table and a key, or the whole table),
  those it reads too (a row its foreign key names);
- a write joins the earliest group of the same statement (and the same parameter names,
  which an executemany needs) that runs after every group already touching its rows, so
  two writes to one row keep their order and writes to different rows may be reordered,
  which changes nothing within one transaction;
- whoever reads in the same transaction flushes first (read your own writes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql import Executable


@dataclass(frozen=True)
class Rows:
    """What a write touches: the row of `table` keyed `key`, or every row when key is None."""

    table: str
    key: str | None = None


@dataclass
class _Group:
    statement: Executable
    names: frozenset[str]
    params: list[dict[str, Any]] = field(default_factory=list)


class HeldWrites:
    """Writes kept in order until `flush`, then sent grouped (see the module's text)."""

    def __init__(self) -> None:
        self._groups: list[_Group] = []
        # For each row, and each table, the index of the last group that touches it.
        self._last_row: dict[Rows, int] = {}
        self._last_any: dict[str, int] = {}  # any row of the table
        self._last_all: dict[str, int] = {}  # a write to every row of the table

    def __len__(self) -> int:
        return sum(len(g.params) for g in self._groups)

    def add(self, statement: Executable, params: Mapping[str, Any], *touched: Rows) -> None:
        """Hold `statement` with `params`, a write that touches `touched`."""
        after = max((self._after(rows) for rows in touched), default=-1)
        names = frozenset(params)
        index = next(
            (
                i
                for i in range(max(after, 0), len(self._groups))
                if self._groups[i].statement is statement and self._groups[i].names == names
            ),
            None,
        )
        if index is None:
            index = len(self._groups)
            self._groups.append(_Group(statement, names))
        self._groups[index].params.append(dict(params))
        for rows in touched:
            if rows.key is None:
                self._last_all[rows.table] = max(self._last_all.get(rows.table, -1), index)
            else:
                self._last_row[rows] = max(self._last_row.get(rows, -1), index)
            self._last_any[rows.table] = max(self._last_any.get(rows.table, -1), index)

    def _after(self, rows: Rows) -> int:
        """The last group that touches `rows` (-1: none)."""
        if rows.key is None:
            return self._last_any.get(rows.table, -1)
        return max(self._last_row.get(rows, -1), self._last_all.get(rows.table, -1))

    async def flush(self, session: AsyncSession | AsyncConnection) -> None:
        """Send what is held, grouped, in order; then hold nothing."""
        groups, self._groups = self._groups, []
        self._last_row.clear()
        self._last_any.clear()
        self._last_all.clear()
        for group in groups:
            if len(group.params) == 1:
                await session.execute(group.statement, group.params[0])
            else:
                await session.execute(group.statement, group.params)
