"""The CLI's one way to reach NATS JetStream (as the admin user the CRATER_NATS_* settings
name), and what it says when it cannot (exit 3)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from crater.cli.errors import UNREACHABLE, CliError

if TYPE_CHECKING:
    from nats.js import JetStreamContext

T = TypeVar("T")
NatsOption = Annotated[
    str, typer.Option(envvar="CRATER_NATS_URL", help="The NATS server Crater runs on.")
]
DEFAULT_NATS = "nats://127.0.0.1:4222"
CONNECT_SECONDS = 8.0


def on_jetstream(nats_url: str, work: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    """`work(jetstream)` on a connection to `nats_url`, closed after."""
    from crater.runtime.nats_connection import NatsConnection
    from crater.runtime.settings import ServiceSettings

    async def go() -> T:
        try:
            # as CRATER_NATS_USER, CRATER_NATS_PASSWORD[_FILE], CRATER_NATS_TLS_* say (admin)
            nats_as = NatsConnection.of(ServiceSettings(nats_url=nats_url))
            # nats-py may retry a refused first connection for ever: bounded here
            connection = await asyncio.wait_for(
                nats_as.connect(
                    connect_timeout=5,
                    max_reconnect_attempts=0,
                    error_cb=_quiet,  # the failure is said once, below: no logged tracebacks
                ),
                CONNECT_SECONDS,
            )
        except Exception as error:
            why = str(error) or type(error).__name__
            raise CliError(
                f"cannot reach NATS at {nats_url} ({why}): is Crater up? Set CRATER_NATS_URL "
                "(and CRATER_NATS_USER/PASSWORD, CRATER_NATS_TLS_* "
                "where it is secured) to the server it runs on.",
                UNREACHABLE,
            ) from None
        try:
            return await work(connection.jetstream())
        finally:
            await connection.close()

    return asyncio.run(go())


async def _quiet(error: Exception) -> None:
    return None
