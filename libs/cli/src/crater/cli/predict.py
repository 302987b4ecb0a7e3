"""`crater predict FILE.json [--explain] [--plot out.png]`: what the predictor would say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from crater.cli.errors import NO, USAGE
from crater.cli.output import cli_console, emit_json
from crater.cli.output import table as print_table
from crater.contracts import ResourcePrediction, TaskRequest
from crater.predictor.adapters.model_configs import with_model_config
from crater.predictor.api import Refused
from crater.predictor.api import predict as estimate
from crater.predictor.app import PredictorSettings

console = cli_console(highlight=True)

COMPONENTS = (
    "weights",
    "gradients",
    "optimizer",
    "gathered_parameters",
    "unsharded_model",
    "activations",
    "logits",
    "kv_cache",
    "workspace",
    "allocator_overhead",
    "cuda_context",
    "learned_correction",
    "requested",
)


def predict(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Task request JSON.")],
    explain: Annotated[
        bool, typer.Option("--explain", help="Show the method, the timeline and the IO.")
    ] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw the training timeline to this PNG.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the prediction as JSON.")] = False,
    hf_config: Annotated[
        Path | None,
        typer.Option(
            "--hf-config",
            exists=True,
            dir_okay=False,
            help="The model's Hugging Face config.json: predicted from its shape "
            "(model_config.hf_config). A request's hf_config_path is read under "
            "CRATER_PREDICTOR_MODEL_CONFIG_DIR, or the current directory.",
        ),
    ] = None,
) -> None:
    """Predict a task's peak GPU memory per card, host memory, step timeline and DataLoader
    settings, offline, as the predictor service would (without learned corrections)."""
    try:
        request = TaskRequest.model_validate_json(file.read_bytes())
        if hf_config is not None:
            try:
                config = json.loads(hf_config.read_bytes())
            except ValueError as error:
                console.print(f"[red]{hf_config} is not JSON[/red]: {error}")
                raise typer.Exit(USAGE) from None
            model = request.model_spec.model_copy(update={"hf_config": config})
            request = TaskRequest.model_validate(
                request.model_copy(update={"model_spec": model}).model_dump()
            )
    except ValidationError as error:
        console.print("[red]invalid request[/red]")
        for e in error.errors(include_url=False):
            console.print(f"  {'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}")
        raise typer.Exit(USAGE) from None
    settings = PredictorSettings()
    try:
        request = with_model_config(request, settings.model_config_dir or Path.cwd())
        prediction = estimate(request, settings.assumptions())
    except Refused as refused:
        console.print("[red]refused[/red]")
        for field_error in refused.errors:
            console.print(f"  {field_error.field}: {field_error.reason}")
        raise typer.Exit(NO) from None
    if as_json:
        emit_json(prediction.model_dump_json())
    else:
        show(request, prediction, explain)
    if plot is not None:
        if prediction.timeline is None:
            typer.echo("no timeline to plot: only training and fine-tuning have one", err=True)
        else:
            plot.parent.mkdir(parents=True, exist_ok=True)
            draw(request, prediction, plot)
            typer.echo(f"timeline drawn to {plot}", err=True)


def show(request: TaskRequest, p: ResourcePrediction, explain: bool) -> None:
    table = Table(
        "component",
        "MiB per GPU",
        "GiB",
        "share",
        title=f"{request.task_id}: {request.model_spec.name}",
    )
    order = [k for k in COMPONENTS if k in p.breakdown_mb]
    order += [k for k in p.breakdown_mb if k not in COMPONENTS]
    peak = max(p.gpu_memory_per_gpu_mb, 1)
    for key in order:
        mb = p.breakdown_mb[key]
        table.add_row(key, f"{mb:,}", f"{mb / 1024:.2f}", f"{mb / peak:.0%}")
    table.add_row("[bold]peak[/bold]", f"[bold]{p.gpu_memory_per_gpu_mb:,}[/bold]",
                  f"[bold]{p.gpu_memory_per_gpu_mb / 1024:.2f}[/bold]", "")  # fmt: skip
    for key, mb in p.host_breakdown_mb.items():
        table.add_row(f"host: {key}", f"{mb:,}", f"{mb / 1024:.2f}", "not on the GPU")
    print_table(table)
    if p.gpu_memory_low_mb is not None and p.gpu_memory_high_mb is not None:
        console.print(
            f"range {p.gpu_memory_low_mb:,} .. {p.gpu_memory_high_mb:,} MiB per GPU "
            "(what published runs measured, 10th to 90th percentile)"
        )
    if p.fit is not None:
        colour = {"fits": "green", "tight": "yellow"}.get(p.fit.verdict.value, "red")
        console.print(f"[{colour}]{p.fit.verdict.value}[/{colour}]: {p.fit.reason}")
    console.print(f"host memory {p.host_memory_mb:,} MiB; confidence {p.confidence.value}")
    console.print(
        f"DataLoader num_workers={p.dataloader_num_workers} "
        f"prefetch_factor={p.dataloader_prefetch_factor}"
    )
    if not explain:
        return
    if p.architecture:
        console.print(f"architecture: {p.architecture}")
    console.print(f"method: {p.method}")
    if p.parameters is not None:
        console.print(
            f"family {p.model_family}; {p.parameters:,} parameters, "
            f"{p.trainable_parameters or 0:,} trainable"
        )
    t = p.timeline
    if t is None:
        return
    console.print(
        f"step {t.step_seconds:.3f} s; {t.samples_per_second:,.1f} samples/s per node; "
        f"dataset read {t.dataset_read_mb_per_s:,.2f} MB/s per node"
    )
    console.print(
        f"checkpoint every {t.checkpoint_interval_steps} steps: {t.checkpoint_size_mb:,} MiB "
        f"per node, {t.checkpoint_seconds:,.1f} s at {t.checkpoint_write_mb_per_s:,.0f} MB/s"
    )
    timeline = Table("step", "phase", "seconds", "MiB per GPU")
    for point in t.points:
        timeline.add_row(
            str(point.step), point.phase, f"{point.seconds:.3f}", f"{point.gpu_memory_mb:,}"
        )
    console.print(timeline)


def draw(request: TaskRequest, p: ResourcePrediction, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert p.timeline is not None
    points = p.timeline.points
    seconds = [x.seconds for x in points]
    gib = [x.gpu_memory_mb / 1024 for x in points]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(seconds, gib, marker="o", markersize=3, linewidth=1.5, label="predicted per GPU")
    ax.axhline(p.gpu_memory_per_gpu_mb / 1024, color="red", linestyle="--", linewidth=1,
               label=f"peak {p.gpu_memory_per_gpu_mb / 1024:.1f} GiB")  # fmt: skip
    for x in points:
        if x.phase == "checkpoint":
            ax.axvspan(points[-2].seconds, points[-1].seconds, color="grey", alpha=0.2)
            break
    ax.set_xlabel("seconds (the checkpoint save is shaded)")
    ax.set_ylabel("GPU memory, GiB")
    ax.set_title(f"{request.model_spec.name} {request.task_type.value}: forward, backward, "
                 "optimizer step, checkpoint")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
