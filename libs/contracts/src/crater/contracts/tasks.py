"""Tasks: the request AllData submits, and what becomes of it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import StrEnum
from functools import cache
from typing import Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    Field,
    GetJsonSchemaHandler,
    JsonValue,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from crater.contracts.base import MAX_ATTEMPT, MAX_EXACT_INT, Contract, Event, TaskEvent
from crater.contracts.gpus import parse_gpu_product
from crater.contracts.nodes import FABRIC_LEVELS, FabricLevel, Toleration
from crater.contracts.quantities import GBQuantity, MiBQuantity

TaskId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$",
        description="Caller-chosen id, unique per task: letters, digits, '.', '_', ':', '-'.",
    ),
]
Name = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
]


# Bounds of what a task asks its node agent to run.
COMMAND_ARGS_MAX = 256
COMMAND_ARG_MAX = 8192
ENV_VARIABLES_MAX = 128
ENV_VALUE_MAX = 8192
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

LabelKey = Annotated[str, Field(min_length=1, max_length=253)]
LabelValue = Annotated[str, Field(max_length=63)]


class TaskType(StrEnum):
    TRAINING = "training"
    FINE_TUNING = "fine-tuning"
    INFERENCE = "inference"
    EVALUATION = "evaluation"


# AllData's names for task kinds (it sends `llm_finetune`), each with Crater's kind.
ALLDATA_TASK_TYPES: dict[str, TaskType] = {
    "llm_pretrain": TaskType.TRAINING,
    "llm_train": TaskType.TRAINING,
    "llm_finetune": TaskType.FINE_TUNING,
    "llm_sft": TaskType.FINE_TUNING,
    "llm_lora": TaskType.FINE_TUNING,
    "llm_inference": TaskType.INFERENCE,
    "llm_serving": TaskType.INFERENCE,
    "llm_evaluation": TaskType.EVALUATION,
    "llm_eval": TaskType.EVALUATION,
}


def _accepted(own: type[StrEnum], aliases: Mapping[str, StrEnum]) -> str:
    return ", ".join([*(m.value for m in own), *aliases])


@cache
def _values(own: type[StrEnum]) -> frozenset[str]:
    """An enum's own names, once (every task request is checked against them)."""
    return frozenset(m.value for m in own)


def _one_of(own: type[StrEnum], aliases: Mapping[str, StrEnum], value: object) -> object:
    """Crater's own name, or one of AllData's turned into Crater's; else ValueError listing
    every accepted name (never a guess)."""
    if isinstance(value, own):
        return value
    if isinstance(value, str):
        if value in _values(own):
            return own(value)
        if value in aliases:
            return aliases[value]
    raise ValueError(f"must be one of {_accepted(own, aliases)}; got {value!r}")


def _as_sent(data: object, field: str, record: str, aliases: Mapping[str, StrEnum]) -> object:
    """Before validation: keep AllData's name of `field` in `record`."""
    if isinstance(data, dict) and isinstance(data.get(field), str) and data[field] in aliases:
        return {**data, record: data[field]}
    return data


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"


class Priority(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


# Numeric priorities run 0..1000, larger first; the named classes sit on that scale.
PRIORITY_MIN, PRIORITY_MAX = 0, 1000
# How long a placement waits for its node to report the task running (milliseconds, as
# AllData configures it: crater.reservation-timeout-ms), per task, per pool, or by default.
RESERVATION_TIMEOUT_MS_DEFAULT = 30_000
RESERVATION_TIMEOUT_MS_MIN = 1_000
RESERVATION_TIMEOUT_MS_MAX = 3_600_000
# A task's stated run time (expected, and the limit it is stopped at), in seconds: a year at
# most, so that an event time plus a limit never leaves the calendar.
RUN_SECONDS_MAX = 366 * 86_400

PRIORITY_VALUES = {Priority.LOW: 100, Priority.MEDIUM: 500, Priority.HIGH: 900}
PRIORITY_NAMES = frozenset(p.value for p in Priority)
NumericPriority = Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)]


def priority_value(priority: Priority | int) -> int:
    """A priority on the 0..1000 scale: low 100, medium 500, high 900, or the number given."""
    return PRIORITY_VALUES[priority] if isinstance(priority, Priority) else int(priority)


class TaskStatus(StrEnum):
    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.REJECTED}
)


# The most a model's config.json may weigh in a request, serialised (a Llama's is ~1 KiB;
# multimodal configs with a vision tower ~10 KiB).
HF_CONFIG_MAX_BYTES = 65_536
HF_CONFIG_PATH_PATTERN = r"^[A-Za-z0-9._@+-][A-Za-z0-9._/@+-]*$"


class ModelSpec(Contract):
    name: str = Field(
        min_length=1,
        max_length=200,
        description="The model: a Hugging Face id or a name in the predictor's catalog "
        "(meta-llama/Llama-3.1-8B-Instruct, Qwen2.5-7B); versions, -Instruct/-chat-hf "
        "suffixes and organisations find the architecture they name.",
        examples=["meta-llama/Llama-2-7b-hf"],
    )
    precision: Precision = Precision.FP16
    quantization: str | None = Field(default=None, max_length=32, examples=["gptq", "awq"])
    parameters_billion: float | None = Field(
        default=None, gt=0, le=10_000, description="Parameter count when the name is unknown."
    )
    hf_config: dict[str, JsonValue] | None = Field(
        default=None,
        description="The model's Hugging Face config.json as published with its weights "
        "(model_type, hidden_size, num_hidden_layers, num_attention_heads, "
        "num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings, the MoE "
        f"fields, ...): the predictor takes the model's shape from it, whatever its name. At "
        f"most {HF_CONFIG_MAX_BYTES // 1024} KiB.",
        examples=[
            {
                "model_type": "qwen2",
                "hidden_size": 3584,
                "intermediate_size": 18944,
                "num_hidden_layers": 28,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "vocab_size": 152064,
                "tie_word_embeddings": False,
            }
        ],
    )
    hf_config_path: str | None = Field(
        default=None,
        max_length=1024,
        pattern=HF_CONFIG_PATH_PATTERN,
        description="A config.json the predictor reads from its model directory "
        "(CRATER_PREDICTOR_MODEL_CONFIG_DIR), relative to it (no '..'); hf_config wins when "
        "both are given.",
        examples=["Qwen2.5-7B-Instruct/config.json"],
    )

    @field_validator("hf_config_path")
    @classmethod
    def _inside_the_directory(cls, value: str | None) -> str | None:
        if value is not None and ".." in value.split("/"):
            raise ValueError(f"{value!r} leaves the model directory ('..'): give a path inside it")
        return value

    @field_validator("hf_config")
    @classmethod
    def _config_size(cls, value: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        if value is not None:
            size = len(json.dumps(value, separators=(",", ":")))
            if size > HF_CONFIG_MAX_BYTES:
                raise ValueError(
                    f"{size} bytes: a config.json here is at most {HF_CONFIG_MAX_BYTES}"
                )
        return value


class IoPattern(StrEnum):
    SEQUENTIAL = "sequential"
    RANDOM = "random"
    MIXED = "mixed"


# AllData's names for io patterns (it sends `random_read`), each with Crater's pattern.
ALLDATA_IO_PATTERNS: dict[str, IoPattern] = {
    "sequential_read": IoPattern.SEQUENTIAL,
    "sequential_write": IoPattern.SEQUENTIAL,
    "random_read": IoPattern.RANDOM,
    "random_write": IoPattern.RANDOM,
    "mixed_read": IoPattern.MIXED,
    "mixed_read_write": IoPattern.MIXED,
    "read_write": IoPattern.MIXED,
}


class DataConfig(Contract):
    train_dataset: str | None = Field(default=None, max_length=1024)
    val_dataset: str | None = Field(default=None, max_length=1024)
    io_pattern: Annotated[
        IoPattern,
        WithJsonSchema(
            {"type": "string", "enum": [*(p.value for p in IoPattern), *ALLDATA_IO_PATTERNS]},
            mode="validation",
        ),
    ] = Field(
        default=IoPattern.SEQUENTIAL,
        description="Crater's pattern, or AllData's name for one (random_read: random, ...).",
    )
    io_pattern_as_sent: str | None = Field(
        default=None,
        description="AllData's name of the io pattern when it sent one (random_read); "
        "io_pattern holds Crater's.",
    )

    @model_validator(mode="before")
    @classmethod
    def _keep_alldata_name(cls, data: object) -> object:
        return _as_sent(data, "io_pattern", "io_pattern_as_sent", ALLDATA_IO_PATTERNS)

    @field_validator("io_pattern", mode="before")
    @classmethod
    def _io_pattern(cls, value: object) -> object:
        return _one_of(IoPattern, ALLDATA_IO_PATTERNS, value)

    @model_validator(mode="after")
    def _as_sent_agrees(self) -> DataConfig:
        sent = self.io_pattern_as_sent
        if sent is not None and ALLDATA_IO_PATTERNS.get(sent) is not self.io_pattern:
            raise ValueError(f"io_pattern_as_sent {sent!r} does not name {self.io_pattern}")
        return self


# `<compute slices>g.<memory GB>gb`, as nvidia-smi names MIG profiles (1g.10gb, 3g.40gb).
MIG_PROFILE_PATTERN = r"^[1-7]g\.[1-9][0-9]{0,3}gb$"


# A task's ordered GPU models: at most this many, waited for at most a week.
GPU_MODELS_MAX = 8
GPU_MODELS_WAIT_MAX = 7 * 86_400


class GpuModelsPolicy(StrEnum):
    """What a task whose models are ordered does when its first model is full."""

    NEXT = "next"  # take the first listed model that fits now
    WAIT = "wait"  # the first model only, up to models_wait_seconds; then as next
    # each model in order on its own pool, then borrowed from a cohort mate, before the next
    BORROW = "borrow"


class GpuRequirement(Contract):
    count: int = Field(default=0, ge=0, le=1024, description="Whole GPUs.")
    memory_mb: MiBQuantity = Field(
        default=0, ge=0, le=1_048_576, description="Memory per card, MiB, or a quantity (40Gi)."
    )
    type: str | None = Field(
        default=None,
        max_length=64,
        description="GPU product: <model>[-<form factor>][-<memory>gb] (a100-pcie-40gb: an A100, "
        "PCIe, 40 GB or more per card), or alternatives A|B. Matched against each node's cards.",
        examples=["A100", "a100-pcie-40gb", "h100-sxm-80gb", "rtx-4090"],
    )
    milli: int = Field(
        default=1000,
        ge=1,
        le=1000,
        description="Share of each card in thousandths; below 1000 (sharing) only with count 1.",
    )
    types: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=32,
        description="Allowed GPU models, any of them (with `type`, either one).",
        examples=[["A100", "H100"]],
    )
    # The three left out of the JSON when unset: a request without them reads byte for byte
    # as one made before they existed, so recorded inputs and decisions replay identically.
    models: list[str] | None = Field(
        default=None,
        max_length=GPU_MODELS_MAX,
        exclude_if=lambda models: models is None,
        description="GPU products in order of preference ('H100, else A100-80GB'): the task "
        "takes the first of them that fits (models_policy next), waits for the first up to "
        "models_wait_seconds (wait), or borrows each from a cohort mate before it takes the "
        "next (borrow); the grant says which it took and why. One product per entry, each "
        "once; not with type or types.",
        examples=[["h100", "a100-80gb"]],
    )
    models_policy: GpuModelsPolicy | None = Field(
        default=None,
        exclude_if=lambda policy: policy is None,
        description="With models: next (the default) takes the first listed model that fits "
        "now, as Kueue's flavor fungibility TryNextFlavor; wait places on the first model "
        "only until models_wait_seconds have passed since submission, then as next; borrow "
        "tries each model on its own pool, then on a cohort mate's idle nodes, before the "
        "next model (Kueue's whenCanBorrow: Borrow; without a cohort, as next).",
    )
    models_wait_seconds: int | None = Field(
        default=None,
        ge=1,
        le=GPU_MODELS_WAIT_MAX,
        validate_default=True,  # wait without it is refused, naming this field
        exclude_if=lambda seconds: seconds is None,
        description="With models_policy wait (required there): how long the task waits for "
        "its first model before it takes the next one that fits.",
    )
    mig_profile: str | None = Field(
        default=None,
        pattern=MIG_PROFILE_PATTERN,
        description="One MIG slice of this profile (e.g. 1g.10gb) instead of a whole card; "
        "count must be 1.",
        examples=["1g.10gb", "3g.40gb"],
    )
    pcie_bandwidth_gbps: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="Host-to-card PCIe bandwidth each granted card needs, GB/s one way: "
        "judged against the link's measured copy bandwidth, else its nominal figure "
        "(generation x width, after encoding); unset: any link.",
        examples=[25.0],
    )

    @field_validator("type")
    @classmethod
    def _known_products(cls, value: str | None) -> str | None:
        """Each alternative (`A|B`) a product Crater knows: `a100-pcie-40gb`, `t4`, ..."""
        for name in (value or "").split("|"):
            if name.strip():
                parse_gpu_product(name)
        return value

    @field_validator("types")
    @classmethod
    def _known_product_list(cls, value: list[str]) -> list[str]:
        for name in value:
            parse_gpu_product(name)
        return value

    @field_validator("models")
    @classmethod
    def _ordered_products(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        """Each entry one product Crater knows, listed once; not beside `type`/`types`."""
        if value is None:
            return value
        if not value:
            raise ValueError(
                "an empty list: give the products in order of preference, or leave "
                "models out for any model"
            )
        if info.data.get("type") or info.data.get("types"):
            raise ValueError(
                "models orders the products itself: give models, or type/types, not both"
            )
        seen: dict[str, int] = {}
        for position, name in enumerate(value, 1):
            if "|" in name:
                raise ValueError(
                    f"entry {position} ({name!r}) names alternatives: one product "
                    "per entry, the list's order says which is preferred"
                )
            try:
                key = str(parse_gpu_product(name))
            except ValueError as error:
                raise ValueError(f"entry {position}: {error}") from None
            if key in seen:
                raise ValueError(
                    f"entries {seen[key]} and {position} ({value[seen[key] - 1]!r}, "
                    f"{name!r}) name the same product {key}: list each once"
                )
            seen[key] = position
        return value

    @field_validator("models_policy")
    @classmethod
    def _policy_with_models(
        cls, value: GpuModelsPolicy | None, info: ValidationInfo
    ) -> GpuModelsPolicy | None:
        # (a `models` that failed its own check is not in info.data: one error, not two)
        if value is not None and "models" in info.data and not info.data["models"]:
            raise ValueError("a policy for the order of models is given without models")
        return value

    @field_validator("models_wait_seconds")
    @classmethod
    def _wait_with_wait_policy(cls, value: int | None, info: ValidationInfo) -> int | None:
        if "models_policy" not in info.data:
            return value  # the policy failed its own check: that error says it
        waits = info.data["models_policy"] is GpuModelsPolicy.WAIT
        if value is not None and not waits:
            raise ValueError("a wait for the first model is set only with models_policy wait")
        if value is None and waits:
            raise ValueError(
                "models_policy wait needs models_wait_seconds: how long to wait for the first "
                "model before taking the next"
            )
        return value

    @model_validator(mode="after")
    def _sharing_is_one_card(self) -> GpuRequirement:
        if self.milli < 1000 and self.count != 1:
            raise ValueError("milli below 1000 shares one card: count must be 1")
        if self.mig_profile is not None and (self.count != 1 or self.milli < 1000):
            raise ValueError("mig_profile asks for one MIG slice: count must be 1, milli unset")
        return self


class CpuRequirement(Contract):
    cores: int = Field(default=1, ge=0, le=4096)
    avx_support: Literal["avx", "avx2", "avx512"] | None = None


# Host memory held for a task that does not say, when nothing predicts it either.
DEFAULT_HOST_MEMORY_MB = 1024


class MemoryRequirement(Contract):
    capacity_mb: MiBQuantity | None = Field(
        default=None,
        ge=0,
        le=64 * 1_048_576,
        description="Host memory, MiB, or a quantity (64Gi); unset: what the predictor "
        f"predicts the task needs ({DEFAULT_HOST_MEMORY_MB} MiB without a prediction).",
    )
    bandwidth_gbps: float | None = Field(default=None, gt=0, le=100_000)


class SsdRequirement(Contract):
    capacity_gb: GBQuantity = Field(
        default=0,
        ge=0,
        le=1_048_576,
        description="Local SSD space, decimal GB (10^9 bytes, as disks are sold), or a quantity "
        "(500Gi: 537 GB).",
    )
    iops_min: int | None = Field(default=None, ge=0, le=100_000_000)
    latency_us_max: int | None = Field(default=None, gt=0, le=10_000_000)


# The flat keys operators type (`{"gpu": 2, "gpu_memory": "40Gi"}`), each with the nested
# field it stands for.
FLAT_RESOURCE_KEYS: dict[str, tuple[str, str]] = {
    "gpu": ("gpu", "count"),
    "gpu_count": ("gpu", "count"),
    "gpu_memory": ("gpu", "memory_mb"),
    "gpu_type": ("gpu", "type"),
    "gpu_models": ("gpu", "models"),
    "cpu": ("cpu", "cores"),
    "memory": ("memory", "capacity_mb"),
    "ssd": ("ssd", "capacity_gb"),
}
NESTED_RESOURCE_KEYS = ("gpu", "cpu", "memory", "ssd")


def _unflatten(data: dict[str, object]) -> dict[str, object]:
    """The nested form of a request that may use flat keys; ValueError naming the key when a
    key is unknown, or a resource is given both nested and flat, or one field twice."""
    nested = {
        k: v
        for k, v in data.items()
        if k in NESTED_RESOURCE_KEYS and isinstance(v, Mapping | BaseModel)
    }
    flat: dict[str, dict[str, object]] = {}
    set_by: dict[tuple[str, str], str] = {}  # nested field -> the flat key that set it
    for key, value in data.items():
        if key in nested:
            continue
        if key not in FLAT_RESOURCE_KEYS:
            raise ValueError(
                f"unknown key {key!r}; accepted: {', '.join(NESTED_RESOURCE_KEYS)} (nested "
                f"objects) or the flat keys {', '.join(FLAT_RESOURCE_KEYS)}"
            )
        resource, field = FLAT_RESOURCE_KEYS[key]
        if resource in nested:
            raise ValueError(
                f"{key!r} is flat but {resource!r} is nested: give {resource} in one form "
                f"(nested: {resource}.{field})"
            )
        if (resource, field) in set_by:
            raise ValueError(f"{set_by[resource, field]!r} and {key!r} both set {resource}.{field}")
        set_by[resource, field] = key
        flat.setdefault(resource, {})[field] = value
    return {**nested, **flat}


class ResourceRequirements(Contract):
    """Per resource, nested (`{"gpu": {"count": 2, "memory_mb": 40960}}`) or flat as operators
    type it (`{"gpu": 2, "gpu_memory": "40Gi"}`; keys gpu, gpu_count, gpu_memory, gpu_type,
    gpu_models, cpu, memory, ssd); sizes in the field's unit or as Kubernetes quantities
    (40Gi). Kept nested."""

    gpu: GpuRequirement = Field(default_factory=GpuRequirement)
    cpu: CpuRequirement = Field(default_factory=CpuRequirement)
    memory: MemoryRequirement = Field(default_factory=MemoryRequirement)
    ssd: SsdRequirement = Field(default_factory=SsdRequirement)

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, data: object) -> object:
        return _unflatten(data) if isinstance(data, dict) else data

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The nested form, or the flat one, each key described by the field it sets."""
        nested = handler.resolve_ref_schema(handler(core_schema))
        models: dict[str, type[Contract]] = {
            "gpu": GpuRequirement,
            "cpu": CpuRequirement,
            "memory": MemoryRequirement,
            "ssd": SsdRequirement,
        }
        properties = {}
        for key, (resource, field) in FLAT_RESOURCE_KEYS.items():
            schema = dict(models[resource].model_json_schema()["properties"][field])
            schema.pop("title", None)
            schema["description"] = f"Flat form of {resource}.{field}."
            properties[key] = schema
        flat = {
            "type": "object",
            "title": "Flat resource requirements",
            "additionalProperties": False,
            "properties": properties,
        }
        return {"anyOf": [nested, flat], "description": nested.get("description", "")}


class Sla(Contract):
    max_queue_time_seconds: int | None = Field(default=None, gt=0, le=30 * 86_400)
    min_gpu_utilization_percent: float | None = Field(default=None, ge=0, le=100)


class Affinity(Contract):
    gpu: Literal["same-node", "any"] | None = Field(
        default=None,
        description=(
            "A task's GPUs are always on one node. For a gang (gang_size > 1): 'same-node' "
            "puts every member on one node; 'any' or unset lets members spread across nodes."
        ),
    )
    numa: Literal["strict", "best-effort", "none"] = "best-effort"


class AntiAffinity(Contract):
    group: str | None = Field(
        default=None, max_length=128, description="Replicas of one group avoid sharing a node."
    )


class NetworkTopology(Contract):
    """Where a gang's members go in the network fabric between nodes (nodes declare their
    place: NodeTopology.fabric), as Kueue's podset-required-topology and
    podset-preferred-topology: `required` keeps every member within one domain of that level
    or the gang waits; `preferred` tries one domain of that level first, then looser levels
    (up to `required`, else anywhere). Either way the members' ranks follow the fabric: those
    sharing a domain are consecutive, so a ring crosses each switch as few times as it can."""

    required: FabricLevel | None = Field(
        default=None,
        description="Every member within one domain of this level (one NVLink domain, under "
        "one leaf switch, under one spine), on nodes that declare it; else the gang waits.",
    )
    preferred: FabricLevel | None = Field(
        default=None,
        description="One domain of this level if the gang fits in one now, else the next "
        "looser level; at least as tight as `required`.",
    )

    @model_validator(mode="after")
    def _levels(self) -> NetworkTopology:
        if self.required is None and self.preferred is None:
            raise ValueError("name a required or a preferred level (nvlink-domain, leaf, spine)")
        if (
            self.required is not None
            and self.preferred is not None
            and FABRIC_LEVELS.index(self.preferred) > FABRIC_LEVELS.index(self.required)
        ):
            raise ValueError(
                f"preferred {self.preferred.value} is looser than required "
                f"{self.required.value}: every placement is within one {self.required.value}"
            )
        return self

    @property
    def levels(self) -> tuple[FabricLevel | None, ...]:
        """The levels a placement tries, tightest first; None: anywhere (nothing required)."""
        first = self.preferred or self.required
        assert first is not None
        start = FABRIC_LEVELS.index(first)
        if self.required is None:
            return (*FABRIC_LEVELS[start:], None)
        return FABRIC_LEVELS[start : FABRIC_LEVELS.index(self.required) + 1]


class Optimizer(StrEnum):
    """The optimizer and where it keeps its states."""

    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"  # with momentum: one state
    SGD_PLAIN = "sgd-plain"  # momentum 0 (PyTorch's default, Trainer's optim=sgd, LOMO): none
    LION = "lion"  # one state (Chen et al. 2023)
    ADAFACTOR = "adafactor"  # factored second moment, no first moment (Shazeer & Stern 2018)
    ADAM_8BIT = "adam8bit"  # bitsandbytes: both states block-wise in 8 bits
    ADAMW_8BIT = "adamw8bit"
    PAGED_ADAMW = "paged-adamw"  # bitsandbytes paged: states in CUDA managed memory
    PAGED_ADAMW_8BIT = "paged-adamw8bit"


class CrossEntropy(StrEnum):
    """How the LM head's logits meet the loss."""

    FULL = "full"  # every token's logits at once, upcast to fp32 for the loss
    CHUNKED = "chunked"  # the loss over chunks of tokens: 16-bit logits, fp32 one chunk at once
    FUSED = "fused"  # head and loss fused (Liger, Cut Cross-Entropy): no logits kept


class CheckpointPolicy(StrEnum):
    """What activation (gradient) checkpointing keeps for backward and what it recomputes."""

    NONE = "none"  # every layer's activations kept
    FULL = "full"  # HF gradient_checkpointing_enable: each block's input kept, block recomputed
    SELECTIVE = "selective"  # Megatron-LM selective: only the attention core (s^2) recomputed
    SELECTIVE_OP = "selective-op"  # torchtitan op-level: every other matmul's output kept
    OFFLOADED = "offloaded"  # Unsloth "unsloth": as full, the kept inputs moved to host memory
    EVERY_K = "every-k"  # torchtune ac_option=k: every k-th block checkpointed, others kept


class Sharding(StrEnum):
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"


class LoraConfig(Contract):
    """Low-rank adapters (LoRA; QLoRA when the frozen base is quantized to 4 bits)."""

    rank: int = Field(default=8, ge=1, le=4096)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        min_length=1,
        max_length=32,
        description="Modules adapted, by any framework's name (q_proj, c_attn, "
        "query_key_value, W_pack, gate_up_proj, lm_head, ...), or all-linear.",
        examples=[["q_proj", "v_proj"], ["all-linear"]],
    )
    quantize_base: bool = Field(
        default=False,
        description="QLoRA: frozen base in 4-bit NF4 with double quantization (bitsandbytes); "
        "for another scheme, name it in model_config.quantization.",
    )
    dropout: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapters' inputs (PEFT lora_dropout): above 0, each "
        "adapted module keeps a copy of its input and a mask for backward.",
    )
    train_embeddings: bool = Field(
        default=False,
        description="The embedding and LM head trained in full alongside the adapters (PEFT "
        "modules_to_save), as a base model learning new tokens needs.",
    )


class TrainingConfig(Contract):
    """How a training or fine-tuning task runs; every field optional (defaults sensible)."""

    batch_size: int = Field(default=1, ge=1, le=1_000_000, description="Micro-batch per GPU.")
    sequence_length: int | None = Field(
        default=None, ge=1, le=1 << 24, description="Tokens per sample; unset: model's context."
    )
    optimizer: Optimizer = Optimizer.ADAMW
    master_weights: bool | None = Field(
        default=None,
        description="An fp32 master copy of the trained weights beside the 16-bit ones, with "
        "fp32 optimizer states (AMP, DeepSpeed, Megatron). False: pure 16-bit training, the "
        "optimizer's states in the weights' dtype (a model loaded in bf16 under the Trainer, "
        "LitGPT bf16-true, torchtune). Unset: true for fp16/bf16, none for fp32.",
    )
    optimizer_in_backward: bool = Field(
        default=False,
        description="Each parameter stepped as soon as its gradient is ready, which is then "
        "freed (torchtune optimizer_in_bwd): no full set of gradients is held.",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Full recomputation (Hugging Face gradient_checkpointing_enable); "
        "checkpoint_policy, when set, says which policy instead.",
    )
    checkpoint_policy: CheckpointPolicy | None = Field(
        default=None,
        description="Which checkpointing: none, full (each block's input kept, the block "
        "recomputed in backward), selective (Megatron-LM: only the attention core's s^2 "
        "scores, softmax and dropout recomputed), selective-op (torchtitan's op-level "
        "selective AC: the block's input, every other matmul's output and the attention's "
        "output kept, the rest recomputed), offloaded (Unsloth: as full, the kept "
        "inputs moved to host memory, predicted there) or every-k (torchtune ac_option: "
        "every checkpoint_every-th block checkpointed). Unset: full when "
        "gradient_checkpointing, else none.",
    )
    checkpoint_every: int = Field(
        default=2,
        ge=1,
        le=1024,
        description="For checkpoint_policy every-k: one block in this many checkpointed.",
    )
    offload_activations: bool = Field(
        default=False,
        description="Saved activations moved to host memory until backward needs them "
        "(torchtune enable_activation_offloading, DeepSpeed cpu_checkpointing).",
    )
    flash_attention: bool = Field(default=True, description="No s^2 attention scores kept.")
    cross_entropy: CrossEntropy = Field(
        default=CrossEntropy.FULL,
        description="How the logits meet the loss: full (every token's fp32 logits at "
        "once), chunked (LitGPT, torchtune CEWithChunkedOutputLoss) or fused (Liger, Cut "
        "Cross-Entropy, Unsloth).",
    )
    task_head: Literal["lm", "classification"] = Field(
        default="lm",
        description="lm: logits over the vocabulary (causal or masked LM, seq2seq); "
        "classification: a small head (sequence or token classification), no vocabulary "
        "logits.",
    )
    torch_compile: bool = Field(
        default=False, description="torch.compile on (recorded; its saving is not modelled)."
    )
    zero_stage: int | None = Field(
        default=None, ge=0, le=3, description="ZeRO/FSDP stage; unset: 3 when data-parallel."
    )
    sharding: Sharding = Field(
        default=Sharding.DEEPSPEED,
        description="What shards the states at zero_stage: DeepSpeed ZeRO (its fp32 gradient "
        "partition, 4x the largest layer gathered at stage 3) or PyTorch FSDP (stage 3: "
        "FULL_SHARD, 2: SHARD_GRAD_OP; one transformer block gathered at a time).",
    )
    full_model_per_rank: bool = Field(
        default=False,
        description="Every data-parallel rank builds the whole model on its GPU and keeps it "
        "there beside the shards (FSDP wrapping a module already moved to the GPU, as "
        "LitGPT's 2023 multi-GPU fine-tuning did): the whole model's weights add to each "
        "GPU's sharded states. False: only the shard reaches the GPU (meta-device or host "
        "initialisation).",
    )
    offload_optimizer: bool = Field(
        default=False,
        description="Optimizer states, fp32 master weights and gradients in host memory "
        "(ZeRO-Offload, FSDP CPUOffload): predicted in host memory.",
    )
    offload_parameters: bool = Field(
        default=False,
        description="Parameters in host memory, gathered a layer at a time (ZeRO-3 "
        "offload_param, FSDP CPUOffload); needs zero_stage 3.",
    )
    data_parallel: int | None = Field(default=None, ge=1, le=65_536)
    tensor_parallel: int = Field(default=1, ge=1, le=1024)
    pipeline_parallel: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Pipeline stages: the layers split over this many cards in sequence.",
    )
    lora: LoraConfig | None = None
    checkpoint_interval_steps: int = Field(default=1000, ge=1, le=10_000_000)
    sample_bytes: int | None = Field(
        default=None, ge=1, le=1 << 34, description="Bytes read from disk per sample."
    )

    @property
    def recompute(self) -> CheckpointPolicy:
        """The checkpointing policy in effect: the named one, else full for the bool."""
        if self.checkpoint_policy is not None:
            return self.checkpoint_policy
        return CheckpointPolicy.FULL if self.gradient_checkpointing else CheckpointPolicy.NONE


class InferenceEngine(StrEnum):
    GENERATE = "generate"  # Transformers generate(): a KV cache as long as each sequence
    PAGED = "paged"  # vLLM, SGLang, TGI: the card preallocated to a memory fraction


class MetricsFormat(StrEnum):
    """How the autoscaler reads an inference replica's load (docs/autoscaling.md, Reading
    real replicas)."""

    CRATER = "crater"  # the replica (or its router) publishes inference.latency itself
    VLLM = "vllm"  # scraped: vLLM's /metrics
    TGI = "tgi"  # scraped: text-generation-inference's /metrics
    TRITON = "triton"  # scraped: Triton Inference Server's metrics port
    ASGI = "asgi"  # scraped: a home-grown server's page from crater_client.serving


class InferenceMetrics(Contract):
    """Where an inference replica exposes its load, for the autoscaler to read."""

    format: MetricsFormat = Field(
        default=MetricsFormat.CRATER,
        description="crater: the replica publishes its samples on NATS (inference.latency), "
        "nothing is scraped; vllm, tgi, triton: the autoscaler scrapes the server's "
        "Prometheus endpoint every CRATER_AUTOSCALER_SCRAPE_INTERVAL_SECONDS; asgi: the same "
        "for a home-grown server wrapped in crater_client.serving.ServingMetrics.",
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="The metrics port on the replica's node: the URL is http://<the node's "
        "hostname>:<port><path> (vLLM: its API port, 8000; TGI: its port, 80 in its image; "
        "Triton: 8002).",
    )
    path: str = Field(
        default="/metrics",
        min_length=1,
        max_length=512,
        pattern=r"^/[^\s]*$",
        description="The metrics path on that port.",
    )
    url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="The whole URL instead of port and path (a replica behind a proxy); "
        "'{host}' in it is replaced by the node's hostname.",
    )

    @model_validator(mode="after")
    def _an_endpoint_to_scrape(self) -> InferenceMetrics:
        if self.format is not MetricsFormat.CRATER and self.port is None and self.url is None:
            raise ValueError(f"format {self.format.value} is scraped: give a port or a url")
        return self


class InferenceConfig(Contract):
    batch_size: int = Field(default=1, ge=1, le=1_000_000, description="Concurrent sequences.")
    context_length: int | None = Field(
        default=None, ge=1, le=1 << 24, description="Prompt + generated tokens; unset: model's."
    )
    prompt_length: int | None = Field(
        default=None,
        ge=1,
        le=1 << 24,
        description="Tokens of the prompt, encoded at once before the first generated token "
        "(the prefill's workspace scales with it); unset: the whole context_length.",
    )
    kv_cache_dtype: Literal["auto", "fp32", "fp16", "bf16", "fp8", "int8", "int4"] = "auto"
    tensor_parallel: int = Field(default=1, ge=1, le=1024)
    engine: InferenceEngine = Field(
        default=InferenceEngine.GENERATE,
        description="generate: Transformers' generate (weights, the KV cache of every "
        "sequence, the prompt's prefill); paged: a serving engine (vLLM, SGLang, TGI) that "
        "takes gpu_memory_utilization of the card up front.",
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Paged engines: the share of each card taken (vLLM's "
        "--gpu-memory-utilization; unset: 0.9).",
    )
    flash_attention: bool = Field(
        default=True,
        description="No s^2 attention scores kept while the prompt is encoded. False: eager "
        "attention, each layer's scores and their fp32 softmax materialised over the prompt.",
    )
    prompt_logits: bool = Field(
        default=False,
        description="generate() computes the logits of every prompt token, upcast to fp32 "
        "(Transformers before 4.45, without num_logits_to_keep), not the last token's only.",
    )
    metrics: InferenceMetrics | None = Field(
        default=None,
        description="Where each replica exposes its load for the autoscaler; None: the replica "
        "publishes its samples itself (format crater).",
    )


class RestartOn(StrEnum):
    """What ends an attempt that may be retried."""

    FAILURE = "failure"  # the task failed, or never confirmed its reservation
    PREEMPTION = "preemption"
    NODE_LOST = "node-lost"


class AttemptFailure(StrEnum):
    """Why a failed attempt failed, as far as the scheduler can tell: what a restart policy's
    `on_failure_kinds` keys on."""

    EXIT_CODE = "exit-code"  # its launcher or node reported it failed (with a code or not)
    OOM = "oom"  # reported failed out of memory (`TaskStatusReported.out_of_memory`)
    NODE_FAULT = "node-fault"  # ended by the scheduler: its card or node was cordoned
    OTHER = "other"  # no report of its end: a reservation never confirmed, an orphan, silence


class OnExitCodes(Contract):
    """Which failed attempts are retried, by their exit code (a Kubernetes Job's
    `podFailurePolicy` `onExitCodes`): `In` retries only those codes, `NotIn` all but them (a
    code that says the task itself is wrong, such as a bad argument, is not worth a retry).
    A failure reported without an exit code is retried as `when` says."""

    operator: Literal["In", "NotIn"]
    values: list[Annotated[int, Field(ge=-255, le=255)]] = Field(min_length=1, max_length=255)


class RestartPolicy(Contract):
    """Whether a task whose attempt ended badly goes back to the queue, and how often.

    Like a Kubernetes Job's `backoffLimit`: an attempt that ends for one of `when` is followed by
    another after `backoff_seconds` (doubled for each further attempt, capped), until
    `max_attempts` attempts have run; the last one's end is the task's."""

    # Not `on`: YAML 1.1 reads a bare `on:` key as true, in the pools file it would not parse.
    when: list[RestartOn] = Field(
        default_factory=list, max_length=3, description="Endings to retry; empty: never."
    )
    max_attempts: int = Field(
        default=3, ge=1, le=100, description="Attempts in all, the first included."
    )
    backoff_seconds: float = Field(
        default=10.0, ge=0, le=86_400, description="Wait before the second attempt; doubles."
    )
    max_backoff_seconds: float = Field(default=600.0, ge=0, le=86_400)
    on_exit_codes: OnExitCodes | None = Field(
        default=None,
        description="Of failed attempts, retry only those whose exit code this matches; "
        "unset: every failure (when `failure` is listed).",
    )
    # Left out of the JSON when None: a policy without it reads byte for byte as before.
    on_failure_kinds: list[AttemptFailure] | None = Field(
        default=None,
        min_length=1,
        max_length=4,
        exclude_if=lambda kinds: kinds is None,
        description="Of failed attempts, retry only those of these kinds: exit-code (its "
        "launcher reported it failed; on_exit_codes then judges the code), oom (reported out "
        "of memory), node-fault (its card or node was cordoned for a fault), other (no "
        "report: an unconfirmed reservation, an orphan, a silent task); unset: every kind "
        "(when `failure` is listed).",
        examples=[["oom", "node-fault"]],
    )

    def backoff_before(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt` (2, 3, ...)."""
        return min(self.backoff_seconds * 2.0 ** max(attempt - 2, 0), self.max_backoff_seconds)

    def retries_kind(self, kind: AttemptFailure | None) -> bool:
        """Whether a failed attempt of `kind` may be retried (None: not a failure)."""
        return self.on_failure_kinds is None or kind is None or kind in self.on_failure_kinds

    def retries_exit_code(self, code: int | None) -> bool:
        """Whether a failure that exited with `code` may be retried (None: no code said)."""
        if self.on_exit_codes is None or code is None:
            return True
        listed = code in self.on_exit_codes.values
        return listed if self.on_exit_codes.operator == "In" else not listed


class TaskRequest(Contract):
    """The body of `POST /api/v1/schedule`, and of the task-submitted event."""

    task_id: TaskId
    task_type: Annotated[
        TaskType,
        WithJsonSchema(
            {"type": "string", "enum": [*(t.value for t in TaskType), *ALLDATA_TASK_TYPES]},
            mode="validation",
        ),
    ] = Field(description="Crater's kind, or AllData's name for one (llm_finetune: fine-tuning).")
    task_type_as_sent: str | None = Field(
        default=None,
        description="AllData's name of the task kind when it sent one (llm_finetune); "
        "task_type holds Crater's.",
    )
    model_spec: ModelSpec = Field(alias="model_config")
    data_config: DataConfig = Field(default_factory=DataConfig)
    resource_requirements: ResourceRequirements = Field(default_factory=ResourceRequirements)
    sla: Sla = Field(default_factory=Sla)
    pool: Name = "default"
    tenant: Name = "default"
    # The two left out of the JSON when unset, as the run times below.
    user: Name | None = Field(
        default=None,
        exclude_if=lambda user: user is None,
        description="Who submits it, inside its tenant: the quotas file's per-user limits "
        "(running GPUs, queued tasks, notebooks) count by it. None: no per-user limit applies.",
        examples=["alice"],
    )
    interactive: bool = Field(
        default=False,
        exclude_if=lambda interactive: not interactive,
        description="A notebook or another interactive session: counts against its user's "
        "notebooks limit (quotas file).",
    )
    priority: Priority | NumericPriority = Field(
        default=Priority.MEDIUM,
        description="high/medium/low, or 0..1000 (larger first; low 100, medium 500, high 900).",
    )
    preemptible: bool = False
    affinity: Affinity = Field(default_factory=Affinity)
    anti_affinity: AntiAffinity = Field(default_factory=AntiAffinity)
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Only nodes carrying every one of these labels.",
        examples=[{"crater.ai/gpu-vendor": "nvidia"}],
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Node taints this task accepts."
    )
    gang_size: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Members placed all or nothing, each with the whole resource request.",
    )
    # Left out of the JSON when unset, as max_run_seconds below.
    network_topology: NetworkTopology | None = Field(
        default=None,
        exclude_if=lambda topology: topology is None,
        description="Where a gang's members go in the network fabric between nodes: within "
        "one NVLink domain, leaf switch or spine, required or preferred; their ranks follow "
        "the fabric. None: anywhere, ranks by score (still along the fabric where nodes "
        "declare it).",
        examples=[{"required": "leaf", "preferred": "nvlink-domain"}],
    )
    training_config: TrainingConfig | None = None
    inference_config: InferenceConfig | None = None
    restart_policy: RestartPolicy | None = Field(
        default=None,
        description="Retry an attempt that failed, was preempted or lost its node; None: the "
        "pool's policy (pools file), else never.",
    )
    command: list[Annotated[str, Field(min_length=1, max_length=COMMAND_ARG_MAX)]] | None = Field(
        default=None,
        min_length=1,
        max_length=COMMAND_ARGS_MAX,
        description="What to run, as argv (no shell): a node agent with execution switched on "
        "(CRATER_PROBE_EXECUTE) runs it as a process pinned to the granted cores; None: the "
        "task is started by a launcher of its own, which confirms it.",
        examples=[["python", "train.py", "--epochs", "3"]],
    )
    env: dict[str, Annotated[str, Field(max_length=ENV_VALUE_MAX)]] = Field(
        default_factory=dict,
        max_length=ENV_VARIABLES_MAX,
        description="Variables added to the command's environment; CRATER_* names are Crater's "
        "own (the task environment) and refused.",
        examples=[{"OMP_NUM_THREADS": "4"}],
    )
    working_dir: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Absolute directory the command starts in, on the node; None: the "
        "attempt's own run directory.",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Container image for node agents with a container runtime; the local "
        "agent runs processes directly and fails a task naming one, saying why.",
    )
    reservation_timeout_ms: int | None = Field(
        default=None,
        ge=RESERVATION_TIMEOUT_MS_MIN,
        le=RESERVATION_TIMEOUT_MS_MAX,
        description="How long a placement is held for the task's node to report it running "
        "before it is released (expired), in milliseconds (AllData's "
        "crater.reservation-timeout-ms); None: the pool's (pools file), else the scheduler's "
        f"(default {RESERVATION_TIMEOUT_MS_DEFAULT}).",
    )

    # Both left out of the JSON when unset: a request without them reads byte for byte as
    # one made before they existed, so recorded inputs and decisions replay identically.
    max_run_seconds: int | None = Field(
        default=None,
        ge=1,
        le=RUN_SECONDS_MAX,
        exclude_if=lambda seconds: seconds is None,
        description="Time limit: once the task has held its grant this long it is told to "
        "checkpoint and stop (task.preempted with time_limit_seconds, the pool's grace "
        "period), and released at the end of the grace (release reason time-limit); never "
        "retried for it. None: the pool's max_run_seconds (pools file), else no limit.",
    )
    expected_run_seconds: int | None = Field(
        default=None,
        ge=1,
        le=RUN_SECONDS_MAX,
        exclude_if=lambda seconds: seconds is None,
        description="How long the task is expected to run, for the start-time estimates of "
        "the tasks waiting behind it; at most max_run_seconds. None: its limit stands for it.",
    )

    @field_validator("expected_run_seconds")
    @classmethod
    def _expected_within_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        limit = info.data.get("max_run_seconds")
        if value is not None and limit is not None and value > limit:
            raise ValueError(
                f"{value} s is more than max_run_seconds ({limit} s): a task is stopped at its "
                "limit, so it cannot be expected to run longer"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _keep_alldata_name(cls, data: object) -> object:
        return _as_sent(data, "task_type", "task_type_as_sent", ALLDATA_TASK_TYPES)

    @field_validator("task_type", mode="before")
    @classmethod
    def _task_type(cls, value: object) -> object:
        return _one_of(TaskType, ALLDATA_TASK_TYPES, value)

    @model_validator(mode="after")
    def _as_sent_agrees(self) -> TaskRequest:
        sent = self.task_type_as_sent
        if sent is not None and ALLDATA_TASK_TYPES.get(sent) is not self.task_type:
            raise ValueError(f"task_type_as_sent {sent!r} does not name {self.task_type}")
        return self

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_named_or_numeric(cls, value: object) -> object:
        """One clear reason for a bad priority, not one per member of the union."""
        if isinstance(value, str) and value in PRIORITY_NAMES:
            return Priority(str(value))
        numeric = isinstance(value, int) and not isinstance(value, bool)
        if numeric and PRIORITY_MIN <= value <= PRIORITY_MAX:  # type: ignore[operator]
            return value
        raise ValueError(
            f"must be high, medium, low or an integer {PRIORITY_MIN}..{PRIORITY_MAX}; got {value!r}"
        )

    @field_validator("command")
    @classmethod
    def _command_args(cls, value: list[str] | None) -> list[str] | None:
        for index, arg in enumerate(value or ()):
            if "\x00" in arg:
                raise ValueError(f"argument {index} contains a NUL byte")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if name.upper().startswith("CRATER_"):
                raise ValueError(
                    f"{name!r} is refused: CRATER_* variables are set by Crater (the task "
                    "environment), a task cannot override them"
                )
            if not ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a variable name (letters, digits and '_', not starting "
                    "with a digit)"
                )
            if "\x00" in text:
                raise ValueError(f"the value of {name!r} contains a NUL byte")
        return value

    @field_validator("working_dir")
    @classmethod
    def _working_dir_absolute(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or "\x00" in value):
            raise ValueError(f"{value!r} must be an absolute path (starting with '/')")
        return value

    @model_validator(mode="after")
    def _gpu_memory_needs_gpus(self) -> TaskRequest:
        gpu = self.resource_requirements.gpu
        if gpu.memory_mb and not gpu.count:
            raise ValueError(
                "resource_requirements.gpu.memory_mb is set but gpu.count is 0: ask for GPUs"
            )
        return self


class TaskSubmitted(TaskRequest, Event):
    """AllData asked for a task to be placed."""

    @classmethod
    def from_request(cls, request: TaskRequest) -> TaskSubmitted:
        return cls.model_validate(request.model_dump())

    def request(self) -> TaskRequest:
        return TaskRequest.model_validate(self.model_dump(exclude=set(Event.model_fields)))


class Confidence(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class TimelinePoint(Contract):
    """GPU memory at one moment of a training step, per card."""

    step: int = Field(ge=0)
    phase: str = Field(examples=["forward", "backward", "optimizer", "checkpoint"])
    seconds: float = Field(ge=0, description="Since the first step began.")
    gpu_memory_mb: int = Field(ge=0)


class TrainingTimeline(Contract):
    """Memory through forward, backward and the optimizer step; checkpoints; data read."""

    step_seconds: float = Field(ge=0)
    samples_per_second: float = Field(ge=0, description="Per node.")
    dataset_read_mb_per_s: float = Field(ge=0, description="Per node, to keep the GPUs fed.")
    checkpoint_size_mb: int = Field(ge=0, description="Written by the node per checkpoint.")
    checkpoint_write_mb_per_s: float = Field(gt=0)
    checkpoint_seconds: float = Field(ge=0)
    checkpoint_interval_steps: int = Field(ge=1)
    points: list[TimelinePoint] = Field(default_factory=list)


class CardFit(StrEnum):
    FITS = "fits"  # even the upper end of the predicted range fits the card
    TIGHT = "tight"  # the prediction fits, the upper end of its range does not
    DOES_NOT_FIT = "does-not-fit"  # the prediction itself is over the card: expect OOM


class FitVerdict(Contract):
    """Whether the task fits the card its request names."""

    card_mb: int = Field(
        ge=0,
        le=MAX_EXACT_INT,
        description="Memory per card the request names: gpu.memory_mb, else what a card of "
        "the product and size in gpu.type reports (an A100 80GB: 81,920 MiB).",
    )
    verdict: CardFit
    reason: str = Field(max_length=2048)


class ResourcePrediction(Contract):
    gpu_memory_per_gpu_mb: int = Field(ge=0, description="Predicted peak per card.")
    host_memory_mb: int = Field(ge=0)
    breakdown_mb: dict[str, int] = Field(
        default_factory=dict, description="The peak per card by component, MiB."
    )
    host_breakdown_mb: dict[str, int] = Field(
        default_factory=dict,
        description="What the task keeps in host memory instead of on its cards (offloaded "
        "optimizer states, parameters, activations; paged optimizer states), per node, MiB; "
        "included in host_memory_mb.",
    )
    confidence: Confidence
    method: str = Field(description="How the figure was obtained.")
    dataloader_num_workers: int = Field(ge=0)
    dataloader_prefetch_factor: int = Field(ge=1)
    model_family: str | None = None
    parameters: int | None = Field(default=None, ge=0)
    trainable_parameters: int | None = Field(default=None, ge=0)
    correction_factor: float | None = Field(
        default=None, gt=0, description="Learned from observed peaks, applied."
    )
    timeline: TrainingTimeline | None = None
    gpu_memory_low_mb: int | None = Field(
        default=None,
        ge=0,
        description="The low end of the predicted peak per card: what the model's published "
        "reference runs measured at the 10th percentile of measured / predicted.",
    )
    gpu_memory_high_mb: int | None = Field(
        default=None,
        ge=0,
        description="The high end of the predicted peak per card (90th percentile of "
        "measured / predicted over the reference runs; wider for a guessed shape).",
    )
    fit: FitVerdict | None = Field(
        default=None,
        description="Whether the task fits the card the request names; None when it names "
        "none (no gpu.memory_mb, no product with a size).",
    )
    architecture: str | None = Field(
        default=None,
        max_length=512,
        description="The architecture the figures are for and how it was chosen: the catalog "
        "entry the model's name found (and from what), the task's config.json, or a generic "
        "shape from parameters_billion.",
        examples=["catalog qwen2.5-7b for 'Qwen/Qwen2.5-7B-Instruct'"],
    )


class TaskProfiled(Event):
    """The predictor attached predicted peaks to a submitted task."""

    task: TaskRequest
    prediction: ResourcePrediction


class FilterReason(Contract):
    """One filter's verdict, summed over the nodes it excluded."""

    filter: str = Field(examples=["GpuCount"])
    code: str = Field(examples=["InsufficientGpus"])
    nodes: int = Field(ge=0, description="Nodes excluded by this filter.")
    message: str


class TaskPending(TaskEvent):
    """The task fits the cluster in principle but not now; the reasons say why."""

    task_id: TaskId
    nodes_total: int = Field(ge=0, le=MAX_EXACT_INT)
    reasons: list[FilterReason]
    summary: str = Field(
        examples=[
            "0/40 nodes available: 32 nodes have fewer than 8 free GPUs; 8 nodes have less "
            "than 40000 MiB of GPU memory per card"
        ]
    )
    attempt: int = Field(
        default=1, ge=1, le=MAX_ATTEMPT, description="Which attempt waits (restart policy)."
    )


# Control characters (but tab and newline) and lone surrogates: what a refusal may echo of
# its input (a field named by the user's own keys) but what is not text to print or to send
# (a NUL makes the whole answer invalid JSON text to its reader: the gateway refuses it).
_NOT_PRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]")


def _escaped(text: str) -> str:
    return _NOT_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class FieldError(Contract):
    """One reason for a refusal: the field (a dotted path) and why. Control characters and
    lone surrogates taken from the input are written as `\\uXXXX` escapes."""

    field: str = Field(examples=["resource_requirements.gpu.count"])
    reason: str

    @field_validator("field", "reason")
    @classmethod
    def _printable(cls, text: str) -> str:
        return _escaped(text)


class TaskRejected(TaskEvent):
    """The task can never be placed, or its request is invalid: its end. Or, with
    `duplicate` set, a submission reusing the id of a task Crater already knows was refused:
    that says nothing of the known task, which goes on."""

    task_id: str = Field(max_length=256)
    errors: list[FieldError]
    duplicate: bool = Field(
        default=False,
        description="The refused submission reused a known task id; the known task is unchanged.",
    )


class TaskEnded(TaskEvent):
    """A task's end, exactly once per task, as the scheduler decided it: the one terminal
    lifecycle event besides `task.rejected`. Whatever the nodes reported and in whatever
    order the streams delivered it, this is what happened to the task."""

    task_id: TaskId
    status: Literal[TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED]
    reason: str = Field(max_length=2048, description="Why, in one line.")
    allocation_id: str | None = Field(
        default=None, description="The last attempt's allocation; None if never placed."
    )
    release_reason: str | None = Field(
        default=None,
        description="How its last allocation went back (succeeded, failed, cancelled, expired, "
        "preempted, node-lost, scaled-in); None if never placed.",
    )
    attempt: int = Field(
        default=1, ge=1, le=MAX_ATTEMPT, description="Attempts run, this one included."
    )


class TaskPreempted(TaskEvent):
    task_id: TaskId
    allocation_id: str
    node: str
    preempted_by: TaskId | None = Field(
        default=None,
        description="The waiting task it yields to; None when its lender takes the capacity "
        "back ahead of the demand it expects (pre-warm, with reclaimed_by_pool).",
    )
    grace_period_seconds: int = Field(ge=0)
    must_stop_by: AwareDatetime | None = Field(
        default=None, description="When the scheduler takes the resources back at the latest."
    )
    reclaimed_by_pool: str | None = Field(
        default=None,
        description="Set when the task ran on capacity borrowed from this pool, whose own "
        "task needs it back (reclaim, whatever the priorities); None: a priority preemption.",
    )
    lent_by: TaskId | None = Field(
        default=None,
        description="Set when it ran on GPUs this task lent during a CPU phase, and the task "
        "wants them back (its phase ended, by itself or at its maximum, or the task went).",
    )
    reclaimed_by_tenant: str | None = Field(
        default=None,
        description="Set when the task's tenant held it above its guarantee (borrowed) and "
        "this tenant, within its own guarantee, needs the capacity back (reclaim, whatever "
        "the priorities).",
    )
    # Left out of the JSON when None: a preemption reads as it did before queue guarantees.
    reclaimed_by_queue: str | None = Field(
        default=None,
        exclude_if=lambda queue: queue is None,
        description="With reclaimed_by_tenant: the tenant's task claimed the guarantee of this "
        "queue above it (docs/queues.md), whose capacity the task's tenant (or a queue above "
        "it) held above its own guarantee.",
    )
    # Left out of the JSON when None: a preemption reads as it did before time limits.
    time_limit_seconds: int | None = Field(
        default=None,
        ge=1,
        exclude_if=lambda seconds: seconds is None,
        description="Set when the task has held its grant for its time limit "
        "(max_run_seconds, its own or its pool's): it is asked to checkpoint and stop, and "
        "is released at must_stop_by (release reason time-limit).",
    )

    def cause(self) -> str:
        """Why, as a phrase ("preempted by t-9")."""
        if self.time_limit_seconds is not None:
            return f"reached its time limit of {self.time_limit_seconds} s"
        if self.lent_by is not None:
            return f"the GPUs lent by {self.lent_by} taken back"
        if self.preempted_by is not None and self.reclaimed_by_queue is not None:
            return (
                f"preempted by {self.preempted_by}: queue {self.reclaimed_by_queue} takes "
                "back its guarantee"
            )
        if self.preempted_by is not None and self.reclaimed_by_tenant is not None:
            return (
                f"preempted by {self.preempted_by}: tenant {self.reclaimed_by_tenant} takes "
                "back its guarantee"
            )
        if self.preempted_by is not None and self.reclaimed_by_pool is not None:
            return (
                f"preempted by {self.preempted_by}: pool {self.reclaimed_by_pool} takes back "
                "the capacity it lent"
            )
        if self.preempted_by is not None:
            return f"preempted by {self.preempted_by}"
        return f"taken back by pool {self.reclaimed_by_pool} ahead of its expected demand"


class TaskEscalated(TaskEvent):
    """A task waited past its `sla.max_queue_time_seconds`: it now ranks one class higher
    (+400 on the 0..1000 scale) and may preempt tasks below that. A task event: the scheduler
    numbers it among the task's events, so its webhook keeps its place."""

    task_id: TaskId
    waited_seconds: float = Field(ge=0)
    max_queue_time_seconds: int = Field(gt=0)
    priority: int = Field(ge=PRIORITY_MIN, le=PRIORITY_MAX, description="As submitted.")
    escalated_priority: int = Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)


class TaskStartEstimated(TaskEvent):
    """A waiting task's place in its pool's queue and when it is estimated to start, from
    the scheduler's start-time forecast (the production core run forward over the queue and
    the running tasks' expected or maximum run times). Told when it is first known and when
    it moves materially, only while the task waits; numbered among the task's events, so its
    `pending` webhook never follows the task's `scheduled`. Advice, not a decision: it is
    not in the audit log."""

    task_id: TaskId
    attempt: int = Field(default=1, ge=1, le=MAX_ATTEMPT, description="Which attempt waits.")
    pool: str = Field(max_length=253)
    queue_position: int = Field(ge=1, le=MAX_EXACT_INT, description="1: next in its pool.")
    estimated_start_at: AwareDatetime | None = Field(
        description="When it is estimated to start if nothing new arrives; None: no estimate "
        "(`estimate` says why)."
    )
    estimate: str = Field(
        max_length=2048,
        examples=["estimated to start in 420 s (position 3 in pool training)"],
        description="The estimate in words, or why there is none.",
    )


class TaskStatusReported(Event):
    """A node (or its runner), or the task's launcher, reports a placed task's progress.

    A launcher (AllData, `crater_client.run_task`, the gateway's
    `/api/v1/allocations/{id}/confirm` and `/status`) names the allocation and carries its
    reservation token: the scheduler checks the token, and from the first such `running` on,
    repeated `running` reports are the task's heartbeats, and every report about that
    allocation must carry the token."""

    task_id: TaskId
    status: Literal[
        TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED
    ]
    allocation_id: str | None = Field(default=None, max_length=64)
    message: str | None = Field(default=None, max_length=2048)
    reservation_token: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The allocation's reservation token (AllocationGranted.reservation_token, "
        "CRATER_RESERVATION_TOKEN): the report is the launcher's; with it, `allocation_id` "
        "is required.",
    )
    exit_code: int | None = Field(
        default=None,
        ge=-255,
        le=255,
        description="The task's exit code (negative: the signal that ended it), on `succeeded` "
        "or `failed` only.",
    )
    # Left out of the JSON when False: reports without it read byte for byte as before.
    out_of_memory: bool = Field(
        default=False,
        exclude_if=lambda oom: not oom,
        description="On `failed`: the task ran out of memory (host: the kernel's OOM killer; "
        "GPU: CUDA out of memory), its failure kind oom, which a restart policy can key on "
        "(restart_policy.on_failure_kinds).",
    )
    heartbeat_grace_seconds: float | None = Field(
        default=None,
        ge=5,
        le=86_400,
        description="On a launcher's `running`: how long the task may go without another "
        "`running` before it is failed (no heartbeat); default the scheduler's "
        "CRATER_SCHEDULER_TASK_HEARTBEAT_GRACE_SECONDS.",
    )
    heartbeat: bool = Field(
        default=False,
        description="A `running` repeated to say the task is alive (a launcher's heartbeat), "
        "not news: AllData is not told it.",
    )

    @field_validator("reservation_token")
    @classmethod
    def _token_names_allocation(cls, token: str | None, info: ValidationInfo) -> str | None:
        if token is not None and info.data.get("allocation_id") is None:
            raise ValueError("a report carrying a reservation token names its allocation_id too")
        return token

    @field_validator("exit_code")
    @classmethod
    def _exit_code_on_end(cls, code: int | None, info: ValidationInfo) -> int | None:
        status = info.data.get("status")
        if code is not None and status not in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
            raise ValueError(f"an exit code is reported with succeeded or failed, not {status}")
        return code

    @field_validator("out_of_memory")
    @classmethod
    def _oom_on_failure(cls, oom: bool, info: ValidationInfo) -> bool:
        status = info.data.get("status")
        if oom and status is not TaskStatus.FAILED:
            raise ValueError(f"out_of_memory is reported with failed, not {status}")
        return oom

    @field_validator("heartbeat")
    @classmethod
    def _heartbeat_is_running(cls, heartbeat: bool, info: ValidationInfo) -> bool:
        if heartbeat and info.data.get("status") != TaskStatus.RUNNING:
            raise ValueError("a heartbeat is a running report")
        return heartbeat

    @field_validator("heartbeat_grace_seconds")
    @classmethod
    def _grace_on_running(cls, grace: float | None, info: ValidationInfo) -> float | None:
        if grace is None:
            return grace
        if info.data.get("status") != TaskStatus.RUNNING:
            raise ValueError("a heartbeat grace is set on a running report")
        if info.data.get("reservation_token") is None:
            raise ValueError("a heartbeat grace is set by a launcher, with its reservation_token")
        return grace
