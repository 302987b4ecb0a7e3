"""This machine's CPU, memory and disk load, through psutil and /sys/block; its memory
bandwidth in use through resctrl's memory bandwidth monitoring, where it is mounted."""

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

    def delta(field: str) -> float:
        if not hasattr(after, field) or not hasattr(before, field):
            return 0.0
        return max(float(getattr(after, field) - getattr(before, field)), 0.0)

    # iostat's await: the ms the completed I/Os spent queued and served, per I/O.
    done = delta("read_count") + delta("write_count")
    waited_ms = delta("read_time") + delta("write_time")
    return DiskMetrics(
        name=name,
        read_mb_s=round(rate("read_bytes") / MIB, 3),
        write_mb_s=round(rate("write_bytes") / MIB, 3),
        read_iops=round(rate("read_count"), 1),
        write_iops=round(rate("write_count"), 1),
        in_flight=in_flight,
        wait_ms=round(min(waited_ms / done, 3_600_000.0), 3) if done > 0 else None,
    )


def read_memory_traffic(resctrl: Path) -> dict[int, int]:
    """Bytes of memory traffic counted so far per L3 monitoring domain (resctrl's MBM,
    `mon_data/mon_L3_<id>/mbm_total_bytes`); {} where resctrl is not mounted or monitors
    no memory bandwidth."""
    out: dict[int, int] = {}
    try:
        domains = sorted((resctrl / "mon_data").glob("mon_L3_*"))
    except OSError:
        return out
    for domain in domains:
        try:
            out[int(domain.name.removeprefix("mon_L3_"))] = int(
                (domain / "mbm_total_bytes").read_text().strip()
            )
        except (OSError, ValueError):
            return {}  # "Unavailable" or unreadable: not measured
    return out


def bandwidth_per_numa(
    before: dict[int, int], after: dict[int, int], seconds: float, nodes: Iterable[NumaNode]
) -> dict[int, float]:
    """GB/s per NUMA node between two `read_memory_traffic` readings. An L3 domain is a
    socket's cache: mapped onto the NUMA nodes only where there are as many of each (one
    NUMA node per socket), else {} (not measured rather than misattributed)."""
    ids = sorted(n.id for n in nodes)
    domains = sorted(set(before) & set(after))
    if not domains or len(domains) != len(ids) or seconds <= 0:
        return {}
    return {
        numa: round(max(after[d] - before[d], 0) / seconds / 1e9, 3)
        for numa, d in zip(ids, domains, strict=True)
    }


class HostSampler:
    def __init__(self, root: Path = Path("/"), clock: Callable[[], float] = time.monotonic) -> None:
        self._sys_block = root / "sys" / "block"
        self._resctrl = root / "sys" / "fs" / "resctrl"
        self._clock = clock
        # psutil measures CPU use between two calls; the first one only starts the clock
        # (the total and the per-CPU figures keep separate clocks).
        psutil.cpu_percent(interval=None)
        psutil.cpu_percent(interval=None, percpu=True)
        self._io = self._io_counters()
        self._traffic = read_memory_traffic(self._resctrl)
        self._io_at = self._traffic_at = self._clock()

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

    def memory_bandwidth(self, nodes: Iterable[NumaNode]) -> dict[int, float]:
        """Memory bandwidth in use per NUMA node since the last call ({}: not measured)."""
        now, traffic = self._clock(), read_memory_traffic(self._resctrl)
        out = bandwidth_per_numa(self._traffic, traffic, now - self._traffic_at, nodes)
        self._traffic, self._traffic_at = traffic, now
        return out

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
