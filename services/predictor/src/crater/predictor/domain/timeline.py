"""A training task's step timeline: step time, memory over a step, checkpoint and dataset IO.

Source: training FLOPs are 6 per parameter per token, 8 with full recomputation (Kaplan et
al. 2020; Narayanan et al. 2021); step time at a model FLOPs utilisation (Chowdhery et al.
2022).
"""

from __future__ import annotations

import math

from crater.contracts import IoPattern, Precision, TaskRequest
from crater.contracts.tasks import (
    CheckpointPolicy,
    TimelinePoint,
    TrainingConfig,
    TrainingTimeline,
)
from crater.predictor.domain.assumptions import Assumptions
from crater.predictor.domain.catalog import Architecture, Kind, lora_trainable_parameters
from crater.predictor.domain.memory import _mb
from crater.predictor.domain.training_memory import optimizer_bytes
from crater.predictor.domain.validation import _Shape

MB = 1_000_000  # disk and network rates are quoted in decimal megabytes
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
PAGE = 4096


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
        forward = 2 * arch.active_parameters / shape.tensor_parallel * b * s
    backward = forward if config.lora is not None else 2 * forward
    recompute = _recompute_flops(arch, config, shape, forward)
    rate = peak_flops(request.resource_requirements.gpu.type) * a.model_flops_utilisation
    if request.model_spec.precision is Precision.FP32:
        rate /= 2  # TF32 tensor cores: half the 16-bit rate
    return (forward + backward + recompute) / rate


def _recompute_flops(
    arch: Architecture, config: TrainingConfig, shape: _Shape, forward: float
) -> float:
    """FLOPs backward spends recomputing what checkpointing dropped."""
    policy = config.recompute
    if policy in (CheckpointPolicy.FULL, CheckpointPolicy.OFFLOADED):
        return forward  # every block's forward again (offloading moves memory, not FLOPs)
    if policy is CheckpointPolicy.SELECTIVE_OP:
        # every other matmul and the elementwise ops again: about half the forward
        return forward / 2
    if policy is CheckpointPolicy.EVERY_K:
        layers = max(arch.layers + arch.encoder_layers, 1)
        return forward * math.ceil(layers / config.checkpoint_every) / layers
    if policy is CheckpointPolicy.SELECTIVE and arch.kind is not Kind.CONV:
        # only the attention core: Q·K^T and the scores times V, 2·2·s²·q per sample and
        # layer (Korthikanti et al. 2022 §4.2: a few percent of the step). Flash attention
        # recomputes its scores in backward anyway, so selective adds nothing to it.
        if config.flash_attention:
            return 0.0
        s = shape.sequence_length
        return 4 * config.batch_size * s * s * arch.q_dim * arch.layers / shape.tensor_parallel
    return 0.0


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
    fixed += breakdown.get("gathered_parameters", 0) + breakdown.get("unsharded_model", 0)
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
    state_bytes = trainable * (optimizer_bytes(config, 4.0) + 4)
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
