"""Whether a task fits the card it asks for, with the range a prediction stands for.

The range is what the published reference runs (benchmarks/predictor/reference.yaml) measured
against what the model predicted for them: the 10th and 90th percentiles of measured /
predicted, per kind of task (benchmarks/results/predictor_accuracy*; a test keeps them honest
against the set). A shape guessed from a parameter count has no such record: its range is
wider by assumption, and says so.

A prediction whose low end is over the largest card of the GPU product the request names
cannot run as asked: it is refused, naming the field, with what would make it fit. One over the
card the request names (its memory_mb, or the least of its product) but not over the largest
is a warning (verdict does-not-fit, said in the method): the scheduler reserves the
prediction and may place it on a larger card, or finds none and says so.
"""

from __future__ import annotations

import math

from crater.contracts import CardFit, Confidence, FieldError, FitVerdict, TaskRequest, TaskType
from crater.contracts.gpus import parse_gpu_product
from crater.predictor.domain.validation import Refused

# measured / predicted over the reference set, 10th and 90th percentiles (step 3 of issue 24)
BANDS = {
    "training": (0.88, 1.50),  # training and fine-tuning, 238 published runs
    "inference": (0.97, 1.12),  # 141 published runs
}
GUESSED = (0.7, 1.8)  # a generic shape from a parameter count: no published record, wider
# The largest memory any card of a GPU model has (GB as sold), for what the request allows.
LARGEST_GB = {
    "b200": 192, "b100": 192, "gb200": 192, "h200": 141, "gh200": 144, "h100": 94, "h800": 80,
    "h20": 96, "a100": 80, "a800": 80, "a40": 48, "a30": 24, "a16": 16, "a10": 24, "a10g": 24,
    "a2": 16, "l40s": 48, "l40": 48, "l20": 48, "l4": 24, "v100": 32, "v100s": 32, "t4": 16,
    "p100": 16, "p40": 24, "p4": 8, "k80": 12, "rtxa6000": 48, "rtxa5000": 24, "rtxa4000": 16,
    "rtx5090": 32, "rtx4090": 24, "rtx4080": 16, "rtx3090": 24, "rtx3080": 12, "mi300x": 192,
    "mi250x": 128, "mi250": 128, "mi210": 64, "mi100": 32,
}  # fmt: skip
LARGEST_ANY_GB = max(LARGEST_GB.values())  # a model the table lacks
# What nvidia-smi reports as the total memory of common cards (MiB), by (model, GB as sold);
# others are read as GiB.
REPORTED_MIB = {
    ("a100", 40): 40960, ("a100", 80): 81920, ("a800", 80): 81920, ("h100", 80): 81559,
    ("h800", 80): 81559, ("h100", 94): 95830, ("h200", 141): 143771, ("h20", 96): 97871,
    ("v100", 16): 16160, ("v100", 32): 32510, ("t4", 16): 15360, ("a10g", 24): 23028,
    ("a10", 24): 23028, ("l4", 24): 23034, ("l40s", 48): 46068, ("l40", 48): 46068,
    ("rtx4090", 24): 24564, ("rtx3090", 24): 24576, ("rtxa6000", 48): 49140,
}  # fmt: skip


def card_mib(model: str, gb: int) -> int:
    return REPORTED_MIB.get((model, gb), gb * 1024)


def band(request: TaskRequest, confidence: Confidence, guessed: bool) -> tuple[float, float]:
    if guessed:
        return GUESSED
    kind = "inference" if request.task_type is TaskType.INFERENCE else "training"
    return BANDS[kind]


def requested_card_mb(request: TaskRequest) -> int | None:
    """The memory per card the request names: gpu.memory_mb, else what a card of its product
    and size reports."""
    gpu = request.resource_requirements.gpu
    if gpu.memory_mb:
        return gpu.memory_mb
    if gpu.type and "|" not in gpu.type:
        product = parse_gpu_product(gpu.type)
        if product is not None and product.memory_gb:
            return card_mib(product.model, product.memory_gb)
    return None


def largest_card_mb(request: TaskRequest) -> tuple[int, str] | None:
    """The most memory a card of the products the request names can have (GB as sold, read
    generously as GiB: an 80 GB A100 reports 81,920 MiB), and what it is; None when the
    request names no product."""
    gpu = request.resource_requirements.gpu
    # every product it may be placed on: its alternatives, or its models in any order
    names = [n for n in (gpu.type or "").split("|") if n.strip()] + list(gpu.types)
    names += gpu.models or []
    sizes: list[tuple[int, str]] = []
    for name in names:
        product = parse_gpu_product(name)
        if product is None:
            continue
        largest = LARGEST_GB.get(product.model, LARGEST_ANY_GB)
        sizes.append((max(largest, product.memory_gb or 0), product.model))
    if not sizes:
        return None
    gb, model = max(sizes)
    return card_mib(model, gb), f"the largest {model}"


def judge(
    request: TaskRequest,
    peak_mb: int,
    low_mb: int,
    high_mb: int,
    advice: str,
    modelled_low_mb: int | None = None,
) -> FitVerdict | None:
    """The verdict on the card the request names (None: it names none); Refused when even
    the low end of the model's own prediction (`modelled_low_mb`: before any learned
    correction, which never refuses a task by itself) is over the largest card it could get."""
    if not request.resource_requirements.gpu.count:
        return None
    named = largest_card_mb(request)
    floor = low_mb if modelled_low_mb is None else modelled_low_mb
    if named is not None and floor > named[0]:
        largest, what = named
        gpu = request.resource_requirements.gpu
        field = f"resource_requirements.gpu.{'models' if gpu.models else 'type'}"
        raise Refused(
            [
                FieldError(
                    field=field,
                    reason=f"needs {peak_mb:,} MiB per card (at least {low_mb:,}), more than "
                    f"{what} has ({largest:,} MiB): {advice}",
                )
            ]
        )
    card = requested_card_mb(request)
    if card is None:
        return None
    if high_mb <= card:
        verdict, reason = (
            CardFit.FITS,
            (f"fits a {card:,} MiB card: {high_mb:,} MiB at the high end of the prediction"),
        )
    elif peak_mb <= card:
        verdict, reason = (
            CardFit.TIGHT,
            (
                f"tight on a {card:,} MiB card: {peak_mb:,} MiB predicted, up to {high_mb:,} MiB "
                f"at the high end"
            ),
        )
    else:
        verdict, reason = (
            CardFit.DOES_NOT_FIT,
            (
                f"does not fit a {card:,} MiB card: {peak_mb:,} MiB predicted (at least "
                f"{low_mb:,}); {advice}"
            ),
        )
    return FitVerdict(card_mb=card, verdict=verdict, reason=reason)


def scaled(peak_mb: int, factors: tuple[float, float]) -> tuple[int, int]:
    return math.floor(peak_mb * factors[0]), math.ceil(peak_mb * factors[1])


def advice(request: TaskRequest) -> str:
    """What would make a task that does not fit its card fit."""
    if request.task_type is TaskType.INFERENCE:
        return (
            "more GPUs with tensor_parallel, a quantized model (model_config.quantization), "
            "a shorter context or smaller batch, or larger cards"
        )
    return (
        "more GPUs (ZeRO-3/FSDP shards the states), LoRA or QLoRA, gradient checkpointing, "
        "a smaller micro-batch or sequence, an 8-bit or offloaded optimizer, or larger cards"
    )
