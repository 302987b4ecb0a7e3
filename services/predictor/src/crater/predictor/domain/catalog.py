"""Known architectures, how a model's name finds one, and what LoRA trains on each.

Transformers come from their Hugging Face config.json (`model_configs`, read by
`architecture.from_hf_config`, the same path a task's own config.json takes). ResNet-50 from He
et al. 2016 (25.6M parameters, torchvision); the Stable Diffusion v1.5 UNet from its diffusers
config (859.5M parameters). The activation bytes per sample of the two convolutional models
are estimates at their reference resolution (ResNet-50 224x224 in fp32; the UNet at 512x512,
i.e. 64x64 latents, in fp16 with memory-efficient attention), not published figures.

Names: `meta-llama/Meta-Llama-3.1-8B-Instruct`, `Qwen/Qwen-7B-Chat-Int4`, `Qwen2.5-7B` and
`llama3.1-8b` all find their architecture: the organisation, what only names a checkpoint of
the same shape (-Instruct, -chat-hf, -it, -Int4, -AWQ, -GPTQ, -bnb-4bit, dates, -v0.1, -4k,
training-step tags) and spelling (_ for . in 1_8B, llama3 for llama-3) are set aside, and the
resolution says which architecture it chose and from what.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from crater.predictor.domain.architecture import (
    Architecture,
    ConfigError,
    Kind,
    Mlp,
    from_hf_config,
    generic,
)
from crater.predictor.domain.model_configs import ALIASES, KNOWN

__all__ = [
    "ALIASES",
    "CATALOG",
    "Architecture",
    "ConfigError",
    "Kind",
    "Mlp",
    "Resolution",
    "checkpoint_fraction",
    "family_of",
    "from_hf_config",
    "infer",
    "linear_shapes",
    "lookup",
    "lora_input_width",
    "lora_trainable_parameters",
    "normalise",
    "resolve_name",
]

_CONV = (
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

CATALOG: dict[str, Architecture] = {
    **{k.key: from_hf_config(k.config, k.key, k.family) for k in KNOWN.values()},
    **{a.key: a for a in _CONV},
}
_ALIASES = {
    **ALIASES,
    "resnet50": "resnet-50",
    "stable-diffusion-v1-5": "stable-diffusion-unet",
    "stable-diffusion-v1-4": "stable-diffusion-unet",
    "sd-unet": "stable-diffusion-unet",
}

# Name tokens that tell checkpoints of one architecture apart, never the shape.
_NOISE = frozenset({
    "hf", "chat", "instruct", "it", "base", "uncased", "cased", "int4", "int8", "gptq", "awq",
    "fp8", "fp16", "bf16", "gguf", "bnb", "4bit", "8bit", "unsloth", "sft", "dpo", "rlhf",
    "diffusers", "unet", "intermediate", "step", "preview", "hf-chat", "math", "coder-instruct",
})  # fmt: skip
_VERSIONS = re.compile(r"^(v\d+(\.\d+)*|\d{4}|\d+k|\d+t|\d{6,8})$")  # v0.1, 2507, 4k, 3t


def _canonical(name: str) -> str:
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"(?<=-\d)_(?=\d)", ".", key)  # Qwen-1_8B, phi-1_5, Llama-3_1
    key = key.replace("_", "-").replace(" ", "-")
    key = re.sub(r"^meta-llama-", "llama-", key)
    key = re.sub(r"^(llama|qwen|gemma|phi)(\d)", r"\1-\2", key)  # llama3 -> llama-3
    key = re.sub(r"^qwen-(\d\.\d|\d)(?=-|$)", r"qwen\1", key)  # qwen-2.5 -> qwen2.5
    key = re.sub(r"^qwen1-(?=\d)", "qwen-", key)
    return key


def _candidates(name: str) -> list[str]:
    """The name's spellings to look up, most specific first."""
    full = _canonical(name)
    words = full.split("-")
    quiet = [w for w in words if w not in _NOISE]  # from anywhere, versions kept
    forms = [full, "-".join(quiet)]
    trimmed = list(words)  # what only names a checkpoint, off the end one word at a time
    while len(trimmed) > 1 and (trimmed[-1] in _NOISE or _VERSIONS.match(trimmed[-1])):
        trimmed.pop()
        forms.append("-".join(trimmed))
    forms.append("-".join(w for w in quiet if not _VERSIONS.match(w)))
    return [f for f in dict.fromkeys(forms) if f]


def _known(key: str) -> str | None:
    key = _ALIASES.get(key, key)
    return key if key in CATALOG else None


def normalise(name: str) -> str:
    """`meta-llama/Llama-3-8b-chat-hf` -> `llama-3-8b`: the catalog key the name finds, or
    its spelling with what only names a checkpoint dropped."""
    forms = _candidates(name)
    for form in forms:
        found = _known(form)
        if found:
            return found
    return forms[-1] if forms else name


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([bm])$")


def _size_billion(word: str) -> float | None:
    match = _SIZE.match(word)
    if not match:
        return None
    return float(match[1]) * (1 if match[2] == "b" else 1e-3)


@dataclass(frozen=True)
class Resolution:
    """The architecture a name (or a config.json) stands for, and why."""

    architecture: Architecture
    how: str
    exact: bool = True  # the name says this architecture; False: the nearest of its family


# A pure function of a fixed catalog, asked once or twice per submission with the names a
# platform's tasks use over and over: the answer is kept (a frozen Resolution).
@functools.lru_cache(maxsize=4096)
def resolve_name(name: str, parameters_billion: float | None = None) -> Resolution | None:
    """The catalog architecture `name` stands for. A name of a known family whose size the
    catalog does not hold (qwen2.5-9b) gets the family's nearest size, and says so."""
    forms = _candidates(name)
    for form in forms:
        found = _known(form)
        if found:
            said = "" if found == name else f" for {name!r}"
            return Resolution(CATALOG[found], f"catalog {found}{said}")
    if not forms:  # nothing of the name is a word (control characters only)
        return None
    # "<family>-<size>-...": the family's entry of the nearest size
    bare = forms[-1]
    best: tuple[float, str] | None = None
    for key, known in KNOWN.items():
        words = key.split("-")
        size_at = next((i for i, w in enumerate(words) if _size_billion(w)), None)
        if size_at is None:
            continue
        prefix = "-".join(words[:size_at])
        if not bare.startswith(prefix + "-"):
            continue
        rest = bare[len(prefix) + 1 :].split("-")
        wanted = _size_billion(rest[0]) or parameters_billion
        if wanted is None:
            continue
        distance = abs(math.log(known.published_billion / wanted))
        if distance < math.log(1.6) and (best is None or distance < best[0]):
            best = (distance, key)
    if best is None:
        return None
    key = best[1]
    return Resolution(
        CATALOG[key],
        f"catalog {key}: the nearest size of its family to {name!r}, not the model itself",
        exact=False,
    )


def lookup(name: str) -> Architecture | None:
    resolution = resolve_name(name)
    return resolution.architecture if resolution and resolution.exact else None


def parameters_billion(name: str) -> float | None:
    architecture = lookup(name)
    return architecture.parameters / 1e9 if architecture else None


_FAMILIES = (
    "mixtral", "mistral", "llama", "qwen3", "qwen2", "qwen", "gemma", "phi", "falcon", "gpt2",
    "bert", "t5", "t0", "resnet", "vit", "unet", "whisper", "yi", "chatglm", "glm", "baichuan",
    "deepseek", "bloom", "stablelm",
)  # fmt: skip


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked per submission
def family_of(name: str) -> str:
    """The family an unknown name most likely belongs to, for learned corrections."""
    key = _canonical(name)
    for family in _FAMILIES:
        if re.search(rf"(^|-){re.escape(family)}", key):
            if family in ("qwen2",) or key.startswith(("qwen1.5", "qwen2.5")):
                return "qwen2"
            return {"t0": "t5", "glm": "chatglm"}.get(family, family)
    return "unknown"


# Families' vocabularies and key/value sharing, for a model of theirs the catalog lacks.
_FAMILY_SHAPE: dict[str, tuple[int, int]] = {  # family -> (vocabulary, heads per KV head)
    "llama": (128_256, 4),
    "qwen": (151_936, 1),
    "qwen2": (152_064, 7),
    "qwen3": (151_936, 4),
    "mistral": (32_768, 4),
    "mixtral": (32_768, 4),
    "gemma": (256_000, 2),
    "phi": (32_064, 1),
    "yi": (64_000, 8),
    "chatglm": (65_024, 16),
    "baichuan": (125_696, 1),
    "deepseek": (102_400, 1),
    "falcon": (65_024, 1),
    "bloom": (250_880, 1),
}


def infer(name: str, parameters: float) -> Architecture:
    """A decoder-only shape for a model known by its parameter count (and perhaps its family:
    its vocabulary and key/value heads); see architecture.generic."""
    family = family_of(name)
    if family == "llama" and re.search(r"llama-?2", name.lower()):
        vocab, ratio = 32_000, 1
    else:
        vocab, ratio = _FAMILY_SHAPE.get(family, (128_256, 1))
    return generic(normalise(name), family, parameters, vocab, ratio)


# -- LoRA ----------------------------------------------------------------------------------

# A framework's module name -> the roles it covers; a tuple is one fused matrix.
_MODULES: dict[str, list[tuple[str, ...]]] = {
    **{n: [("q",)] for n in ("q_proj", "query", "q", "wq", "q_a_proj", "q_b_proj")},
    **{n: [("k",)] for n in ("k_proj", "key", "k", "wk")},
    **{n: [("v",)] for n in ("v_proj", "value", "v", "wv")},
    **{n: [("o",)] for n in ("o_proj", "out_proj", "o", "dense", "attention.dense")},
    **{n: [("q", "k", "v")] for n in ("c_attn", "query_key_value", "qkv_proj", "w_pack", "wqkv")},
    **{n: [("k", "v")] for n in ("kv_a_proj_with_mqa", "kv_b_proj")},
    "gate_proj": [("gate",)],
    "up_proj": [("up",)],
    "down_proj": [("down",)],
    "gate_up_proj": [("gate", "up")],
    "dense_h_to_4h": [("gate", "up")],
    "dense_4h_to_h": [("down",)],
    **{n: [("up",)] for n in ("c_fc", "fc1", "fc_in", "wi", "wi_1", "w3")},
    **{n: [("gate",)] for n in ("wi_0", "w1")},
    **{n: [("down",)] for n in ("fc2", "fc_out", "wo", "w2")},
    "c_proj": [("o",), ("down",)],  # GPT-2 and Qwen name both so
    "lm_head": [("head",)],
    "output_layer": [("head",)],
}
_BY_TYPE: dict[str, dict[str, list[tuple[str, ...]]]] = {
    "qwen": {"w1": [("up",)], "w2": [("gate",)]},  # Qwen (1): w1, w2 are up and gate
}
# Model types whose attention (and MLP) projections are one fused module each.
_FUSED_QKV = frozenset({
    "qwen", "chatglm", "baichuan", "phi3", "falcon", "gpt2", "gpt_bigcode", "bloom", "gpt_neox",
})  # fmt: skip
_FUSED_GATE_UP = frozenset({"phi3", "chatglm"})
_SHORT = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def _matrices(a: Architecture) -> dict[str, list[tuple[int, int, int]]]:
    """Each role's matrices: (inputs, outputs, how many in the model)."""
    h, q, kv = a.hidden, a.q_dim, a.kv_dim
    attention = a.layers + a.encoder_layers
    if a.kind is Kind.ENCODER_DECODER:
        attention += a.layers  # cross-attention
    dense = a.layers - a.moe_layers + a.encoder_layers
    mlps: dict[str, list[tuple[int, int, int]]] = {"gate": [], "up": [], "down": []}

    def mlp(width: int, count: int) -> None:
        if not width or not count:
            return
        if a.mlp is Mlp.SWIGLU:
            mlps["gate"].append((h, width, count))
        mlps["up"].append((h, width, count))
        mlps["down"].append((width, h, count))

    mlp(a.ffn, dense)
    mlp(a.moe_ffn, a.moe_layers * a.experts)
    mlp(a.shared_ffn, a.moe_layers)
    return {
        "q": [(h, q, attention)],
        "k": [(h, kv, attention)],
        "v": [(h, kv, attention)],
        "o": [(q, h, attention)],
        **mlps,
        "head": [(h, a.vocab, 1)],
    }


def linear_shapes(a: Architecture) -> dict[str, tuple[int, int]]:
    """LoRA target modules: (input, output) features of the adapted matrix in one layer."""
    matrices = _matrices(a)
    shapes: dict[str, tuple[int, int]] = {}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        role = name.removesuffix("_proj")
        if matrices[role]:
            shapes[name] = matrices[role][0][:2]
    return shapes


def _adapted(
    a: Architecture, modules: list[str]
) -> tuple[list[list[tuple[int, int, int]]], list[str]]:
    """The matrices `modules` adapt (each fused module one list of its roles' matrices), and
    the names unknown to this architecture."""
    matrices = _matrices(a)
    table = {**_MODULES, **_BY_TYPE.get(a.model_type, {})}
    groups: list[tuple[str, ...]] = []
    unknown: list[str] = []
    for module in modules:
        name = module.lower().rsplit(".", 1)[-1]
        if name in ("all-linear", "all"):
            qkv = [("q", "k", "v")] if a.model_type in _FUSED_QKV else [("q",), ("k",), ("v",)]
            gate_up = [("gate", "up")] if a.model_type in _FUSED_GATE_UP else [("gate",), ("up",)]
            groups += [*qkv, ("o",), *gate_up, ("down",)]
        elif name in table:
            groups += table[name]
        elif name in _SHORT:
            groups += table[_SHORT[name]]
        else:
            unknown.append(module)
    adapted = []
    for group in dict.fromkeys(groups):  # each matrix adapted once
        parts = [matrices[role] for role in group]
        if all(parts):
            fused = []
            for entries in zip(*parts, strict=True):
                fused.append((entries[0][0], sum(e[1] for e in entries), entries[0][2]))
            adapted.append(fused)
    return adapted, unknown


def lora_input_width(a: Architecture, modules: list[str]) -> int:
    """Inputs of the adapted modules per token, summed over the model: what LoRA's dropout
    copies (and masks) for backward."""
    adapted, _ = _adapted(a, modules)
    return sum(d_in * count for fused in adapted for d_in, _, count in fused)


def lora_trainable_parameters(
    a: Architecture, rank: int, modules: list[str]
) -> tuple[int, list[str]]:
    """LoRA (Hu et al. 2021): an adapted d_in x d_out matrix gains B·A with r·(d_in + d_out)
    trainable parameters, wherever the module is (every layer, every expert). Returns the
    count and the module names unknown to this architecture. `all-linear` is PEFT's: every
    attention and MLP matrix, not the LM head."""
    adapted, unknown = _adapted(a, modules)
    total = sum(rank * (d_in + d_out) * count for fused in adapted for d_in, d_out, count in fused)
    return total, unknown


def checkpoint_fraction(a: Architecture) -> float:
    """Share of activations a convolutional net keeps under checkpointing: O(√n) segments
    (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost")."""
    return min(1.0, 2 / math.sqrt(max(a.layers, 1)))
