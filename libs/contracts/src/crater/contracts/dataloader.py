"""The DataLoader recommendation handed to a task (CRATER_DATALOADER_*): pure, no I/O.

Two steps, one place. Before placement the predictor says what the data pipeline wants
(from the step time, or from the cores asked for: `dataloader_settings`); at placement the
scheduler fits that to the node actually chosen (`dataloader_for_node`): its local disk,
the cores and the memory granted. AllData's published figures are the reference: 8 workers
and prefetch 3 on an A100 with fast NVMe, 4 and 1 on a V100 with a SATA SSD.
"""

from __future__ import annotations

from dataclasses import dataclass

from crater.contracts.nodes import Disk

PROCESS_HOST_MB = 2048  # one GPU process: Python, torch, CUDA runtime (RSS)
WORKER_HOST_MB = 512  # one DataLoader worker process

# A local SSD measured this slow at queue depth 1 reads like a SATA SSD whatever its bus: a
# healthy NVMe drive answers a 4 KiB read in under ~100 us (10,000+ reads/s at depth 1).
SLOW_P50_LATENCY_US = 200.0
SLOW_QD1_IOPS = 5_000.0


@dataclass(frozen=True)
class DiskClass:
    """What a local disk sustains: the most workers per GPU process that still gain from
    reading it in parallel, and how many batches each worker keeps ready."""

    name: str
    max_workers: int
    prefetch_factor: int


# NVMe serves many parallel random reads: 8 workers keep it busy, 3 batches each ride out
# its short stalls. A SATA SSD (one AHCI queue, ~550 MB/s) saturates at about 4 readers, and
# deeper prefetch only holds memory while the disk, not decoding, sets the pace.
FAST_NVME = DiskClass("nvme", max_workers=8, prefetch_factor=3)
SATA_SSD = DiskClass("sata-ssd", max_workers=4, prefetch_factor=1)


def workers_per_process(cpu_cores: int, gpus: int) -> int:
    """The most DataLoader workers each GPU process can have on `cpu_cores` cores, one core
    kept for each process's own loop."""
    processes = max(gpus, 1)
    return max((cpu_cores - processes) // processes, 0)


def dataloader_settings(cpu_cores: int, gpus: int) -> tuple[int, int]:
    """Without a step time: workers per GPU process from the cores the task holds, one left
    for each main loop."""
    workers = min(workers_per_process(cpu_cores, gpus), 8)
    prefetch = 2 if workers >= 4 else 4 if workers else 1
    return workers, prefetch


def disk_class(disk: Disk | None) -> DiskClass | None:
    """How a local disk reads, from its kind and, where the probe measured it, its latency
    and random-read rate; None: no local SSD (data streams from remote storage)."""
    if disk is None or disk.rotational:
        return None
    latency, iops = disk.read_latency_us_p50, disk.random_read_iops
    slow = (latency is not None and latency > SLOW_P50_LATENCY_US) or (
        iops is not None and iops < SLOW_QD1_IOPS
    )
    return FAST_NVME if disk.nvme and not slow else SATA_SSD


def dataloader_for_node(
    wanted: tuple[int, int] | None,
    cpu_cores: int,
    gpus: int,
    memory_mb: int,
    disk: Disk | None,
) -> tuple[int, int]:
    """(num_workers, prefetch_factor) for a task placed with `cpu_cores` cores, `gpus` GPU
    processes and `memory_mb` of host memory, reading from `disk` (its local SSD, if any).

    `wanted`: what the predictor said the pipeline needs; None: derived from the cores. The
    node lowers it (never raises it) to what its disk, the cores and the memory sustain, and
    sets the prefetch its disk calls for; without a local SSD the prediction stands."""
    workers, prefetch = wanted if wanted is not None else dataloader_settings(cpu_cores, gpus)
    workers = min(workers, workers_per_process(cpu_cores, gpus))
    if memory_mb > 0:  # nothing granted means nothing was asked: no figure to fit into
        per_process = memory_mb // max(gpus, 1) - PROCESS_HOST_MB
        workers = min(workers, max(per_process // WORKER_HOST_MB, 0))
    kind = disk_class(disk)
    if kind is not None:
        workers = min(workers, kind.max_workers)
        prefetch = kind.prefetch_factor
    # PyTorch takes a prefetch factor only with workers; 1 says "none" to a reader.
    return workers, prefetch if workers else 1
