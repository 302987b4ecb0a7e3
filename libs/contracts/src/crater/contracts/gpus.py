"""GPU product names, as callers write them and as the probe reads them off the card.

A request names a GPU by product: a model, optionally its form factor and its memory per card,
in any order after the model, separated by dashes or spaces, case ignored: `A100`,
`a100-pcie-40gb` (AllData's form), `h100-sxm-80gb`, `v100-sxm2-32gb`, `rtx-4090`, `t4`, or the
name nvidia-smi prints (`NVIDIA A100-SXM4-80GB`). A node's GPUs are read the same way from
the model name the probe reports; the form factor is known only when that name says it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Model families Crater knows, by key (lower case, no spaces or dashes).
GPU_MODELS: tuple[str, ...] = (
    # NVIDIA data centre
    "b200", "b100", "gb200", "h200", "gh200", "h100", "h800", "h20",
    "a100", "a800", "a40", "a30", "a16", "a10", "a10g", "a2",
    "l40s", "l40", "l20", "l4", "v100", "v100s", "t4", "p100", "p40", "p4", "k80",
    # NVIDIA workstation and consumer
    "rtxa6000", "rtxa5000", "rtxa4000",
    "rtx5090", "rtx4090", "rtx4080", "rtx3090", "rtx3080",
    # AMD Instinct
    "mi300x", "mi250x", "mi250", "mi210", "mi100",
    # Alibaba's anonymised models in its cluster traces (openb), for the simulator
    "g2", "g3",
)  # fmt: skip

# Form factors, by the words that name them (SXM generations are one form factor).
FORM_FACTORS: dict[str, str] = {
    "pcie": "pcie",
    "sxm": "sxm",
    "sxm2": "sxm",
    "sxm3": "sxm",
    "sxm4": "sxm",
    "sxm5": "sxm",
    "nvl": "nvl",
}
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon"})
_MEMORY = re.compile(r"^(\d{1,4})gb?$")
_MODEL_WITH_MEMORY = re.compile(r"^([a-z]+\d+[a-z]*?)m(\d{1,4})$")
# Memory types: not a form factor, but NVIDIA names its H100 SXM5 "H100 80GB HBM3".
_MEMORY_TYPES = frozenset({"hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x"})

ACCEPTED_FORMS = (
    "<model>[-<form factor>][-<memory>gb], case ignored, e.g. a100-pcie-40gb, h100-sxm-80gb, "
    "v100-sxm2-32gb, rtx-4090, t4, A100, V100M16; form factors: pcie, sxm (sxm2..sxm5), nvl; "
    f"models: {', '.join(GPU_MODELS)}"
)


@dataclass(frozen=True)
class GpuProduct:
    model: str  # a key of GPU_MODELS (or, read off a node, whatever the name begins with)
    form_factor: str | None = None  # pcie, sxm, nvl; None: not said
    memory_gb: int | None = None  # per card, as products are named (decimal gigabytes)

    @property
    def min_memory_mb(self) -> int:
        """The least memory per card (MiB) a card sold as `memory_gb` GB reports: products
        are named in decimal gigabytes (an "80GB" H100 reports 81559 MiB, a "16GB" T4 15360)."""
        return (self.memory_gb or 0) * 10**9 // 2**20

    def __str__(self) -> str:
        parts = [self.model, self.form_factor, f"{self.memory_gb}gb" if self.memory_gb else None]
        return "-".join(p for p in parts if p)


def _words(name: str) -> list[str]:
    words = [w for w in re.split(r"[\s_\-]+", name.strip().lower()) if w]
    words = [w for w in words if w not in _VENDOR_WORDS]
    # "RTX 4090", "RTX A6000": the series word and the number are one model
    if len(words) >= 2 and words[0] in {"rtx", "gtx"}:
        words = [words[0] + words[1], *words[2:]]
    # "V100M16", as Alibaba's cluster traces (openb) name a V100 of 16 GB
    joined = _MODEL_WITH_MEMORY.match(words[0]) if words else None
    if joined and joined.group(1) in GPU_MODELS:
        words = [joined.group(1), f"{joined.group(2)}gb", *words[1:]]
    return words


def parse_gpu_product(name: str) -> GpuProduct:
    """A requested product, or ValueError naming the accepted forms."""
    words = _words(name)
    if not words or words[0] not in GPU_MODELS:
        raise ValueError(f"unknown GPU product {name!r}; accepted: {ACCEPTED_FORMS}")
    form: str | None = None
    memory: int | None = None
    for word in words[1:]:
        size = _MEMORY.match(word)
        if word in FORM_FACTORS and form is None:
            form = FORM_FACTORS[word]
        elif size and memory is None and int(size.group(1)) > 0:
            memory = int(size.group(1))
        elif word in _MEMORY_TYPES:
            continue
        else:
            raise ValueError(
                f"unknown GPU product {name!r} (what is {word!r}?); accepted: {ACCEPTED_FORMS}"
            )
    return GpuProduct(words[0], form, memory)


def gpu_of_inventory(model_name: str) -> GpuProduct:
    """What a node's card is, from the model name the probe reports (`NVIDIA A100-PCIE-40GB`,
    `NVIDIA H100 80GB HBM3`, `Tesla T4`): words it does not know are ignored, the form factor
    is None unless the name says it."""
    words = _words(model_name)
    if not words:
        return GpuProduct("")
    form = next((FORM_FACTORS[w] for w in words[1:] if w in FORM_FACTORS), None)
    if form is None and any(w.startswith("hbm3") for w in words[1:]):
        form = "sxm"  # "H100 80GB HBM3" is the SXM5 part; the PCIe and NVL parts say so
    size = next((m for m in map(_MEMORY.match, words[1:]) if m), None)
    return GpuProduct(words[0], form, int(size.group(1)) if size else None)


# Memory per card as cards are sold and operators write it (80 for "80Gi"): what a card
# reports is that or a little short of it (a T4 reports 15360 MiB, an RTX 4090 24564 MiB, an
# H100 81559 MiB), never far.
NOMINAL_MEMORY_GB: tuple[int, ...] = (
    4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 180, 192, 256, 288,
)  # fmt: skip
_NOMINAL_TOLERANCE = 0.07


def nominal_memory_gb(model_name: str, memory_mb: int) -> int:
    """A card's memory as it is sold: the size its name says (`A100-SXM4-40GB`), else the
    first nominal size at or above the GiB it reports if at most 7% above, else those GiB
    rounded."""
    named = gpu_of_inventory(model_name).memory_gb
    if named:
        return named
    gib = memory_mb / 1024
    above = [size for size in NOMINAL_MEMORY_GB if size >= gib]
    if above and above[0] - gib <= _NOMINAL_TOLERANCE * above[0]:
        return above[0]
    return round(gib)
