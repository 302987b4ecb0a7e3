"""`crater simulate-shared`: a day of training and inference on one cluster whose inference
pool lends its idle cards (reclaimed by preemption), against the same cluster split into two
fixed pools (crater.scheduler.sim.shared)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from crater.cli.output import cli_console, emit_json
from crater.cli.output import table as print_table
from crater.scheduler.sim.shared import DayResult, Setup, compare

console = cli_console(highlight=True)
ROWS = (
    ("gpu_utilisation_pct", "GPU utilisation %"),
    ("training_gpu_hours", "training GPU-hours"),
    ("inference_replicas", "inference replicas"),
    ("inference_slo_attainment_pct", "inference SLO attainment %"),
    ("reclaims", "reclaims (victims)"),
    ("reclaim_p50_s", "reclaim p50 s (from the request)"),
    ("reclaim_p99_s", "reclaim p99 s (from the request)"),
    ("reclaim_max_s", "reclaim max s (from the request)"),
    ("reclaim_yield_p99_s", "reclaim p99 s (from the yield order)"),
    ("reclaimed_start_p99_s", "reclaiming replica starts, p99 s"),
    ("preemptions", "preemptions"),
    ("prewarm_preemptions", "of which pre-warm (ahead of demand)"),
    ("borrow_preemptions", "of which for a replica to borrow training's cards"),
    ("inference_borrowed", "replicas started on training's cards"),
    ("work_lost_gpu_hours", "work lost, GPU-hours"),
    ("borrowed_gpu_hours", "borrowed GPU-hours"),
)


def simulate_shared(
    seed: Annotated[str, typer.Option(help="Seeds of the day's workload, e.g. 1 or 1,2,3.")] = "1",
    keep_idle: Annotated[int, typer.Option(help="GPUs the inference pool never lends.")] = 8,
    days: Annotated[
        int, typer.Option(min=1, max=14, help="Days in a row (a pre-warm learns from the first).")
    ] = 1,
    prewarm_lead: Annotated[
        float | None,
        typer.Option(help="The inference pool's pre-warm lead in seconds (lend.prewarm); off."),
    ] = None,
    grace: Annotated[
        int | None,
        typer.Option(
            min=10,
            help="Grace period in seconds (default 30); victims stop in 20 s to grace - 5 s.",
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Where shared_day.{json,png} go.")] = Path(
        "results/shared_day"
    ),
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the setup and runs as JSON instead of tables.")
    ] = False,
) -> None:
    """A day-long simulation: shared cluster (lending) vs split cluster (two fixed pools)."""
    setup = Setup(keep_idle_gpus=keep_idle, days=days, prewarm_lead_seconds=prewarm_lead)
    if grace is not None:
        setup = replace(setup, grace_seconds=grace, stop_seconds=(min(20.0, grace), grace - 5.0))
    runs: list[dict[str, Any]] = []
    first: tuple[DayResult, DayResult] | None = None
    for s in (int(x) for x in seed.split(",")):
        split, shared = compare(setup, s)
        first = first or (split, shared)
        runs.append({"seed": s, "split": split.summary(), "shared": shared.summary()})
        table = Table(
            title=f"{days} day(s), seed {s} (grace {setup.grace_seconds} s, SLO "
            f"{setup.slo_seconds:g} s to start, inference keeps {keep_idle} GPUs idle"
            + (f", pre-warm {prewarm_lead:g} s ahead)" if prewarm_lead else ")")
        )
        table.add_column("measure")
        table.add_column("split (two fixed pools)", justify="right")
        table.add_column("shared (inference lends)", justify="right")
        for key, label in ROWS:
            table.add_row(label, str(runs[-1]["split"][key]), str(runs[-1]["shared"][key]))
        gain = shared.training_gpu_seconds / max(split.training_gpu_seconds, 1) - 1
        table.add_row("training GPU-hours gain", "", f"{100 * gain:+.1f}%")
        if not as_json:
            print_table(table)
    body = {"setup": setup.__dict__, "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "shared_day.json").write_text(json.dumps(body, indent=2, default=str) + "\n")
    assert first is not None
    _plot(*first, out / "shared_day.png")
    wrote = f"wrote {out / 'shared_day.json'} and {out / 'shared_day.png'}"
    if as_json:
        emit_json(json.dumps(body, default=str))
        typer.echo(wrote, err=True)
    else:
        console.print(wrote)


def _plot(split: DayResult, shared: DayResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, run in zip(axes, (split, shared), strict=True):
        hours = [t[0] for t in run.timeline]
        inference = [t[1] for t in run.timeline]
        training = [t[2] for t in run.timeline]
        borrowed = [t[3] for t in run.timeline]
        ax.stackplot(
            hours,
            inference,
            training,
            borrowed,
            labels=["inference", "training (own pool)", "training (borrowed)"],
            step="post",
        )
        ax.axhline(run.gpus, color="k", lw=0.8)
        s = run.summary()
        ax.set_title(
            f"{run.mode}: {s['training_gpu_hours']} training GPU-h, "
            f"SLO {s['inference_slo_attainment_pct']}%"
        )
        ax.set_xlabel("hour of the day")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GPUs held (hourly samples)")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
