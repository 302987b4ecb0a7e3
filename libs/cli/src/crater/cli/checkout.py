"""The benchmarks of the repository's `benchmarks/` folder, for the commands that run them
(`crater bench`, `crater chaos`). They are not part of an installed Crater: these commands
find them from the source tree the CLI was installed from in development."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import typer
from rich.console import Console

REPOSITORY = Path(__file__).resolve().parents[5]


def benchmark(folder: str, *modules: str, console: Console) -> list[ModuleType]:
    """`benchmarks.<folder>.<module>` for each module, imported from the checkout; exits 2
    (after saying so) when there is no checkout with `benchmarks/<folder>/<first module>.py`."""
    if not (REPOSITORY / "benchmarks" / folder / f"{modules[0]}.py").exists():
        console.print(f"[red]no benchmarks/{folder}/ under {REPOSITORY}[/red]: run from a checkout")
        raise typer.Exit(2)
    if str(REPOSITORY) not in sys.path:
        sys.path.insert(0, str(REPOSITORY))
    return [importlib.import_module(f"benchmarks.{folder}.{module}") for module in modules]
