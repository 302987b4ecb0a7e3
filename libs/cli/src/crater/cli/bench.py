"""`crater bench`: the scheduler's throughput end to end over a real nats-server.

The harness is `benchmarks/scheduler/throughput.py` (found from the checkout,
`crater.cli.checkout`); this command reads its options and hands them over. `--path http`
runs the services as `crater up` does and submits over the gateway's HTTP API; `--deep-queue`
adds a stage whose tasks wait. Writes benchmarks/results/bench_<path>_<nodes>.json and a PNG
beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from crater.cli.checkout import benchmark
from crater.cli.output import cli_console

console = cli_console(highlight=True)
RESULTS = Path("benchmarks/results")
PATHS = ("scheduler", "full", "http")


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise typer.BadParameter(f"rates: a comma-separated list of numbers ({error})") from None
    if not rates or any(r <= 0 for r in rates):
        raise typer.BadParameter("rates: at least one rate, each above 0 tasks/s")
    return rates


def bench(
    nodes: Annotated[int, typer.Option(min=1, max=100_000, help="Simulated nodes.")] = 1000,
    rates: Annotated[
        str, typer.Option(help="Tasks per second offered, stage by stage (comma-separated).")
    ] = "25,50,100,200,400,800,1600",
    stage_seconds: Annotated[
        float, typer.Option(min=0.5, help="How long each rate is offered.")
    ] = 8.0,
    path: Annotated[
        str,
        typer.Option(
            help="scheduler: publish task.profiled; full: task.submitted (predictor and "
            "scheduler); http: POST /api/v1/schedule to the gateway of a stack as `crater up` "
            "runs it, timed to the receiver's `scheduled` webhook."
        ),
    ] = "scheduler",
    database_url: Annotated[
        str | None,
        typer.Option(help="The scheduler's database (default: a fresh SQLite file)."),
    ] = None,
    consumer_batch: Annotated[
        int, typer.Option(min=1, max=10_000, help="JetStream pull batch.")
    ] = 64,
    raw_messages: Annotated[
        int, typer.Option(min=100, help="Messages for the raw JetStream rate.")
    ] = 20000,
    seed: Annotated[int, typer.Option(help="Seed of the fleet and the tasks.")] = 7,
    out_dir: Annotated[Path, typer.Option(help="Where results go.")] = RESULTS,
    profile: Annotated[
        bool, typer.Option(help="Run the scheduler under cProfile; print its top functions.")
    ] = False,
    keep_going: Annotated[
        bool, typer.Option(help="Offer every rate, even after the scheduler fell behind.")
    ] = False,
    deep_queue: Annotated[
        bool,
        typer.Option(
            help="After the rates, a stage of GPU tasks asking twice the fleet's cards, "
            "offered at once: most wait, and are placed as others finish."
        ),
    ] = False,
    deep_queue_hold: Annotated[
        float,
        typer.Option(min=0.0, max=60.0, help="Seconds each deep-queue task holds its GPUs."),
    ] = 1.0,
    heartbeat_seconds: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Each node's heartbeat interval (default: the probe's shipped one); 0 sends "
            "none and gives the scheduler a day's heartbeat timeout (said in the output).",
        ),
    ] = None,
    idle_seconds: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Before the stages, each process's CPU with no task offered, over this "
            "long: the baseline of the CPU per task above idle (0: not measured).",
        ),
    ] = 5.0,
) -> None:
    """The scheduler's throughput end to end over a real nats-server, beside the raw
    JetStream rate measured in the same run."""
    if path not in PATHS:
        raise typer.BadParameter(f"path: {path!r} is not one of {', '.join(PATHS)}")
    if profile and path == "http":
        raise typer.BadParameter("profile: the scheduler path and the full path only")
    offered = parse_rates(rates)
    (throughput,) = benchmark("scheduler", "throughput", console=console)
    throughput.run(
        throughput.BenchConfig(
            nodes=nodes,
            rates=offered,
            stage_seconds=stage_seconds,
            path=path,
            database_url=database_url,
            consumer_batch=consumer_batch,
            raw_messages=raw_messages,
            seed=seed,
            out_dir=out_dir,
            profile=profile,
            keep_going=keep_going,
            deep_queue=deep_queue,
            deep_queue_hold=deep_queue_hold,
            idle_seconds=idle_seconds,
            **({} if heartbeat_seconds is None else {"heartbeat_seconds": heartbeat_seconds}),
        )
    )
