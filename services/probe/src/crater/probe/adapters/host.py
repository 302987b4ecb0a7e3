"""This machine's CPU and memory load, through psutil."""

from __future__ import annotations

import psutil  # type: ignore[import-untyped]  # no types-psutil in the dev group

MIB = 1024 * 1024


class HostSampler:
    def __init__(self) -> None:
        # psutil measures CPU use between two calls; the first one only starts the clock.
        psutil.cpu_percent(interval=None)

    def sample(self) -> tuple[float, int, int]:
        """CPU use in percent, and memory used and total in MiB."""
        cpu = float(psutil.cpu_percent(interval=None))
        memory = psutil.virtual_memory()
        # Page cache is reclaimable: "used" is what cannot be given to a new task.
        used = (memory.total - memory.available) // MIB
        return min(max(cpu, 0.0), 100.0), max(int(used), 0), int(memory.total // MIB)
