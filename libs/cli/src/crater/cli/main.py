"""`crater`: run the services, the demo, and talk to a running Crater."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated

import httpx
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from crater.cli import (
    audit,
    autoscale,
    bench,
    chaos,
    cost,
    dashboards,
    dead_letters,
    hardware,
    logs,
    predict,
    shared_day,
    simulate,
    tokens,
    webhooks,
)
from crater.cli.credentials import api_headers
from crater.cli.dry_run import print_dry_run, schedule_test
from crater.contracts import NodesAnswer, TasksAnswer

app = typer.Typer(help="Crater: an event-driven scheduler for heterogeneous AI compute.")
console = Console()

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
        raise typer.Exit(2) from None


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
) -> None:
    """Crater on embedded defaults: nats-server, SQLite, every service, a simulated fleet,
    a stand-in for AllData, and a stream of tasks. Ctrl-C stops it cleanly."""
    from crater.cli.demo import run_demo

    run_demo(data_dir=data_dir, duration=duration, rate=rate, seed=seed, local=local, secure=secure)


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
) -> None:
    """Submit a task request (the body of POST /api/v1/schedule)."""
    response = httpx.post(
        f"{gateway}/api/v1/schedule" + ("?dry_run=true" if dry_run else ""),
        content=file.read_bytes(),
        headers={"content-type": "application/json", **api_headers()},
        timeout=10,
    )
    body = response.json()
    if response.status_code >= 400:
        console.print(f"[red]rejected ({response.status_code})[/red]")
        for error in body.get("detail", []):
            if isinstance(error, dict):
                console.print(f"  {error.get('field')}: {error.get('reason')}")
            else:
                console.print(f"  {error}")
        raise typer.Exit(1)
    if dry_run:
        print_dry_run(response.content)
        return
    console.print(f"[green]submitted[/green] {body['task_id']} (event {body['event_id']})")


@app.command("list-nodes")
def list_nodes(
    pool: Annotated[str | None, typer.Option(help="Only this pool.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    gateway: GatewayOption = DEFAULT_GATEWAY,
) -> None:
    """Every node the scheduler knows, with what is free on it."""
    params: dict[str, str | int] = {"pool": pool} if pool else {}
    answer = NodesAnswer.model_validate_json(_get(f"{gateway}/api/v1/nodes", params))
    if as_json:
        console.print_json(answer.model_dump_json())
        return
    table = Table("node", "pool", "condition", "GPU", "GPUs free", "CPU free", "memory free GiB")
    for n in answer.nodes:
        gpu = f"{n.gpu_model} {n.gpu_memory_mb // 1024} GiB" if n.gpu_model else "-"
        table.add_row(
            n.node_id,
            n.pool,
            n.condition.value,
            gpu,
            f"{n.gpus_free}/{n.gpus_total}",
            f"{n.cpu_cores_free}/{n.cpu_cores_total}",
            f"{n.memory_mb_free // 1024}/{n.memory_mb_total // 1024}",
        )
    console.print(table)


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
    answer = TasksAnswer.model_validate_json(_get(f"{gateway}/api/v1/tasks", params))
    if as_json:
        console.print_json(answer.model_dump_json())
        return
    table = Table("task", "type", "status", "pool", "GPUs", "node", "GPU ids", "why")
    for t in answer.tasks:
        table.add_row(
            t.task_id,
            t.task_type.value,
            t.status.value,
            t.pool,
            str(t.gpus),
            t.node or "-",
            ",".join(map(str, t.gpu_ids)) or "-",
            (t.reason or "")[:80],
        )
    console.print(table)


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


app.command()(hardware.probe)
app.command()(hardware.diagnose)
app.command("topology-export")(hardware.topology_export)
app.command("schedule-test")(schedule_test)
app.command("autoscale-sim")(autoscale.autoscale_sim)
app.command()(predict.predict)
app.command()(cost.cost)
app.command()(dashboards.dashboards)
app.command()(logs.logs)
app.command()(simulate.simulate)
app.command("simulate-shared")(shared_day.simulate_shared)
app.command()(bench.bench)
app.command()(chaos.chaos)

db_app = typer.Typer(help="The database every stateful service shares.")
app.add_typer(db_app, name="db")
app.add_typer(webhooks.app, name="webhooks")
app.add_typer(dead_letters.app, name="dead-letters")
app.add_typer(tokens.app, name="tokens")
app.add_typer(audit.app, name="audit")


@db_app.command("upgrade")
def db_upgrade(
    database_url: Annotated[
        str, typer.Option(envvar="CRATER_DATABASE_URL")
    ] = "sqlite+aiosqlite:///var/crater.db",
) -> None:
    """Apply every service's Alembic migrations."""
    from crater.cli.stack import migrate

    migrate(database_url)
    console.print(f"migrated {database_url}")


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
            raise typer.Exit(1)
        console.print("docs are current")
        return
    written = generate(out)
    console.print(f"wrote {len(written)} files under {out}/")


def _get(url: str, params: dict[str, str | int]) -> bytes:
    try:
        response = httpx.get(url, params=params, headers=api_headers(), timeout=10)
    except httpx.ConnectError:
        console.print(f"[red]no gateway at {url}[/red]; is Crater up (make up)?")
        raise typer.Exit(2) from None
    if response.status_code >= 400:
        console.print(f"[red]{response.status_code}[/red] {response.text}")
        raise typer.Exit(1)
    return response.content


if __name__ == "__main__":
    app()
