"""A first-order estimate of a task's peak memory.

Training keeps weights, gradients and Adam states: 16 bytes per parameter under mixed
precision (fp16 weights 2 + fp16 grads 2 + fp32 master 4 + Adam m and v 8), sharded across
the task's GPUs as FSDP/ZeRO-3 would; activations are taken as a fifth of model states.
Inference keeps the weights at their precision plus a fifth for KV cache and workspace.
Every GPU also pays the CUDA context and framework overhead.
"""

from __future__ import annotations

import math

from crater.contracts import Confidence, Precision, ResourcePrediction, TaskRequest, TaskType
from crater.predictor.domain.catalog import parameters_billion

MIB = 1024 * 1024
CUDA_CONTEXT_MB = 1024
BYTES_PER_PARAMETER = {
    Precision.FP32: 4.0,
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}
MIXED_PRECISION_ADAM_BYTES = 16.0
FP32_ADAM_BYTES = 16.0  # fp32 weights 4 + grads 4 + m 4 + v 4
ACTIVATION_SHARE = 0.2
INFERENCE_HEADROOM = 0.2


def predict(request: TaskRequest, cpu_cores_available: int | None = None) -> ResourcePrediction:
    spec = request.model_spec
    known = parameters_billion(spec.name)
    billions = spec.parameters_billion or known
    gpus = max(request.resource_requirements.gpu.count, 1)
    cores = request.resource_requirements.cpu.cores or cpu_cores_available or 1
    workers, prefetch = dataloader_settings(cores, gpus)

    if billions is None:
        requested = request.resource_requirements.gpu.memory_mb
        return ResourcePrediction(
            gpu_memory_per_gpu_mb=requested,
            host_memory_mb=request.resource_requirements.memory.capacity_mb,
            breakdown_mb={"requested": requested},
            confidence=Confidence.LOW,
            method=f"unknown model {spec.name!r} without parameters_billion: the request as is",
            dataloader_num_workers=workers,
            dataloader_prefetch_factor=prefetch,
        )

    parameters = billions * 1e9
    weight_bytes = BYTES_PER_PARAMETER[spec.precision]
    breakdown: dict[str, int]
    if request.task_type in (TaskType.TRAINING, TaskType.FINE_TUNING):
        per_parameter = MIXED_PRECISION_ADAM_BYTES if weight_bytes < 4 else FP32_ADAM_BYTES
        states = parameters * per_parameter / gpus
        breakdown = {
            "weights": _mb(parameters * weight_bytes / gpus),
            "gradients": _mb(parameters * weight_bytes / gpus),
            "optimizer": _mb(states - 2 * parameters * weight_bytes / gpus),
            "activations": _mb(states * ACTIVATION_SHARE),
        }
        method = f"{billions:g}B params x {per_parameter:g} B (Adam, {spec.precision}) / {gpus} GPU"
    else:
        weights = parameters * weight_bytes / gpus
        breakdown = {
            "weights": _mb(weights),
            "kv_cache_and_workspace": _mb(weights * INFERENCE_HEADROOM),
        }
        method = f"{billions:g}B params x {weight_bytes:g} B ({spec.precision}) / {gpus} GPU"
    breakdown["cuda_context"] = CUDA_CONTEXT_MB
    per_gpu = sum(breakdown.values())
    host = max(request.resource_requirements.memory.capacity_mb, _mb(parameters * weight_bytes))
    return ResourcePrediction(
        gpu_memory_per_gpu_mb=per_gpu,
        host_memory_mb=host,
        breakdown_mb=breakdown,
        confidence=Confidence.MEDIUM if known is not None else Confidence.LOW,
        method=method,
        dataloader_num_workers=workers,
        dataloader_prefetch_factor=prefetch,
    )


def dataloader_settings(cpu_cores: int, gpus: int) -> tuple[int, int]:
    """Workers per GPU process from the cores the task holds, one left for the main loop."""
    per_gpu = max((cpu_cores - gpus) // gpus, 0)
    workers = min(per_gpu, 8)
    prefetch = 2 if workers >= 4 else 4 if workers else 1
    return workers, prefetch


def _mb(n_bytes: float) -> int:
    return math.ceil(n_bytes / MIB)
