"""`crater`: run the services, the demo, and talk to a running Crater.

`crater --help` imports none of the commands' modules: each is loaded when it runs (its
one-line help is read from its source), so the services, alembic and numpy load only for
the commands that need them. Exit codes: crater.cli.errors (docs/cli.md).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import sys
from datetime import datetime
from difflib import get_close_matches
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import typer
import typer._click as click  # typer vendors its click: these classes, not click's
from typer.core import TyperCommand, TyperGroup

from crater.cli.errors import INTERNAL, NO, USAGE, CliError
from crater.cli.output import console, emit_json
from crater.cli.output import table as print_table

# name -> (module, attribute): a function (one command) or a typer.Typer (a group).
LAZY: dict[str, tuple[str, str]] = {
    "probe": ("crater.cli.hardware", "probe"),
    "diagnose": ("crater.cli.hardware", "diagnose"),
    "topology-export": ("crater.cli.hardware", "topology_export"),
    "schedule-test": ("crater.cli.dry_run", "schedule_test"),
    "autoscale-sim": ("crater.cli.autoscale", "autoscale_sim"),
    "predict": ("crater.cli.predict", "predict"),
    "cost": ("crater.cli.cost", "cost"),
    "dashboards": ("crater.cli.dashboards", "dashboards"),
    "logs": ("crater.cli.logs", "logs"),
    "simulate": ("crater.cli.simulate", "simulate"),
    "simulate-shared": ("crater.cli.shared_day", "simulate_shared"),
    "bench": ("crater.cli.bench", "bench"),
    "chaos": ("crater.cli.chaos", "chaos"),
    "webhooks": ("crater.cli.webhooks", "app"),
    "dead-letters": ("crater.cli.dead_letters", "app"),
    "tokens": ("crater.cli.tokens", "app"),
    "audit": ("crater.cli.audit", "app"),
}


@cache
def load_command(name: str) -> click.Command:
    """The real command `name`: its module imported now."""
    module, attribute = LAZY[name]
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        command: click.Command = typer.main.get_group(target)
    else:
        single = typer.Typer()
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


@cache
def source_help(name: str) -> str:
    """The help of command `name` as its source has it (docstring or Typer(help=...)),
    read without importing the module."""
    module, attribute = LAZY[name]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return ""
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attribute:
            return ast.get_docstring(node) or ""
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == attribute for t in node.targets)
            and isinstance(node.value, ast.Call)
        ):
            for keyword in node.value.keywords:
                if keyword.arg == "help" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return ""


class LazyGroup(TyperGroup):
    """Lists the lazy commands by their source's help; imports one only to run it."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in LAZY if n not in self.commands)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in LAZY:
            return super().get_command(ctx, cmd_name)
        if ctx.resilient_parsing:  # shell completion: the real options
            return load_command(cmd_name)
        return TyperCommand(cmd_name, help=source_help(cmd_name))  # for the listing

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as error:
            typer.echo(f"crater: {error.message}", err=True)
            raise typer.Exit(error.exit_code) from None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name in LAZY and name not in self.commands:
            return name, load_command(name), args[1:]
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.UsageError as error:
            close = get_close_matches(name, self.list_commands(ctx))
            if close and "Did you mean" not in error.message:
                error.message = f"{error.message.rstrip('.')}. Did you mean {close[0]!r}?"
            raise


class CraterTyper(typer.Typer):
    """`crater` itself: an unexpected exception is one line on stderr and exit 70; the
    traceback only with CRATER_DEBUG=1."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as error:
            if os.environ.get("CRATER_DEBUG"):
                raise
            typer.echo(
                f"crater: internal error: {type(error).__name__}: {error}\n"
                "This is a bug in crater; run again with CRATER_DEBUG=1 for the traceback "
                "and report it.",
                err=True,
            )
            sys.exit(INTERNAL)


app = CraterTyper(
    cls=LazyGroup,
    help="Crater: an event-driven scheduler for heterogeneous AI compute. "
    "Exit codes: 0 done, 1 the answer is no, 2 bad input, 3 cannot reach the gateway, "
    "database or NATS, 4 not authorised, 70 a bug (docs/cli.md).",
    pretty_exceptions_enable=False,
)

GatewayOption = Annotated[
    str,
    typer.Option(envvar="CRATER_GATEWAY_URL", help="The gateway's base URL."),
]
DEFAULT_GATEWAY = "http://127.0.0.1:8080"
RUNNABLE = ("probe", "predictor", "scheduler", "autoscaler", "callback", "gateway")


@app.command()
def run(service: Annotated[str, typer.Argument(help=f"One of: {', '.join(RUNNABLE)}")]) -> None:
    """Run one service in the foreground, configured by CRATER_* environment variables."""
    if service not in RUNNABLE:
        raise typer.BadParameter(f"unknown service {service!r}; one of {', '.join(RUNNABLE)}")
    from pydantic import ValidationError

    try:
        importlib.import_module(f"crater.{service}.app").main()
    except ValidationError as error:  # its settings: say which to set, exit 2
        if not error.title.endswith("Settings"):
            raise
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"])
            message = problem["msg"].removeprefix("Value error, ")
            typer.echo(
                f"crater {service}: refused to start: {where + ': ' if where else ''}{message}",
                err=True,
            )
        raise typer.Exit(USAGE) from None


@app.command()
def up(
    duration: Annotated[
        float, typer.Option(help="Stop after this many seconds (0: until Ctrl-C).")
    ] = 0,
    data_dir: Annotated[Path, typer.Option(help="Where the demo keeps its state.")] = Path(
        "var/demo"
    ),
    rate: Annotated[float, typer.Option(help="Tasks submitted per second.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the workload.")] = 7,
    local: Annotated[
        bool,
        typer.Option(
            help="Also run this machine as node local-01, where a small CPU training script "
            "(examples/train_with_crater_client.py) runs for real every minute."
        ),
    ] = True,
    secure: Annotated[
        bool,
        typer.Option(
            help="NATS over TLS, each service as its own user limited to its catalog subjects "
            "(a development CA and passwords made under the data dir; docs/security.md)."
        ),
    ] = True,
    scenario: Annotated[
        str,
        typer.Option(
            help="mixed: a stream of every kind of task. shared-day: a day in minutes, where "
            "inference lends its idle cards to training at night and takes them back by day "
            "(examples/pools-lending.yaml)."
        ),
    ] = "mixed",
    day_seconds: Annotated[
        float, typer.Option(min=120, help="shared-day: how long the demo's day lasts.")
    ] = 480.0,
) -> None:
    """Crater on embedded defaults: nats-server, SQLite, every service, a simulated fleet,
    a stand-in for AllData, and a stream of tasks. Ctrl-C stops it cleanly."""
    from crater.cli.demo import run_demo

    run_demo(
        data_dir=data_dir,
        duration=duration,
        rate=rate,
        seed=seed,
        local=local,
        secure=secure,
        scenario=scenario,
        day_seconds=day_seconds,
    )


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Task request JSON.")],
    gateway: GatewayOption = DEFAULT_GATEWAY,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Only show the prediction and where it would go: nothing submitted or held.",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the gateway's answer as JSON.")
    ] = False,
) -> None:
    """Submit a task request (the body of POST /api/v1/schedule): checked here first, then
    sent. Exit 1 when the gateway rejects it."""
    from crater.cli.gateway import call

    content = read_json_file(file)
    response = call(
        "POST", gateway, "/api/v1/schedule" + ("?dry_run=true" if dry_run else ""), content=content
    )
    if as_json:
        emit_json(response.text)
        return
    if dry_run:
        from crater.cli.dry_run import print_dry_run

        print_dry_run(response.content)
        return
    body = response.json()
    console.print(f"[green]submitted[/green] {body['task_id']} (event {body['event_id']})")


def read_json_file(file: Path) -> bytes:
    """`file`'s bytes when they are a JSON object; else a CliError (exit 2) saying where."""
    import json

    content = file.read_bytes()
    try:
        body = json.loads(content)
    except UnicodeDecodeError:
        raise CliError(f"{file}: not a UTF-8 text file", USAGE) from None
    except json.JSONDecodeError as error:
        raise CliError(
            f"{file}: invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}",
            USAGE,
        ) from None
    if not isinstance(body, dict):
        raise CliError(f"{file}: a task request is a JSON object, not {type(body).__name__}", USAGE)
    return content


@app.command("list-nodes")
def list_nodes(
    pool: Annotated[str | None, typer.Option(help="Only this pool.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    gateway: GatewayOption = DEFAULT_GATEWAY,
) -> None:
    """Every node the scheduler knows, with what is free on it."""
    params: dict[str, str | int] = {"pool": pool} if pool else {}
    from rich.table import Table

    from crater.cli.gateway import call
    from crater.contracts import NodesAnswer

    answer = NodesAnswer.model_validate_json(
        call("GET", gateway, "/api/v1/nodes", params=params).content
    )
    if as_json:
        emit_json(answer.model_dump_json())
        return
    columns = ["node", "pool", "condition", "GPU", "GPUs free", "CPU free", "memory free GiB"]
    # where nodes declare a place in the network fabric: spine/leaf/NVLink domain
    placed = any(n.fabric is not None for n in answer.nodes)
    table = Table(*columns, *(["fabric"] if placed else []))
    for n in answer.nodes:
        gpu = f"{n.gpu_model} {n.gpu_memory_mb // 1024} GiB" if n.gpu_model else "-"
        held = f" ({len(n.cordoned_gpus)} cordoned)" if n.cordoned_gpus else ""
        fabric = n.fabric
        where = (
            "/".join(name or "-" for name in (fabric.spine, fabric.leaf, fabric.nvlink_domain))
            if fabric is not None
            else "-"
        )
        table.add_row(
            n.node_id,
            n.pool,
            n.condition.value + (" cordoned" if n.cordoned else ""),
            gpu,
            f"{n.gpus_free}/{n.gpus_total}{held}",
            f"{n.cpu_cores_free}/{n.cpu_cores_total}",
            f"{n.memory_mb_free // 1024}/{n.memory_mb_total // 1024}",
            *([where] if placed else []),
        )
    print_table(table)
    for n in answer.nodes:
        for why in [*([n.cordoned] if n.cordoned else []), *n.cordoned_gpus.values()]:
            typer.echo(why)


@app.command("fabric-export")
def fabric_export(
    pool: Annotated[str | None, typer.Option(help="Only this pool.")] = None,
    output: Annotated[Path | None, typer.Option(help="Write DOT here, not stdout.")] = None,
    gateway: GatewayOption = DEFAULT_GATEWAY,
) -> None:
    """The cluster's network fabric as Graphviz DOT: every node the scheduler knows, nested by
    spine, leaf and NVLink domain (its declared place), with its free GPUs."""
    from crater.cli.gateway import call
    from crater.contracts import NodesAnswer
    from crater.probe.domain.dot import fabric_dot

    params: dict[str, str | int] = {"pool": pool} if pool else {}
    answer = NodesAnswer.model_validate_json(
        call("GET", gateway, "/api/v1/nodes", params=params).content
    )
    dot = fabric_dot(answer.nodes)
    if output is None:
        typer.echo(dot, nl=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(dot)
    typer.echo(f"wrote {output} ({len(answer.nodes)} nodes)")


def _cordon_card(node: str, gpu: int, on: bool, reason: str, gateway: str) -> None:
    from crater.cli.gateway import call

    verb = "cordon" if on else "uncordon"
    body = json.dumps({"reason": reason}) if on else None
    call("POST", gateway, f"/api/v1/admin/nodes/{node}/gpus/{gpu}/{verb}", content=body)
    typer.echo(f"{verb}: GPU {gpu} of {node} (applied at the scheduler's next event)")


@app.command()
def cordon(
    node: Annotated[str, typer.Option("--node", help="The node.")],
    gpu: Annotated[int, typer.Option("--gpu", help="The card's index on the node.")],
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    gateway: GatewayOption = DEFAULT_GATEWAY,
) -> None:
    """Cordon one card of a node: no new work lands on it (what runs there goes on) until
    `crater uncordon` (admin scope)."""
    _cordon_card(node, gpu, True, reason, gateway)


@app.command()
def uncordon(
    node: Annotated[str, typer.Option("--node", help="The node.")],
    gpu: Annotated[int, typer.Option("--gpu", help="The card's index on the node.")],
    gateway: GatewayOption = DEFAULT_GATEWAY,
) -> None:
    """Lift the cordon of one card of a node, whatever put it there: a fault the probe
    reported (a card needing service, after it is repaired) or an operator (admin scope)."""
    _cordon_card(node, gpu, False, "", gateway)


def queue_cell(position: int | None, start: datetime | None) -> str:
    """A waiting task's place in its pool's queue and estimated start (`#2, ~14:05:00Z`;
    `?`: no estimate); empty for a task that does not wait."""
    if position is None:
        return ""
    when = f"~{start:%Y-%m-%d %H:%M:%S}Z" if start is not None else "?"
    return f"#{position}, {when}"


@app.command()
def tasks(
    status: Annotated[str | None, typer.Option(help="Only tasks in this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    gateway: GatewayOption = DEFAULT_GATEWAY,
) -> None:
    """Tasks, newest first, with where they run or why they wait."""
    params: dict[str, str | int] = {"limit": limit}
    if status:
        params["status"] = status
    from rich.table import Table

    from crater.cli.gateway import call
    from crater.contracts import TasksAnswer

    answer = TasksAnswer.model_validate_json(
        call("GET", gateway, "/api/v1/tasks", params=params).content
    )
    if as_json:
        emit_json(answer.model_dump_json())
        return
    # the queue's column last: scripts that cut the earlier ones (`cut -f 8`: why) still work
    table = Table("task", "type", "status", "pool", "GPUs", "node", "GPU ids", "why", "queue")
    for t in answer.tasks:
        table.add_row(
            t.task_id,
            t.task_type.value,
            t.status.value,
            t.pool,
            str(t.gpus),
            t.node or "-",
            ",".join(map(str, t.gpu_ids)) or "-",
            t.reason or "",
            queue_cell(t.queue_position, t.estimated_start_at),
        )
    print_table(table)


@app.command()
def receiver(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 9180,
    username: Annotated[str, typer.Option(envvar="CRATER_RECEIVER_USERNAME")] = "alldata",
    password: Annotated[str, typer.Option(envvar="CRATER_RECEIVER_PASSWORD")] = "change-me",
    record_file: Annotated[Path | None, typer.Option(help="Append deliveries as JSONL.")] = None,
    secret: Annotated[
        str | None,
        typer.Option(envvar="CRATER_RECEIVER_SECRET", help="whsec_ secret: verify signatures."),
    ] = None,
    fail_rate: Annotated[float, typer.Option(help="Answer 503 to this share of requests.")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Seed the injected failures.")] = None,
) -> None:
    """A reference webhook receiver standing in for AllData."""
    from crater.callback.sim.receiver import main as receiver_main

    receiver_main(
        host=host,
        port=port,
        username=username,
        password=password,
        record_file=record_file,
        fail_rate=fail_rate,
        seed=seed,
        secret=secret,
    )


db_app = typer.Typer(help="The database the stateful services share (the callback may own one).")
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(
    database_url: Annotated[
        str, typer.Option(envvar="CRATER_DATABASE_URL")
    ] = "sqlite+aiosqlite:///var/crater.db",
    callback_database_url: Annotated[
        str | None,
        typer.Option(
            envvar="CRATER_CALLBACK_DATABASE_URL",
            help="The callback's own database, if it has one (else it shares the other).",
        ),
    ] = None,
) -> None:
    """Apply every service's Alembic migrations."""
    from crater.cli.stack import migrate

    migrate(database_url, callback_database_url)
    console.print(f"migrated {database_url}")
    if callback_database_url:
        console.print(f"migrated {callback_database_url} (the callback's)")


@app.command()
def docs(
    check: Annotated[bool, typer.Option(help="Fail if docs/ is not current.")] = False,
    out: Annotated[Path, typer.Option(help="The docs folder.")] = Path("docs"),
) -> None:
    """Generate JSON Schema, AsyncAPI and the subject table from the contracts."""
    from crater.cli.docs import generate, stale

    if check:
        outdated = stale(out)
        if outdated:
            console.print(f"[red]stale:[/red] {', '.join(outdated)}; run `crater docs`")
            raise typer.Exit(NO)
        console.print("docs are current")
        return
    written = generate(out)
    console.print(f"wrote {len(written)} files under {out}/")


if __name__ == "__main__":
    app()
