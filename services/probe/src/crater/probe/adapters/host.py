"""This machine's CPU, memory and disk load, through psutil and /sys/block."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no types-psutil in the dev group

from crater.contracts import NumaNode
from crater.contracts.nodes import DiskMetrics

MIB = 1024 * 1024


def numa_utilization(per_cpu: Sequence[float], nodes: Iterable[NumaNode]) -> dict[int, float]:
    """Mean CPU use of each NUMA node's CPUs (those psutil reports); nodes without CPUs (memory
    only: CXL, HBM) are left out."""
    out: dict[int, float] = {}
    for node in nodes:
        values = [per_cpu[c] for c in node.cpus if 0 <= c < len(per_cpu)]
        if values:
            out[node.id] = round(min(max(sum(values) / len(values), 0.0), 100.0), 1)
    return out


def read_in_flight(sys_block: Path, disk: str) -> int | None:
    """Reads plus writes in flight (`/sys/block/<disk>/inflight`); None where unreadable."""
    try:
        fields = (sys_block / disk / "inflight").read_text().split()
        return sum(int(f) for f in fields[:2])
    except (OSError, ValueError):
        return None


def disk_rates(
    before: Any, after: Any, seconds: float, name: str, in_flight: int | None
) -> DiskMetrics:
    """IO rates between two psutil `sdiskio` counters taken `seconds` apart (counters that went
    backwards, a wrapped or reset counter, count as zero)."""
    span = max(seconds, 1e-6)

    def rate(field: str) -> float:
        delta: float = getattr(after, field) - getattr(before, field)
        return max(delta, 0.0) / span

    return DiskMetrics(
        name=name,
        read_mb_s=round(rate("read_bytes") / MIB, 3),
        write_mb_s=round(rate("write_bytes") / MIB, 3),
        read_iops=round(rate("read_count"), 1),
        write_iops=round(rate("write_count"), 1),
        in_flight=in_flight,
    )


class HostSampler:
    def __init__(self, root: Path = Path("/"), clock: Callable[[], float] = time.monotonic) -> None:
        self._sys_block = root / "sys" / "block"
        self._clock = clock
        # psutil measures CPU use between two calls; the first one only starts the clock
        # (the total and the per-CPU figures keep separate clocks).
        psutil.cpu_percent(interval=None)
        psutil.cpu_percent(interval=None, percpu=True)
        self._io = self._io_counters()
        self._io_at = self._clock()

    @staticmethod
    def _io_counters() -> dict[str, Any]:
        try:
            counters = psutil.disk_io_counters(perdisk=True, nowrap=True)
        except (OSError, RuntimeError):
            return {}
        return dict(counters or {})

    def sample(self) -> tuple[float, int, int]:
        """CPU use in percent, and memory used and total in MiB."""
        cpu = float(psutil.cpu_percent(interval=None))
        memory = psutil.virtual_memory()
        # Page cache is reclaimable: "used" is what cannot be given to a new task.
        used = (memory.total - memory.available) // MIB
        return min(max(cpu, 0.0), 100.0), max(int(used), 0), int(memory.total // MIB)

    def numa_cpu(self, nodes: Iterable[NumaNode]) -> dict[int, float]:
        """CPU use per NUMA node since the last call."""
        per_cpu = [float(v) for v in psutil.cpu_percent(interval=None, percpu=True)]
        return numa_utilization(per_cpu, nodes)

    def disks(self, names: Iterable[str]) -> list[DiskMetrics]:
        """IO rates of the named disks since the last call (disks psutil does not list are
        left out), with their queue depth where /sys/block says it."""
        now, counters = self._clock(), self._io_counters()
        seconds = now - self._io_at
        out = [
            disk_rates(
                self._io[name],
                counters[name],
                seconds,
                name,
                read_in_flight(self._sys_block, name),
            )
            for name in names
            if name in counters and name in self._io
        ]
        self._io, self._io_at = counters, now
        return out
