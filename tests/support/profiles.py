"""A small training task as the predictor hands it to the scheduler (task.profiled): one
implementation for the scheduler's service-layer tests and the audit replay benchmark."""

from __future__ import annotations

from datetime import datetime

from crater.contracts import Confidence, ResourcePrediction, TaskProfiled, TaskRequest

PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=1000,
    host_memory_mb=1000,
    confidence=Confidence.LOW,
    method="test",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=2,
)


def small_training(task_id: str, gpus: int = 1, at: datetime | None = None) -> TaskProfiled:
    request = TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training",
            "model_config": {"name": "m"},
            "resource_requirements": {
                "gpu": {"count": gpus, "memory_mb": 1000},
                "cpu": {"cores": 1},
                "memory": {"capacity_mb": 1000},
            },
        }
    )
    if at is None:
        return TaskProfiled(task=request, prediction=PREDICTION)
    return TaskProfiled(task=request, prediction=PREDICTION, occurred_at=at)


# A prediction that adds nothing to what the request asks: the test's figures decide.
NOTHING_PREDICTED = ResourcePrediction(
    gpu_memory_per_gpu_mb=0,
    host_memory_mb=0,
    confidence=Confidence.LOW,
    method="test",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=1,
)


def profiled(
    task_id: str,
    gpus: int,
    task_type: str = "training",
    gpu_memory_mb: int | None = None,
    **body: object,
) -> TaskProfiled:
    """A task of `gpus` cards and one core as the scheduler gets it, `body` its other
    request fields (pool, tenant, priority, ...)."""
    gpu: dict[str, int] = {"count": gpus}
    if gpu_memory_mb is not None:
        gpu["memory_mb"] = gpu_memory_mb
    request = TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": task_type,
            "model_config": {"name": "m"},
            "resource_requirements": {"gpu": gpu, "cpu": {"cores": 1}},
            **body,
        }
    )
    return TaskProfiled(task=request, prediction=NOTHING_PREDICTED)
