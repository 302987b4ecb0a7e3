"""Peak memory per GPU of serving: the weights, the KV cache and the prefill workspace; or, for
a paged engine (vLLM, SGLang, TGI), the share of the card it takes up front.

Sources: KV cache = 2 (K and V) · layers · kv_heads · head_dim · sequence · batch · bytes per
value (MLA caches its compressed latent and rotary key instead: DeepSeek-AI 2024, V2 §2.1);
vLLM preallocates gpu_memory_utilization of the card for weights, activations and KV blocks
(Kwon et al. 2023; vLLM's --gpu-memory-utilization, default 0.9). Quantized weights keep the
embeddings and LM head in 16 bits (memory.py).
"""

from __future__ import annotations

import math

from crater.contracts import TaskRequest
from crater.contracts.gpus import parse_gpu_product
from crater.contracts.tasks import InferenceConfig, InferenceEngine
from crater.predictor.domain.catalog import Architecture, Kind
from crater.predictor.domain.memory import MIB, _Parts, compute_bytes, quantization_scheme

KV_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
PAGED_DEFAULT_UTILIZATION = 0.9
PREFILL_CHUNK = 8192  # tokens a paged engine prefills at once (vLLM's chunked prefill)


def card_bytes(request: TaskRequest) -> float | None:
    """The memory of each card the task asks for, when the request says (memory_mb, or a
    product with its size)."""
    gpu = request.resource_requirements.gpu
    if gpu.memory_mb:
        return gpu.memory_mb * MIB
    product = parse_gpu_product(gpu.type) if gpu.type else None
    if product is not None and product.memory_gb:
        return product.memory_gb * 1024 * MIB
    return None


def _inference_memory(request: TaskRequest, arch: Architecture, config: InferenceConfig) -> _Parts:
    parts = _Parts()
    tp = config.tensor_parallel
    compute = compute_bytes(request)
    scheme = quantization_scheme(request)
    embeddings = arch.embedding_parameters
    if scheme is not None:
        weights = ((arch.parameters - embeddings) * scheme.bits / 8 + embeddings * compute) / tp
        parts.method.append(
            f"{arch.parameters / 1e9:.3g}B params, {scheme.name} ({scheme.bits:.3g} bits) with "
            f"embeddings and head in {compute:g} B / tp {tp}"
        )
    else:
        weights = arch.parameters * compute / tp
        parts.method.append(f"{arch.parameters / 1e9:.3g}B params x {compute:g} B / tp {tp}")
    b = config.batch_size
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
        # The prefill: a paged engine in chunks of 8192 tokens, generate() the whole prompt
        # at once; per token the widest intermediates (the MLP's gate, up and product, the
        # attention's Q, K, V and the hidden state), and the fp32 logits of each sequence's
        # last token (and its sampling copy). Eager attention (not a paged engine's) also
        # materialises each layer's scores over the prompt with their fp32 softmax; generate()
        # of Transformers before 4.45 the logits of every prompt token, in 16 bits and upcast
        # to fp32. The scores: Q·K^T scaled and masked (16-bit), its fp32 softmax, and the
        # softmax cast back while the masked scores are still referenced: 2 x 16-bit + fp32
        # per score. The layers' intermediates come and go one layer at a time, so the wider
        # of them and the logits is the workspace; but the score blocks, the largest a layer
        # frees, stay reserved by the caching allocator and are split for the KV cache the
        # later layers add, so the logits after the last layer take fresh memory beside
        # them (DeepSeek LLM's published 7B runs: batch 4 x 4096 tokens out of memory on 40
        # GB where 8 x 2048, the same KV cache and logits, fits).
        paged = config.engine is InferenceEngine.PAGED
        prompt = min(config.prompt_length or context, context)
        tokens = min(b * prompt, PREFILL_CHUNK) if paged else b * prompt
        ffn = arch.active_ffn if arch.moe else arch.ffn
        widths = 2 * arch.hidden + arch.q_dim + 2 * arch.kv_dim + 3 * ffn
        layer = tokens * widths * compute / tp
        scores = logits = 0.0
        if not config.flash_attention and not paged:
            heads = math.ceil(arch.heads / tp)
            scores = b * heads * prompt * prompt * (2 * compute + 4)
            parts.method.append(f"eager attention: {heads} heads x {prompt}^2 scores + fp32")
        if config.prompt_logits and not paged:
            logits = tokens * arch.vocab * (compute + 4)
            parts.method.append(f"logits of {tokens} prompt tokens, 16-bit and fp32")
        workspace = max(layer, scores + logits) + 2 * b * arch.vocab * 4
    parts.breakdown = {"weights": weights, "kv_cache": kv, "workspace": workspace}
    if config.engine is InferenceEngine.PAGED:
        share = config.gpu_memory_utilization or PAGED_DEFAULT_UTILIZATION
        card = card_bytes(request)
        if card is not None:
            need = weights + kv + workspace
            parts.method.append(
                f"paged engine: {share:.0%} of the {card / MIB:,.0f} MiB card taken up front "
                f"({need / MIB:,.0f} MiB of it weights, KV cache and workspace)"
            )
            parts.fixed_total = max(share * card, need)
            if share * card < need:
                parts.notes.append(
                    f"{share:.0%} of the card holds less than the weights, the KV cache of "
                    f"{b} x {config.context_length or arch.context} tokens and the workspace"
                )
        else:
            parts.notes.append(
                "paged engine: it takes gpu_memory_utilization of whatever card it gets; "
                "name the card (resource_requirements.gpu.type or memory_mb) to predict that"
            )
    return parts
