"""How commands print data: rich tables on a terminal; plain tab-separated columns (never
wrapped nor cut) when stdout is a pipe or a file; JSON where --json asks."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def cli_console(*, stderr: bool = False, highlight: bool = False) -> Console:
    """A console for a command's output: wrapped to the width of a terminal; in a pipe or a
    file a line stays one line, however long, so grep and cut see it whole (docs/cli.md)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=highlight, soft_wrap=not stream.isatty())


console = cli_console()


def table(rows: Table, out: Console | None = None) -> None:
    """`rows` as a table on a terminal, else as a header line and rows, tab-separated."""
    out = out or console
    if out.is_terminal:
        out.print(rows)
        return
    columns = rows.columns
    lines = ["\t".join(_plain(c.header) for c in columns)]
    cells = [list(c.cells) for c in columns]
    for i in range(rows.row_count):
        lines.append("\t".join(_plain(col[i]) if i < len(col) else "" for col in cells))
    if rows.title:
        print(f"# {_plain(rows.title)}")
    print("\n".join(lines))


def emit_json(data: Any) -> None:
    """`data` as JSON on stdout, indented on a terminal, one line in a pipe."""
    text = data if isinstance(data, str) else json.dumps(data, default=str)
    if sys.stdout.isatty():
        console.print_json(text)
    else:
        print(json.dumps(json.loads(text)))


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        text = cell.plain
    elif isinstance(cell, str):
        text = Text.from_markup(cell).plain
    else:
        text = str(cell)
    return text.replace("\t", " ").replace("\n", " ")
