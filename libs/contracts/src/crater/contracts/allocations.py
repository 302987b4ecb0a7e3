"""Allocations: the resources a placed task holds."""

from __future__ import annotations

from enum import StrEnum

from pydantic import AwareDatetime, Field

from crater.contracts.base import Contract, TaskEvent
from crater.contracts.tasks import TaskId


class ScoreDetail(Contract):
    plugin: str
    score: float


class AllocationGranted(TaskEvent):
    """The scheduler placed a task: these exact resources are now its own."""

    allocation_id: str
    task_id: TaskId
    node: str
    pool: str
    tenant: str
    gpu_ids: list[int]
    gpu_memory_mb: int = Field(ge=0, description="Reserved per card.")
    gpu_milli: int = Field(default=1000, ge=1, le=1000, description="Share of each card held.")
    mig_profile: str | None = Field(
        default=None, description="The MIG slice held on gpu_ids[0] (e.g. 1g.10gb); None: none."
    )
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
    gang_index: int = Field(
        default=0, ge=0, description="This member of a gang (one grant per member), from 0."
    )
    gang_size: int = Field(default=1, ge=1, description="Members granted together, all or none.")
    attempt: int = Field(default=1, ge=1, description="Which attempt of the task (restart policy).")


class ReleaseReason(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    EXPIRED = "expired"
    NODE_LOST = "node-lost"
    SCALED_IN = "scaled-in"


class AllocationReleased(TaskEvent):
    allocation_id: str
    task_id: TaskId
    node: str
    gpu_ids: list[int]
    cpu_cores: list[int]
    reason: ReleaseReason
