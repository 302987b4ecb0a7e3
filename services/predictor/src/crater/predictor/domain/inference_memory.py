"""Peak memory per GPU of serving: the weights, the KV cache and the prefill workspace.

Source: KV cache = 2 (K and V) · layers · kv_heads · head_dim · sequence · batch · bytes per
value.
"""

from __future__ import annotations

import math

from crater.contracts import Precision, TaskRequest
from crater.contracts.tasks import InferenceConfig
from crater.predictor.domain.catalog import Architecture, Kind
from crater.predictor.domain.memory import _Parts, weight_bytes

KV_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


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
            # KV cache = 2 · layers · kv_heads · head_dim · sequence · batch · bytes (MLA: the
            # compressed latent and rotary key instead of K and V); the key/value heads split
            # over tp (replicated when tp exceeds them)
            width = arch.kv_cache_width
            if not arch.mla:
                width = 2 * math.ceil(arch.kv_heads / tp) * arch.head_dim
            layers = arch.layers * (2 if arch.kind is Kind.ENCODER_DECODER else 1)
            kv = layers * width * context * b * kv_bytes
            parts.method.append(
                f"KV cache {layers} layers x {width} values x {context} tokens x batch {b} "
                f"x {kv_bytes:g} B"
            )
        # prefill in chunks of at most 8192 tokens (vLLM's chunked prefill): the widest
        # intermediate (hidden, K/V and the MLP) per token, plus the fp32 logits of the last
        # token of each sequence
        tokens = min(b * context, 8192)
        ffn = arch.active_ffn if arch.moe else arch.ffn
        widths = 2 * arch.hidden + 2 * arch.kv_dim + 2 * ffn
        workspace = tokens * widths * compute / tp + b * arch.vocab * 4
    parts.breakdown = {"weights": weights, "kv_cache": kv, "workspace": workspace}
    return parts
