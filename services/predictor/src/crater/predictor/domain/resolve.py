"""AllData's job description (framework, model size, data volume) resolved into a task request
sized by the predictor's own model: the fewest GPUs whose cards hold the predicted peak, the
cores its data loaders need, its host memory, and an SSD for the dataset and a checkpoint.
Pure, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from crater.contracts import (
    FieldError,
    JobDescription,
    ResourcePrediction,
    TaskRequest,
    TaskType,
)
from crater.contracts.gpus import GpuProduct, parse_gpu_product
from crater.predictor.domain.estimate import MIB, Assumptions, Correction, Refused, predict

GPU_COUNTS = (1, 2, 4, 8)  # one node's worth, powers of two as parallel layouts want
DEFAULT_CARD_GB = 80  # no gpu_type: sized for the common 80 GB cards (A100, H100)
CARD_HEADROOM = 0.10  # of each card kept free over the predicted peak
DISK_HEADROOM = 0.10  # of the SSD kept free over the dataset and a checkpoint
# Cores per GPU a draft holds: training, enough for the loader the prediction sizes from the
# step time (at most 16 workers + the main process); serving has no step time to size from:
# the server process and one tokenizer worker.
DRAFT_CORES_PER_GPU = {TaskType.INFERENCE: 2}
TRAINING_DRAFT_CORES_PER_GPU = 17


@dataclass(frozen=True)
class Resolved:
    task: TaskRequest
    prediction: ResourcePrediction
    explanation: str


def card_memory_mb(gpu_type: str | None) -> int:
    """The least memory per card (MiB) of the product asked for (a100-pcie-40gb: 40 GB),
    else of an 80 GB card."""
    product = parse_gpu_product(gpu_type) if gpu_type else None
    if product is None or product.memory_gb is None:
        product = GpuProduct("any", memory_gb=DEFAULT_CARD_GB)
    return product.min_memory_mb


def model_name(job: JobDescription) -> str:
    return job.model or f"unnamed-{job.model_size.lower()}"


def new_task_id(job: JobDescription) -> str:
    return f"{job.framework.value}-{job.model_size.lower()}-{uuid4().hex[:8]}"


def request_for(
    job: JobDescription,
    task_id: str,
    gpus: int,
    cores: int,
    gpu_memory_mb: int = 0,
    memory_mb: int = 1024,
    ssd_gb: int = 0,
) -> TaskRequest:
    kind = job.kind
    body: dict[str, Any] = {
        "task_id": task_id,
        "task_type": kind.value,
        "model_config": {
            "name": model_name(job),
            "precision": job.precision.value,
            "parameters_billion": job.parameters / 1e9,
        },
        "data_config": {"io_pattern": job.io_pattern.value},
        "resource_requirements": {
            "gpu": {"count": gpus, "memory_mb": gpu_memory_mb, "type": job.gpu_type},
            "cpu": {"cores": cores},
            "memory": {"capacity_mb": memory_mb},
            "ssd": {"capacity_gb": ssd_gb},
        },
        "pool": job.pool,
        "tenant": job.tenant,
    }
    if kind in (TaskType.TRAINING, TaskType.FINE_TUNING) and job.lora:
        body["training_config"] = {"lora": {}}
    if kind is TaskType.INFERENCE:
        body["inference_config"] = {"tensor_parallel": gpus}  # weights split over the cards
    return TaskRequest.model_validate(body)


def resolve_job(
    job: JobDescription,
    assumptions: Assumptions,
    correction: Correction | None,
    task_id: str | None = None,
) -> Resolved:
    """The task request for `job`, its prediction and why; Refused when no node's worth of
    GPUs holds it (or the predictor refuses the request)."""
    task_id = job.task_id or task_id or new_task_id(job)
    card_mb = card_memory_mb(job.gpu_type)
    usable_mb = math.floor(card_mb / (1 + CARD_HEADROOM))
    counts = (job.gpus,) if job.gpus else GPU_COUNTS
    fitted: tuple[int, ResourcePrediction] | None = None
    peaks: list[str] = []
    for gpus in counts:
        per_gpu = DRAFT_CORES_PER_GPU.get(job.kind, TRAINING_DRAFT_CORES_PER_GPU)
        draft = request_for(job, task_id, gpus, gpus * per_gpu)
        try:
            prediction = predict(draft, assumptions, correction)
        except Refused as refused:  # this layout is impossible (heads over GPUs): the next
            peaks.append(f"on {gpus}: " + "; ".join(e.reason for e in refused.errors))
            continue
        peaks.append(f"{prediction.gpu_memory_per_gpu_mb} MiB on {gpus}")
        if prediction.gpu_memory_per_gpu_mb <= usable_mb:
            fitted = gpus, prediction
            break
    if fitted is None:
        field = "gpus" if job.gpus else "model_size"
        raise Refused(
            [
                FieldError(
                    field=field,
                    reason=f"{job.model_size} parameters ({job.kind.value}) need more than "
                    f"{usable_mb} MiB per {card_mb} MiB card ({CARD_HEADROOM:.0%} kept free) "
                    f"on up to {counts[-1]} GPUs: predicted {', '.join(peaks)}; "
                    "choose larger cards (gpu_type), lora, a smaller model, or name the "
                    "model (model) for its real shape",
                )
            ]
        )
    gpus, draft_prediction = fitted
    # Cores: each GPU process and the loader workers the prediction found it needs.
    workers = draft_prediction.dataloader_num_workers
    cores = gpus * (workers + 1)
    sized = request_for(job, task_id, gpus, cores)
    prediction = predict(sized, assumptions, correction)
    timeline = prediction.timeline
    checkpoint_bytes = timeline.checkpoint_size_mb * MIB if timeline else 0
    ssd_gb = math.ceil((job.data_bytes + checkpoint_bytes) * (1 + DISK_HEADROOM) / 1e9)
    task = request_for(
        job,
        task_id,
        gpus,
        cores,
        gpu_memory_mb=prediction.gpu_memory_per_gpu_mb,
        memory_mb=prediction.host_memory_mb,
        ssd_gb=ssd_gb,
    )
    prediction = predict(task, assumptions, correction)  # as a submission of it will be
    explanation = (
        f"{job.framework.value} {job.kind.value} of {model_name(job)} "
        f"({job.model_size} parameters, {prediction.confidence.value} confidence): "
        f"{prediction.gpu_memory_per_gpu_mb} MiB peak per GPU fits {gpus} x {card_mb} MiB "
        f"cards with {CARD_HEADROOM:.0%} free; {cores} cores (per GPU: its process and "
        f"{workers} loader workers); {prediction.host_memory_mb} MiB host memory; "
        f"{ssd_gb} GB SSD for {job.data_volume} of data"
        + (" and a checkpoint" if checkpoint_bytes else "")
    )
    return Resolved(task, prediction, explanation)
