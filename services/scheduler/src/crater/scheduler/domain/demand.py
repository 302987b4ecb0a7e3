"""What a task needs, reduced to the numbers the filters compare."""

from __future__ import annotations

from dataclasses import dataclass, replace

from crater.contracts import Affinity, ResourcePrediction, ResourceRequirements, TaskRequest


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
    def of(cls, request: TaskRequest, prediction: ResourcePrediction | None) -> Demand:
        demand = cls.of_resources(
            request.resource_requirements, request.pool, request.affinity, prediction
        )
        return replace(demand, anti_affinity_group=request.anti_affinity.group)

    @classmethod
    def of_resources(
        cls,
        needs: ResourceRequirements,
        pool: str,
        affinity: Affinity,
        prediction: ResourcePrediction | None = None,
    ) -> Demand:
        gpu_memory, source = needs.gpu.memory_mb, "requested"
        # Nothing asked per card: place on the predicted peak rather than on nothing.
        if needs.gpu.count and not gpu_memory and prediction is not None:
            gpu_memory, source = prediction.gpu_memory_per_gpu_mb, "predicted"
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
