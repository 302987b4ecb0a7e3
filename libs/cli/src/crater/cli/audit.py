"""`crater audit`: the scheduler's audit log (crater.scheduler.audit, docs/audit.md): verify
its chain and signed checkpoints, replay it through the production core, explain a task,
export the decisions, drop what is past retention.

`--from`/`--to` take a record number or an ISO time (the first record decided at or after it).
Replay and explain run the configuration the log recorded in force at each point (the
scheduler writes it when it loads its state and at every reload of the pools and quotas
files); the token secret, never recorded, comes from the same settings as the scheduler's
(CRATER_SCHEDULER_TOKEN_SECRET), and so does the configuration of a log recorded before
configuration records existed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from sqlalchemy.ext.asyncio import AsyncConnection

from crater.cli.output import cli_console

app = typer.Typer(help="The scheduler's audit log: verify, replay, explain, export.")
console = cli_console(highlight=True)
T = TypeVar("T")

DatabaseOption = Annotated[str, typer.Option(envvar="CRATER_DATABASE_URL")]
DEFAULT_DATABASE = "sqlite+aiosqlite:///var/crater.db"
FromOption = Annotated[
    str | None, typer.Option("--from", help="First record: a number or an ISO time.")
]
ToOption = Annotated[str | None, typer.Option("--to", help="Last record: a number or ISO time.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _on_database(database_url: str, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    from crater.cli.database import on_database

    async def run(engine: Any) -> T:
        async with engine.connect() as connection:
            return await work(connection)

    return on_database(database_url, run)


async def _seq(connection: AsyncConnection, text: str | None, end: bool = False) -> int | None:
    from crater.scheduler import audit

    if text is None:
        return None
    if text.isdigit():
        return int(text)
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    found = await audit.seq_at(connection, moment)
    if end:  # the last record decided before the moment
        return (found - 1) if found else None
    return found or sys.maxsize


def _cpus() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _config() -> Any:
    from crater.scheduler.app import SchedulerSettings, scheduler_config

    return scheduler_config(SchedulerSettings())


@app.command()
def keygen(
    out: Annotated[Path, typer.Option(help="The private key's file; the public key: OUT.pub")],
) -> None:
    """A new Ed25519 key pair for the signed checkpoints: the scheduler gets the private key
    (CRATER_SCHEDULER_AUDIT_SIGNING_KEY_FILE), auditors the public one."""
    from crater.scheduler import audit

    private, public = audit.generate_key_pair()
    out.write_bytes(private)
    out.chmod(0o600)
    Path(f"{out}.pub").write_bytes(public)
    key = audit.load_public_key(public)
    console.print(f"wrote {out} (secret) and {out}.pub (key id {audit.key_id(key)})")


@app.command()
def verify(
    start: FromOption = None,
    end: ToOption = None,
    public_key: Annotated[
        Path | None, typer.Option(help="The operator's public key: check the signatures.")
    ] = None,
    as_json: JsonOption = False,
    database_url: DatabaseOption = DEFAULT_DATABASE,
) -> None:
    """Check the hash chain, the signed checkpoints and the snapshots' bytes; name the first
    record altered, removed or inserted, or snapshot damaged. Exit 1 if one is found."""
    from crater.scheduler import audit

    key = audit.load_public_key(public_key.read_bytes()) if public_key else None

    async def work(connection: AsyncConnection) -> audit.VerifyReport:
        first = await _seq(connection, start) or 1
        last = await _seq(connection, end, end=True)
        return await audit.verify(connection, first, last, key)

    report = _on_database(database_url, work)
    if as_json:
        print(
            json.dumps(
                {
                    "ok": report.ok,
                    "records": report.records,
                    "first": report.first,
                    "last": report.last,
                    "checkpoints": report.checkpoints,
                    "snapshots": report.snapshots,
                    "finding": None
                    if report.finding is None
                    else {
                        "seq": report.finding.seq,
                        "what": report.finding.what,
                        "detail": report.finding.detail,
                    },
                    "notes": report.notes,
                }
            )
        )
    else:
        for note in report.notes:
            console.print(f"note: {note}")
        span = f"records {report.first}..{report.last}" if report.records else "no records"
        if report.finding is None:
            console.print(
                f"ok: {span}, {report.checkpoints} checkpoints, {report.snapshots} snapshots"
            )
        else:
            console.print(f"[red]TAMPERED[/red] {report.finding} ({span})")
    if report.finding is not None:
        raise typer.Exit(1)


@app.command()
def replay(
    start: FromOption = None,
    end: ToOption = None,
    weight: Annotated[
        list[str] | None,
        typer.Option(help="PLUGIN=WEIGHT: replay with a score's weight changed (what-if)."),
    ] = None,
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning",
            help="Start at the log's first record, not at the snapshot at or before --from.",
        ),
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(
            help="Processes at once, each replaying the stretch between two periodic "
            "snapshots (the stretches must join: each ends in the state the next one's "
            "snapshot holds); 0: one per CPU. Pays on idle cores only.",
            min=0,
        ),
    ] = 1,
    as_json: JsonOption = False,
    database_url: DatabaseOption = DEFAULT_DATABASE,
) -> None:
    """Feed the recorded inputs through the production core, from the snapshot at or before
    --from (or the log's beginning), with the configuration recorded in force at each point,
    and check every decision from --from to --to byte for byte. On a difference: stop, show
    the input, the state that led to it and a diff; exit 1."""
    from crater.scheduler import audit

    config = _config()
    changes = [
        (plugin, float(value)) for plugin, _, value in (c.partition("=") for c in weight or [])
    ]

    def what_if(recorded: Any) -> Any:
        for plugin, value in changes:
            recorded = audit.with_weight(recorded, plugin, value)
        return recorded

    def progress(count: int) -> None:
        print(f"replayed {count} events", file=sys.stderr)

    async def bounds(connection: AsyncConnection) -> tuple[int, int | None]:
        return await _seq(connection, start) or 1, await _seq(connection, end, end=True)

    first, last = _on_database(database_url, bounds)  # the database is there: checked here
    report = audit.replay_in_parallel(
        database_url,
        config,
        first,
        last,
        jobs=jobs or _cpus(),
        what_if=what_if if changes else None,
        from_snapshot=not from_beginning,
        progress=progress,
    )
    if as_json:
        print(
            json.dumps(
                {
                    "identical": report.identical,
                    "events": report.events,
                    "compared": report.compared,
                    "seconds": round(report.seconds, 3),
                    "events_per_second": round(report.rate),
                    "started_at": report.started_at,
                    "restarts": report.restarts,
                    "configs": report.configs,
                    "adopted": report.adopted,
                    "diverged_at": None if report.divergence is None else report.divergence.seq,
                    "problem": report.problem,
                    "notes": report.notes,
                }
            )
        )
    else:
        begun = (
            f"from the snapshot at record {report.started_at}"
            if report.started_at
            else "from the log's beginning"
        )
        console.print(
            f"replayed {report.events} events {begun} in {report.seconds:.2f} s "
            f"({report.rate:,.0f} events/s), compared {report.compared}"
        )
        if report.configs:
            console.print(f"configuration records applied: {report.configs}")
        if report.restarts:
            console.print(
                f"leader take-overs at records {report.restarts}; the state each loaded was "
                f"taken from its snapshot at records {report.adopted or 'none'}"
            )
        for note in report.notes:
            console.print(f"note: {note}")
    if report.problem is not None:
        print(f"replay stopped: {report.problem}")
        raise typer.Exit(1)
    if report.divergence is not None:
        print(report.divergence.render())
        raise typer.Exit(1)
    if not as_json:
        console.print("identical: every decision byte for byte")


@app.command()
def explain(
    task_id: Annotated[str, typer.Argument()],
    placements: Annotated[
        bool,
        typer.Option(help="Replay to each placement: filters per node and scores as then."),
    ] = True,
    scan: Annotated[
        bool,
        typer.Option(
            help="Read the whole log and replay it from record 1, not the task index and the "
            "snapshots (slow: what the fast way must equal)."
        ),
    ] = False,
    as_json: JsonOption = False,
    database_url: DatabaseOption = DEFAULT_DATABASE,
) -> None:
    """A task's whole story from the log: every decision about it, and for a placement the
    filters that removed which nodes and the scores of the nodes that remained. Its records
    are found through the task index (and, among records written before it, by a scan), and
    each placement is replayed from the nearest snapshot before it; nothing is left out."""
    from crater.scheduler import audit

    config = _config() if placements else None

    async def work(connection: AsyncConnection) -> audit.Explained:
        if not scan:
            return await audit.explain_log(connection, task_id, config)
        restored = await audit.read_snapshots(connection, why=audit.RESTORED)
        entries = await audit.all_entries(connection)
        return audit.Explained(audit.explain(entries, task_id, config, restored), len(entries))

    told = _on_database(database_url, work)
    steps = told.steps
    for note in told.notes:
        print(f"note: {note}", file=sys.stderr)
    if not steps:
        console.print(f"the log says nothing of {task_id!r}")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps([s.as_dict() for s in steps], indent=2))
        return
    for step in steps:
        what = step.decision["kind"] if step.decision else f"input {step.input_kind}"
        console.print(
            f"#{step.seq} {step.decided_at} epoch {step.epoch} ({step.source}, on "
            f"{step.input_kind}): [bold]{what}[/bold]"
        )
        event = step.decision["event"] if step.decision else {}
        for line in _said(event):
            console.print(f"    {line}")
        if step.placement:
            for fit in step.placement["fits"]:
                scores = ", ".join(f"{s['plugin']}={s['score']:.4g}" for s in fit["scores"])
                console.print(f"    fits {fit['node_id']}: {fit['score']:.6g} ({scores})")
            for misfit in step.placement["misfits"]:
                console.print(
                    f"    removed {misfit['node_id']} by {misfit['filter']}: {misfit['reason']}"
                )


def _said(event: dict[str, Any]) -> list[str]:
    lines = []
    for name in ("node", "gpu_ids", "score", "explanation", "summary", "reason", "status"):
        if event.get(name) not in (None, "", []):
            lines.append(f"{name}: {event[name]}")
    for error in event.get("errors", []):
        lines.append(f"error {error.get('field')}: {error.get('reason')}")
    return lines


@app.command()
def index(database_url: DatabaseOption = DEFAULT_DATABASE) -> None:
    """Fill in the task index (explain's way to a task's records) for the records written
    without it: before migration 0011, or by an older scheduler since. A few thousand records
    per transaction, committed as it goes: run it with the scheduler running."""
    from crater.scheduler import audit

    async def work(connection: AsyncConnection) -> int:
        return await audit.index_tasks(
            connection, progress=lambda done: print(f"{done} records indexed", file=sys.stderr)
        )

    count = _on_database(database_url, work)
    console.print(f"indexed {count} records: every record's tasks are in the index")


@app.command()
def export(
    out: Annotated[Path, typer.Option(help="The file to write.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet")] = "parquet",
    start: FromOption = None,
    end: ToOption = None,
    database_url: DatabaseOption = DEFAULT_DATABASE,
) -> None:
    """One row per decision: task, tenant, pool, resources, node, score, the decision's time
    and its input's (for AllData's own analysis; pandas.read_parquet reads it)."""
    from crater.scheduler import audit

    if fmt not in ("jsonl", "parquet"):
        raise typer.BadParameter("jsonl or parquet", param_hint="--format")

    async def work(connection: AsyncConnection) -> list[audit.Entry]:
        # From the beginning, so each task's request is known; rows from --from on.
        last = await _seq(connection, end, end=True)
        return await audit.all_entries(connection, 1, last)

    entries = _on_database(database_url, work)
    first = _on_database(database_url, lambda c: _seq(c, start)) or 1
    rows = (r for r in audit.decision_rows(entries) if r["seq"] >= first)
    writer = audit.export_jsonl if fmt == "jsonl" else audit.export_parquet
    count = writer(rows, out)
    console.print(f"wrote {count} decisions to {out}")


@app.command()
def prune(
    days: Annotated[
        float | None,
        typer.Option(help="Keep this many days; default: CRATER_SCHEDULER_AUDIT_RETENTION_DAYS."),
    ] = None,
    database_url: DatabaseOption = DEFAULT_DATABASE,
) -> None:
    """Drop the records past retention (the checkpoints stay: verify starts at the first kept
    record's stored link, and a checkpoint vouches for it)."""
    from crater.scheduler import audit
    from crater.scheduler.app import SchedulerSettings

    keep = days if days is not None else SchedulerSettings().audit_retention_days
    if keep is None:
        console.print("no retention set: the audit log is kept for ever")
        return
    before = datetime.now(UTC) - timedelta(days=keep)

    async def work(connection: AsyncConnection) -> int:
        count = await audit.prune(connection, before)
        await connection.commit()
        return count

    count = _on_database(database_url, work)
    console.print(f"dropped {count} records decided before {before:%Y-%m-%dT%H:%M:%SZ}")
