"""Allocations: the resources a placed task holds."""

from __future__ import annotations

from enum import StrEnum

from pydantic import AwareDatetime, Field

from crater.contracts.base import Contract, Event
from crater.contracts.tasks import TaskId


class ScoreDetail(Contract):
    plugin: str
    score: float


class AllocationGranted(Event):
    """The scheduler placed a task: these exact resources are now its own."""

    allocation_id: str
    task_id: TaskId
    node: str
    pool: str
    tenant: str
    gpu_ids: list[int]
    gpu_memory_mb: int = Field(ge=0, description="Reserved per card.")
    gpu_milli: int = Field(default=1000, ge=1, le=1000, description="Share of each card held.")
    cpu_cores: list[int]
    numa_node: int | None
    memory_mb: int = Field(ge=0)
    checkpoint_path: str | None
    reservation_token: str
    reservation_expires_at: AwareDatetime
    score: float
    scores: list[ScoreDetail] = Field(default_factory=list)
    explanation: str = Field(description="Why this node, in one line.")
    environment: dict[str, str] = Field(description="CRATER_* variables handed to the task.")


class ReleaseReason(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    EXPIRED = "expired"
    NODE_LOST = "node-lost"
    SCALED_IN = "scaled-in"


class AllocationReleased(Event):
    allocation_id: str
    task_id: TaskId
    node: str
    gpu_ids: list[int]
    cpu_cores: list[int]
    reason: ReleaseReason
