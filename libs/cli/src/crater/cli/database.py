"""The CLI's one way to open the database the services share: never creates one (a SQLite
file that is not there is an error, not a new empty database), and says what to do when it
cannot be reached or has no tables yet (exit codes in crater.cli.errors)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from crater.cli.errors import UNREACHABLE, CliError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")
HINT = (
    "set CRATER_DATABASE_URL (or --database-url) to the database the services use; "
    "under `crater up` that is sqlite+aiosqlite:///var/demo/crater.db, and the callback's "
    "own (CRATER_CALLBACK_DATABASE_URL) sqlite+aiosqlite:///var/demo/callback.db"
)


def sqlite_file(database_url: str) -> Path | None:
    """The file of a SQLite URL (None for another database or an in-memory one)."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def on_database(database_url: str, work: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """`work(engine)` on `database_url`, disposed after; a CliError when the database is
    missing, unreachable or not migrated."""
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    from crater.runtime.db import make_engine

    try:
        file = sqlite_file(database_url)
    except (ArgumentError, NoSuchModuleError) as error:
        raise CliError(f"database URL {database_url!r} is not valid: {error}; {HINT}") from None
    if file is not None and not file.is_file():
        raise CliError(f"no database at {file}: {HINT}", UNREACHABLE)

    async def go() -> T:
        engine = make_engine(database_url)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    shown = _shown(database_url)
    try:
        return asyncio.run(go())
    except DBAPIError as error:
        text = str(error.orig or error).splitlines()[0]
        if "no such table" in text or "does not exist" in text:
            raise CliError(
                f"the database at {shown} has no Crater tables yet ({text}): "
                "run `crater db upgrade` with that URL, or point to the one the services use",
                UNREACHABLE,
            ) from None
        raise CliError(f"cannot use the database at {shown}: {text}; {HINT}", UNREACHABLE) from None
    except OSError as error:
        raise CliError(
            f"cannot reach the database at {shown}: {error}; {HINT}", UNREACHABLE
        ) from None


def _shown(database_url: str) -> str:
    """The URL without its password."""
    from sqlalchemy.engine import make_url

    return make_url(database_url).render_as_string(hide_password=True)
