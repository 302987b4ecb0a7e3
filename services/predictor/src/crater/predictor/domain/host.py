"""A task's DataLoader settings and its host memory per node."""

from __future__ import annotations

import math

from crater.contracts import IoPattern, TaskRequest
from crater.contracts.dataloader import PROCESS_HOST_MB, WORKER_HOST_MB, workers_per_process
from crater.contracts.tasks import TrainingConfig, TrainingTimeline
from crater.predictor.domain.catalog import Architecture, Kind
from crater.predictor.domain.memory import MIB, _Parts, weight_bytes
from crater.predictor.domain.validation import _Shape

STALL_COVER_SECONDS = {IoPattern.SEQUENTIAL: 0.25, IoPattern.MIXED: 0.5, IoPattern.RANDOM: 1.0}


def cpu_seconds_per_sample(arch: Architecture, shape: _Shape) -> float:
    if arch.cpu_seconds_per_sample:
        return arch.cpu_seconds_per_sample
    return 2e-4 * shape.sequence_length / 1024  # collate and pad pre-tokenized text


def _loader_for_training(
    request: TaskRequest,
    arch: Architecture,
    config: TrainingConfig,
    shape: _Shape,
    timeline: TrainingTimeline,
) -> tuple[int, int]:
    """Workers per GPU process enough to decode `batch/step` samples per second with half
    again in reserve, within the cores the task holds (one kept for each main process);
    prefetch enough batches to ride out a disk stall typical of the IO pattern."""
    cores = request.resource_requirements.cpu.cores or 1
    per_process = workers_per_process(cores, shape.gpus_per_node)
    step = max(timeline.step_seconds, 1e-6)
    needed = math.ceil(config.batch_size / step * cpu_seconds_per_sample(arch, shape) * 1.5)
    workers = min(max(needed, 1), per_process, 16)
    if workers == 0:
        return 0, 1
    stall = STALL_COVER_SECONDS[request.data_config.io_pattern]
    prefetch = min(max(math.ceil(stall / step / workers), 2), 8)
    return workers, prefetch


def _host_memory_mb(
    request: TaskRequest,
    arch: Architecture,
    parts: _Parts,
    timeline: TrainingTimeline | None,
    workers: int,
    prefetch: int,
) -> int:
    """Per node: one page-cached copy of the weights file, each GPU process and its workers,
    pinned prefetch buffers, and one rank's checkpoint shard staged in memory."""
    processes = max(request.resource_requirements.gpu.count, 1)
    weights_file = arch.parameters * weight_bytes(request)
    host = weights_file / MIB + processes * (PROCESS_HOST_MB + workers * WORKER_HOST_MB)
    if timeline is not None:
        config = request.training_config or TrainingConfig()
        sequence = config.sequence_length or min(arch.context or 1, 2048)
        # a decoded sample: a float32 image tensor, or int64 token ids and attention mask
        decoded = 3 * 224 * 224 * 4 if arch.kind is Kind.CONV else 16 * sequence
        batch_bytes = config.batch_size * decoded
        host += processes * workers * prefetch * batch_bytes / MIB
        host += timeline.checkpoint_size_mb / processes  # one rank's share in flight at once
    return math.ceil(host)
