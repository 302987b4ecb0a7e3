"""The task runner's subscriptions: the simulated fleet's runner, or the executing agent, each
fed the grants, releases, profiles and preemptions of the tasks placed on its nodes."""

from __future__ import annotations

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    LatencySamplesReported,
    Subjects,
    TaskPreempted,
    TaskProfiled,
)
from crater.probe.executor import TaskExecutor
from crater.probe.service_layer.metrics import ProbeMetrics
from crater.probe.sim.runner import TaskRunner
from crater.runtime.bus import durable
from crater.runtime.service import Service


def subscribe_runner(
    service: Service, runner: TaskRunner | TaskExecutor, metrics: ProbeMetrics, consumer: str
) -> None:
    """Durable consumers for the simulated runner, named per fleet (two fleets each see every
    grant, two replicas of one fleet share the work), or for the executing agent, named per
    node."""
    batch = service.settings.consumer_batch

    @durable(
        service.broker,
        Subjects.ALLOCATION_GRANTED,
        service.name,
        batch=batch,
        name=f"{consumer}-{Subjects.ALLOCATION_GRANTED.short_name}",
    )
    async def on_allocation_granted(event: AllocationGranted) -> None:
        metrics.grants.labels(outcome=runner.granted(event).value).inc()
        metrics.tasks.set(runner.running)

    @durable(
        service.broker,
        Subjects.ALLOCATION_RELEASED,
        service.name,
        batch=batch,
        name=f"{consumer}-{Subjects.ALLOCATION_RELEASED.short_name}",
    )
    async def on_allocation_released(event: AllocationReleased) -> None:
        runner.released(event)
        metrics.tasks.set(runner.running)

    @durable(
        service.broker,
        Subjects.TASK_PROFILED,
        service.name,
        batch=batch,
        name=f"{consumer}-{Subjects.TASK_PROFILED.short_name}",
    )
    async def on_task_profiled(event: TaskProfiled) -> None:
        runner.profiled(event)  # what the task will really use, once placed

    @durable(
        service.broker,
        Subjects.TASK_PREEMPTED,
        service.name,
        batch=batch,
        name=f"{consumer}-{Subjects.TASK_PREEMPTED.short_name}",
    )
    async def on_task_preempted(event: TaskPreempted) -> None:
        runner.preempted(event)
        metrics.tasks.set(runner.running)


def subscribe_served(service: Service, runner: TaskRunner, consumer: str) -> None:
    """The simulated fleet only: an inference replica's own reports set its cards' memory use
    (a real node's NVML sees the KV cache the replica's load fills)."""

    @durable(
        service.broker,
        Subjects.INFERENCE_LATENCY,
        service.name,
        batch=service.settings.consumer_batch,
        name=f"{consumer}-{Subjects.INFERENCE_LATENCY.short_name}",
    )
    async def on_inference_latency(event: LatencySamplesReported) -> None:
        runner.served(event)
