"""Known architectures, from their published configurations.

Transformer figures are the `config.json` of each model on the Hugging Face Hub (layers =
num_hidden_layers / n_layer, hidden = hidden_size / n_embd, heads = num_attention_heads,
kv_heads = num_key_value_heads, ffn = intermediate_size, vocab = vocab_size, context =
max_position_embeddings / n_positions); parameter counts as the model cards state them.
ResNet-50 from He et al. 2016 (25.6M parameters, torchvision); the Stable Diffusion v1.5
UNet from its diffusers config (859.5M parameters). The activation bytes per sample of the
two convolutional models are estimates at their reference resolution (ResNet-50 224x224 in
fp32; the UNet at 512x512, i.e. 64x64 latents, in fp16 with memory-efficient attention), not
published figures.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    DECODER = "decoder"  # causal LM: KV cache at inference
    ENCODER = "encoder"  # BERT: no KV cache
    CONV = "conv"  # ResNet, UNet: activations per sample from the catalog
    GENERIC = "generic"  # unknown: a shape inferred from the parameter count


class Mlp(StrEnum):
    GELU = "gelu"  # two matrices, h -> f -> h
    SWIGLU = "swiglu"  # three matrices, gate and up h -> f, down f -> h


@dataclass(frozen=True)
class Architecture:
    key: str
    family: str
    kind: Kind
    parameters: int
    layers: int
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    ffn: int = 0
    vocab: int = 0
    context: int = 0
    mlp: Mlp = Mlp.GELU
    # convolutional models: activation bytes one training sample keeps, and its input size
    activation_bytes_per_sample: int = 0
    activation_dtype_bytes: int = 2  # the precision activation_bytes_per_sample assumes
    forward_flops_per_sample: float = 0.0  # convolutional models; transformers: 2·P per token
    cpu_seconds_per_sample: float = 0.0  # decode and augment one sample on one core
    sample_bytes: int = 0  # a stored sample read from disk (JPEG, tokenized text, ...)
    known: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads if self.heads else 0

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def _llm(key: str, family: str, params: float, layers: int, hidden: int, heads: int,
         kv_heads: int, ffn: int, vocab: int, context: int, mlp: Mlp = Mlp.SWIGLU,
         kind: Kind = Kind.DECODER) -> Architecture:  # fmt: skip
    return Architecture(
        key, family, kind, int(params), layers, hidden, heads, kv_heads, ffn, vocab, context, mlp
    )


CATALOG: dict[str, Architecture] = {
    a.key: a
    for a in (
        # meta-llama/Llama-2-*-hf (Touvron et al. 2023)
        _llm("llama-2-7b", "llama", 6.74e9, 32, 4096, 32, 32, 11008, 32000, 4096),
        _llm("llama-2-13b", "llama", 13.0e9, 40, 5120, 40, 40, 13824, 32000, 4096),
        _llm("llama-2-70b", "llama", 69.0e9, 80, 8192, 64, 8, 28672, 32000, 4096),
        # meta-llama/Meta-Llama-3-* (grouped-query attention, 128K vocabulary)
        _llm("llama-3-8b", "llama", 8.03e9, 32, 4096, 32, 8, 14336, 128256, 8192),
        _llm("llama-3-70b", "llama", 70.6e9, 80, 8192, 64, 8, 28672, 128256, 8192),
        # mistralai/Mistral-7B-v0.1
        _llm("mistral-7b", "mistral", 7.24e9, 32, 4096, 32, 8, 14336, 32000, 32768),
        # Qwen/Qwen2-7B
        _llm("qwen2-7b", "qwen2", 7.62e9, 28, 3584, 28, 4, 18944, 152064, 32768),
        # openai-community/gpt2, -medium, -large, -xl (Radford et al. 2019)
        _llm("gpt2", "gpt2", 124e6, 12, 768, 12, 12, 3072, 50257, 1024, Mlp.GELU),
        _llm("gpt2-medium", "gpt2", 355e6, 24, 1024, 16, 16, 4096, 50257, 1024, Mlp.GELU),
        _llm("gpt2-large", "gpt2", 774e6, 36, 1280, 20, 20, 5120, 50257, 1024, Mlp.GELU),
        _llm("gpt2-xl", "gpt2", 1.56e9, 48, 1600, 25, 25, 6400, 50257, 1024, Mlp.GELU),
        # google-bert/bert-base-uncased, bert-large-uncased (Devlin et al. 2019)
        _llm("bert-base", "bert", 110e6, 12, 768, 12, 12, 3072, 30522, 512, Mlp.GELU, Kind.ENCODER),
        _llm(
            "bert-large", "bert", 340e6, 24, 1024, 16, 16, 4096, 30522, 512, Mlp.GELU, Kind.ENCODER
        ),
        Architecture(
            "resnet-50",
            "resnet",
            Kind.CONV,
            25_557_032,
            layers=50,
            activation_bytes_per_sample=100 * 2**20,  # ~26M saved fp32 values at 224x224
            activation_dtype_bytes=4,
            forward_flops_per_sample=8.2e9,  # 4.1 GMACs at 224x224 (He et al. 2016)
            cpu_seconds_per_sample=0.006,  # JPEG decode + random-resized-crop, PIL
            sample_bytes=110_000,  # an average ImageNet JPEG
        ),
        Architecture(
            "stable-diffusion-unet",
            "unet",
            Kind.CONV,
            859_520_964,
            layers=25,
            activation_bytes_per_sample=2500 * 2**20,  # 512x512, fp16, memory-efficient attn
            forward_flops_per_sample=8e11,  # ~0.4 TMACs per UNet pass at 64x64 latents
            cpu_seconds_per_sample=0.02,  # 512x512 JPEG decode, resize, tokenize the caption
            sample_bytes=450_000,  # a 512x512 JPEG and its caption
        ),
    )
}

ALIASES = {
    "meta-llama-3-8b": "llama-3-8b",
    "meta-llama-3-70b": "llama-3-70b",
    "llama3-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
    "llama2-7b": "llama-2-7b",
    "llama2-13b": "llama-2-13b",
    "llama2-70b": "llama-2-70b",
    "gpt2-small": "gpt2",
    "gpt-2": "gpt2",
    "resnet50": "resnet-50",
    "stable-diffusion-v1-5": "stable-diffusion-unet",
    "stable-diffusion-v1-4": "stable-diffusion-unet",
    "sd-unet": "stable-diffusion-unet",
}

_NOISE = re.compile(
    r"-(hf|chat|instruct|it|base|uncased|cased|v0\.\d|v\d(\.\d)?|\d+k|unet|diffusers)$"
)


def normalise(name: str) -> str:
    """`meta-llama/Llama-3-8b-chat-hf` -> `llama-3-8b`: drop the organisation and suffixes."""
    key = name.lower().strip().rsplit("/", 1)[-1].replace("_", "-").replace(" ", "-")
    previous = None
    while previous != key:
        previous = key
        if key in CATALOG or key in ALIASES:
            break
        key = _NOISE.sub("", key)
    return ALIASES.get(key, key)


def lookup(name: str) -> Architecture | None:
    key = normalise(name)
    if key in CATALOG:
        return CATALOG[key]
    # the longest catalog name the key starts with ("llama-2-7b-32k" -> "llama-2-7b")
    matches = [k for k in (*CATALOG, *ALIASES) if key.startswith(k + "-")]
    if not matches:
        return None
    best = max(matches, key=len)
    return CATALOG[ALIASES.get(best, best)]


def parameters_billion(name: str) -> float | None:
    architecture = lookup(name)
    return architecture.parameters / 1e9 if architecture else None


def family_of(name: str) -> str:
    """The family an unknown name most likely belongs to, for learned corrections."""
    key = normalise(name)
    for family in ("llama", "mistral", "mixtral", "qwen", "gemma", "phi", "falcon", "gpt2",
                   "bert", "t5", "resnet", "vit", "unet", "whisper"):  # fmt: skip
        if family in key:
            return family
    return "unknown"


def infer(name: str, parameters: float) -> Architecture:
    """A decoder-only shape for an unknown model from its parameter count alone.

    A dense transformer holds about 12·L·h² parameters (Kaplan et al. 2020, eq. 2.1: 4h²
    attention + 8h² MLP per layer); we take the depth/width ratio of the Llama family
    (h ≈ 128·L) so that h = (128·P/12)^(1/3), rounded to a multiple of 128, with 128-wide
    heads, full multi-head attention (the larger KV cache, so a conservative guess) and a
    32K vocabulary.
    """
    hidden = max(128, round((128 * parameters / 12) ** (1 / 3) / 128) * 128)
    layers = max(1, round(parameters / (12 * hidden * hidden)))
    heads = max(1, hidden // 128)
    return Architecture(
        key=normalise(name),
        family=family_of(name),
        kind=Kind.GENERIC,
        parameters=int(parameters),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        ffn=4 * hidden,
        vocab=32000,
        context=4096,
        known=False,
    )


# LoRA target modules: (input, output) features of the adapted matrix in one layer.
def linear_shapes(a: Architecture) -> dict[str, tuple[int, int]]:
    h, f, kv = a.hidden, a.ffn, a.kv_dim
    shapes = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "up_proj": (h, f),
        "down_proj": (f, h),
    }
    if a.mlp is Mlp.SWIGLU:
        shapes["gate_proj"] = (h, f)
    # GPT-2 and BERT spell them differently
    shapes |= {
        "c_attn": (h, h + 2 * kv),
        "c_proj": (h, h),
        "c_fc": (h, f),
        "query": (h, h),
        "key": (h, kv),
        "value": (h, kv),
        "dense": (h, h),
    }
    return shapes


_SHORT = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
          "up": "up_proj", "down": "down_proj"}  # fmt: skip


def lora_trainable_parameters(
    a: Architecture, rank: int, modules: list[str]
) -> tuple[int, list[str]]:
    """LoRA (Hu et al. 2021): an adapted d_in x d_out matrix gains B·A with r·(d_in + d_out)
    trainable parameters, in every layer. Returns the count and the module names unknown
    to this architecture."""
    shapes = linear_shapes(a)
    if any(m.lower() in ("all-linear", "all") for m in modules):
        names = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
        modules = names + (["gate_proj"] if a.mlp is Mlp.SWIGLU else [])
    total, unknown = 0, []
    for module in modules:
        name = _SHORT.get(module.lower(), module.lower())
        if name not in shapes:
            unknown.append(module)
            continue
        d_in, d_out = shapes[name]
        total += rank * (d_in + d_out)
    return total * a.layers, unknown


def checkpoint_fraction(a: Architecture) -> float:
    """Share of activations a convolutional net keeps under checkpointing: O(√n) segments
    (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost")."""
    return min(1.0, 2 / math.sqrt(max(a.layers, 1)))
