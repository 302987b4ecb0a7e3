"""AllData's high-level job description (alldata_job.json: framework, model size, data volume),
which `POST /api/v1/resolve` turns into a full task request."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator

from crater.contracts.base import Contract
from crater.contracts.gpus import parse_gpu_product
from crater.contracts.tasks import (
    ALLDATA_IO_PATTERNS,
    ALLDATA_TASK_TYPES,
    IoPattern,
    Name,
    Precision,
    TaskId,
    TaskType,
    _one_of,
)


class Framework(StrEnum):
    """What the job runs on. Training frameworks shard the model states over the task's GPUs
    (FSDP / ZeRO-3, the predictor's default for data-parallel training); vLLM serves a model
    (an inference task, its weights split over the GPUs by tensor parallelism)."""

    PYTORCH = "pytorch"
    DEEPSPEED = "deepspeed"
    MEGATRON = "megatron"
    JAX = "jax"
    TENSORFLOW = "tensorflow"
    TRANSFORMERS = "transformers"
    VLLM = "vllm"


# The task kind a framework implies when the job does not say.
FRAMEWORK_TASK_TYPES: dict[Framework, TaskType] = {
    **{f: TaskType.FINE_TUNING for f in Framework},
    Framework.VLLM: TaskType.INFERENCE,
}

_NUMBER = r"\s*([0-9]+(?:\.[0-9]+)?)\s*"
_PARAMETERS = re.compile(rf"^{_NUMBER}([KMBT])\s*$", re.IGNORECASE)
_PARAMETER_UNITS = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
_BYTES = re.compile(rf"^{_NUMBER}([KMGTP]I?B|B)\s*$", re.IGNORECASE)
_BYTE_UNITS = {
    "B": 1,
    **{f"{p}B": 1000 ** (i + 1) for i, p in enumerate("KMGTP")},
    **{f"{p}IB": 1024 ** (i + 1) for i, p in enumerate("KMGTP")},
}
MODEL_SIZE_FORM = "a number and K, M, B or T parameters: 350M, 8B, 70B, 1.5T"
DATA_VOLUME_FORM = (
    "a number and a byte unit, decimal (B, KB, MB, GB, TB, PB) or binary (KiB ... PiB): "
    "500GB, 2TB, 1.5TiB"
)
MAX_PARAMETERS = 10e12  # as ModelSpec.parameters_billion's bound
MAX_DATA_BYTES = 500 * 10**12  # with a checkpoint and headroom, within an SSD request


def parse_parameters(text: str) -> float:
    """`8B` -> 8e9 parameters; ValueError naming the accepted form."""
    match = _PARAMETERS.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a model size; expected {MODEL_SIZE_FORM}")
    count = float(match.group(1)) * _PARAMETER_UNITS[match.group(2).upper()]
    if not 1 <= count <= MAX_PARAMETERS:
        raise ValueError(f"{text!r}: a model has 1 to 10T parameters")
    return count


def parse_bytes(text: str) -> int:
    """`2TB` -> 2e12 bytes, `1.5TiB` -> 1.5 * 2**40; ValueError naming the accepted form."""
    match = _BYTES.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a data volume; expected {DATA_VOLUME_FORM}")
    count = round(float(match.group(1)) * float(_BYTE_UNITS[match.group(2).upper()]))
    if count > MAX_DATA_BYTES:
        raise ValueError(f"{text!r}: at most {MAX_DATA_BYTES // 10**12:,} TB")
    return count


def _framework(value: object) -> object:
    if isinstance(value, str) and value.lower() in {f.value for f in Framework}:
        return Framework(value.lower())
    raise ValueError(f"must be one of {', '.join(f.value for f in Framework)}; got {value!r}")


class JobDescription(Contract):
    """AllData's job as its resolver sees it: framework, model size and data volume; the
    rest optional. `POST /api/v1/resolve` answers the task request to submit for it."""

    framework: Annotated[
        Framework, Field(description="pytorch, deepspeed, megatron, jax, tensorflow, ...")
    ]
    model_size: str = Field(
        max_length=32, description=f"Parameters: {MODEL_SIZE_FORM}.", examples=["8B"]
    )
    data_volume: str = Field(
        max_length=32,
        description=f"The dataset's size, staged on the node's SSD: {DATA_VOLUME_FORM}.",
        examples=["2TB"],
    )
    task_id: TaskId | None = Field(
        default=None, description="The task id of the answered request; unset: one is made."
    )
    task_type: TaskType | None = Field(
        default=None,
        description="Crater's kind or AllData's name (llm_finetune); unset: fine-tuning, "
        "inference for vllm.",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The model's name (meta-llama/Llama-3-8b-hf): a model in the predictor's "
        "catalog is sized by its real shape; unset or unknown: a transformer inferred from "
        "model_size.",
    )
    precision: Precision = Precision.BF16
    lora: bool = Field(default=False, description="Fine-tune low-rank adapters (LoRA) only.")
    gpu_type: str | None = Field(
        default=None,
        max_length=64,
        description="GPU product to run on (a100-pcie-40gb); its memory bounds the GPUs' "
        "count. Unset: any GPU, counted against 80 GB cards.",
    )
    gpus: int | None = Field(
        default=None, ge=1, le=8, description="GPUs to use; unset: the fewest that hold it."
    )
    io_pattern: IoPattern = Field(
        default=IoPattern.SEQUENTIAL, description="Crater's pattern or AllData's (random_read)."
    )
    pool: Name = "default"
    tenant: Name = "default"

    @field_validator("framework", mode="before")
    @classmethod
    def _known_framework(cls, value: object) -> object:
        return _framework(value)

    @field_validator("model_size")
    @classmethod
    def _model_size(cls, value: str) -> str:
        parse_parameters(value)
        return value

    @field_validator("data_volume")
    @classmethod
    def _data_volume(cls, value: str) -> str:
        parse_bytes(value)
        return value

    @field_validator("task_type", mode="before")
    @classmethod
    def _task_type(cls, value: object) -> object:
        return None if value is None else _one_of(TaskType, ALLDATA_TASK_TYPES, value)

    @field_validator("io_pattern", mode="before")
    @classmethod
    def _io_pattern(cls, value: object) -> object:
        return _one_of(IoPattern, ALLDATA_IO_PATTERNS, value)

    @field_validator("gpu_type")
    @classmethod
    def _known_product(cls, value: str | None) -> str | None:
        if value is not None:
            parse_gpu_product(value)
        return value

    @property
    def parameters(self) -> float:
        return parse_parameters(self.model_size)

    @property
    def data_bytes(self) -> int:
        return parse_bytes(self.data_volume)

    @property
    def kind(self) -> TaskType:
        return self.task_type or FRAMEWORK_TASK_TYPES[self.framework]
