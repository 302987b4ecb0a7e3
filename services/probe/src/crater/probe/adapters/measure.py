"""Measured, not datasheet: memory bandwidth per NUMA node and disk random-read IOPS/latency.

All are bounded in size and time, so a full measurement of a node costs a few seconds:

- Memory, one thread: one thread pinned (sched_setaffinity) to a NUMA node's CPUs allocates
  two buffers there (first touch places the pages on the node that touches them) and copies
  one into the other until the time is up. The figure is single-stream copy bandwidth, bytes
  read plus bytes written per second: what one data-loading process sees, not the node's.
- Memory, all cores: the same copy in one process per CPU of the NUMA node, each pinned to
  its CPU with its own buffers, started together (a barrier) for the same time. The figure is
  the bytes all of them copied over the whole span: the node's aggregate, in STREAM's sense
  (its Copy kernel counts read + write bytes too). Processes, not threads: a copy holds the GIL.
- Disk, queue depth 1: a temporary file of bounded size on the disk's own filesystem (at its
  mount path) is read at random 4 KiB-aligned offsets, one read at a time, with O_DIRECT
  where the filesystem allows it, else after posix_fadvise(DONTNEED) so the page cache does
  not answer. The file is removed afterwards.
- Disk, at depth: the same file read by `DEPTH` threads at once (os.preadv releases the GIL,
  so up to `DEPTH` reads are in flight), O_DIRECT only: buffered reads would be answered by
  the page cache. Python's cost per read (a few microseconds) caps the figure well below a
  datacenter NVMe's rated ~1M IOPS, so it is a lower bound of the datasheets' figure; where
  the model's rated figure is known (domain/datasheets.py) or an operator set one, that is
  reported instead.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing
import os
import queue
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crater.contracts import Disk, NodeTopology, NumaNode

log = logging.getLogger("crater.probe.measure")

MIB = 1024 * 1024
BLOCK = 4096
# Re-drop the cache this often when reading without O_DIRECT: a small file is soon cached.
FADVISE_EVERY = 64
# Reads in flight at once for the at-depth figure (fio's usual --iodepth for rated IOPS).
DEPTH = 32
# Seconds the all-core copy waits for its processes to start (spawned interpreters).
START_SECONDS = 60.0

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Bounds:
    """How much a measurement may cost."""

    memory_buffer_mb: int = 64
    memory_seconds: float = 0.5
    # per process of the all-core copy: two buffers per CPU, so 2 x this x CPUs in all ...
    memory_all_cores_buffer_mb: int = 16
    # ... and at least this much in all, whatever the CPUs (see memory_bandwidth_all_cores)
    memory_all_cores_total_mb: int = 1024
    disk_file_mb: int = 64
    disk_seconds: float = 1.5


@dataclass(frozen=True)
class MemoryBandwidth:
    numa_node: int
    gbps: float
    copies: int
    seconds: float


@dataclass(frozen=True)
class AllCoresBandwidth:
    numa_node: int
    gbps: float
    processes: int
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


@dataclass(frozen=True)
class DiskReadsAtDepth:
    disk: str
    path: str
    iops: float
    depth: int
    reads: int


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


def _buffers(size: int) -> tuple[memoryview, memoryview]:
    """Two buffers of `size` bytes (at least 1 MiB), every page touched by the calling thread
    (first touch: on its CPU's NUMA node)."""
    source = bytearray(os.urandom(MIB)) * max(1, size // MIB)
    target = bytearray(len(source))
    src, dst = memoryview(source), memoryview(target)
    dst[:] = src  # warm up: fault in every page of the target
    return src, dst


def _copy_until(
    src: memoryview, dst: memoryview, seconds: float, start: float | None = None
) -> tuple[int, float, float]:
    """Copy `src` into `dst` from `start` (a time.monotonic time; None: now) until `seconds`
    later: (bytes read + written, start, end)."""
    if start is not None:
        while time.monotonic() < start:
            pass  # spin: a sleep would wake late
    started = time.monotonic()
    deadline = started + seconds
    copies = 0
    while True:
        dst[:] = src  # memmove
        copies += 1
        now = time.monotonic()
        if now >= deadline:
            break
    return 2 * len(src) * copies, started, now


def memory_bandwidth(
    cpus: Sequence[int], *, buffer_mb: int = 64, seconds: float = 0.5, numa_node: int = 0
) -> MemoryBandwidth:
    """Copy bandwidth (GB/s, read + write) of one thread pinned to `cpus`."""
    usable = usable_cpus(cpus)
    if not usable:
        raise ValueError(f"none of NUMA node {numa_node}'s CPUs is usable by this process")
    with _pinned(usable):
        src, dst = _buffers(max(1, buffer_mb) * MIB)
        copied, started, ended = _copy_until(src, dst, seconds)
    elapsed = ended - started
    return MemoryBandwidth(numa_node, copied / elapsed / 1e9, copied // (2 * len(src)), elapsed)


def _copy_on(cpu: int, size: int, seconds: float, ready: Any, go: Any, results: Any) -> None:
    """One process of the all-core copy (runs in the child): pinned to `cpu`, its buffers
    allocated there, it waits for the others, then copies from the common start; it answers
    (bytes, start, end), or the error as text."""
    try:
        os.sched_setaffinity(0, [cpu])
        src, dst = _buffers(size)
        ready.wait(timeout=START_SECONDS)
        results.put(_copy_until(src, dst, seconds, go.get(timeout=START_SECONDS)))
    except BaseException as error:  # the parent waits for one answer per process
        ready.abort()  # the parent stops waiting at once
        results.put(repr(error))


def memory_bandwidth_all_cores(
    cpus: Sequence[int],
    *,
    buffer_mb: int = 16,
    total_mb: int = 1024,
    seconds: float = 0.5,
    numa_node: int = 0,
) -> AllCoresBandwidth:
    """Aggregate copy bandwidth (GB/s, read + write) of one process per usable CPU of
    `cpus`, each pinned to its CPU, copying for the same `seconds`: every byte copied over
    the span from the first start to the last end. Each process copies buffers of
    `buffer_mb` MiB, more where the processes are few, so that all their buffers together
    make `total_mb` at least: a last-level cache (tens of MiB, ~100 on big sockets) must
    not hold the working set, or the figure would be the cache's."""
    usable = usable_cpus(cpus)
    if not usable:
        raise ValueError(f"none of NUMA node {numa_node}'s CPUs is usable by this process")
    size = max(1, buffer_mb, -(-total_mb // (2 * len(usable)))) * MIB
    # spawn: the probe runs this from a thread of an asyncio process, where fork is unsafe
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(len(usable) + 1)
    go = context.Queue()
    results = context.Queue()
    workers = [
        context.Process(target=_copy_on, args=(cpu, size, seconds, ready, go, results), daemon=True)
        for cpu in usable
    ]
    try:
        for worker in workers:
            worker.start()
        try:
            ready.wait(timeout=START_SECONDS)
        except threading.BrokenBarrierError:
            why = f"did not start within {START_SECONDS:g} s"
            with contextlib.suppress(queue.Empty):
                why = f"failed: {results.get(timeout=1)}"
            raise OSError(f"a copy process {why}") from None
        start = time.monotonic() + 0.05  # every process spins until then: one common start
        for _ in workers:
            go.put(start)
        answers = [results.get(timeout=START_SECONDS + seconds + 1) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
    failed = [a for a in answers if isinstance(a, str)]
    if failed:
        raise OSError(f"a copy process failed: {failed[0]}")
    copied = sum(a[0] for a in answers)
    span = max(a[2] for a in answers) - min(a[1] for a in answers)
    return AllCoresBandwidth(numa_node, copied / span / 1e9, len(workers), span)


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


@contextlib.contextmanager
def _scratch_file(directory: Path, size: int) -> Iterator[str]:
    """A temp file of `size` bytes of random data in `directory`, removed afterwards."""
    fd, path = tempfile.mkstemp(prefix=".crater-probe-", dir=directory)
    try:
        try:
            _write_file(fd, size)
        finally:
            os.close(fd)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _direct_reader(path: str, buffer: mmap.mmap) -> int | None:
    """The file opened with O_DIRECT, if the filesystem takes it and a read works."""
    reader = _open_direct(path)
    if reader is None:
        return None
    try:
        os.preadv(reader, [buffer], 0)
    except OSError:
        os.close(reader)
        return None
    return reader


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
    with _scratch_file(directory, size) as path:
        buffer = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT requires
        reader = _direct_reader(path, buffer)
        direct = reader is not None
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


def disk_random_reads_at_depth(
    directory: Path,
    *,
    file_mb: int = 64,
    seconds: float = 1.5,
    depth: int = DEPTH,
    disk: str = "",
    seed: int = 0,
) -> DiskReadsAtDepth:
    """Random 4 KiB reads of a temp file of `file_mb` MiB in `directory` by `depth` threads
    at once, with O_DIRECT (OSError where the filesystem refuses it: the page cache would
    answer buffered reads). A lower bound of the disk's IOPS at that depth."""
    size = max(1, file_mb) * MIB
    blocks = size // BLOCK
    with _scratch_file(directory, size) as path:
        probe = mmap.mmap(-1, BLOCK)
        reader = _direct_reader(path, probe)
        probe.close()
        if reader is None:
            raise OSError("no O_DIRECT on this filesystem: reads at depth would hit the cache")
        counts = [0] * depth
        errors: list[OSError] = []
        start = threading.Barrier(depth + 1)
        stop = threading.Event()

        def read(worker: int) -> None:
            rng = random.Random(f"{seed}:{worker}")
            buffer = mmap.mmap(-1, BLOCK)  # one per thread: reads in flight at once
            try:
                start.wait()
                while not stop.is_set():
                    os.preadv(reader, [buffer], rng.randrange(blocks) * BLOCK)  # GIL released
                    counts[worker] += 1
            except OSError as error:
                errors.append(error)
            finally:
                buffer.close()

        threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(depth)]
        try:
            for thread in threads:
                thread.start()
            start.wait()
            started = time.perf_counter()
            time.sleep(seconds)
            stop.set()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - started
        finally:
            stop.set()
            os.close(reader)
    if errors:
        raise errors[0]
    reads = sum(counts)
    return DiskReadsAtDepth(disk, str(directory), reads / elapsed, depth, reads)


@dataclass(frozen=True)
class Measurements:
    memory: dict[int, MemoryBandwidth]
    disks: dict[str, DiskReads]
    skipped: dict[str, str]  # what was not measured, and why
    memory_all_cores: dict[int, AllCoresBandwidth] = field(default_factory=dict)
    disks_at_depth: dict[str, DiskReadsAtDepth] = field(default_factory=dict)

    def apply(self, node: NodeTopology) -> NodeTopology:
        """The topology with the measured figures filled in (its fingerprint is unchanged:
        measurements are not hardware). A disk's at-depth figure from its datasheet or an
        operator stays: the measured one is only a lower bound of it."""
        numa = [
            _with_bandwidth(n, self.memory.get(n.id), self.memory_all_cores.get(n.id))
            for n in node.numa_nodes
        ]
        disks = [
            _with_reads(d, self.disks.get(d.name), self.disks_at_depth.get(d.name))
            for d in node.disks
        ]
        return node.model_copy(update={"numa_nodes": numa, "disks": disks})


def _with_bandwidth(
    node: NumaNode, measured: MemoryBandwidth | None, all_cores: AllCoresBandwidth | None
) -> NumaNode:
    update: dict[str, float] = {}
    if measured is not None:
        update["memory_bandwidth_gbps"] = round(measured.gbps, 2)
    if all_cores is not None:
        update["memory_bandwidth_gbps_all_cores"] = round(all_cores.gbps, 2)
    return node.model_copy(update=update) if update else node


def _with_reads(disk: Disk, measured: DiskReads | None, at_depth: DiskReadsAtDepth | None) -> Disk:
    update: dict[str, object] = {}
    if measured is not None:
        update["random_read_iops"] = round(measured.iops, 1)
        update["read_latency_us_p50"] = round(measured.latency_us_p50, 1)
        update["read_latency_us_p99"] = round(measured.latency_us_p99, 1)
    if at_depth is not None and disk.random_read_iops_at_depth_source in (None, "measured"):
        update["random_read_iops_at_depth"] = round(at_depth.iops, 1)
        update["random_read_iops_at_depth_source"] = "measured"
    return disk.model_copy(update=update) if update else disk


def measure_node(
    node: NodeTopology,
    *,
    root: Path = Path("/"),
    bounds: Bounds | None = None,
    progress: Progress = _quiet,
) -> Measurements:
    """Measure every NUMA node's memory (one thread, then all its CPUs) and every mounted
    disk (at queue depth 1, then at depth `DEPTH`), one after the other (so they do not
    disturb each other); what cannot be measured is skipped with the reason."""
    bounds = bounds or Bounds()
    memory: dict[int, MemoryBandwidth] = {}
    memory_all_cores: dict[int, AllCoresBandwidth] = {}
    disks: dict[str, DiskReads] = {}
    disks_at_depth: dict[str, DiskReadsAtDepth] = {}
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
        all_cores = _memory_all_cores(numa, bounds, skipped, progress)
        if all_cores is not None:
            memory_all_cores[numa.id] = all_cores
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
        deep = _reads_at_depth(disk, places[0], bounds, skipped, progress)
        if deep is not None:
            disks_at_depth[disk.name] = deep
    return Measurements(memory, disks, skipped, memory_all_cores, disks_at_depth)


def _memory_all_cores(
    numa: NumaNode, bounds: Bounds, skipped: dict[str, str], progress: Progress
) -> AllCoresBandwidth | None:
    what = f"NUMA {numa.id} memory, all cores"
    cpus = usable_cpus(numa.cpus)
    progress(
        f"{what}: {len(cpus)} processes copying for {bounds.memory_seconds:.2g} s, "
        f"{bounds.memory_all_cores_total_mb} MiB of buffers or more in all"
    )
    try:
        result = memory_bandwidth_all_cores(
            numa.cpus,
            buffer_mb=bounds.memory_all_cores_buffer_mb,
            total_mb=bounds.memory_all_cores_total_mb,
            seconds=bounds.memory_seconds,
            numa_node=numa.id,
        )
    except (OSError, ValueError, MemoryError) as error:
        skipped[what] = str(error)
        progress(f"{what}: skipped, {error}")
        return None
    progress(f"{what}: {result.gbps:.1f} GB/s")
    return result


def _reads_at_depth(
    disk: Disk, place: Path, bounds: Bounds, skipped: dict[str, str], progress: Progress
) -> DiskReadsAtDepth | None:
    what = f"disk {disk.name} at depth {DEPTH}"
    if disk.random_read_iops_at_depth_source in ("datasheet", "operator"):
        # kept over a measurement, which could only be lower: not worth the seconds
        progress(
            f"{what}: not measured, {disk.random_read_iops_at_depth:,.0f} IOPS from the "
            f"{disk.random_read_iops_at_depth_source}"
        )
        return None
    progress(f"{what}: {DEPTH} threads reading for {bounds.disk_seconds:.2g} s")
    try:
        deep = disk_random_reads_at_depth(
            place, file_mb=bounds.disk_file_mb, seconds=bounds.disk_seconds, disk=disk.name
        )
    except OSError as error:
        skipped[what] = error.strerror or str(error)
        progress(f"{what}: skipped, {skipped[what]}")
        return None
    progress(f"{what}: {deep.iops:,.0f} IOPS (a lower bound: Python's cost per read caps it)")
    return deep
