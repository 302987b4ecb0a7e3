"""`crater chaos`: the chaos harness of `benchmarks/chaos/` from the command line.

The harness lives with the other benchmarks in the repository (it is not part of an installed
Crater), so this command finds it from the source tree it was installed from in development
(`crater.cli.checkout`).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from crater.cli.checkout import benchmark
from crater.cli.output import cli_console

console = cli_console()
DEFAULT_DATABASE = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"


def _harness() -> tuple[ModuleType, ModuleType]:
    harness, plan = benchmark("chaos", "harness", "plan", console=console)
    return harness, plan


def _seconds_range(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    try:
        pair = (float(low), float(high or low))
    except ValueError:
        raise typer.BadParameter(f"{text!r}: want MIN-MAX seconds, e.g. 5-25") from None
    if pair[0] > pair[1] or pair[0] < 0:
        raise typer.BadParameter(f"{text!r}: want 0 <= MIN <= MAX")
    return pair


def chaos(
    tasks: Annotated[int, typer.Option(min=1, help="Tasks submitted through the gateway.")] = 2000,
    rate: Annotated[float, typer.Option(min=0.01, help="Tasks per second, steady.")] = 3.0,
    scheduler_kills: Annotated[int, typer.Option(min=0, help="kill -9 of the scheduler.")] = 5,
    callback_kills: Annotated[int, typer.Option(min=0, help="kill -9 of the callback.")] = 3,
    predictor_kills: Annotated[int, typer.Option(min=0, help="kill -9 of the predictor.")] = 2,
    gateway_kills: Annotated[int, typer.Option(min=0, help="kill -9 of the gateway.")] = 2,
    nats_restarts: Annotated[
        int, typer.Option(min=0, help="nats-server restarts (same store dir and port).")
    ] = 1,
    silent_nodes: Annotated[
        int, typer.Option(min=0, help="Simulated GPU nodes that stop reporting.")
    ] = 2,
    silent_seconds: Annotated[
        float,
        typer.Option(min=1, help="How long each is silent (past 90 s: the scheduler's lost)."),
    ] = 120.0,
    seed: Annotated[int, typer.Option(help="Seeds the plan and the workload.")] = 12,
    drain_seconds: Annotated[
        float, typer.Option(min=0, help="After the last task: wait this long for every end.")
    ] = 300.0,
    settle_seconds: Annotated[
        float, typer.Option(min=0, help="After every task ended: wait for late duplicates.")
    ] = 10.0,
    task_seconds: Annotated[
        str, typer.Option(help="Simulated run time of a placed task, MIN-MAX seconds.")
    ] = "5-25",
    database_url: Annotated[
        str,
        typer.Option(
            envvar="CRATER_CHAOS_DATABASE_URL",
            help="A PostgreSQL server; the run creates a fresh database on it and drops it.",
        ),
    ] = DEFAULT_DATABASE,
    data_dir: Annotated[
        Path | None, typer.Option(help="Logs, stores and records; default var/chaos/seed-N.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="The JSON report; default benchmarks/results/.")
    ] = None,
    plot: Annotated[bool, typer.Option(help="Also a PNG of allocations over time.")] = True,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE for every service (repeatable)."),
    ] = None,
    autoscaler: Annotated[bool, typer.Option(help="Run the autoscaler too.")] = False,
    reanalyse: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="Run nothing: judge the run of this report again from its recorded data.",
        ),
    ] = None,
) -> None:
    """Chaos run: tasks through the gateway while services are killed (-9) and restarted,
    nats-server restarts and nodes go silent; then what AllData was told, checked. Exits 1
    when a check of the issue's "done when" fails."""
    harness, plan = _harness()
    if reanalyse is not None:
        recorded = Path(json.loads(reanalyse.read_text())["data_dir"])
        report = harness.reanalyse(reanalyse, recorded, echo=console.print)
        if not all(check["ok"] for check in report["checks"].values()):
            raise typer.Exit(1)
        return
    service_env = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--env {item!r}: want KEY=VALUE")
        service_env[key] = value
    config = plan.ChaosConfig(
        tasks=tasks,
        rate=rate,
        kills={
            "scheduler": scheduler_kills,
            "callback": callback_kills,
            "predictor": predictor_kills,
            "gateway": gateway_kills,
        },
        nats_restarts=nats_restarts,
        silent_nodes=silent_nodes,
        silent_seconds=silent_seconds,
        seed=seed,
        drain_seconds=drain_seconds,
        settle_seconds=settle_seconds,
        database_url=database_url,
        task_seconds=_seconds_range(task_seconds),
        service_env=service_env,
    )
    name = f"chaos_{tasks}_seed{seed}"
    out = out or Path("benchmarks/results") / f"{name}.json"
    report = harness.run(
        config,
        data_dir or Path("var/chaos") / f"seed-{seed}",
        out=out,
        plot=out.with_suffix(".png") if plot else None,
        echo=console.print,
        with_autoscaler=autoscaler,
    )
    if not all(check["ok"] for check in report["checks"].values()):
        raise typer.Exit(1)
