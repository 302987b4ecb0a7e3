"""`crater cost --by tenant|pool|model|task --since --until [--json|--csv]`: usage and cost
of allocations, from the gateway (GET /api/v1/usage; the predictor keeps the records)."""

from __future__ import annotations

import csv
import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table

from crater.cli.output import cli_console, emit_json
from crater.cli.output import table as print_table
from crater.contracts import UsageAnswer
from crater.predictor.domain.usage import csv_rows, month_start

console = cli_console(highlight=True)


class By(StrEnum):
    TENANT = "tenant"
    POOL = "pool"
    MODEL = "model"
    TASK = "task"


def _moment(text: str | None, default: datetime) -> datetime:
    if text is None:
        return default
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def cost(
    by: Annotated[By, typer.Option(help="Group by tenant, pool, GPU model or task.")] = By.TENANT,
    since: Annotated[
        str | None, typer.Option(help="ISO time (UTC unless it says); default: this month.")
    ] = None,
    until: Annotated[str | None, typer.Option(help="ISO time; default: now.")] = None,
    hourly: Annotated[bool, typer.Option("--hourly", help="One line per UTC hour.")] = False,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant (admin).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (AllData loads it).")] = False,
    gateway: Annotated[
        str, typer.Option(envvar="CRATER_GATEWAY_URL", help="The gateway's base URL.")
    ] = "http://127.0.0.1:8080",
) -> None:
    """Allocated GPU-hours (idle and unmeasured among them), GPU memory, cores, memory and
    cost per tenant, pool, GPU model or task; a tenant's credential sees its own only."""
    from crater.cli.gateway import call

    now = datetime.now(UTC)
    params: dict[str, str | int] = {
        "since": _moment(since, month_start(now)).isoformat(),
        "until": _moment(until, now).isoformat(),
        "by": by.value,
    }
    if hourly:
        params["hourly"] = "true"
    if tenant:
        params["tenant"] = tenant
    answer = UsageAnswer.model_validate_json(
        call("GET", gateway, "/api/v1/usage", params=params).content
    )
    if as_json:
        emit_json(answer.model_dump_json())
        return
    if as_csv:
        rows = csv_rows(answer)
        fields = list(rows[0]) if rows else ["by"]
        writer = csv.DictWriter(sys.stdout, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    currency = answer.currency or ""
    table = Table(
        by.value,
        *(["hour"] if hourly else []),
        "allocations",
        "GPU-hours",
        "idle GPU-h",
        "unmeasured GPU-h",
        "core-hours",
        "memory GiB-h",
        f"cost {currency}".strip(),
        title=f"usage {answer.since:%Y-%m-%d %H:%M} .. {answer.until:%Y-%m-%d %H:%M} UTC",
    )
    for line in [*answer.lines, answer.total]:
        table.add_row(
            line.key,
            *([f"{line.hour:%Y-%m-%d %H}" if line.hour else ""] if hourly else []),
            str(line.allocations),
            f"{line.gpu_hours:.3f}",
            f"{line.idle_gpu_seconds / 3600:.3f}",
            f"{line.unmeasured_gpu_seconds / 3600:.3f}",
            f"{line.cpu_core_seconds / 3600:.3f}",
            f"{line.memory_gib_seconds / 3600:.3f}",
            "-" if line.cost is None else f"{line.cost:.2f}",
        )
    print_table(table)
