"""Lifecycle events as the scheduler and the probes emit them, for the callback's tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from crater.contracts import (
    AllocationGranted,
    FieldError,
    FilterReason,
    TaskEnded,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskStatus,
    TaskStatusReported,
)

OCCURRED = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def granted(task_id: str = "train-1", **overrides: Any) -> AllocationGranted:
    fields: dict[str, Any] = {
        "allocation_id": f"alloc-{task_id}",
        "task_id": task_id,
        "node": "gpu-01",
        "pool": "default",
        "tenant": "default",
        "gpu_ids": [0, 1],
        "gpu_memory_mb": 40000,
        "cpu_cores": [0, 1, 2, 3, 4, 5, 6, 7],
        "numa_node": 0,
        "memory_mb": 65536,
        "checkpoint_path": f"/nvme0/ckpt/{task_id}",
        "reservation_token": "tok-1",
        "reservation_expires_at": OCCURRED + timedelta(seconds=30),
        "score": 97.5,
        "explanation": "gpu-01: 2 NVLink-connected A100 on NUMA 0, NVMe local",
        "environment": {"CRATER_GPU_IDS": "0,1"},
        "occurred_at": OCCURRED,
    }
    fields.update(overrides)
    return AllocationGranted(**fields)


def pending(task_id: str = "train-1") -> TaskPending:
    return TaskPending(
        task_id=task_id,
        nodes_total=40,
        reasons=[
            FilterReason(filter="GpuCount", code="InsufficientGpus", nodes=32, message="too few"),
            FilterReason(filter="GpuMemory", code="GpuMemoryPerCard", nodes=8, message="small"),
        ],
        summary="0/40 nodes: 32 InsufficientGpus, 8 GpuMemoryPerCard",
        occurred_at=OCCURRED,
    )


def rejected(task_id: str = "train-1", duplicate: bool = False) -> TaskRejected:
    if duplicate:
        errors = [FieldError(field="task_id", reason=f"task {task_id} is already known")]
    else:
        errors = [
            FieldError(field="resource_requirements.gpu.count", reason="no node has 64 GPUs"),
            FieldError(field="pool", reason="unknown pool 'x'"),
        ]
    return TaskRejected(task_id=task_id, errors=errors, duplicate=duplicate, occurred_at=OCCURRED)


def ended(
    task_id: str = "train-1",
    value: TaskStatus = TaskStatus.SUCCEEDED,
    release_reason: str | None = None,
    attempt: int = 1,
) -> TaskEnded:
    """The scheduler's one end of a task, after the allocation `granted` makes."""
    return TaskEnded(
        task_id=task_id,
        status=value,  # type: ignore[arg-type]
        reason=f"{value.value}: allocation alloc-{task_id} released",
        allocation_id=f"alloc-{task_id}",
        release_reason=release_reason if release_reason is not None else value.value,
        attempt=attempt,
        occurred_at=OCCURRED,
    )


def preempted(task_id: str = "train-1") -> TaskPreempted:
    return TaskPreempted(
        task_id=task_id,
        allocation_id=f"alloc-{task_id}",
        node="gpu-01",
        preempted_by="urgent-9",
        grace_period_seconds=30,
        occurred_at=OCCURRED,
    )


def status(task_id: str = "train-1", value: TaskStatus = TaskStatus.RUNNING) -> TaskStatusReported:
    return TaskStatusReported(
        task_id=task_id, status=value, message=f"{value.value} on gpu-01", occurred_at=OCCURRED
    )
