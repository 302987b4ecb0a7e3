"""The workload the scheduler has seen: request shapes learned online.

Production has no future trace to measure fragmentation against, so the core counts every
task it accepts, once, into a table of request shapes (GPU count, per-card share, GPU model,
CPU class) whose weights decay with a half-life counted in requests, each with the decayed
mean CPU and memory its requests ask for. It is part of the core's state: fed in the order
tasks arrive (deterministic on replay) and rebuilt on restore from the live allocations and
the queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from crater.scheduler.domain.demand import Demand

# Requests after which a shape's weight halves: the mix of the last few thousand requests.
HALF_LIFE_REQUESTS = 5000.0
# The shapes that together make this share of the (decayed) requests are measured against;
# the rare rest would cost time and shift little...
COVERAGE = 0.95
# ... and so are those that make this share of the GPU thousandths asked: an eight-card
# request rare by count is not rare by cards (openb's multi-GPU traces: at 95% their 120-core
# eight-card pods, under 0.1% of the requests, were left out and failed first).
GPU_DEMAND_COVERAGE = 0.99
MAX_SHAPES = 32
# Requests are told apart by their CPU too, in quarter octaves: an eight-card task asking 120
# cores fits fewer nodes than one asking 48, and a mean over both would hide it (openb's
# multi-GPU traces: only its 128-core nodes hold the 120-core eight-card pods).
CPU_CLASSES_PER_OCTAVE = 4


def cpu_class(cores: float) -> int:
    """Requests whose cores are within a quarter octave of each other share a class (0: none)."""
    if cores <= 0:
        return 0
    return 1 + max(round(CPU_CLASSES_PER_OCTAVE * math.log2(cores * 10)), 0)


@dataclass(frozen=True)
class LearnedShape:
    """One request shape and its share of the requests seen, with the mean CPU and memory
    its requests asked for."""

    gpus: int
    gpu_milli: int  # per card; 0 without GPUs
    gpu_model: str | None
    popularity: float
    cpu_cores: float
    memory_mb: float


@dataclass
class _Tally:
    weight: float = 0.0
    cpu: float = 0.0  # decayed sums: mean = sum / weight
    memory: float = 0.0


@dataclass
class WorkloadModel:
    """Request shapes seen so far, each request counted once, older ones weighing less."""

    half_life: float = HALF_LIFE_REQUESTS
    tallies: dict[tuple[int, int, str | None, int], _Tally] = field(default_factory=dict)
    seen: int = 0
    _shapes: tuple[LearnedShape, ...] | None = None

    def observe(self, demand: Demand) -> None:
        """Count one request (the core calls this once per task it accepts)."""
        if demand.mig_profile is not None:  # a MIG slice is not a share of the cards measured
            return
        self.observe_shape(
            demand.gpus, demand.gpu_milli, demand.gpu_model, demand.cpu_cores, demand.memory_mb
        )

    def observe_shape(
        self, gpus: int, gpu_milli: int, gpu_model: str | None, cpu_cores: float, memory_mb: float
    ) -> None:
        keep = 0.5 ** (1.0 / self.half_life)
        for tally in self.tallies.values():
            tally.weight *= keep
            tally.cpu *= keep
            tally.memory *= keep
        key = (gpus, gpu_milli if gpus else 0, gpu_model or None, cpu_class(cpu_cores))
        tally = self.tallies.setdefault(key, _Tally())
        tally.weight += 1.0
        tally.cpu += cpu_cores
        tally.memory += memory_mb
        self.seen += 1
        self._shapes = None
        if len(self.tallies) > 4 * MAX_SHAPES:  # forget shapes nobody asks for any more
            floor = sorted(t.weight for t in self.tallies.values())[-2 * MAX_SHAPES]
            self.tallies = {k: t for k, t in self.tallies.items() if t.weight >= floor}

    def shapes(self) -> tuple[LearnedShape, ...]:
        """The most requested shapes covering `COVERAGE` of the decayed weight, most popular
        first (ties in a fixed order), popularity as a share of all requests."""
        if self._shapes is None:
            total = sum(t.weight for t in self.tallies.values())
            ranked = sorted(
                self.tallies.items(),
                key=lambda kv: (-kv[1].weight, kv[0][:2], kv[0][2] or "", kv[0][3]),
            )
            chosen: set[tuple[int, int, str | None, int]] = set()
            covered = 0.0
            for key, tally in ranked:
                if covered >= COVERAGE * total or len(chosen) == MAX_SHAPES:
                    break
                covered += tally.weight
                chosen.add(key)
            # Rare by count is not rare by cards: an eight-card request weighs eight times a
            # one-card one in what fragments, so the GPU demand is covered as well.
            demand = {k: t.weight * k[0] * k[1] for k, t in ranked}
            demand_total = sum(demand.values())
            covered = sum(demand[k] for k in chosen)
            by_demand = sorted(ranked, key=lambda kv: -demand[kv[0]])  # stable: ties as ranked
            for key, _ in by_demand:
                if covered >= GPU_DEMAND_COVERAGE * demand_total or len(chosen) == 2 * MAX_SHAPES:
                    break
                if key not in chosen:
                    covered += demand[key]
                    chosen.add(key)
            self._shapes = tuple(
                LearnedShape(
                    gpus,
                    milli,
                    model,
                    tally.weight / total,
                    tally.cpu / tally.weight,
                    tally.memory / tally.weight,
                )
                for (gpus, milli, model, cpu), tally in ranked
                if (gpus, milli, model, cpu) in chosen
            )
        return self._shapes

    def host_per_gpu_milli(self) -> tuple[float, float]:
        """CPU cores and memory MiB the GPU requests seen ask per GPU thousandth: what a
        node's free GPUs need beside them to be usable."""
        gpu = cpu = memory = 0.0
        for (gpus, milli, _, _), tally in self.tallies.items():
            if gpus:
                gpu += tally.weight * gpus * milli
                cpu += tally.cpu
                memory += tally.memory
        if not gpu:
            return 0.0, 0.0
        return cpu / gpu, memory / gpu
