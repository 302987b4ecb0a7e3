"""What the memory models share: bytes per stored weight and the per-GPU parts by component."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from crater.contracts import Precision, TaskRequest

MIB = 1024 * 1024

BYTES_PER_PARAMETER = {
    Precision.FP32: 4.0,
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}
# GPTQ/AWQ store 4-bit weights with an fp16 scale and zero point per group of 128 weights.
FOUR_BIT_QUANTIZATION = 0.5 + 4 / 128
FOUR_BIT_NAMES = ("gptq", "awq", "nf4", "4bit", "4-bit", "int4", "q4", "bnb-4bit", "exl2")
EIGHT_BIT_NAMES = ("int8", "8bit", "8-bit", "llm.int8", "smoothquant", "fp8", "q8", "bnb-8bit")


@dataclass
class _Parts:
    """Per-GPU bytes by component, and what the timeline needs."""

    breakdown: dict[str, float] = field(default_factory=dict)
    trainable: int = 0
    method: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def weight_bytes(request: TaskRequest) -> float:
    """Bytes per stored weight: the precision, or the quantization scheme when it says less."""
    quantization = (request.model_spec.quantization or "").lower()
    if any(n in quantization for n in FOUR_BIT_NAMES):
        return FOUR_BIT_QUANTIZATION
    if any(n in quantization for n in EIGHT_BIT_NAMES):
        return 1.0
    return BYTES_PER_PARAMETER[request.model_spec.precision]


def _mb(n_bytes: float) -> int:
    return math.ceil(n_bytes / MIB)
