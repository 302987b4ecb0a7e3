"""Peak memory per GPU of a training step: model states, their sharding and offload, LoRA and
QLoRA, activations and the logits.

Sources:
- Model states under mixed precision: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
  Toward Training Trillion Parameter Models", §3.1 and §5: with Ψ parameters, 16-bit weights
  2Ψ + 16-bit gradients 2Ψ + K·Ψ optimizer states, K = 12 for Adam (fp32 master weights,
  momentum and variance). Pure 16-bit training (no master; PyTorch's optimizers keep their
  states in the parameters' dtype) holds 2Ψ + 2Ψ + 4Ψ.
- DeepSpeed's own estimators (deepspeed/runtime/zero/stage_1_and_2.py
  estimate_zero2_model_states_mem_needs, stage3.py estimate_zero3_model_states_mem_needs):
  stages 1-2: 4Ψ + 16Ψ/N on the GPU (16-bit weights and gradients whole; fp32 master,
  momentum, variance and the fp32 gradient partition sharded), 2Ψ with the optimizer offloaded
  and Ψ·max(4N, 16)·1.5 on the host; stage 3: 4·largest_layer + 18Ψ/N, 4·largest_layer +
  2Ψ/N with the optimizer offloaded (16Ψ·1.5 on the host), 4·largest_layer with the
  parameters too (18Ψ·1.5 on the host).
- PyTorch FSDP (Zhao et al. 2023): FULL_SHARD shards weights, gradients and states over N and
  gathers one wrapped unit (a transformer block) at a time, the next prefetched: 2 units in
  16 bits, and one unit's unsharded gradient.
- Activations of a transformer layer: Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 1: s·b·h·(34 + 5·a·s/h) bytes with 16-bit
  activations; divided by t under tensor and sequence parallelism (§4.2.2); full
  recomputation keeps each layer's input (§3).
- LoRA: Hu et al. 2021; QLoRA: Dettmers et al. 2023; 8-bit optimizers: Dettmers et al. 2022,
  "8-bit Optimizers via Block-wise Quantization" (2 bytes of state per parameter instead of 8);
  Adafactor: Shazeer & Stern 2018 (a factored second moment: row and column sums).
- The loss: cross-entropy over the vocabulary in one piece (Transformers upcasts the logits for
  the loss) holds at its peak the 16-bit logits and, in fp32, the saved log-probabilities,
  their gradient and log_softmax backward's result, less what is freed by then: 2 + 10 bytes
  per logit (2 + 14 before Transformers 4.46, which copied the shifted logits); chunked
  (torchtune's CEWithChunkedOutputLoss, LitGPT) keeps the 16-bit logits and one chunk in fp32;
  fused (Liger, Cut Cross-Entropy, Wijmans et al. 2024) one chunk.
"""

from __future__ import annotations

from crater.contracts import Precision, TaskRequest
from crater.contracts.tasks import (
    CheckpointPolicy,
    CrossEntropy,
    Optimizer,
    Sharding,
    TrainingConfig,
)
from crater.predictor.domain.catalog import (
    Architecture,
    Kind,
    Mlp,
    checkpoint_fraction,
    lora_input_width,
    lora_trainable_parameters,
)
from crater.predictor.domain.memory import (
    NF4_DOUBLE_QUANT,
    _Parts,
    compute_bytes,
    quantization_scheme,
)
from crater.predictor.domain.validation import _Shape

MASTER_WEIGHT_BYTES = 4.0  # fp32 copy kept by mixed-precision training
FP32_GRADIENT_BYTES = 4.0  # DeepSpeed's fp32 gradient partition (stages 1-3)
ZERO_HOST_BUFFER = 1.5  # DeepSpeed's additional_buffer_factor for host memory
FSDP_UNITS_GATHERED = 2  # the unit computing and the next one prefetched
CHUNK_TOKENS = 1024  # a chunked or fused loss: tokens whose fp32 logits exist at once
# fp32 bytes per logit at the loss's peak, besides the 16-bit logits: the saved
# log-probabilities, their gradient and log_softmax backward's result (4 B each), less what is
# freed by then. Transformers since 4.46 shift the labels, not the logits, so no fp32 copy of
# shifted logits is made (14 B before); 10 B matches peaks measured on an H200 with
# Transformers 5.17 (benchmarks/predictor/measure_on_gpu.py) and the published set as a whole.
LOSS_FP32_BYTES = 10
ADAFACTOR_BYTES = 0.05  # factored second moment: O(rows + columns) per matrix, ~0 per weight
# Optimizer state values per trainable parameter, and whether they are 8-bit.
STATES = {
    Optimizer.ADAM: (2, False),
    Optimizer.ADAMW: (2, False),
    Optimizer.SGD: (1, False),
    Optimizer.SGD_PLAIN: (0, False),
    Optimizer.LION: (1, False),
    Optimizer.ADAFACTOR: (0, False),
    Optimizer.ADAM_8BIT: (2, True),
    Optimizer.ADAMW_8BIT: (2, True),
    Optimizer.PAGED_ADAMW: (2, False),
    Optimizer.PAGED_ADAMW_8BIT: (2, True),
}
PAGED = frozenset({Optimizer.PAGED_ADAMW, Optimizer.PAGED_ADAMW_8BIT})


def uses_master_weights(request: TaskRequest, config: TrainingConfig) -> bool:
    if request.model_spec.precision is Precision.FP32:
        return False
    return True if config.master_weights is None else config.master_weights


def optimizer_bytes(config: TrainingConfig, state_dtype_bytes: float) -> float:
    """Optimizer state bytes per trainable parameter, without a master copy."""
    states, eight_bit = STATES[config.optimizer]
    if config.optimizer is Optimizer.ADAFACTOR:
        return ADAFACTOR_BYTES
    return states * (1.0 if eight_bit else state_dtype_bytes)


def _training_memory(
    request: TaskRequest, arch: Architecture, config: TrainingConfig, shape: _Shape
) -> _Parts:
    parts = _Parts()
    precision = request.model_spec.precision
    compute = compute_bytes(request)
    master = uses_master_weights(request, config)
    state_dtype = 4.0 if master or compute == 4.0 else compute
    tp, pp = shape.tensor_parallel, shape.pipeline_parallel
    dp, zero = shape.data_parallel, shape.zero_stage
    split = tp * pp  # Megatron splits every matrix t ways, a pipeline the layers p ways
    psi = arch.parameters / split
    embeddings = arch.embedding_parameters / split
    scheme = quantization_scheme(request)
    if config.lora is not None and config.lora.quantize_base and scheme is None:
        scheme = NF4_DOUBLE_QUANT

    # Weights on each GPU: quantized blocks with 16-bit embeddings and head, or 16/32-bit.
    if scheme is not None:
        frozen = (psi - embeddings) * scheme.bits / 8 + embeddings * compute
        base = f"{scheme.name} ({scheme.bits:.3g} bits), embeddings and head in 16 bits"
    else:
        frozen = psi * compute
        base = f"{precision} ({compute:g} B/param)"
    if config.lora is not None:
        adapters, _ = lora_trainable_parameters(arch, config.lora.rank, config.lora.target_modules)
        trainable = adapters
        if config.lora.train_embeddings:
            trainable += arch.embedding_parameters
        trainable_per_gpu = trainable / split
        weights = frozen + trainable_per_gpu * compute
        kind = "QLoRA" if scheme is not None else "LoRA"
        parts.method.append(
            f"{kind} r={config.lora.rank} on {','.join(config.lora.target_modules)}"
            + (" with embedding and head trained" if config.lora.train_embeddings else "")
            + f": {trainable / 1e6:.2f}M trainable of {arch.parameters / 1e9:.3g}B, frozen "
            f"base {base}"
        )
    else:
        trainable = arch.parameters
        trainable_per_gpu = psi
        weights = psi * compute
    states_per_param = optimizer_bytes(config, state_dtype)
    master_bytes = MASTER_WEIGHT_BYTES if master else 0.0
    gradients = trainable_per_gpu * compute
    if config.optimizer_in_backward:
        # each parameter is stepped as its gradient arrives: one gradient at a time
        gradients = min(gradients, arch.largest_layer_parameters / split * compute)
    optimizer = trainable_per_gpu * (states_per_param + master_bytes)
    gathered = 0.0
    host: dict[str, float] = {}
    deepspeed = config.sharding is Sharding.DEEPSPEED and zero >= 1
    if deepspeed and compute < 4:
        optimizer += trainable_per_gpu * FP32_GRADIENT_BYTES  # the fp32 gradient partition

    # Sharding over the N data-parallel ranks (ZeRO, FSDP)
    if zero >= 1:
        optimizer /= dp
    if zero >= 2 and not deepspeed:
        gradients /= dp  # DeepSpeed's estimator keeps the 16-bit gradients whole (4Ψ)
    if zero >= 3:
        weights /= dp
        if deepspeed:
            gathered = 4 * arch.largest_layer_parameters / split  # DeepSpeed: 4x largest layer
            gradients = 0.0  # reduce-scattered into the fp32 partition (18Ψ/N in all)
        else:
            unit = arch.block_parameters() / split
            gathered = (FSDP_UNITS_GATHERED * unit + (unit if config.lora is None else 0)) * (
                compute
            )

    # The whole model kept on every rank beside its shard (built on the GPU before wrapping)
    unsharded = frozen + trainable / split * compute if config.lora is not None else psi * compute
    unsharded = unsharded if config.full_model_per_rank and zero >= 3 and dp > 1 else 0.0

    # Offload: states (and master, fp32 gradients) to host; parameters too at stage 3
    if config.offload_optimizer:
        host["offloaded optimizer"] = (
            optimizer * (ZERO_HOST_BUFFER if deepspeed else 1.0) * shape.ranks_per_node
        )
        optimizer = 0.0
        if deepspeed and zero <= 2:
            gradients = 0.0  # reduced straight to the host partition
    if config.optimizer in PAGED:
        # bitsandbytes paged states live in CUDA managed memory: evicted to the host when
        # the card is full, and not counted by PyTorch's allocator
        host["paged optimizer"] = optimizer * shape.ranks_per_node
        optimizer = 0.0
    if config.offload_parameters:
        host["offloaded parameters"] = weights * shape.ranks_per_node
        weights = 0.0
        if not gathered:
            gathered = 4 * arch.largest_layer_parameters / split

    if config.lora is None:
        states = compute * 2 + states_per_param + master_bytes
        parts.method.append(
            f"{arch.parameters / 1e9:.3g}B params x {states:g} B ({config.optimizer}, "
            f"{precision}{', fp32 master' if master else ', no master copy'})"
        )
    if config.optimizer_in_backward:
        parts.method.append("optimizer stepped in backward: one gradient at a time")
    if tp > 1 or dp > 1 or pp > 1 or zero:
        framework = "DeepSpeed ZeRO" if config.sharding is Sharding.DEEPSPEED else "FSDP stage "
        parts.method.append(
            f"{framework}-{zero}".replace(" -", " ")
            + f", data-parallel {dp}, tensor-parallel {tp}"
            + (f", pipeline {pp}" if pp > 1 else "")
        )
    for what in host:
        parts.method.append(f"{what} in host memory")

    activations, logits, checkpoints_on_host = _training_activations(arch, config, shape, compute)
    if checkpoints_on_host:
        host["offloaded checkpoints"] = checkpoints_on_host * shape.ranks_per_node
    elif config.offload_activations:
        host["offloaded activations"] = activations * shape.ranks_per_node
        layers = max(arch.layers + arch.encoder_layers, 1)
        activations = activations * min(1.0, 2 / layers)  # the layer computing, one in flight
    if scheme is not None and scheme.dequantizes:
        # bitsandbytes dequantizes a 4-bit matrix to 16 bits for each matmul
        activations += arch.largest_layer_parameters / split * compute * 0.5
    parts.breakdown = {
        "weights": weights,
        "gradients": gradients,
        "optimizer": optimizer,
        "activations": activations,
    }
    if gathered:
        parts.breakdown["gathered_parameters"] = gathered
    if unsharded:
        parts.breakdown["unsharded_model"] = unsharded
        parts.method.append("the whole model kept on every rank beside its shard")
    if logits:
        parts.breakdown["logits"] = logits
    parts.host = host
    parts.trainable = int(trainable)
    parts.method.append(
        f"micro-batch {config.batch_size}"
        + (f" x {shape.sequence_length} tokens" if arch.kind is not Kind.CONV else "")
        + _checkpointing_label(config)
        + (", activations offloaded" if config.offload_activations else "")
        + (f", {config.cross_entropy.value} cross-entropy" if logits else "")
    )
    if config.torch_compile:
        parts.notes.append("torch.compile: activations counted as eager (no published saving)")
    if arch.context and shape.sequence_length > arch.context:
        parts.notes.append(f"sequence beyond the model's {arch.context}-token context")
    return parts


def _checkpointing_label(config: TrainingConfig) -> str:
    policy = config.recompute
    if policy is CheckpointPolicy.NONE:
        return ""
    if policy is CheckpointPolicy.EVERY_K:
        return f", checkpointing every {config.checkpoint_every} blocks (every-k policy)"
    return f", {policy.value} gradient checkpointing"


def _training_activations(
    arch: Architecture, config: TrainingConfig, shape: _Shape, act_bytes: float
) -> tuple[float, float, float]:
    """Activations one GPU keeps for backward, the logits with their fp32 loss copies, and
    the checkpoints an offloading policy keeps in host memory instead."""
    b, s, t = config.batch_size, shape.sequence_length, shape.tensor_parallel
    scale = act_bytes / 2  # the published coefficients count 16-bit activations
    policy = config.recompute
    if arch.kind is Kind.CONV:
        per_sample = arch.activation_bytes_per_sample * act_bytes / arch.activation_dtype_bytes
        kept = per_sample * b
        # no attention core: selective recomputation keeps everything; the others as full
        if policy is CheckpointPolicy.EVERY_K:
            share = 1 / config.checkpoint_every
            kept *= share * checkpoint_fraction(arch) + 1 - share
        elif policy in (CheckpointPolicy.FULL, CheckpointPolicy.OFFLOADED):
            kept *= checkpoint_fraction(arch)
        return kept, 0.0, 0.0
    h, q, kv = arch.hidden, arch.q_dim, arch.kv_dim
    # Korthikanti et al. 2022, §4.1, per layer at 16 bits, written for any attention width:
    #   attention: its input 2·sbh, Q and K 2·sb(q + kv), V 2·sb·kv, the output projection's
    #   input 2·sb·q, a dropout mask sbh, and without flash attention the scores, their
    #   softmax and dropout 5·a·s²·b (with q = kv = h this is their 11·sbh + 5·a·s²·b);
    #   the MLP: 3·sbh + 4·sbf for a two-matrix GeLU MLP (19·sbh at f = 4h), 3·sbh + 8·sbf for
    #   a gated one (gate, up, activation and product, each 2·sbf); two norms 4·sbh.
    #   An MoE layer keeps its routed experts' and shared experts' MLP activations per token.
    attention: float = s * b * (3 * h + 4 * q + 4 * kv)
    core = 0.0 if config.flash_attention else 5 * arch.heads * s * s * b
    attention += core
    gated = 8 if arch.mlp is Mlp.SWIGLU else 4

    def mlp(width: int) -> float:
        return 3 * s * b * h + gated * s * b * width

    norms = 4 * s * b * h
    layer = attention + norms
    per_layer = [layer + mlp(arch.ffn)] * (arch.layers - arch.moe_layers)
    per_layer += [layer + mlp(arch.active_ffn)] * arch.moe_layers
    if arch.kind is Kind.ENCODER_DECODER:
        # the decoder's cross-attention over the encoder's output, and the encoder's layers
        cross = attention + 2 * s * b * h
        per_layer = [x + cross for x in per_layer] + [layer + mlp(arch.ffn)] * arch.encoder_layers
    pp = shape.pipeline_parallel
    per_layer = [x * scale / t for x in per_layer]  # sequence parallel: all of it over t
    stage = per_layer[: max(1, len(per_layer) // pp)] if pp > 1 else per_layer
    lora = config.lora
    if lora is not None and lora.dropout > 0:
        # LoRA's dropout copies each adapted module's input and keeps a bool mask (1 B)
        width = lora_input_width(arch, lora.target_modules) / max(len(per_layer), 1)
        per_layer = [x + s * b * width * (act_bytes + 1) / t for x in per_layer]
        stage = per_layer[: max(1, len(per_layer) // pp)] if pp > 1 else per_layer
    checkpoint = 2 * s * b * h * scale / t  # one block's 16-bit input
    on_host = 0.0
    if policy is CheckpointPolicy.FULL:
        # full recomputation keeps each layer's 16-bit input (2·sbh), plus one layer's full
        # activations while it is recomputed in backward (Korthikanti et al. 2022, §3)
        kept = len(stage) * checkpoint + max(stage, default=0)
    elif policy is CheckpointPolicy.OFFLOADED:
        # Unsloth's offloaded checkpointing: as full, but each block input is copied to host
        # memory asynchronously (non_blocking) in forward and back in backward, so the GPU
        # holds about two inputs in flight plus the block being recomputed; the inputs
        # themselves take host memory (unsloth.ai/blog/long-context)
        kept = min(len(stage), 2) * checkpoint + max(stage, default=0)
        on_host = len(stage) * checkpoint
    elif policy is CheckpointPolicy.SELECTIVE:
        # Megatron-LM --recompute-granularity selective (Korthikanti et al. 2022, §4.2): only
        # the attention core (scores, softmax, dropout: 5·a·s²·b) is dropped and recomputed,
        # so each layer keeps 34·sbh; one layer's core exists again while it is recomputed.
        # With flash attention there is no such core to drop: the same as no checkpointing.
        dropped = core * scale / t
        kept = sum(stage) - len(stage) * dropped + (dropped if stage else 0.0)
    elif policy is CheckpointPolicy.SELECTIVE_OP:
        # torchtitan's op-level selective AC (activation_checkpoint mode selective, option
        # op): inside each block only the outputs of matmuls and of the attention kernel are
        # kept, and of the matmuls only every other one (the 1st, 3rd, ...; in execution
        # order Q, K, V, output, then gate, up, down), beside the block's input; norms and
        # elementwise products are recomputed. One block's full activations exist again
        # while it is recomputed in backward.
        def op_saved(width: int) -> float:
            mlp_out = [width, width, h] if arch.mlp is Mlp.SWIGLU else [width, h]
            matmuls = [q, kv, kv, h, *mlp_out]
            return 2 * s * b * (h + q + sum(matmuls[0::2])) * scale / t

        dense = [op_saved(arch.ffn)] * (arch.layers - arch.moe_layers)
        saved = dense + [op_saved(arch.active_ffn)] * arch.moe_layers
        saved += [op_saved(arch.ffn)] * arch.encoder_layers
        saved = saved[: len(stage)]
        kept = sum(saved) + max(stage, default=0)
    elif policy is CheckpointPolicy.EVERY_K:
        # torchtune's selective activation checkpointing, ac_option k: blocks 0, k, 2k, ...
        # wrapped in checkpoint (keep their input, recompute one at a time), the rest keep
        # their full activations
        k = config.checkpoint_every
        wrapped = [x for i, x in enumerate(stage) if i % k == 0]
        plain = [x for i, x in enumerate(stage) if i % k != 0]
        kept = sum(plain) + len(wrapped) * checkpoint + max(wrapped, default=0)
    else:
        kept = sum(stage)
    if config.task_head == "classification":
        return kept, 0.0, on_host
    # The output layer (vocabulary-parallel over t): the logits in the compute dtype, and
    # the loss's fp32 tensors (log-probabilities, their gradients) for every token at once, or
    # for one chunk of tokens. An encoder's MLM head is the same shape.
    tokens = s * b
    chunk = min(tokens, CHUNK_TOKENS)
    if config.cross_entropy is CrossEntropy.FULL:
        logits = tokens * arch.vocab * (act_bytes + LOSS_FP32_BYTES) / t
    elif config.cross_entropy is CrossEntropy.CHUNKED:
        logits = (tokens * act_bytes + chunk * LOSS_FP32_BYTES) * arch.vocab / t
    else:
        logits = chunk * arch.vocab * (act_bytes + LOSS_FP32_BYTES) / t
    return kept, logits, on_host
