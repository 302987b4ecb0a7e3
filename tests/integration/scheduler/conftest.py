"""The scheduler's database, migrated to head, for the integration tests that drive its
service layer directly (SQLite and PostgreSQL, by `database_url`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from crater.runtime.db import make_engine, make_session_factory, upgrade_to_head_async
from crater.scheduler.app import MIGRATIONS_DIR


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[Any]:
    await upgrade_to_head_async(database_url, MIGRATIONS_DIR)
    engine = make_engine(database_url)
    yield make_session_factory(engine)
    await engine.dispose()
