"""Real databases for tests: a SQLite file, and a fresh PostgreSQL database per test.

PostgreSQL comes from CRATER_TEST_DATABASE_URL (a server URL; each test gets its own
database on it), else from testcontainers when a Docker engine answers. With
CRATER_REQUIRE_POSTGRES=1 (CI) a missing server fails the run instead of skipping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager

from crater.runtime.db import fresh_postgres_database as fresh_database


def postgres_required() -> bool:
    return os.environ.get("CRATER_REQUIRE_POSTGRES", "") not in ("", "0", "false")


@contextmanager
def postgres_server_url() -> Iterator[str | None]:
    """A PostgreSQL server URL (asyncpg dialect), or None when there is none to be had."""
    url = os.environ.get("CRATER_TEST_DATABASE_URL")
    if url:
        yield url
        return
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        yield None
        return
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16-alpine", driver="asyncpg") as container:
        yield container.get_connection_url()


def fresh_postgres_database(server_url: str) -> AbstractAsyncContextManager[str]:
    """An empty database on the server for one test, dropped afterwards."""
    return fresh_database(server_url, prefix="crater_test")
