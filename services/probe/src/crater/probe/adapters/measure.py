"""Measured, not datasheet: memory bandwidth per NUMA node and disk random-read IOPS/latency.

Both are bounded in size and time, so a full measurement of a node costs a few seconds:

- Memory: one thread pinned (sched_setaffinity) to a NUMA node's CPUs allocates two buffers
  there (first touch places the pages on the node that touches them) and copies one into the
  other until the time is up. The figure is single-stream copy bandwidth, bytes read plus
  bytes written per second: what one data-loading process sees, not the socket's peak.
- Disk: a temporary file of bounded size on the disk's own filesystem (at its mount path) is
  read at random 4 KiB-aligned offsets, one read at a time (queue depth 1), with O_DIRECT
  where the filesystem allows it, else after posix_fadvise(DONTNEED) so the page cache does
  not answer. The file is removed afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from crater.contracts import Disk, NodeTopology, NumaNode

log = logging.getLogger("crater.probe.measure")

MIB = 1024 * 1024
BLOCK = 4096
# Re-drop the cache this often when reading without O_DIRECT: a small file is soon cached.
FADVISE_EVERY = 64

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Bounds:
    """How much a measurement may cost."""

    memory_buffer_mb: int = 64
    memory_seconds: float = 0.5
    disk_file_mb: int = 64
    disk_seconds: float = 1.5


@dataclass(frozen=True)
class MemoryBandwidth:
    numa_node: int
    gbps: float
    copies: int
    seconds: float


@dataclass(frozen=True)
class DiskReads:
    disk: str
    path: str
    iops: float
    latency_us_p50: float
    latency_us_p99: float
    reads: int
    direct: bool  # O_DIRECT; False: buffered reads after posix_fadvise(DONTNEED)


@contextlib.contextmanager
def _pinned(cpus: Sequence[int]) -> Iterator[None]:
    """Run the calling thread on these CPUs only (pid 0 is the calling thread on Linux)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def usable_cpus(cpus: Sequence[int]) -> list[int]:
    """The node's CPUs this process may run on (a container's cpuset may hold fewer)."""
    allowed = os.sched_getaffinity(0)
    return sorted(c for c in cpus if c in allowed)


def memory_bandwidth(
    cpus: Sequence[int], *, buffer_mb: int = 64, seconds: float = 0.5, numa_node: int = 0
) -> MemoryBandwidth:
    """Copy bandwidth (GB/s, read + write) of one thread pinned to `cpus`."""
    usable = usable_cpus(cpus)
    if not usable:
        raise ValueError(f"none of NUMA node {numa_node}'s CPUs is usable by this process")
    size = max(1, buffer_mb) * MIB
    with _pinned(usable):
        source = bytearray(os.urandom(MIB)) * (size // MIB)  # touched here: local pages
        target = bytearray(size)
        src, dst = memoryview(source), memoryview(target)
        dst[:] = src  # warm up: fault in every page of the target
        copies = 0
        started = time.perf_counter()
        deadline = started + seconds
        while True:
            dst[:] = src  # memmove
            copies += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        elapsed = now - started
    return MemoryBandwidth(numa_node, 2 * size * copies / elapsed / 1e9, copies, elapsed)


def _scratch_dirs(mount: Path) -> list[Path]:
    """Directories on the same filesystem as `mount` where a temp file may go (`/` itself
    usually is not writable; /tmp may be a tmpfs, which the device check rules out)."""
    try:
        device = mount.stat().st_dev
    except OSError:
        return []
    found = []
    for candidate in (mount, mount / "tmp", mount / "var/tmp"):
        try:
            if candidate.stat().st_dev == device and os.access(candidate, os.W_OK | os.X_OK):
                found.append(candidate)
        except OSError:
            continue
    return found


def _write_file(fd: int, size: int) -> None:
    chunk = os.urandom(MIB)  # incompressible, so compressing drives cannot shortcut reads
    written = 0
    while written < size:
        written += os.write(fd, chunk[: min(MIB, size - written)])
    os.fsync(fd)


def _open_direct(path: str) -> int | None:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None  # tmpfs and some FUSE filesystems refuse O_DIRECT


def disk_random_reads(
    directory: Path,
    *,
    file_mb: int = 64,
    seconds: float = 1.5,
    disk: str = "",
    seed: int = 0,
) -> DiskReads:
    """QD1 random 4 KiB reads of a temp file of `file_mb` MiB in `directory`."""
    size = max(1, file_mb) * MIB
    blocks = size // BLOCK
    rng = random.Random(seed)
    fd, path = tempfile.mkstemp(prefix=".crater-probe-", dir=directory)
    try:
        _write_file(fd, size)
        os.close(fd)
        fd = -1
        reader = _open_direct(path)
        direct = reader is not None
        buffer = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT requires
        if reader is not None:
            try:
                os.preadv(reader, [buffer], 0)
            except OSError:
                os.close(reader)
                reader, direct = None, False
        if reader is None:
            reader = os.open(path, os.O_RDONLY)
        latencies: list[int] = []
        try:
            started = time.perf_counter()
            deadline = started + seconds
            while True:
                if not direct and len(latencies) % FADVISE_EVERY == 0:
                    os.posix_fadvise(reader, 0, 0, os.POSIX_FADV_DONTNEED)
                offset = rng.randrange(blocks) * BLOCK
                t0 = time.perf_counter_ns()
                os.preadv(reader, [buffer], offset)
                latencies.append(time.perf_counter_ns() - t0)
                if time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - started
        finally:
            os.close(reader)
            buffer.close()
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
    micros = sorted(n / 1000 for n in latencies)
    p99 = micros[min(len(micros) - 1, int(len(micros) * 0.99))]
    return DiskReads(
        disk=disk,
        path=str(directory),
        iops=len(micros) / elapsed,
        latency_us_p50=statistics.median(micros),
        latency_us_p99=p99,
        reads=len(micros),
        direct=direct,
    )


@dataclass(frozen=True)
class Measurements:
    memory: dict[int, MemoryBandwidth]
    disks: dict[str, DiskReads]
    skipped: dict[str, str]  # what was not measured, and why

    def apply(self, node: NodeTopology) -> NodeTopology:
        """The topology with the measured figures filled in (its fingerprint is unchanged:
        measurements are not hardware)."""
        numa = [_with_bandwidth(n, self.memory.get(n.id)) for n in node.numa_nodes]
        disks = [_with_reads(d, self.disks.get(d.name)) for d in node.disks]
        return node.model_copy(update={"numa_nodes": numa, "disks": disks})


def _with_bandwidth(node: NumaNode, measured: MemoryBandwidth | None) -> NumaNode:
    if measured is None:
        return node
    return node.model_copy(update={"memory_bandwidth_gbps": round(measured.gbps, 2)})


def _with_reads(disk: Disk, measured: DiskReads | None) -> Disk:
    if measured is None:
        return disk
    return disk.model_copy(
        update={
            "random_read_iops": round(measured.iops, 1),
            "read_latency_us_p50": round(measured.latency_us_p50, 1),
            "read_latency_us_p99": round(measured.latency_us_p99, 1),
        }
    )


def measure_node(
    node: NodeTopology,
    *,
    root: Path = Path("/"),
    bounds: Bounds | None = None,
    progress: Progress = _quiet,
) -> Measurements:
    """Measure every NUMA node's memory and every mounted disk, one after the other (so
    they do not disturb each other); what cannot be measured is skipped with the reason."""
    bounds = bounds or Bounds()
    memory: dict[int, MemoryBandwidth] = {}
    disks: dict[str, DiskReads] = {}
    skipped: dict[str, str] = {}
    for numa in node.numa_nodes:
        what = f"NUMA {numa.id} memory"
        if not numa.cpus:
            skipped[what] = "no CPUs on this node (memory-only)"
            progress(f"{what}: skipped, no CPUs")
            continue
        progress(f"{what}: copying {bounds.memory_buffer_mb} MiB for {bounds.memory_seconds:.2g} s")
        try:
            result = memory_bandwidth(
                numa.cpus,
                buffer_mb=bounds.memory_buffer_mb,
                seconds=bounds.memory_seconds,
                numa_node=numa.id,
            )
        except (OSError, ValueError, MemoryError) as error:
            skipped[what] = str(error)
            progress(f"{what}: skipped, {error}")
            continue
        memory[numa.id] = result
        progress(f"{what}: {result.gbps:.1f} GB/s")
    for disk in node.disks:
        what = f"disk {disk.name}"
        if disk.mount_path is None:
            skipped[what] = "not mounted"
            progress(f"{what}: skipped, not mounted")
            continue
        mount = root / disk.mount_path.lstrip("/")
        places = _scratch_dirs(mount)
        if not places:
            skipped[what] = f"no writable directory on {disk.mount_path}"
            progress(f"{what}: skipped, no writable directory on {disk.mount_path}")
            continue
        progress(
            f"{what}: random 4 KiB reads of a {bounds.disk_file_mb} MiB file in {places[0]} "
            f"for {bounds.disk_seconds:.2g} s"
        )
        try:
            reads = disk_random_reads(
                places[0], file_mb=bounds.disk_file_mb, seconds=bounds.disk_seconds, disk=disk.name
            )
        except OSError as error:
            skipped[what] = error.strerror or str(error)
            progress(f"{what}: skipped, {skipped[what]}")
            continue
        disks[disk.name] = reads
        progress(
            f"{what}: {reads.iops:,.0f} IOPS, p50 {reads.latency_us_p50:.0f} us, "
            f"p99 {reads.latency_us_p99:.0f} us ({'O_DIRECT' if reads.direct else 'fadvise'})"
        )
    return Measurements(memory, disks, skipped)
