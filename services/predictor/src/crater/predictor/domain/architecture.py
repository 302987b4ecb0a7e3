"""A model's shape, and how it is read from a Hugging Face `config.json`.

The predictor needs what decides memory: the vocabulary (embeddings, LM head, logits), layers,
hidden and MLP widths, attention heads and key/value heads with their width (the KV cache),
whether the MLP is gated (three matrices: SwiGLU, GeGLU) or not (two: GELU, ReLU), whether the
LM head shares the embedding, mixture-of-experts (experts, active experts, their width, shared
experts, dense layers), DeepSeek's multi-head latent attention (a compressed KV cache), and
encoder-decoder models (T5: an encoder and a decoder with cross-attention).

`from_hf_config` reads those from a config.json as Hugging Face publishes it, for the model
types of Transformers (and the remote-code ones people fine-tune: Qwen, ChatGLM, Baichuan),
naming the field and the reason when something needed is missing. Parameter counts follow from
the shape (biases and norms, well under 1%, left out), so weights always match the shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    DECODER = "decoder"  # causal LM: KV cache at inference
    ENCODER = "encoder"  # BERT: no KV cache
    ENCODER_DECODER = "encoder-decoder"  # T5: an encoder, a decoder with cross-attention
    CONV = "conv"  # ResNet, UNet: activations per sample from the catalog
    GENERIC = "generic"  # unknown: a shape inferred from the parameter count


class Mlp(StrEnum):
    GELU = "gelu"  # two matrices, h -> f -> h (GELU, ReLU)
    SWIGLU = "swiglu"  # gated: three matrices, gate and up h -> f, down f -> h (SwiGLU, GeGLU)


@dataclass(frozen=True)
class Architecture:
    key: str
    family: str
    kind: Kind
    parameters: int
    layers: int  # decoder layers (encoder layers for an encoder-only model)
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    ffn: int = 0  # dense MLP width
    vocab: int = 0
    context: int = 0
    mlp: Mlp = Mlp.GELU
    head_dim_override: int = 0  # when heads x head_dim is not the hidden size (Gemma, Qwen3)
    tied: bool = False  # the LM head is the embedding matrix
    learned_positions: int = 0  # position embeddings in the weights (BERT, GPT-2)
    # mixture of experts
    experts: int = 0
    active_experts: int = 0
    moe_ffn: int = 0  # one expert's MLP width
    shared_ffn: int = 0  # the shared experts' MLP width, all of them together
    dense_layers: int = 0  # layers with a dense MLP in an MoE model (DeepSeek's first k)
    # multi-head latent attention (DeepSeek V2/V3)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    # encoder-decoder
    encoder_layers: int = 0
    # convolutional models: activation bytes one training sample keeps, and its input size
    activation_bytes_per_sample: int = 0
    activation_dtype_bytes: int = 2  # the precision activation_bytes_per_sample assumes
    forward_flops_per_sample: float = 0.0  # convolutional models; transformers: 2·P per token
    cpu_seconds_per_sample: float = 0.0  # decode and augment one sample on one core
    sample_bytes: int = 0  # a stored sample read from disk (JPEG, tokenized text, ...)
    known: bool = True
    source: str = "catalog"  # catalog | config.json | generic
    model_type: str = ""  # the config.json's model_type

    @property
    def head_dim(self) -> int:
        if self.head_dim_override:
            return self.head_dim_override
        return self.hidden // self.heads if self.heads else 0

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output) of one layer."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_cache_width(self) -> int:
        """Values the KV cache keeps per token per layer (K and V, or MLA's compressed
        latent and its rotary key, which vLLM and SGLang cache instead of K and V)."""
        if self.mla:
            return self.kv_lora_rank + self.rope_head_dim
        return 2 * self.kv_dim

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    @property
    def active_ffn(self) -> int:
        """MLP width one token passes through in an MoE layer: its experts and the shared."""
        return self.active_experts * self.moe_ffn + self.shared_ffn

    @property
    def decoder_layers(self) -> int:
        return self.layers

    @property
    def active_parameters(self) -> int:
        """Parameters one token passes through: all of them unless experts are routed."""
        if not self.moe:
            return self.parameters
        idle = self.moe_layers * (self.experts - self.active_experts) * self._mlp(self.moe_ffn)
        return self.parameters - idle

    @property
    def embedding_parameters(self) -> int:
        """The embeddings and the LM head: what quantization schemes leave in 16 bits."""
        if not self.hidden:
            return 0
        head = 0 if self.tied else self.vocab * self.hidden
        return (self.vocab + self.learned_positions) * self.hidden + head

    @property
    def largest_layer_parameters(self) -> int:
        """The largest module's parameters (DeepSpeed's largest_layer_params): the embedding,
        or one MLP matrix, or a layer's experts stacked as one."""
        if not self.hidden:
            return self.parameters
        widest = max(self.ffn, self.moe_ffn)
        return max(self.vocab * self.hidden, self.hidden * widest, self.hidden * self.q_dim)

    def block_parameters(self) -> int:
        """One transformer block's parameters (an FSDP unit)."""
        blocks = max(self.layers + self.encoder_layers, 1)
        return (self.parameters - self.embedding_parameters) // blocks

    def _mlp(self, width: int) -> int:
        return (3 if self.mlp is Mlp.SWIGLU else 2) * self.hidden * width

    def attention_parameters(self) -> int:
        """One layer's attention projections."""
        h = self.hidden
        if self.mla:
            v = self.v_head_dim or self.head_dim
            nope = self.head_dim  # qk_nope_head_dim
            q_width = self.heads * (nope + self.rope_head_dim)
            q = h * q_width
            if self.q_lora_rank:  # queries through their own low-rank bottleneck
                q = h * self.q_lora_rank + self.q_lora_rank * q_width
            kv = h * (self.kv_lora_rank + self.rope_head_dim)
            kv += self.kv_lora_rank * self.heads * (nope + v)
            return q + kv + self.heads * v * h
        return 2 * h * self.q_dim + 2 * h * self.kv_dim

    def counted_parameters(self) -> int:
        """Parameters of this shape: embeddings, LM head, attention and MLPs."""
        if self.kind is Kind.CONV or not self.hidden:
            return self.parameters
        embeddings = (self.vocab + self.learned_positions) * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        attention = self.attention_parameters()
        if self.kind is Kind.ENCODER_DECODER:
            mlp = self._mlp(self.ffn)
            encoder = self.encoder_layers * (attention + mlp)
            decoder = self.layers * (2 * attention + mlp)  # self- and cross-attention
            return embeddings + head + encoder + decoder
        if self.moe:
            expert_layer = self.experts * self._mlp(self.moe_ffn) + self._mlp(self.shared_ffn)
            expert_layer += self.hidden * self.experts  # the router
            mlps = self.dense_layers * self._mlp(self.ffn) + self.moe_layers * expert_layer
            return embeddings + head + self.layers * attention + mlps
        return embeddings + head + self.layers * (attention + self._mlp(self.ffn))


class ConfigError(ValueError):
    """A config.json that does not say what the predictor needs: `field` names the key."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# Model types whose MLP is gated (three matrices). Others: two matrices.
GATED = frozenset({
    "llama", "mistral", "mixtral", "qwen", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
    "gemma2", "gemma3_text", "gemma3", "phi3", "phimoe", "chatglm", "glm", "glm4", "baichuan",
    "deepseek", "deepseek_v2", "deepseek_v3", "yi", "internlm", "internlm2", "olmo", "olmo2",
    "cohere", "starcoder2_gated", "granite", "exaone", "minicpm", "stablelm_epoch",
})  # fmt: skip
PLAIN = frozenset({
    "gpt2", "gpt_bigcode", "gpt_neox", "gptj", "phi", "falcon", "RefinedWeb", "RefinedWebModel",
    "bloom", "opt", "bert", "roberta", "xlm-roberta", "distilbert", "deberta-v2", "starcoder2",
    "mpt", "stablelm",
})  # fmt: skip
ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "deberta-v2", "electra"})
ENCODER_DECODERS = frozenset({"t5", "mt5", "umt5", "bart", "mbart", "pegasus"})
# Model types whose LM head is its own matrix unless the config says otherwise (Transformers
# itself ties by default; these models' code does not read the flag, or sets it false).
UNTIED = frozenset(
    {"qwen", "chatglm", "glm", "baichuan", "gpt_neox", "phi", "mixtral", "qwen2_moe"}
)
LEARNED_POSITIONS = frozenset({"gpt2", "gpt_bigcode", "bert", "roberta", "xlm-roberta", "opt"})

_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "d_model", "n_embed", "dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "ffn": ("intermediate_size", "ffn_hidden_size", "n_inner", "d_ff", "ffn_dim"),
    "vocab": ("padded_vocab_size", "vocab_size", "n_vocab"),
    "context": (
        "max_position_embeddings", "n_positions", "seq_length", "max_sequence_length",
        "model_max_length", "n_ctx", "max_seq_len",
    ),
}  # fmt: skip


def _get(config: Mapping[str, Any], what: str) -> Any:
    for key in _ALIASES[what]:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _int(config: Mapping[str, Any], what: str, required: bool = True) -> int:
    value = _get(config, what)
    if value is None:
        if required:
            others = ", ".join(_ALIASES[what][1:])
            raise ConfigError(_ALIASES[what][0], f"missing (also looked for {others})")
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(_ALIASES[what][0], f"must be a positive integer, got {value!r}")
    if value > 10**8:
        raise ConfigError(_ALIASES[what][0], f"{value} is beyond any model's")
    return int(value)


def _positive(config: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value > 10**8:
        raise ConfigError(key, f"must be a non-negative integer, got {value!r}")
    return int(value)


def from_hf_config(
    config: Mapping[str, Any], key: str | None = None, family: str | None = None
) -> Architecture:
    """The shape a Hugging Face config.json describes; ConfigError naming the field when a
    needed one is missing or absurd."""
    if not isinstance(config, Mapping):
        raise ConfigError("config", "must be a JSON object (the model's config.json)")
    text = config.get("text_config")
    if _get(config, "hidden") is None and isinstance(text, Mapping):
        config = {**text, "model_type": text.get("model_type") or config.get("model_type")}
    model_type = str(config.get("model_type") or "")
    if not model_type:
        architectures = config.get("architectures")
        if not architectures:
            raise ConfigError("model_type", "missing, and no architectures to tell the model by")
        model_type = str(architectures[0]).lower().removesuffix("forcausallm")
    hidden = _int(config, "hidden")
    layers = _int(config, "layers")
    heads = _int(config, "heads")
    vocab = _int(config, "vocab")
    context = _int(config, "context", required=False)
    if hidden > 10**6 or layers > 10**4 or heads > hidden:
        raise ConfigError("hidden_size", f"{hidden} hidden, {layers} layers, {heads} heads")

    head_dim = _positive(config, "head_dim") or _positive(config, "kv_channels")
    head_dim = head_dim or _positive(config, "d_kv")
    kv_heads = _int(config, "kv_heads", required=False)
    if model_type == "chatglm" and not config.get("multi_query_attention", True):
        kv_heads = heads
    if config.get("multi_query") and not config.get("new_decoder_architecture"):
        kv_heads = 1  # Falcon-7B, GPT-BigCode
    kv_heads = kv_heads or heads
    if kv_heads > heads:
        raise ConfigError("num_key_value_heads", f"{kv_heads} is more than {heads} heads")

    ffn = _int(config, "ffn", required=False)
    if model_type == "qwen" and ffn:
        ffn //= 2  # Qwen (1) counts gate and up together
    if model_type in ("falcon", "RefinedWeb", "RefinedWebModel", "bloom", "gpt2") and not ffn:
        ffn = 4 * hidden
    mlp = _mlp_kind(config, model_type)
    tie = config.get("tie_word_embeddings")
    tied = (model_type not in UNTIED) if tie is None else bool(tie)
    if model_type in ("gpt_neox", "phi") and tie is None:
        tied = False

    experts = _positive(config, "num_local_experts") or _positive(config, "n_routed_experts")
    experts = experts or _positive(config, "num_experts")
    active = _positive(config, "num_experts_per_tok") or _positive(config, "moe_topk")
    moe_ffn = _positive(config, "moe_intermediate_size") if experts else 0
    shared_ffn = 0
    dense_layers = 0
    if experts:
        moe_ffn = moe_ffn or ffn
        if not active:
            raise ConfigError("num_experts_per_tok", f"missing for {experts} experts")
        shared_ffn = _positive(config, "n_shared_experts") * moe_ffn
        shared_ffn = shared_ffn or _positive(config, "shared_expert_intermediate_size")
        dense_layers = _positive(config, "first_k_dense_replace")
        only = config.get("mlp_only_layers")
        if isinstance(only, list):
            dense_layers += len(only)
        step = _positive(config, "decoder_sparse_step", 1)
        if step > 1:
            dense_layers += layers - layers // step
        dense_layers = min(dense_layers, layers)
        if not ffn:
            ffn = moe_ffn
    if not ffn:
        raise ConfigError("intermediate_size", "missing: the MLP's width")

    kv_lora = _positive(config, "kv_lora_rank")
    rope = v_head = q_lora = 0
    if kv_lora:
        head_dim = _positive(config, "qk_nope_head_dim") or head_dim
        rope = _positive(config, "qk_rope_head_dim")
        v_head = _positive(config, "v_head_dim")
        q_lora = _positive(config, "q_lora_rank")

    kind = Kind.DECODER
    encoder_layers = 0
    if model_type in ENCODERS:
        kind = Kind.ENCODER
    elif model_type in ENCODER_DECODERS or config.get("is_encoder_decoder"):
        kind = Kind.ENCODER_DECODER
        encoder_layers = layers
        layers = _positive(config, "num_decoder_layers") or _positive(config, "decoder_layers")
        layers = layers or encoder_layers
        tied = bool(config.get("tie_word_embeddings", True))
    positions = 0
    if model_type in LEARNED_POSITIONS:
        positions = context + _positive(config, "type_vocab_size")

    architecture = Architecture(
        key=key or f"config:{model_type}",
        family=family or _family_of_type(model_type),
        kind=kind,
        parameters=0,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        vocab=vocab,
        context=context,
        mlp=mlp,
        head_dim_override=head_dim if head_dim and head_dim != hidden // heads else 0,
        tied=tied,
        learned_positions=positions,
        experts=experts,
        active_experts=min(active, experts) if experts else 0,
        moe_ffn=moe_ffn,
        shared_ffn=shared_ffn,
        dense_layers=dense_layers,
        kv_lora_rank=kv_lora,
        q_lora_rank=q_lora,
        rope_head_dim=rope,
        v_head_dim=v_head,
        encoder_layers=encoder_layers,
        source="catalog" if key else "config.json",
        model_type=model_type,
    )
    return replace(architecture, parameters=architecture.counted_parameters())


def _mlp_kind(config: Mapping[str, Any], model_type: str) -> Mlp:
    projection = str(config.get("feed_forward_proj") or "")
    if projection:  # T5: "relu", "gated-gelu"
        return Mlp.SWIGLU if projection.startswith("gated") else Mlp.GELU
    if model_type in GATED:
        return Mlp.SWIGLU
    if model_type in PLAIN:
        return Mlp.GELU
    activation = str(config.get("hidden_act") or config.get("activation_function") or "")
    return Mlp.SWIGLU if activation in ("silu", "swiglu", "geglu", "swish") else Mlp.GELU


def _family_of_type(model_type: str) -> str:
    """The family a config's model type belongs to, for learned corrections."""
    return {
        "RefinedWeb": "falcon",
        "RefinedWebModel": "falcon",
        "qwen2_moe": "qwen2",
        "qwen3_moe": "qwen3",
        "gemma3_text": "gemma",
        "gemma2": "gemma",
        "gemma3": "gemma",
        "phi3": "phi",
        "deepseek_v2": "deepseek",
        "deepseek_v3": "deepseek",
        "mt5": "t5",
        "umt5": "t5",
        "gpt_bigcode": "gpt2",
        "xlm-roberta": "bert",
        "roberta": "bert",
        "glm4": "chatglm",
        "glm": "chatglm",
    }.get(model_type, model_type.replace("_", "-") or "unknown")


def generic(
    name: str, family: str, parameters: float, vocab: int = 128_256, kv_ratio: int = 1
) -> Architecture:
    """A decoder-only shape for a model known only by its parameter count.

    Modern decoders (Llama, Qwen, Mistral): a SwiGLU MLP of width ≈ 8/3·h·(3/2) = 3.5h rounded
    to 256, 128-wide heads, h ≈ 128·L (the depth/width ratio of the Llama family). Per layer
    that is 4h² attention + 3·h·3.5h MLP = 14.5h² parameters, plus the embedding and LM head
    (2·V·h), solved for h. The vocabulary defaults to the 128K of Llama 3 (Qwen's is 152K,
    Llama 2's 32K): over-counting the logits errs on the side of a larger card. Full multi-head
    attention unless `kv_ratio` says otherwise: the larger KV cache, again the safer guess.
    """
    hidden = 128
    for _ in range(60):  # fixed point of P = 14.5·h²·(h/128) + 2·V·h
        body = max(parameters - 2 * vocab * hidden, parameters * 0.3)
        hidden = max(128, round((128 * body / 14.5) ** (1 / 3) / 128) * 128)
    body = max(parameters - 2 * vocab * hidden, parameters * 0.3)
    layers = max(1, round(body / (14.5 * hidden**2)))
    heads = max(1, hidden // 128)
    ffn = math.ceil(3.5 * hidden / 256) * 256
    architecture = Architecture(
        key=name,
        family=family,
        kind=Kind.GENERIC,
        parameters=0,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=max(1, heads // kv_ratio),
        ffn=ffn,
        vocab=vocab,
        context=4096,
        mlp=Mlp.SWIGLU,
        known=False,
        source="generic",
    )
    # keep the count the caller gave: the shape is a guess, the size is not
    return replace(architecture, parameters=int(parameters))
