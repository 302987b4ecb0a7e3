"""`crater tokens`: the gateway's API keys. A token is printed once, at creation; only its
SHA-256 is kept, in the gateway's JetStream key-value bucket (default) or in a keys file
(`--file`, the gateway's CRATER_GATEWAY_API_KEYS_FILE)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from crater.cli.output import cli_console
from crater.cli.output import table as print_table
from crater.gateway.apikeys import (
    ApiKey,
    Scope,
    find_key,
    kv_bucket,
    kv_keys,
    kv_put,
    new_key,
    read_keys_file,
    write_keys_file,
)
from crater.runtime.bus import replicas_for
from crater.runtime.nats_connection import NatsConnection

app = typer.Typer(help="The gateway's API keys: create (the token shown once), list, revoke.")
console = cli_console(highlight=True)

NatsOption = Annotated[
    str, typer.Option(envvar="CRATER_NATS_URL", help="The NATS server the gateway uses.")
]
FileOption = Annotated[
    Path | None,
    typer.Option(
        "--file",
        envvar="CRATER_GATEWAY_API_KEYS_FILE",
        dir_okay=False,
        help="A keys file (YAML, or JSON by its suffix) instead of the JetStream bucket.",
    ),
]
DEFAULT_NATS = "nats://127.0.0.1:4222"


async def _stored(nats_url: str) -> list[ApiKey]:
    connection = await NatsConnection(nats_url).connect()
    try:
        return await kv_keys(await kv_bucket(connection.jetstream()))
    finally:
        await connection.close()


async def _store(nats_url: str, key: ApiKey) -> None:
    connection = await NatsConnection(nats_url).connect()
    try:
        bucket = await kv_bucket(connection.jetstream(), replicas_for(connection, 0))
        await kv_put(bucket, key)
    finally:
        await connection.close()


def load(file: Path | None, nats_url: str) -> list[ApiKey]:
    return read_keys_file(file) if file else asyncio.run(_stored(nats_url))


def save(file: Path | None, nats_url: str, key: ApiKey) -> None:
    if file is None:
        asyncio.run(_store(nats_url, key))
        return
    keys = [k for k in read_keys_file(file) if k.hash != key.hash]
    write_keys_file(file, [*keys, key])


@app.command()
def create(
    tenant: Annotated[str, typer.Option(help="The tenant whose tasks the key submits and sees.")],
    scope: Annotated[
        list[Scope], typer.Option("--scope", help="submit, read, cancel or admin; repeatable.")
    ],
    name: Annotated[str, typer.Option(help="What the key is for (shown by list).")] = "",
    user: Annotated[
        str | None,
        typer.Option(
            help="The user the key submits as: a task naming another user is refused (403)."
        ),
    ] = None,
    file: FileOption = None,
    nats_url: NatsOption = DEFAULT_NATS,
) -> None:
    """Create a key and print its token, once: only its hash is kept."""
    token, key = new_key(tenant, scope, name, user)
    save(file, nats_url, key)
    typer.echo(token)
    typer.echo(
        f"key {key.key_id} for tenant {key.tenant}"
        + (f", user {key.user}" if key.user else "")
        + f" ({', '.join(key.scopes)}): the token above "
        "is shown only now",
        err=True,
    )


@app.command("list")
def list_keys(
    file: FileOption = None,
    nats_url: NatsOption = DEFAULT_NATS,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
) -> None:
    """The keys (never their tokens): id, tenant, user, scopes, name, created, revoked."""
    keys = load(file, nats_url)
    if as_json:
        for key in keys:
            typer.echo(json.dumps({"id": key.key_id, **key.model_dump(mode="json")}))
        return
    table = Table("id", "tenant", "user", "scopes", "name", "created", "revoked")
    for key in keys:
        table.add_row(
            key.key_id,
            key.tenant,
            key.user or "",
            ",".join(key.scopes),
            key.name,
            key.created.isoformat(timespec="seconds"),
            key.revoked.isoformat(timespec="seconds") if key.revoked else "",
        )
    print_table(table)


@app.command()
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (list), 8 characters at least.")],
    file: FileOption = None,
    nats_url: NatsOption = DEFAULT_NATS,
) -> None:
    """Revoke a key: refused (401) from the next request on; kept, marked, for the record."""
    try:
        key = find_key(load(file, nats_url), key_id)
    except LookupError as error:
        raise typer.BadParameter(str(error)) from None
    if key.revoked is None:
        save(file, nats_url, key.model_copy(update={"revoked": datetime.now(UTC)}))
    typer.echo(f"key {key.key_id} revoked")
