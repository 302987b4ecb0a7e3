"""A task's peak memory per GPU, its host memory, its step timeline and its IO: pure, no I/O.

predict() is the entry point; each part, with the sources of its formulas, lives in its own
module: validation (refusals), training_memory (model states, ZeRO, LoRA/QLoRA, activations),
inference_memory (weights, KV cache), timeline (step time, checkpoint, dataset reads) and host
(DataLoader settings, host memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from crater.contracts import (
    CardFit,
    Confidence,
    FieldError,
    ResourcePrediction,
    TaskRequest,
    TaskType,
)
from crater.contracts.dataloader import dataloader_settings
from crater.contracts.tasks import DEFAULT_HOST_MEMORY_MB, InferenceConfig, TrainingConfig
from crater.predictor.domain.assumptions import Assumptions
from crater.predictor.domain.catalog import (
    Architecture,
    ConfigError,
    family_of,
    from_hf_config,
    infer,
    normalise,
    resolve_name,
)
from crater.predictor.domain.fit import advice, band, judge
from crater.predictor.domain.fit import scaled as spread
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


@dataclass(frozen=True)
class Resolved:
    """The architecture a request's model is predicted as, and how sure that is."""

    architecture: Architecture | None
    confidence: Confidence
    how: str
    notes: tuple[str, ...] = ()


def resolve_model(request: TaskRequest) -> Resolved:
    """The task's config.json when it carries one, else the catalog entry its name finds,
    else a generic shape from parameters_billion; Refused when a config.json says too
    little to read a shape from."""
    spec = request.model_spec
    named = resolve_name(spec.name, spec.parameters_billion)
    if spec.hf_config is not None:
        family = named.architecture.family if named else None
        try:
            architecture = from_hf_config(spec.hf_config, None, family)
        except ConfigError as error:
            raise Refused(
                [FieldError(field=f"model_config.hf_config.{error.field}", reason=error.reason)]
            ) from None
        architecture = replace(architecture, key=normalise(spec.name))
        how = f"the task's config.json (model_type {architecture.model_type or '?'})"
        return Resolved(architecture, Confidence.MEDIUM, how)
    if named is not None:
        architecture = named.architecture
        confidence = Confidence.MEDIUM if named.exact else Confidence.LOW
        notes: tuple[str, ...] = ()
        given = spec.parameters_billion
        if given and abs(given * 1e9 / architecture.parameters - 1) > 0.25:
            # the name and the count disagree: the shape is the name's, said, not silently
            # swapped for a guess; the confidence says it may be the wrong model
            confidence = Confidence.LOW
            notes = (
                f"parameters_billion {given:g} disagrees with {architecture.key}'s "
                f"{architecture.parameters / 1e9:.3g}B: {architecture.key}'s shape is used "
                "(send model_config.hf_config for another)",
            )
        return Resolved(architecture, confidence, named.how, notes)
    if spec.parameters_billion:
        architecture = infer(spec.name, spec.parameters_billion * 1e9)
        how = (
            f"a generic {architecture.family if architecture.family != 'unknown' else ''} "
            f"decoder of {spec.parameters_billion:g}B parameters ({architecture.layers} layers, "
            f"hidden {architecture.hidden}, vocabulary {architecture.vocab}): "
            f"{spec.name!r} is not in the catalog"
        ).replace("generic  decoder", "generic decoder")
        return Resolved(architecture, Confidence.LOW, how)
    return Resolved(None, Confidence.LOW, f"unknown model {spec.name!r}")


def resolve(request: TaskRequest) -> tuple[Architecture | None, Confidence]:
    resolved = resolve_model(request)
    return resolved.architecture, resolved.confidence


def family(request: TaskRequest) -> str:
    """The model family corrections are kept for."""
    try:
        architecture, _ = resolve(request)
    except Refused:
        architecture = None
    return architecture.family if architecture else family_of(request.model_spec.name)


def predict(
    request: TaskRequest,
    assumptions: Assumptions | None = None,
    correction: Correction | None = None,
) -> ResourcePrediction:
    """The prediction for one task; raises Refused when the request makes no sense."""
    a = assumptions or Assumptions()
    resolved = resolve_model(request)
    architecture, confidence = resolved.architecture, resolved.confidence
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
    if parts.fixed_total is None:
        parts.breakdown["allocator_overhead"] = tensors * a.allocator_overhead
    else:  # a paged engine's share of the card holds everything, its KV blocks the rest
        rest = parts.fixed_total - tensors + parts.breakdown["kv_cache"]
        parts.breakdown["kv_cache"] = max(rest - a.cuda_context_mb * MIB, 0.0)
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
    host_breakdown = {k: _mb(v) for k, v in parts.host.items() if v}
    host += sum(host_breakdown.values())
    if not gpu.count:
        host += _mb(tensors)

    if timeline is not None and timeline.dataset_read_mb_per_s > a.disk_read_mb_per_s:
        parts.notes.append(
            f"IO-bound: {timeline.dataset_read_mb_per_s:,.0f} MB/s of dataset reads wanted, "
            f"the disk gives {a.disk_read_mb_per_s:,.0f}"
        )
    method = "; ".join([resolved.how, *parts.method, *resolved.notes, *parts.notes])
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
    peak = max(sum(breakdown.values()), 0)
    fit = None
    low = high = None
    if gpu.count:
        guessed = not architecture.known and architecture.source == "generic"
        factors = band(request, confidence, guessed)
        low, high = spread(peak, factors)
        modelled_low, _ = spread(raw, factors)
        fit = judge(request, peak, low, high, advice(request), modelled_low)
        if fit is not None and fit.verdict is not CardFit.FITS:
            method += f"; {fit.reason}"
    return ResourcePrediction(
        gpu_memory_per_gpu_mb=peak,
        gpu_memory_low_mb=low,
        gpu_memory_high_mb=high,
        fit=fit,
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
        architecture=resolved.how,
        host_breakdown_mb=host_breakdown,
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
