"""What a task needs, reduced to the numbers the filters compare."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from crater.contracts import (
    Affinity,
    Confidence,
    ResourcePrediction,
    ResourceRequirements,
    TaskRequest,
)

# Headroom over a predicted peak: allocator fragmentation and what the model misses.
PREDICTION_MARGIN = 0.10


def _trusted(prediction: ResourcePrediction, requested_mb: int) -> bool:
    """A prediction of a known model (medium or high confidence) is placed on; a guess
    (low confidence) only stands in when nothing was asked."""
    return prediction.confidence is not Confidence.LOW or not requested_mb


@dataclass(frozen=True)
class Demand:
    pool: str
    gpus: int
    gpu_milli: int  # share of each card; below 1000 only with one card
    gpu_memory_mb: int
    gpu_model: str | None
    cpu_cores: int
    memory_mb: int
    disk_gb: int
    avx: str | None
    numa_strict: bool
    gpu_memory_source: str
    anti_affinity_group: str | None = None

    @classmethod
    def of(
        cls,
        request: TaskRequest,
        prediction: ResourcePrediction | None,
        margin: float = PREDICTION_MARGIN,
    ) -> Demand:
        demand = cls.of_resources(
            request.resource_requirements, request.pool, request.affinity, prediction, margin
        )
        return replace(demand, anti_affinity_group=request.anti_affinity.group)

    @classmethod
    def of_resources(
        cls,
        needs: ResourceRequirements,
        pool: str,
        affinity: Affinity,
        prediction: ResourcePrediction | None = None,
        margin: float = PREDICTION_MARGIN,
    ) -> Demand:
        gpu_memory, source = needs.gpu.memory_mb, "requested"
        # A trusted prediction above the request wins: placing on the request alone would
        # put the task on a card it runs out of memory on.
        if needs.gpu.count and prediction is not None and _trusted(prediction, gpu_memory):
            predicted = prediction.gpu_memory_per_gpu_mb
            with_margin = math.ceil(predicted * (1 + margin))
            if with_margin > gpu_memory:
                gpu_memory = with_margin
                source = f"predicted peak {predicted} MiB + {margin:.0%}"
        return cls(
            pool=pool,
            gpus=needs.gpu.count,
            gpu_milli=needs.gpu.milli if needs.gpu.count else 0,
            gpu_memory_mb=gpu_memory,
            gpu_model=needs.gpu.type,
            cpu_cores=needs.cpu.cores,
            memory_mb=needs.memory.capacity_mb,
            disk_gb=needs.ssd.capacity_gb,
            avx=needs.cpu.avx_support,
            numa_strict=affinity.numa == "strict",
            gpu_memory_source=source,
        )
