"""A task's peak memory per GPU, its host memory, its step timeline and its IO: pure, no I/O.

Sources of the formulas (each cited again where it is used):
- Model states under mixed precision and their ZeRO partitioning: Rajbhandari et al. 2020,
  "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §3.1 and §5: with
  Ψ parameters, fp16 weights 2Ψ + fp16 gradients 2Ψ + K·Ψ optimizer states, K = 12 for Adam
  (fp32 master weights, momentum and variance), so 16Ψ bytes; stage 1 divides the optimizer
  states by the data-parallel degree N_d, stage 2 also the gradients, stage 3 also the weights.
- Activations of a transformer layer: Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 1: s·b·h·(34 + 5·a·s/h) bytes with 16-bit
  activations; divided by t under tensor and sequence parallelism (§4.2.2).
- KV cache: 2 (K and V) · layers · kv_heads · head_dim · sequence · batch · bytes per value.
- LoRA: Hu et al. 2021; QLoRA's 4-bit NormalFloat with double quantization: Dettmers et al.
  2023 (about 0.127 bits per parameter of quantization constants).
- 8-bit Adam: Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization" (2 bytes
  of state per parameter instead of 8).
- Training FLOPs: 6 per parameter per token, 8 with full recomputation (Kaplan et al. 2020;
  Narayanan et al. 2021); step time at a model FLOPs utilisation (Chowdhery et al. 2022).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from crater.contracts import (
    Confidence,
    FieldError,
    IoPattern,
    Precision,
    ResourcePrediction,
    TaskRequest,
    TaskType,
)
from crater.contracts.dataloader import (
    PROCESS_HOST_MB,
    WORKER_HOST_MB,
    dataloader_settings,
    workers_per_process,
)
from crater.contracts.tasks import (
    DEFAULT_HOST_MEMORY_MB,
    InferenceConfig,
    Optimizer,
    TimelinePoint,
    TrainingConfig,
    TrainingTimeline,
)
from crater.predictor.domain.catalog import (
    Architecture,
    Kind,
    Mlp,
    checkpoint_fraction,
    family_of,
    infer,
    lookup,
    lora_trainable_parameters,
    normalise,
)

MIB = 1024 * 1024
MB = 1_000_000  # disk and network rates are quoted in decimal megabytes

BYTES_PER_PARAMETER = {
    Precision.FP32: 4.0,
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}
# GPTQ/AWQ store 4-bit weights with an fp16 scale and zero point per group of 128 weights.
FOUR_BIT_QUANTIZATION = 0.5 + 4 / 128
FOUR_BIT_NAMES = ("gptq", "awq", "nf4", "4bit", "4-bit", "int4", "q4", "bnb-4bit", "exl2")
EIGHT_BIT_NAMES = ("int8", "8bit", "8-bit", "llm.int8", "smoothquant", "fp8", "q8", "bnb-8bit")
# QLoRA: NF4 weights (4 bits) + double-quantized constants (0.127 bits), Dettmers et al. 2023
NF4_DOUBLE_QUANT = (4 + 0.127) / 8
# Optimizer state bytes per trainable parameter, without the fp32 master copy.
OPTIMIZER_BYTES = {
    Optimizer.ADAM: 8.0,  # m and v in fp32
    Optimizer.ADAMW: 8.0,
    Optimizer.SGD: 4.0,  # momentum buffer in fp32
    Optimizer.ADAM_8BIT: 2.0,  # m and v block-wise quantized to 8 bits
}
MASTER_WEIGHT_BYTES = 4.0  # fp32 copy kept by mixed-precision training
KV_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
# Dense fp16/bf16 tensor-core peak, FLOP/s (vendor datasheets, without sparsity).
GPU_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "A10": 125e12,
    "A6000": 155e12,
    "4090": 165e12,
    "3090": 71e12,
    "V100": 125e12,
    "T4": 65e12,
}
DEFAULT_GPU = "A100"
STALL_COVER_SECONDS = {IoPattern.SEQUENTIAL: 0.25, IoPattern.MIXED: 0.5, IoPattern.RANDOM: 1.0}
PAGE = 4096


@dataclass(frozen=True)
class Assumptions:
    """What the predictor assumes about the machines; the service's settings."""

    cuda_context_mb: int = 1024  # ~0.5 GB with CUDA lazy loading, ~1.3 GB without
    allocator_overhead: float = 0.05  # caching-allocator fragmentation, share of tensors
    max_sequence_length: int = 1 << 20
    model_flops_utilisation: float = 0.4
    checkpoint_write_mb_per_s: float = 2000.0
    disk_read_mb_per_s: float = 3000.0
    default_train_sequence_length: int = 2048
    timeline_steps: int = 3


class Refused(Exception):
    """The request cannot be profiled: each error names the field and the reason."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(f"{e.field}: {e.reason}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class Correction:
    """A learned multiplier for one (model family, task type), with its track record."""

    factor: float = 1.0
    samples: int = 0
    mape: float | None = None


@dataclass
class _Parts:
    """Per-GPU bytes by component, and what the timeline needs."""

    breakdown: dict[str, float] = field(default_factory=dict)
    trainable: int = 0
    method: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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


# --- validation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """How the training job is laid out."""

    gpus_per_node: int
    nodes: int
    tensor_parallel: int
    data_parallel: int
    zero_stage: int
    sequence_length: int

    @property
    def ranks_per_node(self) -> int:
        return max(self.gpus_per_node // self.tensor_parallel, 1)


def _validate_training(
    request: TaskRequest, arch: Architecture, config: TrainingConfig, a: Assumptions
) -> _Shape:
    errors: list[FieldError] = []
    gpus = max(request.resource_requirements.gpu.count, 1)
    total = gpus * request.gang_size
    tp = config.tensor_parallel
    sequence = config.sequence_length or min(arch.context or 1, a.default_train_sequence_length)
    if arch.kind is Kind.CONV:
        sequence = 1
    if config.sequence_length and config.sequence_length > a.max_sequence_length:
        errors.append(
            FieldError(
                field="training_config.sequence_length",
                reason=f"{config.sequence_length} tokens is beyond the "
                f"{a.max_sequence_length} this predictor accepts",
            )
        )
    before_tp = len(errors)
    if tp > 1:
        if tp > gpus:
            errors.append(
                FieldError(
                    field="training_config.tensor_parallel",
                    reason=f"{tp} is more than the {gpus} GPUs of one node "
                    "(resource_requirements.gpu.count); tensor parallelism stays in a node",
                )
            )
        elif gpus % tp:
            errors.append(
                FieldError(
                    field="training_config.tensor_parallel",
                    reason=f"{tp} does not divide the {gpus} GPUs per node",
                )
            )
        if arch.kind is Kind.CONV:
            errors.append(
                FieldError(
                    field="training_config.tensor_parallel",
                    reason=f"{arch.key} is convolutional: no attention heads to split",
                )
            )
        elif arch.heads % tp or (arch.kv_heads % tp and tp % arch.kv_heads):
            errors.append(
                FieldError(
                    field="training_config.tensor_parallel",
                    reason=f"{tp} does not divide {arch.key}'s {arch.heads} attention heads "
                    f"({arch.kv_heads} key/value heads)",
                )
            )
    dp = config.data_parallel or max(total // tp, 1)
    if dp * tp > total and len(errors) == before_tp:  # a bad tp says it already
        errors.append(
            FieldError(
                field="training_config.data_parallel",
                reason=f"{dp} x tensor_parallel {tp} = {dp * tp} GPUs, but the task holds "
                f"{total} ({gpus} per node x gang_size {request.gang_size})",
            )
        )
    precision = request.model_spec.precision
    if config.lora is None and precision in (Precision.INT8, Precision.INT4):
        errors.append(
            FieldError(
                field="model_config.precision",
                reason=f"{precision} weights cannot be trained directly: train in "
                "fp16/bf16/fp32, or use training_config.lora (QLoRA: lora.quantize_base)",
            )
        )
    if config.lora is not None:
        if arch.kind is Kind.CONV:
            errors.append(
                FieldError(
                    field="training_config.lora",
                    reason=f"LoRA adapts attention and MLP matrices; {arch.key} has none",
                )
            )
        elif config.lora.rank > arch.hidden:
            errors.append(
                FieldError(
                    field="training_config.lora.rank",
                    reason=f"rank {config.lora.rank} exceeds {arch.key}'s hidden size "
                    f"{arch.hidden}: not low-rank",
                )
            )
        else:
            _, unknown = lora_trainable_parameters(
                arch, config.lora.rank, config.lora.target_modules
            )
            if unknown:
                errors.append(
                    FieldError(
                        field="training_config.lora.target_modules",
                        reason=f"{', '.join(unknown)}: not a linear layer of {arch.key}",
                    )
                )
    if errors:
        raise Refused(errors)
    zero = config.zero_stage if config.zero_stage is not None else (3 if dp > 1 else 0)
    return _Shape(gpus, request.gang_size, tp, dp, zero, sequence)


def _validate_inference(
    request: TaskRequest, arch: Architecture, config: InferenceConfig, a: Assumptions
) -> None:
    errors: list[FieldError] = []
    gpus = max(request.resource_requirements.gpu.count, 1)
    if config.context_length and config.context_length > a.max_sequence_length:
        errors.append(
            FieldError(
                field="inference_config.context_length",
                reason=f"{config.context_length} tokens is beyond the "
                f"{a.max_sequence_length} this predictor accepts",
            )
        )
    tp = config.tensor_parallel
    if tp > 1 and (tp > gpus or gpus % tp):
        errors.append(
            FieldError(
                field="inference_config.tensor_parallel",
                reason=f"{tp} does not divide the {gpus} GPUs requested",
            )
        )
    elif tp > 1 and (arch.kind is Kind.CONV or arch.heads % tp):
        errors.append(
            FieldError(
                field="inference_config.tensor_parallel",
                reason=f"{tp} does not divide {arch.key}'s {arch.heads} attention heads",
            )
        )
    if errors:
        raise Refused(errors)


# --- memory --------------------------------------------------------------------------------


def weight_bytes(request: TaskRequest) -> float:
    """Bytes per stored weight: the precision, or the quantization scheme when it says less."""
    quantization = (request.model_spec.quantization or "").lower()
    if any(n in quantization for n in FOUR_BIT_NAMES):
        return FOUR_BIT_QUANTIZATION
    if any(n in quantization for n in EIGHT_BIT_NAMES):
        return 1.0
    return BYTES_PER_PARAMETER[request.model_spec.precision]


def _training_memory(
    request: TaskRequest, arch: Architecture, config: TrainingConfig, shape: _Shape
) -> _Parts:
    parts = _Parts()
    precision = request.model_spec.precision
    mixed = precision is not Precision.FP32
    compute = 2.0 if mixed else 4.0  # fp16/bf16 compute copy, or fp32 throughout
    tp, dp, zero = shape.tensor_parallel, shape.data_parallel, shape.zero_stage
    psi = arch.parameters / tp  # Megatron splits every matrix (and the vocabulary) t ways
    optimizer_bytes = OPTIMIZER_BYTES[config.optimizer] + (MASTER_WEIGHT_BYTES if mixed else 0)

    if config.lora is not None:
        trainable, _ = lora_trainable_parameters(arch, config.lora.rank, config.lora.target_modules)
        trainable_per_gpu = trainable / tp
        base = NF4_DOUBLE_QUANT if config.lora.quantize_base else weight_bytes(request)
        weights = psi * base + trainable_per_gpu * compute
        kind = "QLoRA" if config.lora.quantize_base else "LoRA"
        parts.method.append(
            f"{kind} r={config.lora.rank} on {','.join(config.lora.target_modules)}: "
            f"{trainable / 1e6:.2f}M trainable of {arch.parameters / 1e9:.3g}B "
            f"(frozen base {base:.3g} B/param)"
        )
    else:
        trainable = arch.parameters
        trainable_per_gpu = psi
        weights = psi * compute
        states = compute * 2 + optimizer_bytes
        parts.method.append(
            f"{arch.parameters / 1e9:.3g}B params x {states:g} B ({config.optimizer}, "
            f"{precision}{', fp32 master' if mixed else ''})"
        )
    gradients = trainable_per_gpu * compute
    optimizer = trainable_per_gpu * optimizer_bytes
    # ZeRO (Rajbhandari et al. 2020, §5.1-5.3): partition over the N_d data-parallel ranks
    if zero >= 1:
        optimizer /= dp
    if zero >= 2:
        gradients /= dp
    if zero >= 3:
        weights /= dp
    if tp > 1 or dp > 1:
        parts.method.append(f"ZeRO-{zero}, data-parallel {dp}, tensor-parallel {tp}")

    activations, logits = _training_activations(arch, config, shape, compute)
    parts.breakdown = {
        "weights": weights,
        "gradients": gradients,
        "optimizer": optimizer,
        "activations": activations,
    }
    if logits:
        parts.breakdown["logits"] = logits
    parts.trainable = int(trainable)
    parts.method.append(
        f"micro-batch {config.batch_size}"
        + (f" x {shape.sequence_length} tokens" if arch.kind is not Kind.CONV else "")
        + (", gradient checkpointing" if config.gradient_checkpointing else "")
    )
    if arch.context and shape.sequence_length > arch.context:
        parts.notes.append(f"sequence beyond the model's {arch.context}-token context")
    return parts


def _training_activations(
    arch: Architecture, config: TrainingConfig, shape: _Shape, act_bytes: float
) -> tuple[float, float]:
    """Activations one GPU keeps for backward, and the logits with their fp32 loss copy."""
    b, s, t = config.batch_size, shape.sequence_length, shape.tensor_parallel
    scale = act_bytes / 2  # the published coefficients count 16-bit activations
    if arch.kind is Kind.CONV:
        per_sample = arch.activation_bytes_per_sample * act_bytes / arch.activation_dtype_bytes
        kept = per_sample * b
        if config.gradient_checkpointing:
            kept *= checkpoint_fraction(arch)
        return kept, 0.0
    h, a, f = arch.hidden, arch.heads, arch.ffn
    # Korthikanti et al. 2022, §4.1, per layer at 16 bits:
    #   attention 11·sbh + 5·a·s²·b (QKV input, Q and K, softmax and its dropout, V, output
    #   projection input and dropout mask); MLP 19·sbh for a 4h GeLU MLP, i.e. 3·sbh + 4·sbf
    #   in general, and 3·sbh + 8·sbf for SwiGLU (gate, up, SiLU and product, each 2·sbf);
    #   two layer norms 4·sbh. Flash attention keeps no s² scores (the 5·a·s²·b term).
    attention = 11 * s * b * h + (0 if config.flash_attention else 5 * a * s * s * b)
    mlp = 3 * s * b * h + (8 if arch.mlp is Mlp.SWIGLU else 4) * s * b * f
    norms = 4 * s * b * h
    per_layer = (attention + mlp + norms) * scale / t  # sequence parallel: all of it over t
    if config.gradient_checkpointing:
        # full recomputation keeps each layer's 16-bit input (2·sbh), plus one layer's full
        # activations while it is recomputed in backward (Korthikanti et al. 2022, §3)
        kept = arch.layers * 2 * s * b * h * scale / t + per_layer
    else:
        kept = arch.layers * per_layer
    # the output layer: logits in the compute dtype plus the fp32 copy cross-entropy takes
    # (vocabulary-parallel over t); an encoder's MLM head is the same shape
    logits = s * b * arch.vocab * (act_bytes + 4) / t
    return kept, logits


def _inference_memory(request: TaskRequest, arch: Architecture, config: InferenceConfig) -> _Parts:
    parts = _Parts()
    tp = config.tensor_parallel
    w = weight_bytes(request)
    weights = arch.parameters * w / tp
    b = config.batch_size
    compute = 4.0 if request.model_spec.precision is Precision.FP32 else 2.0
    parts.method.append(f"{arch.parameters / 1e9:.3g}B params x {w:.3g} B / tp {tp}")
    kv = 0.0
    workspace: float
    if arch.kind is Kind.CONV:
        per_sample = arch.activation_bytes_per_sample * compute / arch.activation_dtype_bytes
        # forward only: two consecutive layers' outputs are alive at once
        workspace = per_sample * b * 2 / max(arch.layers, 1)
        parts.method.append(f"batch {b}")
    else:
        context = config.context_length or arch.context
        kv_bytes = compute if config.kv_cache_dtype == "auto" else KV_BYTES[config.kv_cache_dtype]
        if arch.kind is Kind.ENCODER:
            parts.method.append(f"batch {b} x {context} tokens, no KV cache (encoder)")
        else:
            # KV cache = 2 · layers · kv_heads · head_dim · sequence · batch · bytes; the
            # key/value heads split over tp (replicated when tp exceeds them)
            kv_heads = math.ceil(arch.kv_heads / tp)
            kv = 2 * arch.layers * kv_heads * arch.head_dim * context * b * kv_bytes
            parts.method.append(
                f"KV cache 2 x {arch.layers} layers x {kv_heads} kv heads x {arch.head_dim} "
                f"x {context} tokens x batch {b} x {kv_bytes:g} B"
            )
        # prefill in chunks of at most 8192 tokens (vLLM's chunked prefill): the widest
        # intermediate (hidden, K/V and the MLP) per token, plus the fp32 logits of the last
        # token of each sequence
        tokens = min(b * context, 8192)
        widths = 2 * arch.hidden + 2 * arch.kv_dim + 2 * arch.ffn
        workspace = tokens * widths * compute / tp + b * arch.vocab * 4
    parts.breakdown = {"weights": weights, "kv_cache": kv, "workspace": workspace}
    return parts


# --- timeline, IO and the DataLoader -------------------------------------------------------


def peak_flops(gpu_type: str | None) -> float:
    name = (gpu_type or DEFAULT_GPU).upper().replace(" ", "")
    for model in sorted(GPU_PEAK_FLOPS, key=len, reverse=True):
        if model in name:
            return GPU_PEAK_FLOPS[model]
    return GPU_PEAK_FLOPS[DEFAULT_GPU]


def _step_seconds(
    request: TaskRequest, arch: Architecture, config: TrainingConfig, shape: _Shape, a: Assumptions
) -> float:
    """FLOPs of one optimizer step on one GPU over its achievable rate.

    Transformers: 2·P FLOPs per token forward, 4·P backward (Kaplan et al. 2020), 2·P more
    when checkpointing recomputes the forward; LoRA skips the weight gradients (≈ 2·P).
    """
    b, s = config.batch_size, shape.sequence_length
    if arch.kind is Kind.CONV:
        forward = arch.forward_flops_per_sample * b
    else:
        forward = 2 * arch.parameters / shape.tensor_parallel * b * s
    backward = forward if config.lora is not None else 2 * forward
    recompute = forward if config.gradient_checkpointing else 0
    rate = peak_flops(request.resource_requirements.gpu.type) * a.model_flops_utilisation
    if request.model_spec.precision is Precision.FP32:
        rate /= 2  # TF32 tensor cores: half the 16-bit rate
    return (forward + backward + recompute) / rate


def sample_bytes(arch: Architecture, config: TrainingConfig, shape: _Shape) -> int:
    """Bytes read from disk per sample: given, the catalog's, or 4 per token (tokenized
    int32 ids, about the size of the UTF-8 text at 4 characters per token)."""
    if config.sample_bytes:
        return config.sample_bytes
    if arch.sample_bytes:
        return arch.sample_bytes
    return 4 * shape.sequence_length


def _timeline(
    request: TaskRequest,
    arch: Architecture,
    config: TrainingConfig,
    shape: _Shape,
    breakdown: dict[str, int],
    a: Assumptions,
) -> TrainingTimeline:
    step = _step_seconds(request, arch, config, shape, a)
    weights, gradients = breakdown.get("weights", 0), breakdown.get("gradients", 0)
    optimizer = breakdown.get("optimizer", 0)
    activations = breakdown.get("activations", 0) + breakdown.get("logits", 0)
    fixed = breakdown.get("cuda_context", 0) + breakdown.get("allocator_overhead", 0)
    # Gradient buffers live for the whole run (DDP buckets, DeepSpeed's partitioned buffers);
    # Adam allocates its states lazily at the first step, so step 0 starts without them.
    points: list[TimelinePoint] = []
    forward, backward = step / 3, step * 0.62  # backward ≈ 2x forward; the rest optimizer

    def point(k: int, phase: str, at: float, mb: float) -> None:
        points.append(
            TimelinePoint(step=k, phase=phase, seconds=round(at, 6), gpu_memory_mb=round(mb))
        )

    for k in range(a.timeline_steps):
        t0 = k * step
        states = fixed + weights + gradients + (optimizer if k else 0)
        point(k, "start", t0, states)
        point(k, "forward", t0 + forward / 2, states + activations / 2)
        point(k, "forward", t0 + forward, states + activations)  # the peak: backward begins
        point(k, "backward", t0 + forward + backward / 2, states + activations / 2)
        point(k, "backward", t0 + forward + backward, states)
        point(k, "optimizer", t0 + step, fixed + weights + gradients + optimizer)

    # checkpoint: what a resume needs (weights or master weights, optimizer states), the
    # node's share when ZeRO/tensor parallelism shards it, written at the disk's rate
    mixed = request.model_spec.precision is not Precision.FP32
    trainable = (
        lora_trainable_parameters(arch, config.lora.rank, config.lora.target_modules)[0]
        if config.lora is not None
        else arch.parameters
    )
    state_bytes = trainable * (OPTIMIZER_BYTES[config.optimizer] + 4)
    weight_part = 0 if config.lora is not None else arch.parameters * (2 if mixed else 0)
    share = 1 / shape.nodes
    node_bytes = state_bytes * (share if shape.zero_stage >= 1 else 1) + weight_part * (
        share if shape.zero_stage >= 3 else 1
    )
    size_mb = _mb(node_bytes)
    write_seconds = node_bytes / MB / a.checkpoint_write_mb_per_s
    end = a.timeline_steps * step
    point(a.timeline_steps, "checkpoint", end, fixed + weights + gradients + optimizer)
    point(
        a.timeline_steps, "checkpoint", end + write_seconds, fixed + weights + gradients + optimizer
    )

    samples = shape.ranks_per_node * config.batch_size / step if step else 0.0
    per_sample = sample_bytes(arch, config, shape)
    if request.data_config.io_pattern is not IoPattern.SEQUENTIAL:
        per_sample = max(per_sample, PAGE)  # a random read costs at least a page
    return TrainingTimeline(
        step_seconds=step,
        samples_per_second=samples,
        dataset_read_mb_per_s=samples * per_sample / MB,
        checkpoint_size_mb=size_mb,
        checkpoint_write_mb_per_s=a.checkpoint_write_mb_per_s,
        checkpoint_seconds=write_seconds,
        checkpoint_interval_steps=config.checkpoint_interval_steps,
        points=points,
    )


def cpu_seconds_per_sample(arch: Architecture, shape: _Shape) -> float:
    if arch.cpu_seconds_per_sample:
        return arch.cpu_seconds_per_sample
    return 2e-4 * shape.sequence_length / 1024  # collate and pad pre-tokenized text


def _loader_for_training(
    request: TaskRequest,
    arch: Architecture,
    config: TrainingConfig,
    shape: _Shape,
    timeline: TrainingTimeline,
) -> tuple[int, int]:
    """Workers per GPU process enough to decode `batch/step` samples per second with half
    again in reserve, within the cores the task holds (one kept for each main process);
    prefetch enough batches to ride out a disk stall typical of the IO pattern."""
    cores = request.resource_requirements.cpu.cores or 1
    per_process = workers_per_process(cores, shape.gpus_per_node)
    step = max(timeline.step_seconds, 1e-6)
    needed = math.ceil(config.batch_size / step * cpu_seconds_per_sample(arch, shape) * 1.5)
    workers = min(max(needed, 1), per_process, 16)
    if workers == 0:
        return 0, 1
    stall = STALL_COVER_SECONDS[request.data_config.io_pattern]
    prefetch = min(max(math.ceil(stall / step / workers), 2), 8)
    return workers, prefetch


def _host_memory_mb(
    request: TaskRequest,
    arch: Architecture,
    parts: _Parts,
    timeline: TrainingTimeline | None,
    workers: int,
    prefetch: int,
) -> int:
    """Per node: one page-cached copy of the weights file, each GPU process and its workers,
    pinned prefetch buffers, and one rank's checkpoint shard staged in memory."""
    processes = max(request.resource_requirements.gpu.count, 1)
    weights_file = arch.parameters * weight_bytes(request)
    host = weights_file / MIB + processes * (PROCESS_HOST_MB + workers * WORKER_HOST_MB)
    if timeline is not None:
        config = request.training_config or TrainingConfig()
        sequence = config.sequence_length or min(arch.context or 1, 2048)
        # a decoded sample: a float32 image tensor, or int64 token ids and attention mask
        decoded = 3 * 224 * 224 * 4 if arch.kind is Kind.CONV else 16 * sequence
        batch_bytes = config.batch_size * decoded
        host += processes * workers * prefetch * batch_bytes / MIB
        host += timeline.checkpoint_size_mb / processes  # one rank's share in flight at once
    return math.ceil(host)


def _mb(n_bytes: float) -> int:
    return math.ceil(n_bytes / MIB)


__all__ = [
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
