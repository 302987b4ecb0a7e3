"""Real databases for tests: a SQLite file, and a fresh PostgreSQL database per test.

PostgreSQL comes from CRATER_TEST_DATABASE_URL (a server URL; each test gets its own
database on it), else from testcontainers when a Docker engine answers. With
CRATER_REQUIRE_POSTGRES=1 (CI) a missing server fails the run instead of skipping.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import asyncpg
from sqlalchemy.engine import make_url


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


@asynccontextmanager
async def fresh_postgres_database(server_url: str) -> AsyncIterator[str]:
    """Create an empty database on the server for one test, and drop it afterwards."""
    url = make_url(server_url)
    name = f"crater_test_{uuid.uuid4().hex[:12]}"
    admin_dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
