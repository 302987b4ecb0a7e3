"""Refusals: a request whose layout, precision or adapters make no sense for the model."""

from __future__ import annotations

from dataclasses import dataclass

from crater.contracts import FieldError, Precision, TaskRequest
from crater.contracts.tasks import InferenceConfig, TrainingConfig
from crater.predictor.domain.assumptions import Assumptions
from crater.predictor.domain.catalog import Architecture, Kind, lora_trainable_parameters


class Refused(Exception):
    """The request cannot be profiled: each error names the field and the reason."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(f"{e.field}: {e.reason}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class _Shape:
    """How the training job is laid out."""

    gpus_per_node: int
    nodes: int
    tensor_parallel: int
    data_parallel: int
    zero_stage: int
    sequence_length: int
    pipeline_parallel: int = 1

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
    pp = config.pipeline_parallel
    if pp > 1 and arch.kind is not Kind.CONV and pp > arch.layers + arch.encoder_layers:
        errors.append(
            FieldError(
                field="training_config.pipeline_parallel",
                reason=f"{pp} stages for {arch.key}'s {arch.layers} layers",
            )
        )
    if tp * pp > total and len(errors) == before_tp:
        errors.append(
            FieldError(
                field="training_config.pipeline_parallel",
                reason=f"tensor_parallel {tp} x pipeline_parallel {pp} = {tp * pp} GPUs, but "
                f"the task holds {total}",
            )
        )
    dp = config.data_parallel or max(total // (tp * pp), 1)
    if dp * tp * pp > total and len(errors) == before_tp:  # a bad tp says it already
        errors.append(
            FieldError(
                field="training_config.data_parallel",
                reason=f"{dp} x tensor_parallel {tp} x pipeline_parallel {pp} = "
                f"{dp * tp * pp} GPUs, but the task holds "
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
        elif config.lora.quantize_base and request.model_spec.quantization:
            errors.append(
                FieldError(
                    field="training_config.lora.quantize_base",
                    reason="the base is quantized as model_config.quantization says "
                    f"({request.model_spec.quantization}); quantize_base asks for NF4 too",
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
    zero = config.zero_stage if config.zero_stage is not None else (3 if dp > 1 else 0)
    if config.offload_parameters and zero < 3:
        errors.append(
            FieldError(
                field="training_config.offload_parameters",
                reason=f"parameters are offloaded when sharded: zero_stage 3 (ZeRO-3 "
                f"offload_param, FSDP FULL_SHARD with CPUOffload), not {zero}",
            )
        )
    if errors:
        raise Refused(errors)
    return _Shape(gpus, request.gang_size, tp, dp, zero, sequence, pp)


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
