"""The FGD paper's evaluation protocol, run through the production scheduling core.

Pods arrive one at a time (a seeded shuffle of the trace, then pods drawn with replacement
until the next would take the GPU request past 130% of the cluster's cards); none leaves. Each
arrival is a `TaskProfiled` event handed to `Scheduler.handle`; a pod the core cannot place
fails (it is withdrawn with a `TaskStatusReported(cancelled)`, so it never waits for room)
and still counts as arrived. After every arrival: GPU thousandths arrived and allocated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from uuid import uuid5

import numpy as np
import numpy.typing as npt

from crater.contracts import (
    AllocationGranted,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.cluster import WHOLE
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.plugins import TaskShape, policy_pipeline, typical_shapes
from crater.scheduler.sim.openb import (
    _IDS,
    CPU_UNIT_MILLI,
    SIM_TIME,
    OpenbNode,
    OpenbPod,
    node_event,
    task_event,
)

ARRIVAL_LIMIT = 1.3  # arrived GPU request, as a share of the cluster's cards
CURVE_FROM = 80  # the curve is reported from 80% arrived ...
CURVE_TO = 130  # ... to 130%


def arrivals(pods: list[OpenbPod], gpu_capacity_milli: int, seed: int) -> list[OpenbPod]:
    """The shuffled trace, then pods drawn with replacement, stopping before the first one
    that would take the arrived GPU request past 130% of the capacity."""
    rng = np.random.default_rng(seed)
    limit = ARRIVAL_LIMIT * gpu_capacity_milli
    out: list[OpenbPod] = []
    total = 0
    for i in rng.permutation(len(pods)):
        pod = pods[int(i)]
        if total + pod.gpu_request > limit:
            return out
        out.append(pod)
        total += pod.gpu_request
    if not any(p.gpu_request for p in pods):
        return out  # nothing asks for GPUs: drawing more would never stop
    while True:
        pod = pods[int(rng.integers(len(pods)))]
        if total + pod.gpu_request > limit:
            return out
        out.append(pod)
        total += pod.gpu_request


def workload_of(
    pods: list[OpenbPod], cpu_unit_milli: int = CPU_UNIT_MILLI
) -> tuple[TaskShape, ...]:
    """FGD's target workload: the trace's request shapes and how often each occurs (CPU in
    the core's units)."""
    return typical_shapes(
        [(p.num_gpu, p.gpu_milli, p.cpu_units(cpu_unit_milli), p.gpu_spec) for p in pods]
    )


@dataclass
class RunResult:
    """One seed's run: per arrival, cumulative amounts (GPU and CPU in thousandths)."""

    policy: str
    seed: int
    gpu_capacity_milli: int
    cpu_capacity_milli: int
    memory_capacity_mib: int
    arrived_gpu: list[int] = field(default_factory=list)
    allocated_gpu: list[int] = field(default_factory=list)
    allocated_cpu: list[int] = field(default_factory=list)
    allocated_memory: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)  # cumulative failed pods
    failed_names: list[str] = field(default_factory=list)

    def curve(self) -> dict[int, tuple[float, float, float]]:
        """x = round(arrived / capacity * 100) -> mean (GPU, CPU, memory) allocation %."""
        x = np.rint(np.asarray(self.arrived_gpu) / self.gpu_capacity_milli * 100).astype(int)
        columns = (
            (np.asarray(self.allocated_gpu), self.gpu_capacity_milli),
            (np.asarray(self.allocated_cpu), self.cpu_capacity_milli),
            (np.asarray(self.allocated_memory), self.memory_capacity_mib),
        )
        out: dict[int, tuple[float, float, float]] = {}
        for point in np.unique(x):
            at = x == point
            gpu, cpu, mem = (float(v[at].mean()) / cap * 100 for v, cap in columns)
            out[int(point)] = (gpu, cpu, mem)
        return out


def simulate(
    nodes: list[OpenbNode],
    pods: list[OpenbPod],
    policy: str,
    seed: int,
    workload: tuple[TaskShape, ...] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cpu_unit_milli: int = CPU_UNIT_MILLI,
) -> RunResult:
    """Run one seed of the protocol through `Scheduler.handle`; `workload` (FGD's target)
    defaults to the pod list's own shapes."""
    gpu_capacity = sum(n.gpus for n in nodes) * WHOLE
    queue = arrivals(pods, gpu_capacity, seed)
    if workload is None:
        workload = workload_of(pods, cpu_unit_milli)
    return replay(nodes, queue, policy, seed, workload, progress, cpu_unit_milli)


def replay(
    nodes: list[OpenbNode],
    queue: list[OpenbPod],
    policy: str,
    seed: int = 0,
    workload: tuple[TaskShape, ...] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cpu_unit_milli: int = CPU_UNIT_MILLI,
) -> RunResult:
    """Hand `queue`, in order, to the core (after every node's topology) and account."""
    pipeline = policy_pipeline(
        policy,
        seed=seed,
        workload=workload if workload is not None else workload_of(queue, cpu_unit_milli),
        cpu_milli_per_unit=cpu_unit_milli,
    )
    scheduler = Scheduler(SchedulerConfig(pipeline=pipeline))
    for node in sorted(nodes, key=lambda n: n.name):
        scheduler.handle(node_event(node, cpu_unit_milli))
    gpu_capacity = sum(n.gpus for n in nodes) * WHOLE
    result = RunResult(
        policy=policy,
        seed=seed,
        gpu_capacity_milli=gpu_capacity,
        cpu_capacity_milli=sum(n.cpu_milli for n in nodes),
        memory_capacity_mib=sum(n.memory_mib for n in nodes),
    )
    arrived = allocated = cpu = memory = failed = 0
    for k, pod in enumerate(queue):
        task_id = f"{pod.name}.{k}"
        decisions = scheduler.handle(task_event(pod, task_id, cpu_unit_milli))
        arrived += pod.gpu_request
        if any(isinstance(d, AllocationGranted) and d.task_id == task_id for d in decisions):
            allocated += pod.gpu_request
            cpu += pod.cpu_milli
            memory += pod.memory_mib
        else:
            failed += 1
            result.failed_names.append(task_id)
            if task_id in scheduler.pending:  # fails now: it does not wait for room
                scheduler.handle(
                    TaskStatusReported(
                        event_id=uuid5(_IDS, f"withdrawn:{task_id}"),
                        occurred_at=SIM_TIME,
                        task_id=task_id,
                        status=TaskStatus.CANCELLED,
                    )
                )
        result.arrived_gpu.append(arrived)
        result.allocated_gpu.append(allocated)
        result.allocated_cpu.append(cpu)
        result.allocated_memory.append(memory)
        result.failed.append(failed)
        if progress is not None:
            progress(k + 1, len(queue))
    return result


def held_gpu_milli(scheduler: Scheduler) -> int:
    """GPU thousandths the core itself holds allocated (a cross-check of the accounting)."""
    return sum(a.gpu_milli * len(a.gpu_ids) for a in scheduler.allocations.values())


def mean_curve(results: list[RunResult]) -> dict[int, tuple[float, float, float]]:
    """Per x, the mean over seeds of each seed's (GPU, CPU, memory) allocation %."""
    return mean_of_curves([r.curve() for r in results])


def mean_of_curves(
    curves: list[dict[int, tuple[float, float, float]]],
) -> dict[int, tuple[float, float, float]]:
    """Per x, the mean of the curves' (GPU, CPU, memory) allocation % (those that reach x)."""
    xs = sorted(set().union(*curves))
    out: dict[int, tuple[float, float, float]] = {}
    for x in xs:
        values: npt.NDArray[np.float64] = np.asarray([c[x] for c in curves if x in c])
        gpu, cpu, mem = values.mean(axis=0)
        out[x] = (float(gpu), float(cpu), float(mem))
    return out
