"""`crater logs TASK`: a task's output, as the executing node agent on this machine kept it
(STATE_DIR/logs/tasks/TASK-ATTEMPT.log; docs/execution.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from crater.probe.api import find_logs, log_finished


def logs(
    task_id: Annotated[str, typer.Argument(help="The task's id.")],
    attempt: Annotated[
        int | None, typer.Option(min=1, help="Which attempt; default the latest.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the attempt ends.")
    ] = False,
    state_dir: Annotated[
        Path,
        typer.Option(envvar="CRATER_PROBE_STATE_DIR", help="The node agent's state directory."),
    ] = Path("var/probe"),
) -> None:
    """Print a task's stdout and stderr from this node (local files of the executing agent)."""
    found = find_logs(state_dir, task_id)
    if not found:
        typer.echo(f"no logs of task {task_id!r} under {state_dir / 'logs' / 'tasks'}", err=True)
        raise typer.Exit(1)
    chosen = max(found) if attempt is None else attempt
    if chosen not in found:
        typer.echo(
            f"task {task_id!r} has no attempt {chosen} here (attempts: "
            f"{', '.join(map(str, sorted(found)))})",
            err=True,
        )
        raise typer.Exit(1)
    for path in found[chosen]:
        with path.open("rb") as log:
            while True:
                chunk = log.read(65536)
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                    continue
                if not follow or log_finished(state_dir, path):
                    # the end is recorded after the last line: read what came before it
                    rest = log.read()
                    sys.stdout.buffer.write(rest)
                    sys.stdout.buffer.flush()
                    break
                time.sleep(0.25)
