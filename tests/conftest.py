"""Fixtures every test layer shares: a real nats-server from the wheel, real databases."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from crater.runtime.nats_server import NatsServer, start_nats_server
from tests.support.databases import (
    fresh_postgres_database,
    postgres_required,
    postgres_server_url,
)
from tests.support.events import EventTap

# The test session is development: its services run on the development token secret and
# unsigned webhooks. Tests of the production refusals set CRATER_ENVIRONMENT=production.
os.environ["CRATER_ENVIRONMENT"] = "development"


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server with JetStream for the session, on a free port."""
    store = tmp_path_factory.mktemp("jetstream")
    with start_nats_server(store, log_file=store / "nats.log") as server:
        yield server


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture
async def fresh_nats(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A nats-server of the test's own, for tests that need empty streams and consumers."""
    with start_nats_server(tmp_path / "js", log_file=tmp_path / "nats.log") as server:
        yield server


@pytest.fixture
async def tap(fresh_nats: NatsServer) -> AsyncIterator[EventTap]:
    event_tap = await EventTap.start(fresh_nats.url)
    yield event_tap
    await event_tap.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str | None]:
    with postgres_server_url() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_server: str | None
) -> AsyncIterator[str]:
    """Each database test runs twice: on a SQLite file and on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'crater.db'}"
        return
    if postgres_server is None:
        message = "no PostgreSQL: set CRATER_TEST_DATABASE_URL or run a Docker engine"
        if postgres_required():
            pytest.fail(message)
        pytest.skip(message)
    async with fresh_postgres_database(postgres_server) as url:
        yield url
