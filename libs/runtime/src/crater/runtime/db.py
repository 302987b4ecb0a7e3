"""Database access shared by the services that keep state: engines, sessions, migrations.

SQLite (aiosqlite) is the embedded default; PostgreSQL (asyncpg) is production. Each service
owns its tables and its own Alembic history (its own version table) in one database.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import asyncpg  # type: ignore[import-untyped]
from alembic import command
from alembic.config import Config
from sqlalchemy import MetaData, Table, event, pool
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, CursorResult, make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from crater.runtime.sqlite_one_trip import one_trip_dbapi

# SQLite's `synchronous` in WAL mode, chosen with `?synchronous=` on the database URL.
# FULL (the default) syncs the WAL at every commit: a commit survives power loss, so acking
# the message after it is safe. NORMAL syncs only at checkpoints: still safe if the process
# crashes, but power loss or an OS crash can roll back the last commits, and the messages
# acked after them are then lost for good (JetStream will not redeliver an acked message).
# OFF is refused: power loss could corrupt the database itself.
SQLITE_SYNCHRONOUS = ("FULL", "EXTRA", "NORMAL")


def sqlite_synchronous(url: URL) -> tuple[URL, str]:
    """The URL without its `synchronous` query parameter, and that parameter (FULL if none)."""
    value = url.query.get("synchronous", "FULL")
    chosen = (value if isinstance(value, str) else value[-1]).upper()
    if chosen not in SQLITE_SYNCHRONOUS:
        raise ValueError(
            f"database_url: synchronous={value!r} is not one of {', '.join(SQLITE_SYNCHRONOUS)}"
        )
    return url.difference_update_query(["synchronous"]), chosen


def make_engine(database_url: str, **kwargs: Any) -> AsyncEngine:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        url, synchronous = sqlite_synchronous(url)
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        # Several service processes share the file: WAL lets readers run beside one writer.
        engine = create_async_engine(
            url, connect_args={"timeout": 30}, module=one_trip_dbapi(), **kwargs
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")  # one of SQLITE_SYNCHRONOUS
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_async_engine(url, pool_pre_ping=True, **kwargs)


async def take_write_lock(session: AsyncSession) -> None:
    """SQLite: take the database's write lock now, for the rest of the session's transaction.
    pysqlite opens a transaction only at the first write, so the reads before it run outside
    any transaction (and SELECT ... FOR UPDATE is a no-op): two connections could both read a
    row, then both write on what they read. Holding the lock from the start, this session's
    reads see every commit before it and no other writer commits until it ends.
    PostgreSQL: nothing (the caller locks its rows with FOR UPDATE)."""
    if session.get_bind().dialect.name != "sqlite":
        return
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    if raw.driver_connection is not None and raw.driver_connection.in_transaction:
        return  # a write already took it
    await connection.exec_driver_sql("BEGIN IMMEDIATE")


# Per SQLite engine (and event loop): the lock its hot write transactions take in turn.
_WRITERS: weakref.WeakKeyDictionary[Any, dict[asyncio.AbstractEventLoop, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def one_writer(sessions: async_sessionmaker[Any]) -> AbstractAsyncContextManager[Any]:
    """SQLite: a lock that a process's write transactions on this database take in turn,
    held until the commit is done. SQLite lets one connection write at a time; a second
    waits in its busy handler, which sleeps in steps growing to 100 ms and so can sleep on
    long after the lock is free (a commit that waits for the outbox relay's, or the relay
    for a batch's, measured in tens of milliseconds). Queued here, the next writer starts
    the moment the last one commits. Other processes sharing the file still meet the busy
    handler. PostgreSQL: no lock (its writers lock rows, not the database)."""
    engine = sessions.kw.get("bind")
    if engine is None or engine.dialect.name != "sqlite":
        return contextlib.nullcontext()
    by_loop = _WRITERS.setdefault(engine.sync_engine, {})
    loop = asyncio.get_running_loop()
    lock = by_loop.get(loop)
    if lock is None:
        for gone in [other for other in by_loop if other.is_closed()]:
            del by_loop[gone]
        lock = by_loop[loop] = asyncio.Lock()
    return lock


@asynccontextmanager
async def write_transaction(sessions: async_sessionmaker[Any]) -> AsyncIterator[AsyncSession]:
    """A session in a transaction that commits when the block ends (rolls back if it
    raises), taken in turn with this process's other writers (`one_writer`)."""
    async with one_writer(sessions), sessions() as session, session.begin():
        yield session


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


@asynccontextmanager
async def fresh_postgres_database(server_url: str, prefix: str = "crater") -> AsyncIterator[str]:
    """An empty database `<prefix>_<random>` on the PostgreSQL server at `server_url` (any
    database of it), as a URL with the same driver; dropped afterwards (tests, chaos runs)."""
    url = make_url(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
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


def _insert_ignoring_conflicts(
    session: AsyncSession | AsyncConnection, table: Table
) -> postgresql.Insert | sqlite.Insert:
    """`INSERT ... ON CONFLICT DO NOTHING` into `table`, in the session's dialect."""
    bind = session if isinstance(session, AsyncConnection) else session.bind
    dialect = bind.dialect.name if bind is not None else None
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    # Crater runs on these two (docs/configuration.md)
    raise ValueError(f"insert_if_absent: no ON CONFLICT for database {dialect!r}")


async def insert_if_absent(
    session: AsyncSession | AsyncConnection, table: Table, values: dict[str, Any]
) -> bool:
    """Insert the row unless one with its key is there; True when it went in. One statement,
    `INSERT ... ON CONFLICT DO NOTHING`, so two transactions inserting one key at once do not
    both read "absent" and then collide on the key: the second waits for the first's commit
    and inserts nothing."""
    statement = _insert_ignoring_conflicts(session, table).values(**values)
    done = cast(CursorResult[Any], await session.execute(statement))
    return done.rowcount == 1


async def insert_absent_returning(
    session: AsyncSession | AsyncConnection,
    table: Table,
    rows: Sequence[dict[str, Any]],
    key: Sequence[str],
    chunk: int = 300,
) -> set[tuple[Any, ...]]:
    """`insert_if_absent` for many rows, telling which went in: the `key` columns of each
    inserted row. One statement per `chunk` rows (`INSERT ... ON CONFLICT DO NOTHING
    RETURNING`); a key twice among `rows` goes in once."""
    columns = [table.c[name] for name in key]
    inserted: set[tuple[Any, ...]] = set()
    for start in range(0, len(rows), chunk):
        statement = (
            _insert_ignoring_conflicts(session, table)
            .values(list(rows[start : start + chunk]))
            .returning(*columns)
        )
        inserted.update(tuple(row) for row in await session.execute(statement))
    return inserted


async def insert_all_if_absent(
    session: AsyncSession | AsyncConnection, table: Table, rows: Sequence[dict[str, Any]]
) -> None:
    """`insert_if_absent` for many rows in one executemany (which rows went in is not told)."""
    if rows:
        await session.execute(_insert_ignoring_conflicts(session, table), list(rows))
