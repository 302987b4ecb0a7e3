"""What a task needs, reduced to the numbers the filters compare."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from crater.contracts import (
    Affinity,
    Confidence,
    FabricLevel,
    PlacementQuery,
    ResourcePrediction,
    ResourceRequirements,
    TaskRequest,
    Toleration,
    priority_value,
)
from crater.contracts.tasks import DEFAULT_HOST_MEMORY_MB
from crater.scheduler.domain.mig import MigProfile

# Work at this priority or above (high: 900) is high-SLA work: restricted nodes refuse it.
HIGH_PRIORITY = 900
# Headroom over a predicted peak: allocator fragmentation and what the model misses.
PREDICTION_MARGIN = 0.10


def _trusted(prediction: ResourcePrediction, requested_mb: int) -> bool:
    """A prediction of a known model (medium or high confidence) is placed on; a guess
    (low confidence) only stands in when nothing was asked."""
    return prediction.confidence is not Confidence.LOW or not requested_mb


def _host_memory(needs: ResourceRequirements, prediction: ResourcePrediction | None) -> int:
    """The host memory asked for; unasked, the predicted need (a guess stands in when nothing
    was asked, as for GPU memory), else the default."""
    if needs.memory.capacity_mb is not None:
        return needs.memory.capacity_mb
    if prediction is not None and prediction.host_memory_mb:
        return prediction.host_memory_mb
    return DEFAULT_HOST_MEMORY_MB


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
    memory_bandwidth_gbps: float | None = None
    ssd_iops_min: int | None = None
    ssd_latency_us_max: int | None = None
    mig_profile: str | None = None
    # GB/s one way each granted card's PCIe link must carry (measured, else nominal)
    pcie_bandwidth_gbps: float | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    # High-priority work (900 and up): kept off nodes whose health score is restricted.
    high_priority: bool = False
    # network_topology.required: only nodes that declare a domain at this level (the gang's
    # members all within one of them: fabric.py)
    fabric_required: FabricLevel | None = None
    # `gpu.models`, more than one, in order of preference: `gpu_model` lets every one of them
    # pass the filters, the placer tries them in this order (gpu_order.py). Empty: unordered.
    gpu_model_order: tuple[str, ...] = ()

    @property
    def wants_ssd(self) -> bool:
        """The task asked for local SSD space or speed: a disk is chosen with its GPUs."""
        return bool(self.disk_gb) or (
            self.ssd_iops_min is not None or self.ssd_latency_us_max is not None
        )

    @property
    def gpu_models(self) -> list[str]:
        """The allowed GPU models (any of them); empty: any model."""
        return [m.strip() for m in (self.gpu_model or "").split("|") if m.strip()]

    @classmethod
    def of(
        cls,
        request: TaskRequest,
        prediction: ResourcePrediction | None,
        margin: float = PREDICTION_MARGIN,
    ) -> Demand:
        demand = cls.of_resources(
            request.resource_requirements,
            request.pool,
            request.affinity,
            prediction,
            margin,
            node_selector=request.node_selector,
            tolerations=request.tolerations,
            anti_affinity_group=request.anti_affinity.group,
        )
        if priority_value(request.priority) >= HIGH_PRIORITY:
            demand = replace(demand, high_priority=True)
        topology = request.network_topology
        if topology is not None and topology.required is not None:
            demand = replace(demand, fabric_required=topology.required)
        return demand

    @classmethod
    def of_query(cls, query: PlacementQuery) -> Demand:
        """A dry run's demand: the request alone, no prediction."""
        return cls.of_resources(
            query.resource_requirements,
            query.pool,
            query.affinity,
            node_selector=query.node_selector,
            tolerations=query.tolerations,
        )

    @classmethod
    def of_resources(
        cls,
        needs: ResourceRequirements,
        pool: str,
        affinity: Affinity,
        prediction: ResourcePrediction | None = None,
        margin: float = PREDICTION_MARGIN,
        *,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Toleration] = (),
        anti_affinity_group: str | None = None,
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
        gpu = needs.gpu
        mig = MigProfile.parse(gpu.mig_profile) if gpu.mig_profile and gpu.count else None
        models = gpu.models or [m for m in (gpu.type, *gpu.types) if m]
        return cls(
            pool=pool,
            gpus=gpu.count,
            # a MIG slice counts as its share of the card's compute (quotas, sharing)
            gpu_milli=(mig.milli if mig else gpu.milli) if gpu.count else 0,
            gpu_memory_mb=gpu_memory,
            gpu_model="|".join(models) or None,
            cpu_cores=needs.cpu.cores,
            memory_mb=_host_memory(needs, prediction),
            disk_gb=needs.ssd.capacity_gb,
            avx=needs.cpu.avx_support,
            numa_strict=affinity.numa == "strict",
            gpu_memory_source=source,
            memory_bandwidth_gbps=needs.memory.bandwidth_gbps,
            ssd_iops_min=needs.ssd.iops_min,
            ssd_latency_us_max=needs.ssd.latency_us_max,
            mig_profile=mig.name if mig else None,
            pcie_bandwidth_gbps=gpu.pcie_bandwidth_gbps if gpu.count else None,
            node_selector=tuple(sorted((node_selector or {}).items())),
            tolerations=tuple(tolerations),
            anti_affinity_group=anti_affinity_group,
            gpu_model_order=tuple(gpu.models) if gpu.models and len(gpu.models) > 1 else (),
        )
