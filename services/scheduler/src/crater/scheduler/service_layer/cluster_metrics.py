"""The cluster as the scheduler holds it, rendered at scrape time (`ClusterSeries`): each
pool's capacity, allocated, free and unavailable resources and its GPU fragmentation, its
nodes by condition, and how long each waiting task has waited. Read off the leader's core
when Prometheus asks, so the hot path pays nothing; a standby holds no state and exports
none of these."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from crater.scheduler.domain.capacity import pool_totals
from crater.scheduler.domain.state import SchedulerState

MIB = 1024 * 1024
GB = 1_000_000_000


class ClusterSeries(Collector):
    """`crater_pool_*` and `crater_task_wait_seconds` from the core's state."""

    def __init__(
        self,
        state: Callable[[], SchedulerState],
        task_limit: int = 1000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.state = state
        self.task_limit = task_limit
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        return _families()

    def collect(self) -> Iterable[Metric]:
        families = _families()
        (
            gpus,
            gpu_memory,
            cpu,
            memory,
            disk,
            fragmentation,
            nodes,
            waited,
            not_exported,
        ) = families
        state = self.state()
        for pool, totals in sorted(pool_totals(state.cluster).items()):
            for family, amounts, unit in (
                (gpus, totals.gpus, 1),
                (gpu_memory, totals.gpu_memory_mb, MIB),
                (cpu, totals.cpu_cores, 1),
                (memory, totals.memory_mb, MIB),
            ):
                for name, amount in amounts.states().items():
                    family.add_metric([pool, name], amount * unit)
            gpus.add_metric([pool, "fragmented"], totals.gpus_fragmented)
            disk.add_metric([pool, "capacity"], totals.disk_gb * GB)
            fragmentation.add_metric([pool], totals.fragmentation_ratio)
            for condition, count in totals.nodes.items():
                nodes.add_metric([pool, condition.value], count)
        now = self.clock()
        waiting = sorted(
            (t for t in state.pending.values() if t.submitted_at is not None),
            key=lambda t: (t.submitted_at, t.seq),
        )
        for task in waiting[: self.task_limit]:
            assert task.submitted_at is not None
            request = task.request
            seconds = max(0.0, (now - task.submitted_at).total_seconds())
            waited.add_metric([request.task_id, request.tenant, request.pool], seconds)
        not_exported.add_metric([], max(0, len(waiting) - self.task_limit))
        return families


def _families() -> list[GaugeMetricFamily]:
    by_state = ["pool", "state"]
    return [
        GaugeMetricFamily(
            "crater_pool_gpus",
            "A pool's GPUs by state: capacity (cards x the pool's GPU over-commit), "
            "allocated, free (on Ready nodes), unavailable (on NotReady nodes), fragmented "
            "(of the free share, what the workload seen could not use). A shared card "
            "counts its shares.",
            labels=by_state,
        ),
        GaugeMetricFamily(
            "crater_pool_gpu_memory_bytes",
            "A pool's GPU memory by state (capacity, allocated, free, unavailable), a card's "
            "memory going with the share of it taken.",
            labels=by_state,
        ),
        GaugeMetricFamily(
            "crater_pool_cpu_cores",
            "A pool's CPU cores by state (capacity: cores x the pool's CPU over-commit).",
            labels=by_state,
        ),
        GaugeMetricFamily(
            "crater_pool_memory_bytes",
            "A pool's host memory by state (capacity: memory x the pool's memory over-commit).",
            labels=by_state,
        ),
        GaugeMetricFamily(
            "crater_pool_disk_bytes",
            "A pool's local disks, capacity only (the space held on each SSD is not exported).",
            labels=by_state,
        ),
        GaugeMetricFamily(
            "crater_pool_gpu_fragmentation_ratio",
            "Fragmented over free GPU share of the pool's Ready nodes (0..1; 0 with none "
            "free): how much of what is free the workload seen could not use.",
            labels=["pool"],
        ),
        GaugeMetricFamily(
            "crater_pool_nodes",
            "A pool's nodes by condition (Ready, Degraded, NotReady), as the scheduler holds them.",
            labels=["pool", "condition"],
        ),
        GaugeMetricFamily(
            "crater_task_wait_seconds",
            "How long a waiting task has waited so far (since it reached the scheduler); "
            "the series goes when the task is placed, rejected or cancelled. The longest "
            "waiting CRATER_SCHEDULER_TASK_METRICS_LIMIT tasks only.",
            labels=["task_id", "tenant", "pool"],
        ),
        GaugeMetricFamily(
            "crater_scheduler_waiting_tasks_not_exported",
            "Waiting tasks past CRATER_SCHEDULER_TASK_METRICS_LIMIT: no "
            "crater_task_wait_seconds series of their own.",
            labels=[],
        ),
    ]
