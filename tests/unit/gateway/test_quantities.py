"""Resource sizes as operators write them: Kubernetes quantities, and the flat request form."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from pydantic import ValidationError

from crater.contracts import PlacementQuery, TaskRequest
from crater.contracts.quantities import parse_quantity
from crater.contracts.tasks import ResourceRequirements
from crater.gateway.bodies import parse_task_request


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("32Gi", 32 * 2**30),
        ("500Gi", 500 * 2**30),
        ("1.5Ti", 3 * 2**39),
        ("40G", 40 * 10**9),
        ("512Mi", 512 * 2**20),
        ("8Ki", 8192),
        ("2k", 2000),
        ("3M", 3 * 10**6),
        ("1T", 10**12),
        ("1Pi", 2**50),
        ("1P", 10**15),
        (".5Gi", 2**29),
        ("1024", 1024),
        ("0.1k", 100),
    ],
)
def test_quantities_read_exactly(text: str, amount: int) -> None:
    assert parse_quantity(text) == Fraction(amount)


@pytest.mark.parametrize("text", ["40GB", "40gi", "-1Gi", "Gi", "", "1.2.3Gi", "40 Gi x", "1e3"])
def test_what_is_not_a_quantity_is_refused_with_the_accepted_form(text: str) -> None:
    with pytest.raises(ValueError, match="accepted: a number, or a Kubernetes quantity"):
        parse_quantity(text)


def resources(value: object) -> ResourceRequirements:
    return ResourceRequirements.model_validate(value)


def test_each_size_field_takes_a_quantity_in_its_own_unit_rounded_up() -> None:
    nested = resources(
        {
            "gpu": {"count": 2, "memory_mb": "40Gi"},
            "memory": {"capacity_mb": "1.5Ti"},
            "ssd": {"capacity_gb": "500Gi"},
        }
    )
    assert nested.gpu.memory_mb == 40 * 1024  # MiB
    assert nested.memory.capacity_mb == 1536 * 1024
    # ssd.capacity_gb counts decimal GB, as disks are sold: 500 GiB is 536.87 GB, asked as 537
    assert nested.ssd.capacity_gb == 537
    assert resources({"ssd": {"capacity_gb": "500G"}}).ssd.capacity_gb == 500
    # never shrunk: 40 GB is 38146.97 MiB, one byte over 1 MiB is 2 MiB
    assert resources({"gpu": {"count": 1, "memory_mb": "40G"}}).gpu.memory_mb == 38147
    assert resources({"memory": {"capacity_mb": "1025Ki"}}).memory.capacity_mb == 2


def test_numbers_keep_the_fields_unit_as_before() -> None:
    same = resources({"gpu": {"count": 2, "memory_mb": 40960}, "ssd": {"capacity_gb": 500}})
    assert (same.gpu.memory_mb, same.ssd.capacity_gb) == (40960, 500)
    # a digit string is the field's unit too (pydantic read it so before quantities)
    assert resources({"memory": {"capacity_mb": "4096"}}).memory.capacity_mb == 4096


def test_a_bad_quantity_names_the_field_and_the_accepted_form() -> None:
    with pytest.raises(ValidationError) as raised:
        resources({"gpu": {"count": 1, "memory_mb": "40GB"}})
    (error,) = raised.value.errors()
    assert error["loc"] == ("gpu", "memory_mb")
    assert "'40GB' is neither a number of MiB nor a quantity" in error["msg"]
    assert "40Gi, 500Gi" in error["msg"]
    with pytest.raises(ValidationError, match="less than or equal to 1048576"):
        resources({"gpu": {"count": 1, "memory_mb": "2Ti"}})  # over the field's bound


def test_the_flat_form_is_the_nested_one() -> None:
    flat = resources({"gpu": 2, "gpu_memory": "40Gi", "cpu": 8, "memory": "64Gi", "ssd": "500Gi"})
    assert flat == resources(
        {
            "gpu": {"count": 2, "memory_mb": 40960},
            "cpu": {"cores": 8},
            "memory": {"capacity_mb": 65536},
            "ssd": {"capacity_gb": 537},
        }
    )
    typed = resources({"gpu_count": 1, "gpu_type": "a100", "gpu_memory": 81920})
    assert (typed.gpu.count, typed.gpu.type, typed.gpu.memory_mb) == (1, "a100", 81920)
    # one resource nested, another flat: each in one form
    mixed = resources({"gpu": {"count": 1}, "memory": "8Gi"})
    assert (mixed.gpu.count, mixed.memory.capacity_mb) == (1, 8192)
    # what is stored and sent on is nested
    assert flat.model_dump()["gpu"]["count"] == 2


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"gpus": 2}, "unknown key 'gpus'; accepted: gpu, cpu, memory, ssd (nested objects) or "
         "the flat keys gpu, gpu_count, gpu_memory, gpu_type, gpu_models, cpu, memory, ssd"),
        ({"gpu": {"count": 2}, "gpu_memory": "40Gi"}, "'gpu_memory' is flat but 'gpu' is nested"),
        ({"gpu": 2, "gpu_count": 2}, "'gpu' and 'gpu_count' both set gpu.count"),
    ],
)  # fmt: skip
def test_flat_keys_unknown_or_doubled_are_refused_naming_them(value: object, reason: str) -> None:
    with pytest.raises(ValidationError) as raised:
        PlacementQuery.model_validate({"resource_requirements": value})
    (error,) = raised.value.errors()
    assert error["loc"] == ("resource_requirements",)
    assert reason in error["msg"]


def test_a_flat_value_of_the_wrong_kind_names_the_field_it_sets() -> None:
    with pytest.raises(ValidationError) as raised:
        resources({"gpu": "two"})
    assert raised.value.errors()[0]["loc"] == ("gpu", "count")


def test_the_task_body_takes_the_flat_form_and_quantities() -> None:
    body = {
        "task_id": "t",
        "task_type": "training",
        "model_config": {"name": "gpt2"},
        "resource_requirements": {"gpu": 2, "gpu_memory": "40Gi", "ssd": "1Ti"},
    }
    parsed = parse_task_request(json.dumps(body).encode())
    assert isinstance(parsed, TaskRequest)
    assert parsed.resource_requirements.gpu.memory_mb == 40960
    assert parsed.resource_requirements.ssd.capacity_gb == 1100  # 1 TiB is 1099.51 GB
    bad = parse_task_request(
        json.dumps({**body, "resource_requirements": {"gpu": 1, "memory": "64GB"}}).encode()
    )
    assert isinstance(bad, list)
    assert [e.field for e in bad] == ["resource_requirements.memory.capacity_mb"]
    assert "'64GB' is neither a number of MiB nor a quantity" in bad[0].reason


def test_the_schema_says_number_or_quantity_and_the_flat_form() -> None:
    schema = TaskRequest.model_json_schema()["$defs"]
    memory = schema["GpuRequirement"]["properties"]["memory_mb"]
    assert [branch["type"] for branch in memory["anyOf"]] == ["integer", "string"]
    assert memory["anyOf"][0]["maximum"] == 1_048_576
    nested, flat = schema["ResourceRequirements"]["anyOf"]
    assert set(nested["properties"]) == {"gpu", "cpu", "memory", "ssd"}
    assert flat["additionalProperties"] is False
    assert flat["properties"]["gpu_memory"]["description"] == "Flat form of gpu.memory_mb."
