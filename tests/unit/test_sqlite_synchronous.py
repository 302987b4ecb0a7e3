"""SQLite's durability is FULL unless the database URL asks for less, and only for a level
that cannot corrupt the database on power loss (WAL mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from crater.runtime.db import make_engine

# PRAGMA synchronous answers with a number.
LEVELS = {"FULL": 2, "NORMAL": 1, "EXTRA": 3}


async def pragma(url: str) -> tuple[int, str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as connection:
            synchronous = (await connection.execute(text("PRAGMA synchronous"))).scalar_one()
            journal = (await connection.execute(text("PRAGMA journal_mode"))).scalar_one()
            return int(synchronous), str(journal)
    finally:
        await engine.dispose()


async def test_full_by_default(tmp_path: Path) -> None:
    assert await pragma(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") == (LEVELS["FULL"], "wal")


@pytest.mark.parametrize("level", ["normal", "NORMAL", "extra", "full"])
async def test_chosen_on_the_url(tmp_path: Path, level: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}?synchronous={level}"
    assert await pragma(url) == (LEVELS[level.upper()], "wal")


def test_off_is_refused_as_power_loss_could_corrupt_the_database(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"database_url: synchronous='off' is not one of"):
        make_engine(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}?synchronous=off")
