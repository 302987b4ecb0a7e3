"""`crater webhooks`: the callback's delivery log, read and acted on in the database.

`list` shows deliveries; `retry ID` and `replay --since TIME` put deliveries back in the
queue, where a running callback service's delivery loop sends them (same webhook-id, so a
receiver that de-duplicates drops what it already has).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, TypeVar

import typer
from rich.table import Table

from crater.callback.adapters.records import DeliveryRow
from crater.callback.api import DeliveryLog
from crater.cli.database import on_database
from crater.cli.errors import NO, USAGE, CliError
from crater.cli.output import cli_console
from crater.cli.output import table as print_table
from crater.runtime.db import make_session_factory
from crater.runtime.settings import DEFAULT_DATABASE_URL

app = typer.Typer(help="Webhook deliveries to AllData: list, retry, replay.")
console = cli_console(highlight=True)
T = TypeVar("T")

DatabaseOption = Annotated[
    str,
    typer.Option(
        envvar=["CRATER_CALLBACK_DATABASE_URL", "CRATER_DATABASE_URL"],
        help="The database the callback writes: its own if it has one, else the shared one.",
    ),
]
AttemptsOption = Annotated[
    int,
    typer.Option(
        envvar="CRATER_CALLBACK_MAX_ATTEMPTS", min=1, help="Attempts the new round may make."
    ),
]
STATES = ("pending", "delivered", "dead", "skipped", "superseded")


def _run(database_url: str, work: Callable[[DeliveryLog], Awaitable[T]]) -> T:
    return on_database(database_url, lambda engine: work(DeliveryLog(make_session_factory(engine))))


def parse_time(value: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 time (UTC unless it says otherwise) or an age: `90s`, `15m`, `2h`, `1d`."""
    now = now or datetime.now(UTC)
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = value.strip()
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return now - timedelta(seconds=float(text[:-1]) * units[text[-1]])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{value!r}: an ISO time or an age like 15m, 2h, 1d") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@app.command("list")
def list_deliveries(
    state: Annotated[
        str | None, typer.Option(help=f"Only deliveries in this state ({', '.join(STATES)}).")
    ] = None,
    task: Annotated[str | None, typer.Option(help="Only this task's deliveries.")] = None,
    endpoint: Annotated[str | None, typer.Option(help="Only this endpoint's.")] = None,
    since: Annotated[str | None, typer.Option(help="Recorded since (ISO time or 2h).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
    database_url: DatabaseOption = DEFAULT_DATABASE_URL,
) -> None:
    """Deliveries in the log, newest first."""
    if state is not None and state not in STATES:
        raise typer.BadParameter(f"state is one of {', '.join(STATES)}")
    start = parse_time(since) if since else None
    rows = _run(
        database_url,
        lambda log: log.list(
            state=state, task_id=task, endpoint=endpoint, since=start, limit=limit
        ),
    )
    if as_json:
        for row in rows:
            print(json.dumps(asdict(row), default=str))
        return
    _print_rows(rows)


def _print_rows(rows: list[DeliveryRow]) -> None:
    table = Table("id", "task", "status", "endpoint", "state", "attempts", "last", "next", "when")
    for row in rows:
        last = str(row.last_status_code or "") or (row.last_error or "")
        table.add_row(
            str(row.id),
            row.task_id,
            row.task_status,
            row.endpoint or "-",
            row.state,
            str(row.attempts),
            last or "-",
            row.next_attempt_at.strftime("%H:%M:%S") if row.next_attempt_at else "-",
            row.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    print_table(table)


@app.command()
def retry(
    delivery_id: Annotated[int, typer.Argument(help="The delivery's id (from `list`).")],
    attempts: AttemptsOption = 20,
    database_url: DatabaseOption = DEFAULT_DATABASE_URL,
) -> None:
    """Send one delivery again now (a dead or delivered one starts a new round of attempts)."""
    if not _run(database_url, lambda log: log.retry(delivery_id, attempts)):
        console.print(f"[red]no delivery {delivery_id}[/red] to send (or it is superseded)")
        raise typer.Exit(1)
    console.print(f"delivery {delivery_id} is due now")


@app.command()
def replay(
    since: Annotated[str, typer.Option(help="Recorded since: ISO time, or an age (15m, 2h).")],
    state: Annotated[
        str | None, typer.Option(help="Only deliveries in this state (dead, delivered).")
    ] = None,
    task: Annotated[str | None, typer.Option(help="Only this task's deliveries.")] = None,
    endpoint: Annotated[str | None, typer.Option(help="Only this endpoint's.")] = None,
    attempts: AttemptsOption = 20,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask: send them (needed in scripts).")
    ] = False,
    database_url: DatabaseOption = DEFAULT_DATABASE_URL,
) -> None:
    """Send again every delivery recorded since TIME, in their original order per task: shows
    what it would send and asks first (or --yes). Exit 1 when declined or nothing matches."""
    if state is not None and state not in STATES:
        raise typer.BadParameter(f"state is one of {', '.join(STATES)}")
    start = parse_time(since)
    shown = 1000
    rows = _run(
        database_url,
        lambda log: log.to_replay(start, state=state, endpoint=endpoint, task_id=task, limit=shown),
    )
    if not rows:
        console.print(f"no deliveries since {start.isoformat()} to send again")
        raise typer.Exit(NO)
    _print_rows(rows)
    more = " or more" if len(rows) == shown else ""
    question = f"send these {len(rows)}{more} deliveries again (same webhook-id)?"
    if not yes:
        if not sys.stdin.isatty():
            raise CliError(f"{len(rows)}{more} deliveries would be sent again: pass --yes", USAGE)
        if not typer.confirm(question, default=False):
            console.print("nothing sent")
            raise typer.Exit(NO)
    count = _run(
        database_url,
        lambda log: log.replay(start, attempts, state=state, endpoint=endpoint, task_id=task),
    )
    console.print(f"{count} deliveries since {start.isoformat()} are due now")
