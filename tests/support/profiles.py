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
