"""`crater dead-letters`: messages the consumers gave up on, read from the CRATER_DEAD_LETTERS
stream, and replayed to where they came from.

A dead letter's id is its sequence in CRATER_DEAD_LETTERS. `replay` re-publishes the original
payload to its original subject with its original headers (its `Nats-Msg-Id` too, so every
consumer that already handled it de-duplicates it, and JetStream drops it inside the stream's
duplicate window), and records what it did as a `MessageReplayed` in the same stream.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from rich.table import Table

from crater.cli.jetstream import DEFAULT_NATS, NatsOption, on_jetstream
from crater.cli.output import cli_console
from crater.cli.output import table as print_table
from crater.contracts import MessageDeadLettered, MessageReplayed, Streams, Subjects
from crater.runtime.bus import PUBLISH_ACK_TIMEOUT_SECONDS, encode, retry_transient
from crater.runtime.jsondepth import json_depth

app = typer.Typer(help="Messages the consumers gave up on: list, show, replay.")
console = cli_console(highlight=True)
T = TypeVar("T")

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON lines.")]
PRETTY_DEPTH = 16  # payloads nested deeper are shown as received
SHOWN_CHARS = 8000
STREAM = Streams.DEAD_LETTERS.name


@dataclass
class Letter:
    """One dead letter and the replays recorded of it."""

    id: int
    event: MessageDeadLettered
    replays: list[MessageReplayed]

    def as_json(self, full: bool = False) -> dict[str, Any]:
        body = self.event.model_dump(mode="json")
        if not full:
            for key in ("payload", "payload_base64", "headers"):
                body.pop(key)
        return {"id": self.id, **body, "replays": [r.model_dump(mode="json") for r in self.replays]}


def _run(nats_url: str, work: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    return on_jetstream(nats_url, work)


async def read_letters(js: JetStreamContext) -> list[Letter]:
    """Every dead letter still held, oldest first, with its replays."""
    try:
        info = await js.stream_info(STREAM)
    except NotFoundError:
        return []  # no service has started since dead letters were introduced
    letters: dict[str, Letter] = {}
    replays: list[MessageReplayed] = []
    if not info.state.messages:
        return []  # an empty stream's first sequence is 0, which get_msg refuses
    for sequence in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
        try:
            raw = await js.get_msg(STREAM, sequence)
        except NotFoundError:
            continue  # deleted or aged out
        if raw.subject == Subjects.MESSAGE_DEAD_LETTERED.subject:
            event = MessageDeadLettered.model_validate_json(raw.data or b"")
            letters[str(event.event_id)] = Letter(sequence, event, [])
        elif raw.subject == Subjects.MESSAGE_REPLAYED.subject:
            replays.append(MessageReplayed.model_validate_json(raw.data or b""))
    for replay in replays:
        if (letter := letters.get(replay.dead_letter_id)) is not None:
            letter.replays.append(replay)
    return list(letters.values())


async def replay_letter(js: JetStreamContext, letter: Letter) -> MessageReplayed:
    """Publish the letter's message again where it came from, and record that it was."""
    event = letter.event
    if event.payload is not None:
        payload = event.payload.encode()
    elif event.payload_base64 is not None:
        payload = base64.b64decode(event.payload_base64)
    else:  # too large to keep in the letter: read from the stream it came from
        try:
            original = await js.get_msg(event.stream, event.stream_sequence)
        except NotFoundError:
            raise LookupError(
                f"dead letter {letter.id}: its payload was too large to keep, and "
                f"{event.stream} no longer holds #{event.stream_sequence}"
            ) from None
        payload = original.data or b""
    ack = await retry_transient(
        lambda: js.publish(
            event.subject,
            payload,
            timeout=PUBLISH_ACK_TIMEOUT_SECONDS,
            stream=event.stream,
            headers=dict(event.headers) or None,
        ),
        what=f"replay to {event.subject}",
    )
    record = MessageReplayed(
        dead_letter_id=str(event.event_id),
        dead_letter_sequence=letter.id,
        subject=event.subject,
        stream=ack.stream,
        stream_sequence=None if ack.duplicate else ack.seq,
        duplicate=bool(ack.duplicate),
    )
    await retry_transient(
        lambda: js.publish(
            Subjects.MESSAGE_REPLAYED.subject,
            encode(record),
            timeout=PUBLISH_ACK_TIMEOUT_SECONDS,
            stream=STREAM,
            headers={"Nats-Msg-Id": str(record.event_id), "content-type": "application/json"},
        ),
        what="replay record",
    )
    letter.replays.append(record)
    return record


def _find(letters: list[Letter], letter_id: int) -> Letter:
    for letter in letters:
        if letter.id == letter_id:
            return letter
    console.print(f"[red]no dead letter {letter_id}[/red] in {STREAM} (see `list`)")
    raise typer.Exit(1)


def _reason(event: MessageDeadLettered) -> str:
    return "; ".join(f"{e.field}: {e.reason}" for e in event.errors)


@app.command("list")
def list_letters(
    service: Annotated[str | None, typer.Option(help="Only this service's.")] = None,
    subject: Annotated[str | None, typer.Option(help="Only messages of this subject.")] = None,
    pending: Annotated[bool, typer.Option(help="Only those never replayed.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 50,
    as_json: JsonOption = False,
    nats_url: NatsOption = DEFAULT_NATS,
) -> None:
    """Dead letters, newest first: where each came from, who gave up on it and why."""
    letters = [
        letter
        for letter in reversed(_run(nats_url, read_letters))
        if (service is None or letter.event.service == service)
        and (subject is None or letter.event.subject == subject)
        and not (pending and letter.replays)
    ][:limit]
    if as_json:
        for letter in letters:
            print(json.dumps(letter.as_json()))
        return
    table = Table(
        "id", "when", "service", "consumer", "subject", "kind", "tries", "why", "replayed"
    )
    for letter in letters:
        event = letter.event
        table.add_row(
            str(letter.id),
            event.occurred_at.strftime("%Y-%m-%d %H:%M:%S"),
            event.service,
            event.consumer,
            event.subject,
            event.kind,
            str(event.deliveries),
            _reason(event)[:100],
            str(len(letter.replays)) if letter.replays else "-",
        )
    print_table(table)


@app.command()
def show(
    letter_id: Annotated[int, typer.Argument(help="The dead letter's id (from `list`).")],
    as_json: JsonOption = False,
    nats_url: NatsOption = DEFAULT_NATS,
) -> None:
    """One dead letter in full: payload, headers, origin, the reason, its replays."""
    letter = _find(_run(nats_url, read_letters), letter_id)
    if as_json:
        print(json.dumps(letter.as_json(full=True)))
        return
    event = letter.event
    console.print(f"[bold]dead letter {letter.id}[/bold] ({event.event_id})")
    console.print(f"  when       {event.occurred_at.isoformat()}")
    console.print(f"  from       {event.stream} #{event.stream_sequence} on {event.subject}")
    console.print(f"  refused by {event.service} ({event.consumer}), {event.kind} failure")
    console.print(f"  deliveries {event.deliveries}")
    console.print(f"  error      {event.error_class}")
    for error in event.errors:
        console.print(f"    {error.field}: {error.reason}", markup=False)
    console.print("  headers")
    for key, value in event.headers.items():
        console.print(f"    {key}: {value}", markup=False)
    console.print(f"  payload ({event.payload_bytes} bytes)")
    if event.payload is not None:
        text = event.payload
        if json_depth(text) <= PRETTY_DEPTH:  # never decode what was refused as too deep
            with contextlib.suppress(ValueError):
                text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        if len(text) > SHOWN_CHARS:
            text = text[:SHOWN_CHARS] + f"\n... ({len(text) - SHOWN_CHARS} more; --json has all)"
        console.print(text, markup=False, highlight=False)
    elif event.payload_base64 is not None:
        console.print(f"    (not UTF-8; base64) {event.payload_base64}", markup=False)
    else:
        console.print(f"    (too large to keep here: {event.stream} #{event.stream_sequence})")
    for replay in letter.replays:
        console.print(f"  replayed   {_replayed(replay)}")


def _replayed(record: MessageReplayed) -> str:
    when = record.occurred_at.strftime("%Y-%m-%d %H:%M:%S")
    if record.duplicate:
        return (
            f"{when} to {record.subject}: dropped by {record.stream} as a duplicate (it saw this "
            "Nats-Msg-Id within its duplicate window; replay again later)"
        )
    return f"{when} to {record.subject}: {record.stream} #{record.stream_sequence}"


@app.command()
def replay(
    letter_id: Annotated[
        int | None, typer.Argument(help="The dead letter's id (from `list`).")
    ] = None,
    replay_all: Annotated[
        bool, typer.Option("--all", help="Every dead letter never replayed, oldest first.")
    ] = False,
    service: Annotated[str | None, typer.Option(help="With --all: only this service's.")] = None,
    as_json: JsonOption = False,
    nats_url: NatsOption = DEFAULT_NATS,
) -> None:
    """Publish a dead letter's message again to its original subject, with its original
    headers; consumers that already handled it de-duplicate it."""
    if (letter_id is None) == (not replay_all):
        raise typer.BadParameter("give a dead letter's id, or --all (not both)")

    async def work(js: JetStreamContext) -> list[tuple[Letter, MessageReplayed | str]]:
        letters = await read_letters(js)
        if letter_id is not None:
            chosen = [_find(letters, letter_id)]
        else:
            chosen = [
                letter
                for letter in letters
                if not letter.replays and (service is None or letter.event.service == service)
            ]
        done: list[tuple[Letter, MessageReplayed | str]] = []
        for letter in chosen:
            try:
                done.append((letter, await replay_letter(js, letter)))
            except LookupError as gone:
                done.append((letter, str(gone)))
        return done

    done = _run(nats_url, work)
    failed = False
    for letter, outcome in done:
        if isinstance(outcome, str):
            failed = True
            if as_json:
                print(json.dumps({"id": letter.id, "error": outcome}))
            else:
                console.print(f"[red]{outcome}[/red]")
        elif as_json:
            print(json.dumps({"id": letter.id, **outcome.model_dump(mode="json")}))
        else:
            console.print(f"dead letter {letter.id} replayed {_replayed(outcome)}", markup=False)
    if not done and not as_json:
        console.print("nothing to replay")
    if failed:
        raise typer.Exit(1)
