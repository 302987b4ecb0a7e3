"""`crater autoscale-sim`: replay a request trace against a simulated inference fleet, scaled
by Crater's own autoscaling policy (the domain code the service runs) and by the baselines a
user would configure instead (the HPA on slot or KV-cache utilisation, a Knative-KPA-like
concurrency autoscaler), and compare SLO attainment against replica-minutes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from crater.autoscaler.api import STRATEGIES, ScalingPolicy, Strategy
from crater.autoscaler.sim import (
    BASELINES,
    TOKEN_PROFILES,
    Baseline,
    FleetModel,
    HpaBaseline,
    KpaBaseline,
    RunResult,
    SimulationConfig,
    TraceShape,
    describe_departures,
    generate_trace,
    read_trace,
    simulate,
    with_tokens,
    write_trace,
)
from crater.cli.output import cli_console, emit_json
from crater.cli.output import table as print_table

console = cli_console(highlight=True)
# The service's defaults (its settings default to these too): every flag's default is the
# shipped value; a run with other values says so in its output.
_POLICY = ScalingPolicy()
_FLEET = FleetModel()
_CONFIG = SimulationConfig()


def autoscale_sim(
    trace: Annotated[
        Path | None,
        typer.Option(help="CSV trace: timestamp_s,input_tokens,output_tokens per request."),
    ] = None,
    policy: Annotated[
        str, typer.Option(help="crater, baseline (also spelt hpa: the --baseline runs) or both.")
    ] = "both",
    baseline: Annotated[
        list[str] | None,
        typer.Option(
            help="Baseline: hpa-slots (HPA on slot utilisation), hpa-kv (HPA/KEDA on KV-cache "
            "utilisation) or kpa (Knative-KPA-like concurrency); repeat for several "
            "(default hpa-slots)."
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(help="Write a PNG: replicas and p95 over time, SLO against replica-minutes."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the generated trace.")] = 1,
    generate: Annotated[
        Path | None,
        typer.Option(help="Write a synthetic diurnal trace with bursts here, then stop."),
    ] = None,
    hours: Annotated[float, typer.Option(help="Generated trace: length in hours.")] = 4.0,
    day_hours: Annotated[
        float | None, typer.Option(help="Generated trace: one day's length (default: --hours).")
    ] = None,
    peak_rps: Annotated[float, typer.Option(help="Generated trace: peak requests/s.")] = 30.0,
    trough_rps: Annotated[float, typer.Option(help="Generated trace: trough requests/s.")] = 3.0,
    bursts_per_hour: Annotated[
        float, typer.Option(help="Generated trace: bursts per hour (Poisson).")
    ] = 1.5,
    burst_factor: Annotated[
        tuple[float, float], typer.Option(help="Generated trace: a burst multiplies the rate by")
    ] = (2.5, 5.0),
    burst_seconds: Annotated[
        tuple[float, float], typer.Option(help="Generated trace: a burst lasts (seconds)")
    ] = (30.0, 120.0),
    tokens: Annotated[
        str,
        typer.Option(
            help="Generated trace: prompt and output lengths, lognormal: short (median 300 / "
            "120 tokens), conversation (1,020 / 129, heavy-tailed) or coding (1,500 / 13)."
        ),
    ] = "short",
    output: Annotated[Path | None, typer.Option(help="Write the results as JSON here.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the results as JSON instead of the table.")
    ] = False,
    slo_ms: Annotated[float, typer.Option(help="SLO: time to first token at most this.")] = 200.0,
    tpot_slo_ms: Annotated[
        float,
        typer.Option(
            help="Crater: a second SLO on time per output token (scale_out_tpot_ms; 0: not "
            "judged, as shipped); the report then counts the requests within it."
        ),
    ] = 0.0,
    strategy: Annotated[
        str, typer.Option(help="Crater: demand (the default) or rule (the field's rule alone).")
    ] = _POLICY.strategy,
    target_pressure: Annotated[
        list[float] | None,
        typer.Option(
            help="Crater (demand): mean GPU memory pressure to size for; repeat for several "
            f"runs (default {_POLICY.target_pressure:g}, the service's)."
        ),
    ] = None,
    drain_seconds: Annotated[
        float, typer.Option(help="Crater (demand): serve the queue within this as well.")
    ] = _POLICY.drain_seconds,
    warm_pool: Annotated[
        int, typer.Option(help="Crater: standby replicas kept placed.")
    ] = _POLICY.warm_pool_size,
    max_replicas: Annotated[
        int, typer.Option(help="Both: most replicas serving or starting.")
    ] = _POLICY.max_replicas,
    min_replicas: Annotated[
        int, typer.Option(help="Both: fewest replicas serving.")
    ] = _POLICY.min_replicas,
    scale_in_step: Annotated[
        int, typer.Option(help="Crater: replicas removed per scale-in at most.")
    ] = _POLICY.max_scale_in_step,
    headroom: Annotated[
        float,
        typer.Option(
            help="Crater (rule): also scale in when fewer replicas keep p95 and mean pressure "
            "within this share of the scale-out lines (0: the field's rule alone)."
        ),
    ] = _POLICY.scale_in_headroom or 0.0,
    initial_replicas: Annotated[
        int, typer.Option(help="Both: the replicas serving when the trace starts.")
    ] = _CONFIG.initial_replicas,
    startup_s: Annotated[
        float, typer.Option(help="Cold start of a replica, seconds (placement to serving).")
    ] = _FLEET.startup_s,
    hpa_target: Annotated[
        list[float] | None,
        typer.Option(
            help="hpa-slots: target slot utilisation (busy sequences / slots); repeat for "
            "several runs (default 0.7)."
        ),
    ] = None,
    hpa_kv_target: Annotated[
        list[float] | None,
        typer.Option(
            help="hpa-kv: target KV-cache utilisation (tokens held / KV capacity, like vLLM's "
            "gpu_cache_usage_perc); repeat for several runs (default 0.7)."
        ),
    ] = None,
    kpa_target: Annotated[
        list[float] | None,
        typer.Option(
            help="kpa: target requests in flight plus queued per replica, before the 70% "
            "target utilisation; repeat for several runs (default 16, the replica's slots)."
        ),
    ] = None,
) -> None:
    """Replay a request trace against a simulated inference fleet under Crater's autoscaling
    policy and the baselines a user would configure instead: the HPA on slot or KV-cache
    utilisation (15 s sync, 10% tolerance, 300 s scale-in window) and a Knative-KPA-like
    concurrency autoscaler (60 s stable and 6 s panic windows); report p95 time to first
    token, SLO attainment, replica-minutes and scale events."""
    if generate is not None:
        if tokens not in TOKEN_PROFILES:
            raise typer.BadParameter(
                f"--tokens is one of {', '.join(TOKEN_PROFILES)}, not {tokens!r}"
            )
        shape = TraceShape(
            hours=hours,
            day_hours=day_hours,
            peak_rps=peak_rps,
            trough_rps=trough_rps,
            bursts_per_hour=bursts_per_hour,
            burst_factor=burst_factor,
            burst_seconds=burst_seconds,
        )
        requests = generate_trace(with_tokens(shape, tokens), seed)
        write_trace(requests, generate)
        console.print(
            f"wrote {len(requests):,} requests over {hours:g} h (seed {seed}) to {generate}"
        )
        if trace is None:
            return
    if trace is None:
        raise typer.BadParameter("give --trace FILE (or --generate FILE to make one)")
    if policy not in ("crater", "baseline", "hpa", "both"):
        raise typer.BadParameter("--policy is crater, baseline (or hpa) or both")
    baselines = baseline or ["hpa-slots"]
    for name in baselines:
        if name not in BASELINES:
            raise typer.BadParameter(f"--baseline is one of {', '.join(BASELINES)}, not {name!r}")
    if strategy not in STRATEGIES:
        raise typer.BadParameter(f"--strategy is one of {', '.join(STRATEGIES)}")
    requests = read_trace(trace)
    if not requests:
        raise typer.BadParameter(f"{trace} holds no requests")
    targets = target_pressure or [_POLICY.target_pressure]
    hpa_targets = hpa_target or [HpaBaseline().target_utilisation]
    kv_targets = hpa_kv_target or [HpaBaseline(metric="kv").target_utilisation]
    kpa_targets = kpa_target or [KpaBaseline().target_concurrency]
    swept: dict[str, list[tuple[float, Baseline]]] = {
        "hpa-slots": [(t, HpaBaseline(target_utilisation=t)) for t in hpa_targets],
        "hpa-kv": [(t, HpaBaseline(metric="kv", target_utilisation=t)) for t in kv_targets],
        "kpa": [(t, KpaBaseline(target_concurrency=t)) for t in kpa_targets],
    }
    try:
        base = SimulationConfig(
            fleet=FleetModel(startup_s=startup_s),
            policy=ScalingPolicy(
                strategy=cast(Strategy, strategy),
                target_pressure=targets[0],
                drain_seconds=drain_seconds,
                warm_pool_size=warm_pool,
                min_replicas=min_replicas,
                max_replicas=max_replicas,
                max_scale_in_step=scale_in_step,
                scale_in_headroom=headroom or None,
                scale_out_tpot_ms=tpot_slo_ms or None,
            ),
            hpa=HpaBaseline(target_utilisation=hpa_targets[0]),
            initial_replicas=initial_replicas,
            slo_ms=slo_ms,
            seed=seed,
        )
        runs: list[tuple[str | Baseline, str, SimulationConfig]] = []
        if policy in ("crater", "both"):
            for target in targets if strategy == "demand" else targets[:1]:
                label = f"crater {target:g}" if len(targets) > 1 and strategy == "demand" else ""
                config = replace(base, policy=replace(base.policy, target_pressure=target))
                runs.append(("crater", label or "crater", config))
        if policy in ("baseline", "hpa", "both"):
            for name in baselines:
                # The slot-utilisation HPA keeps its old label, "hpa".
                short = "hpa" if name == "hpa-slots" else name
                for target, spec in swept[name]:
                    label = f"{short} {target:g}" if len(swept[name]) > 1 else short
                    runs.append((spec, label, base))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    notes = sorted(
        {
            note
            for name, _, config in runs
            if name == "crater" and (note := describe_departures(config.policy)) is not None
        }
    )
    for note in notes:  # loudly, before the results: what runs is not what ships
        if as_json:
            _say(note)
        else:
            console.print(f"[bold red]{note}[/]", soft_wrap=True)
    results: list[RunResult] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        for scaler, label, config in runs:
            task = progress.add_task(f"{label}: {len(requests):,} requests", total=1.0)

            def advance(fraction: float, task: TaskID = task) -> None:
                progress.update(task, completed=fraction)

            result = simulate(requests, config, scaler, advance)
            results.append(replace(result, policy=label))
            progress.update(task, completed=1.0)
    if not as_json:
        show(results, trace, tpot_slo_ms)
    if output is not None or as_json:
        body = {
            "trace": str(trace),
            "requests": len(requests),
            "config": {
                "slo": f"TTFT <= {slo_ms:g} ms",
                "strategy": strategy,
                "target_pressure": targets,
                "drain_seconds": drain_seconds,
                "warm_pool": warm_pool,
                "min_replicas": min_replicas,
                "max_replicas": max_replicas,
                "scale_in_step": scale_in_step,
                "scale_in_headroom": headroom or None,
                "tpot_slo_ms": tpot_slo_ms or None,
                "initial_replicas": initial_replicas,
                "startup_s": startup_s,
                "not_the_shipped_defaults": notes,
                "baselines": baselines,
                "hpa_target_utilisation": hpa_targets,
                "hpa_kv_target_utilisation": kv_targets,
                "kpa_target_concurrency": kpa_targets,
            },
            "results": [r.summary() for r in results],
        }
        if as_json:
            emit_json(body)
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(body, indent=2) + "\n")
            (console.print if not as_json else _say)(f"wrote {output}")
    if plot is not None:
        draw(results, plot, slo_ms)
        (console.print if not as_json else _say)(f"wrote {plot}")


def show(results: list[RunResult], trace: Path, tpot_slo_ms: float = 0.0) -> None:
    table = Table(title=f"{trace}: {results[0].requests:,} requests")
    table.add_column("")
    for r in results:
        table.add_column(r.policy, justify="right")
    rows: list[tuple[str, list[str]]] = [
        (
            f"SLO attainment (TTFT <= {results[0].slo_ms:g} ms)",
            [f"{r.slo_attainment:.2%}" for r in results],
        ),
        (
            "p50 / p95 / p99 TTFT, ms",
            [f"{r.p50_ms:.0f} / {r.p95_ms:.0f} / {r.p99_ms:.0f}" for r in results],
        ),
        ("p95 time per output token, ms", [f"{r.tpot_p95_ms or 0:.1f}" for r in results]),
        *(
            [
                (
                    f"TPOT <= {tpot_slo_ms:g} ms",
                    [f"{r.tpot_within(tpot_slo_ms):.2%}" for r in results],
                )
            ]
            if tpot_slo_ms
            else []
        ),
        ("replica-minutes (holding GPUs)", [f"{r.replica_minutes:,.0f}" for r in results]),
        ("replica-minutes serving", [f"{r.serving_replica_minutes:,.0f}" for r in results]),
        (
            "scale events (out / in)",
            [f"{len(r.scale_events)} ({r.scale_outs} / {r.scale_ins})" for r in results],
        ),
        ("panic scale-outs", [str(r.panics) for r in results]),
        ("reversals within 120 s", [str(r.reversals) for r in results]),
        ("replicas from the warm pool", [str(r.promoted) for r in results]),
        (
            "decisions not carried out as asked",
            [str(r.disagreements) for r in results],
        ),
        (
            "peak replicas / max",
            [f"{r.peak_replicas} / {r.max_replicas}" for r in results],
        ),
        ("requests dropped", [str(r.dropped) for r in results]),
    ]
    for label, values in rows:
        table.add_row(label, *values)
    print_table(table)


def draw(results: list[RunResult], path: Path, slo_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(15, 7))
    grid = figure.add_gridspec(2, 3)
    top = figure.add_subplot(grid[0, :2])
    bottom = figure.add_subplot(grid[1, :2], sharex=top)
    frontier = figure.add_subplot(grid[:, 2])
    rate = top.twinx()
    first = results[0].timeline
    rate.fill_between(
        [b.start_s / 60 for b in first],
        [b.arrivals / 60 for b in first],
        step="post",
        color="0.85",
        label="requests/s",
    )
    rate.set_ylabel("requests/s")
    top.set_zorder(rate.get_zorder() + 1)
    top.patch.set_visible(False)
    for r in results:
        minutes = [b.start_s / 60 for b in r.timeline]
        top.step(minutes, [b.holding for b in r.timeline], where="post", label=r.policy)
        bottom.plot(
            minutes,
            [
                b.p95_ms if b.p95_ms is not None and b.p95_ms != float("inf") else float("nan")
                for b in r.timeline
            ],
            label=f"{r.policy}: SLO {r.slo_attainment:.1%}, {r.replica_minutes:,.0f} replica-min",
            linewidth=1,
        )
        marker = "o" if r.policy.startswith("crater") else "s"
        frontier.scatter(r.replica_minutes, r.slo_attainment * 100, marker=marker, s=40)
        frontier.annotate(
            r.policy,
            (r.replica_minutes, r.slo_attainment * 100),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    top.set_ylabel("replicas holding GPUs")
    top.legend(loc="upper left", fontsize=8)
    bottom.axhline(slo_ms, color="red", linestyle="--", linewidth=0.8, label=f"SLO {slo_ms:g} ms")
    bottom.set_yscale("log")
    bottom.set_ylabel("p95 TTFT per minute, ms")
    bottom.set_xlabel("minutes")
    bottom.legend(loc="upper left", fontsize=8)
    frontier.set_xlabel("replica-minutes (holding GPUs)")
    frontier.set_ylabel(f"SLO attainment, % of requests with TTFT <= {slo_ms:g} ms")
    frontier.set_title("up and to the left is better", fontsize=9)
    frontier.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _say(line: str) -> None:
    """A note on stderr, where stdout carries --json."""
    typer.echo(line, err=True)
