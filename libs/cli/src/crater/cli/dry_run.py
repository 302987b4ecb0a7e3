"""Dry runs: `crater schedule-test` (a placement query against the live cluster state) and
the readable print of `crater submit --dry-run`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from crater.cli.errors import NO, USAGE, CliError
from crater.cli.gateway import call
from crater.cli.output import console, emit_json
from crater.cli.output import table as print_table
from crater.contracts import PlacementAnswer, PlacementQuery


def schedule_test(
    resource_request: Annotated[
        str,
        typer.Option(
            "--resource-request",
            help="resource_requirements JSON (as in a task request), or @FILE to read it.",
        ),
    ],
    pool: Annotated[str, typer.Option(help="The pool to place in.")] = "default",
    numa: Annotated[str, typer.Option(help="strict, best-effort or none.")] = "best-effort",
    node_selector: Annotated[
        list[str] | None,
        typer.Option("--node-selector", help="KEY=VALUE a node must carry (repeatable)."),
    ] = None,
    toleration: Annotated[
        list[str] | None,
        typer.Option(
            "--toleration",
            help="A taint to tolerate: KEY=VALUE[:EFFECT], KEY[:EFFECT] (any value) or '*' "
            "(every taint); repeatable.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    gateway: Annotated[str, typer.Option(envvar="CRATER_GATEWAY_URL")] = "http://127.0.0.1:8080",
) -> None:
    """Every node that fits, with its score, and every node that does not, with its reason.
    Exit 1 when no node fits."""
    text = resource_request
    if resource_request.startswith("@"):
        try:
            text = Path(resource_request[1:]).read_text()
        except OSError as error:
            raise CliError(
                f"--resource-request {resource_request}: {error.strerror}", USAGE
            ) from None
    try:
        query = PlacementQuery.model_validate(
            {
                "resource_requirements": json.loads(text),
                "pool": pool,
                "affinity": {"numa": numa},
                "node_selector": dict(_pair(s) for s in node_selector or []),
                "tolerations": [_toleration(t) for t in toleration or []],
            }
        )
    except (ValueError, ValidationError) as error:
        console.print(f"[red]invalid resource request:[/red] {error}")
        raise typer.Exit(USAGE) from None
    response = call("POST", gateway, "/api/v1/schedule/dry-run", content=query.model_dump_json())
    answer = PlacementAnswer.model_validate_json(response.content)
    if as_json:
        emit_json(answer.model_dump_json())
    else:
        print_placement(answer)
    if not answer.fits:
        raise typer.Exit(NO)


def print_placement(answer: PlacementAnswer) -> None:
    """The fits, best first, and the misfits with their filter, as tables."""
    fits = Table("rank", "node", "score", "GPUs", "cores", "NUMA", "per plugin", title="fits")
    for rank, fit in enumerate(answer.fits, start=1):
        fits.add_row(
            str(rank),
            fit.node_id,
            f"{fit.score:.3f}",
            ",".join(map(str, fit.gpu_ids)) + (f" ({fit.mig_profile})" if fit.mig_profile else "")
            or "-",
            f"{len(fit.cpu_cores)}",
            "-" if fit.numa_node is None else str(fit.numa_node),
            " ".join(f"{s.plugin}={s.score:.2f}" for s in fit.scores),
        )
    print_table(fits)
    misfits = Table("node", "filter", "code", "reason", title="does not fit")
    for misfit in answer.misfits:
        misfits.add_row(misfit.node_id, misfit.filter, misfit.code, misfit.reason)
    print_table(misfits)
    console.print(answer.summary)


def print_dry_run(body: bytes) -> None:
    """A task's dry run (POST /api/v1/schedule?dry_run=true): the prediction, where each
    member would go, and the node tables as schedule-test prints them."""
    from crater.gateway.app import TaskDryRun  # the gateway's app is heavy: only when needed

    answer = TaskDryRun.model_validate_json(body)
    p, placement = answer.prediction, answer.placement
    console.print(
        f"[bold]{answer.task_id}[/bold] (dry run, nothing submitted): predicted "
        f"{p.gpu_memory_per_gpu_mb} MiB per GPU, {p.host_memory_mb} MiB host memory, "
        f"{p.confidence.value} confidence"
        + (f", x{p.correction_factor:.3f} learned" if p.correction_factor else "")
    )
    console.print(
        f"placed on {placement.gpu_memory_per_gpu_mb} MiB per GPU ({placement.gpu_memory_source})"
    )
    colour = {"placed": "green", "waiting": "yellow", "rejected": "red"}[placement.outcome]
    console.print(f"[{colour}]would be {placement.outcome}[/{colour}]")
    if placement.members:
        members = Table("member", "node", "score", "GPUs", "cores", "NUMA", title="would go to")
        for m in placement.members:
            members.add_row(
                str(m.member),
                m.node_id,
                f"{m.score:.3f}",
                ",".join(map(str, m.gpu_ids)) + (f" ({m.mig_profile})" if m.mig_profile else "")
                or "-",
                str(len(m.cpu_cores)),
                "-" if m.numa_node is None else str(m.numa_node),
            )
        print_table(members)
    from crater.scheduler.domain.wording import sentence

    for reason in placement.reasons:
        console.print(f"  waits: {sentence(reason)} ({reason.filter}, {reason.code})")
    for error in placement.errors:
        console.print(f"  rejected: {error.field}: {error.reason}")
    print_placement(placement)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--node-selector {text!r}: expected KEY=VALUE")
    return key, value


def _toleration(text: str) -> dict[str, str]:
    """`key=value[:Effect]` tolerates that taint; `key[:Effect]` any value; `*` everything."""
    if text == "*":
        return {"operator": "Exists"}
    spec, _, effect = text.partition(":")
    key, sep, value = spec.partition("=")
    toleration = {"key": key, "operator": "Equal" if sep else "Exists", "value": value}
    return {**toleration, "effect": effect} if effect else toleration
