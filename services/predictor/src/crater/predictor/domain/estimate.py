"""A task's peak memory per GPU, its host memory, its step timeline and its IO: pure, no I/O.

predict() is the entry point; each part, with the sources of its formulas, lives in its own
module: validation (refusals), training_memory (model states, ZeRO, LoRA/QLoRA, activations),
inference_memory (weights, KV cache), timeline (step time, checkpoint, dataset reads) and host
(DataLoader settings, host memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from crater.contracts import Confidence, FieldError, ResourcePrediction, TaskRequest, TaskType
from crater.contracts.dataloader import dataloader_settings
from crater.contracts.tasks import DEFAULT_HOST_MEMORY_MB, InferenceConfig, TrainingConfig
from crater.predictor.domain.assumptions import Assumptions
from crater.predictor.domain.catalog import Architecture, family_of, infer, lookup, normalise
from crater.predictor.domain.host import _host_memory_mb, _loader_for_training
from crater.predictor.domain.inference_memory import _inference_memory
from crater.predictor.domain.memory import MIB, _mb, weight_bytes
from crater.predictor.domain.timeline import _timeline
from crater.predictor.domain.training_memory import _training_memory
from crater.predictor.domain.validation import Refused, _validate_inference, _validate_training


@dataclass(frozen=True)
class Correction:
    """A learned multiplier for one (model family, task type), with its track record."""

    factor: float = 1.0
    samples: int = 0
    mape: float | None = None


def resolve(request: TaskRequest) -> tuple[Architecture | None, Confidence]:
    spec = request.model_spec
    known = lookup(spec.name)
    if known is not None:
        if (
            spec.parameters_billion
            and abs(spec.parameters_billion * 1e9 / known.parameters - 1) > 0.25
        ):
            # the caller says otherwise: trust the count, keep nothing of the catalog shape
            return infer(spec.name, spec.parameters_billion * 1e9), Confidence.LOW
        return known, Confidence.MEDIUM
    if spec.parameters_billion:
        return infer(spec.name, spec.parameters_billion * 1e9), Confidence.LOW
    return None, Confidence.LOW


def family(request: TaskRequest) -> str:
    """The model family corrections are kept for."""
    architecture, _ = resolve(request)
    return architecture.family if architecture else family_of(request.model_spec.name)


def predict(
    request: TaskRequest,
    assumptions: Assumptions | None = None,
    correction: Correction | None = None,
) -> ResourcePrediction:
    """The prediction for one task; raises Refused when the request makes no sense."""
    a = assumptions or Assumptions()
    architecture, confidence = resolve(request)
    gpu = request.resource_requirements.gpu
    gpus = max(gpu.count, 1)
    cores = request.resource_requirements.cpu.cores or 1
    if architecture is None:
        if gpu.count and not gpu.memory_mb:
            raise Refused(
                [
                    FieldError(
                        field="model_config.name",
                        reason=f"unknown model {request.model_spec.name!r}: give "
                        "model_config.parameters_billion or resource_requirements.gpu.memory_mb",
                    )
                ]
            )
        workers, prefetch = dataloader_settings(cores, gpus)
        return ResourcePrediction(
            gpu_memory_per_gpu_mb=gpu.memory_mb,
            host_memory_mb=request.resource_requirements.memory.capacity_mb
            or DEFAULT_HOST_MEMORY_MB,
            breakdown_mb={"requested": gpu.memory_mb},
            confidence=Confidence.LOW,
            method=f"unknown model {request.model_spec.name!r} without parameters_billion: "
            "the request as is",
            dataloader_num_workers=workers,
            dataloader_prefetch_factor=prefetch,
            model_family=family_of(request.model_spec.name),
        )

    training = request.task_type in (TaskType.TRAINING, TaskType.FINE_TUNING)
    if training:
        config = request.training_config or TrainingConfig()
        shape = _validate_training(request, architecture, config, a)
        parts = _training_memory(request, architecture, config, shape)
    else:
        inference = request.inference_config or InferenceConfig()
        _validate_inference(request, architecture, inference, a)
        parts = _inference_memory(request, architecture, inference)

    tensors = sum(parts.breakdown.values())
    parts.breakdown["allocator_overhead"] = tensors * a.allocator_overhead
    breakdown = {k: _mb(v) for k, v in parts.breakdown.items()}
    breakdown["cuda_context"] = a.cuda_context_mb
    if not gpu.count:  # a CPU task: what would sit on a card sits in host memory
        breakdown = {}
    raw = sum(breakdown.values())

    timeline = None
    if training:
        timeline = _timeline(request, architecture, config, shape, breakdown, a)
        workers, prefetch = _loader_for_training(request, architecture, config, shape, timeline)
    else:
        workers, prefetch = dataloader_settings(cores, gpus)
    host = _host_memory_mb(request, architecture, parts, timeline, workers, prefetch)
    if not gpu.count:
        host += _mb(tensors)

    if timeline is not None and timeline.dataset_read_mb_per_s > a.disk_read_mb_per_s:
        parts.notes.append(
            f"IO-bound: {timeline.dataset_read_mb_per_s:,.0f} MB/s of dataset reads wanted, "
            f"the disk gives {a.disk_read_mb_per_s:,.0f}"
        )
    method = "; ".join(parts.method + parts.notes)
    factor = None
    if correction is not None and correction.samples and raw:
        factor = correction.factor
        breakdown["learned_correction"] = round(raw * factor) - raw
        method += f"; x{factor:.3f} learned from {correction.samples} observed peaks"
        if timeline is not None:
            scaled = [
                p.model_copy(update={"gpu_memory_mb": round(p.gpu_memory_mb * factor)})
                for p in timeline.points
            ]
            timeline = timeline.model_copy(update={"points": scaled})
        if correction.mape is not None and correction.samples >= 5 and correction.mape < 0.1:
            confidence = Confidence.HIGH
    if _method_assumed(request):
        # Full fine-tuning and LoRA of the same model differ several times over: a figure for
        # an assumed method is a guess, so the task's own ask stands (AllData's llm_finetune
        # of an 8B model asks 16 GB a card: the bf16 weights, i.e. adapters on a frozen base).
        confidence = Confidence.LOW
        method += "; fine-tuning method not stated (training_config): full fine-tuning assumed"
    return ResourcePrediction(
        gpu_memory_per_gpu_mb=max(sum(breakdown.values()), 0),
        host_memory_mb=host,
        breakdown_mb=breakdown,
        confidence=confidence,
        method=method,
        dataloader_num_workers=workers,
        dataloader_prefetch_factor=prefetch,
        model_family=architecture.family,
        parameters=architecture.parameters,
        trainable_parameters=parts.trainable if training else 0,
        correction_factor=factor,
        timeline=timeline,
    )


def _method_assumed(request: TaskRequest) -> bool:
    """A fine-tuning whose method (full, LoRA, QLoRA) the request does not say."""
    return request.task_type is TaskType.FINE_TUNING and request.training_config is None


__all__ = [
    "MIB",
    "Assumptions",
    "Correction",
    "Refused",
    "dataloader_settings",
    "family",
    "normalise",
    "predict",
    "resolve",
    "weight_bytes",
]
