"""Peak memory per GPU of a training step: model states, ZeRO, LoRA/QLoRA and activations.

Sources:
- Model states under mixed precision and their ZeRO partitioning: Rajbhandari et al. 2020,
  "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §3.1 and §5: with
  Ψ parameters, fp16 weights 2Ψ + fp16 gradients 2Ψ + K·Ψ optimizer states, K = 12 for Adam
  (fp32 master weights, momentum and variance), so 16Ψ bytes; stage 1 divides the optimizer
  states by the data-parallel degree N_d, stage 2 also the gradients, stage 3 also the weights.
- Activations of a transformer layer: Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 1: s·b·h·(34 + 5·a·s/h) bytes with 16-bit
  activations; divided by t under tensor and sequence parallelism (§4.2.2).
- LoRA: Hu et al. 2021; QLoRA's 4-bit NormalFloat with double quantization: Dettmers et al.
  2023 (about 0.127 bits per parameter of quantization constants).
- 8-bit Adam: Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization" (2 bytes
  of state per parameter instead of 8).
"""

from __future__ import annotations

from crater.contracts import Precision, TaskRequest
from crater.contracts.tasks import Optimizer, TrainingConfig
from crater.predictor.domain.catalog import (
    Architecture,
    Kind,
    Mlp,
    checkpoint_fraction,
    lora_trainable_parameters,
)
from crater.predictor.domain.memory import _Parts, weight_bytes
from crater.predictor.domain.validation import _Shape

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
    h, q, kv = arch.hidden, arch.q_dim, arch.kv_dim
    # Korthikanti et al. 2022, §4.1, per layer at 16 bits, written for any attention width:
    #   attention: its input 2·sbh, Q and K 2·sb(q + kv), V 2·sb·kv, the output projection's
    #   input 2·sb·q, a dropout mask sbh, and without flash attention the scores, their
    #   softmax and dropout 5·a·s²·b (with q = kv = h this is their 11·sbh + 5·a·s²·b);
    #   the MLP: 3·sbh + 4·sbf for a two-matrix GeLU MLP (19·sbh at f = 4h), 3·sbh + 8·sbf for
    #   a gated one (gate, up, activation and product, each 2·sbf); two norms 4·sbh.
    #   An MoE layer keeps its routed experts' and shared experts' MLP activations per token.
    attention = s * b * (3 * h + 4 * q + 4 * kv)
    if not config.flash_attention:
        attention += 5 * arch.heads * s * s * b
    gated = 8 if arch.mlp is Mlp.SWIGLU else 4

    def mlp(width: int) -> float:
        return 3 * s * b * h + gated * s * b * width

    norms = 4 * s * b * h
    layer = attention + norms
    per_layer = [layer + mlp(arch.ffn)] * (arch.layers - arch.moe_layers)
    per_layer += [layer + mlp(arch.active_ffn)] * arch.moe_layers
    if arch.kind is Kind.ENCODER_DECODER:
        # the encoder's layers, and the decoder's cross-attention over the encoder's output
        per_layer += [layer + mlp(arch.ffn)] * arch.encoder_layers
        per_layer = [x + attention + 2 * s * b * h for x in per_layer[: arch.layers]] + per_layer[
            arch.layers :
        ]
    per_layer = [x * scale / t for x in per_layer]  # sequence parallel: all of it over t
    if config.gradient_checkpointing:
        # full recomputation keeps each layer's 16-bit input (2·sbh), plus one layer's full
        # activations while it is recomputed in backward (Korthikanti et al. 2022, §3)
        kept = len(per_layer) * 2 * s * b * h * scale / t + max(per_layer, default=0)
    else:
        kept = sum(per_layer)
    # the output layer: logits in the compute dtype plus the fp32 copy cross-entropy takes
    # (vocabulary-parallel over t); an encoder's MLM head is the same shape
    logits = s * b * arch.vocab * (act_bytes + 4) / t
    return kept, logits
