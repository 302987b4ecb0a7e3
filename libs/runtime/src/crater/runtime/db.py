"""Database access shared by the services that keep state: engines, sessions, migrations.

SQLite (aiosqlite) is the embedded default; PostgreSQL (asyncpg) is production. Each service
owns its tables and its own Alembic history (its own version table) in one database.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import MetaData, event, pool
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine


def make_engine(database_url: str, **kwargs: Any) -> AsyncEngine:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        # Several service processes share the file: WAL lets readers run beside one writer.
        engine = create_async_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_async_engine(url, pool_pre_ping=True, **kwargs)


def make_session_factory(engine: AsyncEngine) -> async_sessionmaker[Any]:
    return async_sessionmaker(engine, expire_on_commit=False)


def alembic_config(database_url: str, migrations_dir: Path) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade_to_head(database_url: str, migrations_dir: Path) -> None:
    command.upgrade(alembic_config(database_url, migrations_dir), "head")


async def upgrade_to_head_async(database_url: str, migrations_dir: Path) -> None:
    # Alembic's env runs its own event loop; give it a thread.
    await asyncio.to_thread(upgrade_to_head, database_url, migrations_dir)


def run_alembic_env(target_metadata: MetaData, version_table: str) -> None:
    """The body of every service's migrations/env.py: online, async, its own version table."""
    from alembic import context

    config = context.config
    url = config.get_main_option("sqlalchemy.url")
    assert url is not None

    def configure(connection: Connection | None) -> None:
        context.configure(
            connection=connection,
            url=None if connection is not None else url,
            target_metadata=target_metadata,
            version_table=version_table,
            render_as_batch=make_url(url).get_backend_name() == "sqlite",
            compare_type=True,
        )

    if context.is_offline_mode():
        configure(None)
        with context.begin_transaction():
            context.run_migrations()
        return

    def run_sync(connection: Connection) -> None:
        configure(connection)
        with context.begin_transaction():
            context.run_migrations()

    async def run_async() -> None:
        engine = make_engine(url, poolclass=pool.NullPool)
        async with engine.connect() as connection:
            await connection.run_sync(run_sync)
            await connection.commit()
        await engine.dispose()

    asyncio.run(run_async())
