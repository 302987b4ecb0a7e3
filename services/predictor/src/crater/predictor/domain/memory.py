"""What the memory models share: how many bytes a weight takes (precision, quantization scheme)
and the per-GPU parts by component.

Quantization schemes quantize the linear layers of the transformer blocks; the embeddings and
the LM head stay in 16 bits (bitsandbytes skips lm_head, GPTQ and AWQ quantize only the
blocks' linear layers). Bits per weight, with each scheme's constants:
- GPTQ and AWQ (Frantar et al. 2022, Lin et al. 2023): b-bit weights with a 16-bit scale and
  a b-bit zero point per group of 128 weights: b + (16 + b)/128 bits.
- bitsandbytes NF4/FP4 (Dettmers et al. 2023, QLoRA): 4 bits and an fp32 absmax per block of
  64: 4.5 bits; with double quantization the absmax in 8 bits per 256 blocks: 4.127 bits.
- LLM.int8() (Dettmers et al. 2022): 8 bits and an fp32 scale per row, ~8 bits.
- FP8 (block-wise scales, as Qwen3 and DeepSeek-V3 ship them): 8 bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from crater.contracts import FieldError, Precision, TaskRequest

MIB = 1024 * 1024

BYTES_PER_PARAMETER = {
    Precision.FP32: 4.0,
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}


@dataclass(frozen=True)
class Quantization:
    name: str
    bits: float  # per quantized weight, constants included
    dequantizes: bool = False  # forward dequantizes each matrix to 16 bits (bitsandbytes 4-bit)


def _grouped(bits: int) -> float:
    return bits + (16 + bits) / 128


_SCHEMES: dict[str, Quantization] = {}
for names, scheme in (
    (("gptq", "gptq-int4", "gptq-4bit", "int4", "4bit", "w4a16", "marlin", "q4"),
     Quantization("4-bit, group size 128", _grouped(4))),
    (("awq", "awq-int4", "awq-4bit"), Quantization("AWQ 4-bit, group size 128", _grouped(4))),
    (("gptq-int8", "gptq-8bit", "w8a16"), Quantization("GPTQ 8-bit, group size 128", _grouped(8))),
    (("gptq-int3", "gptq-3bit", "int3", "q3"), Quantization("3-bit, group size 128", _grouped(3))),
    (("gptq-int2", "gptq-2bit", "int2", "q2", "aqlm", "aqlm-2bit"),
     Quantization("2-bit", _grouped(2))),
    (("nf4", "bnb-nf4", "bnb-4bit", "fp4", "bnb-fp4", "load-in-4bit"),
     Quantization("bitsandbytes 4-bit, fp32 absmax per 64", 4.5, dequantizes=True)),
    (("nf4-dq", "bnb-nf4-dq", "qlora"),
     Quantization("bitsandbytes NF4, double-quantized", 4 + 0.127, dequantizes=True)),
    (("int8", "8bit", "bnb-8bit", "bnb-int8", "llm.int8", "load-in-8bit", "q8", "smoothquant",
      "w8a8"), Quantization("8-bit", 8.0)),
    (("fp8", "fp8-e4m3", "fp8-dynamic", "w8a8-fp8"), Quantization("FP8", 8.0)),
):  # fmt: skip
    for name in names:
        _SCHEMES[name] = scheme

# Names that say the weights are not quantized (AllData sends "none").
UNQUANTIZED = frozenset({"none", "no", "off", "false", "null", "fp32", "fp16", "bf16", "16bit"})
KNOWN_QUANTIZATIONS = ("none", *_SCHEMES)
NF4_DOUBLE_QUANT = _SCHEMES["nf4-dq"]


def quantization_scheme(request: TaskRequest) -> Quantization | None:
    """The scheme model_config.quantization names (int8/int4 precision: a generic one);
    Refused naming the field, with the names known, when it names none."""
    from crater.predictor.domain.validation import Refused

    raw = request.model_spec.quantization
    if raw:
        key = raw.strip().lower().replace("_", "-").replace(" ", "-")
        if key in UNQUANTIZED:
            return _by_precision(request)
        scheme = _SCHEMES.get(key)
        if scheme is None:
            raise Refused(
                [
                    FieldError(
                        field="model_config.quantization",
                        reason=f"unknown quantization {raw!r}; known: "
                        f"{', '.join(KNOWN_QUANTIZATIONS)}",
                    )
                ]
            )
        return scheme
    return _by_precision(request)


def _by_precision(request: TaskRequest) -> Quantization | None:
    precision = request.model_spec.precision
    if precision is Precision.INT4:
        return _SCHEMES["int4"]
    if precision is Precision.INT8:
        return _SCHEMES["int8"]
    return None


def compute_bytes(request: TaskRequest) -> float:
    """Bytes of an activation or an unquantized weight: 4 in fp32, else 2."""
    return 4.0 if request.model_spec.precision is Precision.FP32 else 2.0


def weight_bytes(request: TaskRequest) -> float:
    """Bytes per quantized weight: the precision, or the quantization scheme when it says less."""
    scheme = quantization_scheme(request)
    if scheme is not None:
        return scheme.bits / 8
    return BYTES_PER_PARAMETER[request.model_spec.precision]


@dataclass
class _Parts:
    """Per-GPU bytes by component, host bytes by component, and what the timeline needs."""

    breakdown: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)  # offloaded, paged: host memory
    trainable: int = 0
    fixed_total: float | None = None  # a paged engine takes this much of each card, whatever
    method: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _mb(n_bytes: float) -> int:
    return math.ceil(n_bytes / MIB)
