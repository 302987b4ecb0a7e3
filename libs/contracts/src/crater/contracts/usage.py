"""What a placed task measured of itself while it ran, and what Crater made of it.

`crater_client.start_monitoring()` samples the task from inside (its GPUs, its process tree's
memory and IO) and posts one sample per interval to the gateway, which publishes it here: the
predictor learns from it, and checks it against the task's `sla.min_gpu_utilization_percent`.
"""

from __future__ import annotations

from pydantic import Field

from crater.contracts.base import MAX_ATTEMPT, Contract, Event, ExactInt
from crater.contracts.tasks import TaskId


class GpuUsage(Contract):
    gpu_id: int = Field(ge=0, le=1023, description="The card's index on its node.")
    utilization_percent: float = Field(ge=0, le=100, description="Mean over the interval.")
    memory_used_mb: int = Field(ge=0, le=16 * 1024 * 1024, description="Peak over the interval.")
    memory_total_mb: int | None = Field(
        default=None,
        ge=0,
        le=16 * 1024 * 1024,
        description="The card's size: a peak at the card's limit may be clipped (a lower bound).",
    )


class TaskUsageReported(Event):
    """One sample of a running task's own use, averaged over `interval_seconds` (memory: the
    peak seen in the interval)."""

    task_id: TaskId
    allocation_id: str | None = Field(default=None, max_length=256)
    attempt: int = Field(default=1, ge=1, le=10_000)
    node: str | None = Field(default=None, max_length=253)
    interval_seconds: float = Field(gt=0, le=3_600)
    gpus: list[GpuUsage] = Field(
        default_factory=list, max_length=1024, description="The task's GPUs; empty: none seen."
    )
    host_memory_used_mb: ExactInt | None = Field(
        default=None, ge=0, description="Resident memory of the task's process tree (peak)."
    )
    # Bounds far past any machine, so that sums over a task's samples stay finite numbers
    # its database can hold (the fuzzer's usage.task crash: an integer past 64 bits).
    io_read_bytes_per_second: float | None = Field(default=None, ge=0, le=1e15)
    io_write_bytes_per_second: float | None = Field(default=None, ge=0, le=1e15)
    cpu_utilization_percent: float | None = Field(
        default=None, ge=0, le=1e6, description="Of the cores granted (100: all of them busy)."
    )
    source: str = Field(default="crater-client", max_length=64)

    @property
    def gpu_utilization_percent(self) -> float | None:
        """Mean over the task's GPUs; None when no GPU was sampled."""
        if not self.gpus:
            return None
        return sum(g.utilization_percent for g in self.gpus) / len(self.gpus)


class TaskUnderutilized(Event):
    """A running task used its GPUs less than its `sla.min_gpu_utilization_percent` over a
    whole window: said once per attempt, when it first happens."""

    task_id: TaskId
    allocation_id: str | None = None
    attempt: int = Field(default=1, ge=1, le=MAX_ATTEMPT)
    measured_gpu_utilization_percent: float = Field(ge=0, le=100)
    min_gpu_utilization_percent: float = Field(ge=0, le=100)
    window_seconds: float = Field(gt=0, description="How long the mean was measured over.")
    samples: int = Field(ge=1)
