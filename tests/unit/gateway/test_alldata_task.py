"""AllData's task body (../shared/compat/alldata_task.json), unedited: accepted by the
contract; a name Crater does not know is refused with the names it does know (the gateway
and the bus: tests/integration/gateway/test_alldata_task.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from crater.contracts import IoPattern, TaskRequest, TaskSubmitted, TaskType
from crater.contracts.gpus import GpuProduct, gpu_of_inventory, parse_gpu_product
from crater.gateway.bodies import parse_task_request
from tests.support.alldata import FIXTURES, SHARED, fixture

TASK = fixture("alldata_task.json")


def body(**overrides: Any) -> dict[str, Any]:
    return {**json.loads(TASK), **overrides}


def test_the_copy_is_the_shared_fixture_byte_for_byte() -> None:
    if not (SHARED / "alldata_task.json").is_file():
        pytest.skip("no ../shared/compat in this checkout")
    assert (FIXTURES / "alldata_task.json").read_bytes() == TASK


def test_the_contract_accepts_alldatas_task_as_is_and_keeps_its_names() -> None:
    task = TaskRequest.model_validate_json(TASK)
    assert task.task_type is TaskType.FINE_TUNING
    assert task.task_type_as_sent == "llm_finetune"
    assert task.data_config.io_pattern is IoPattern.RANDOM
    assert task.data_config.io_pattern_as_sent == "random_read"
    gpu = task.resource_requirements.gpu
    assert (gpu.count, gpu.memory_mb, gpu.type) == (2, 16384, "a100-pcie-40gb")
    assert task.sla.min_gpu_utilization_percent == 65
    assert task.resource_requirements.memory.bandwidth_gbps == 140
    assert task.resource_requirements.ssd.iops_min == 800_000
    # over the bus and back, nothing is lost
    assert TaskSubmitted.from_request(task).request() == task
    # and the body as is is a task.submitted event (its envelope fields have defaults)
    assert TaskSubmitted.model_validate_json(TASK).request() == task


@pytest.mark.parametrize(
    ("sent", "kind"),
    [
        ("llm_pretrain", TaskType.TRAINING),
        ("llm_finetune", TaskType.FINE_TUNING),
        ("llm_inference", TaskType.INFERENCE),
        ("llm_evaluation", TaskType.EVALUATION),
        ("fine-tuning", TaskType.FINE_TUNING),
    ],
)
def test_task_kinds_by_either_name(sent: str, kind: TaskType) -> None:
    task = TaskRequest.model_validate(body(task_type=sent))
    assert task.task_type is kind
    assert task.task_type_as_sent == (None if sent == kind else sent)


@pytest.mark.parametrize(
    ("sent", "pattern"),
    [
        ("sequential_read", IoPattern.SEQUENTIAL),
        ("random_read", IoPattern.RANDOM),
        ("mixed_read_write", IoPattern.MIXED),
        ("mixed", IoPattern.MIXED),
    ],
)
def test_io_patterns_by_either_name(sent: str, pattern: IoPattern) -> None:
    task = TaskRequest.model_validate(body(data_config={"io_pattern": sent}))
    assert task.data_config.io_pattern is pattern


def test_unknown_names_are_refused_naming_the_field_and_every_accepted_value() -> None:
    errors = parse_task_request(
        json.dumps(
            body(
                task_type="llm_quantum",
                data_config={"io_pattern": "zigzag_read"},
                resource_requirements={"gpu": {"count": 1, "type": "a100-pcie-41"}},
            )
        ).encode()
    )
    assert isinstance(errors, list)
    reasons = {e.field: e.reason for e in errors}
    assert set(reasons) == {
        "task_type",
        "data_config.io_pattern",
        "resource_requirements.gpu.type",
    }
    for accepted in ("training", "fine-tuning", "llm_finetune", "llm_pretrain", "llm_inference"):
        assert accepted in reasons["task_type"]
    for accepted in ("sequential", "random", "mixed", "random_read", "sequential_read"):
        assert accepted in reasons["data_config.io_pattern"]
    assert "a100-pcie-40gb" in reasons["resource_requirements.gpu.type"]
    assert "models: " in reasons["resource_requirements.gpu.type"]
    with pytest.raises(ValidationError, match="does not name"):
        TaskRequest.model_validate(body(task_type="training", task_type_as_sent="llm_finetune"))


@pytest.mark.parametrize(
    ("name", "product"),
    [
        ("a100-pcie-40gb", GpuProduct("a100", "pcie", 40)),
        ("h100-sxm-80gb", GpuProduct("h100", "sxm", 80)),
        ("v100-sxm2-32gb", GpuProduct("v100", "sxm", 32)),
        ("rtx-4090", GpuProduct("rtx4090")),
        ("RTX4090", GpuProduct("rtx4090")),
        ("t4", GpuProduct("t4")),
        ("A100", GpuProduct("a100")),
        ("NVIDIA A100-SXM4-80GB", GpuProduct("a100", "sxm", 80)),
    ],
)
def test_gpu_product_names_parse(name: str, product: GpuProduct) -> None:
    assert parse_gpu_product(name) == product


@pytest.mark.parametrize("name", ["z900", "a100-pcie-40", "a100-foo", "nvidia", "a100-pcie-sxm"])
def test_unknown_gpu_products_are_refused_with_the_accepted_forms(name: str) -> None:
    with pytest.raises(ValueError, match=r"<model>\[-<form factor>\]\[-<memory>gb\]"):
        parse_gpu_product(name)


@pytest.mark.parametrize(
    ("reported", "product"),
    [
        ("NVIDIA A100-PCIE-40GB", GpuProduct("a100", "pcie", 40)),
        ("NVIDIA A100 80GB PCIe", GpuProduct("a100", "pcie", 80)),
        ("NVIDIA H100 80GB HBM3", GpuProduct("h100", "sxm", 80)),
        ("NVIDIA H100 PCIe", GpuProduct("h100", "pcie")),
        ("Tesla V100-SXM2-32GB", GpuProduct("v100", "sxm", 32)),
        ("NVIDIA GeForce RTX 4090", GpuProduct("rtx4090")),
        ("Tesla T4", GpuProduct("t4")),
    ],
)
def test_the_probes_model_names_read_as_products(reported: str, product: GpuProduct) -> None:
    assert gpu_of_inventory(reported) == product
