"""AllData's job description: sizes parsed or refused by name, and resolved into a task
request the predictor's own model sizes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from crater.contracts import JobDescription, TaskRequest
from crater.contracts.jobs import parse_bytes, parse_parameters
from crater.predictor.domain.estimate import Assumptions, Refused, predict
from crater.predictor.domain.resolve import CARD_HEADROOM, card_memory_mb, resolve_job
from tests.support.alldata import fixture


@pytest.mark.parametrize(
    ("text", "count"),
    [("8B", 8e9), ("70b", 70e9), ("350M", 350e6), ("1.5T", 1.5e12), (" 7 B ", 7e9)],
)
def test_model_sizes(text: str, count: float) -> None:
    assert parse_parameters(text) == count


@pytest.mark.parametrize(
    ("text", "count"),
    [("2TB", 2 * 10**12), ("500GB", 500 * 10**9), ("1.5TiB", 3 * 2**39), ("10 MiB", 10 << 20)],
)
def test_data_volumes(text: str, count: int) -> None:
    assert parse_bytes(text) == count


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("model_size", "8", "350M, 8B"),
        ("model_size", "8GB", "350M, 8B"),
        ("model_size", "0B", "1 to 10T"),
        ("model_size", "-8B", "350M, 8B"),
        ("data_volume", "2 tera", "500GB, 2TB, 1.5TiB"),
        ("data_volume", "2TiBs", "500GB, 2TB, 1.5TiB"),
        ("data_volume", "9000PB", "at most"),
        ("framework", "caffe", "pytorch, deepspeed"),
        ("gpu_type", "a100-huge", "unknown GPU product"),
        ("task_type", "llm_x", "llm_finetune"),
    ],
)
def test_nonsense_is_refused_naming_the_field_and_the_accepted_form(
    field: str, value: str, said: str
) -> None:
    body = {"framework": "pytorch", "model_size": "8B", "data_volume": "2TB", field: value}
    with pytest.raises(ValidationError) as raised:
        JobDescription.model_validate(body)
    [error] = raised.value.errors()
    assert error["loc"] == (field,)
    assert said in error["msg"]


def job(**extra: object) -> JobDescription:
    base = JobDescription.model_validate_json(fixture("alldata_job.json"))
    return base.model_copy(update=extra) if extra else base


def test_alldata_job_resolves_to_a_request_the_predictor_agrees_with() -> None:
    resolved = resolve_job(job(), Assumptions(), None, task_id="job-1")
    task = TaskRequest.model_validate_json(resolved.task.model_dump_json())  # as sent
    gpu = task.resource_requirements.gpu
    assert task.task_id == "job-1"
    assert task.task_type == "fine-tuning"
    assert gpu.memory_mb == resolved.prediction.gpu_memory_per_gpu_mb
    assert gpu.memory_mb * (1 + CARD_HEADROOM) <= card_memory_mb(None)
    # the fewest GPUs: one fewer would not hold the peak
    fewer = task.model_copy(
        update={
            "resource_requirements": task.resource_requirements.model_copy(
                update={"gpu": gpu.model_copy(update={"count": gpu.count // 2})}
            )
        }
    )
    assert gpu.count > 1
    assert predict(fewer).gpu_memory_per_gpu_mb * (1 + CARD_HEADROOM) > card_memory_mb(None)
    assert predict(task) == resolved.prediction  # a submission of it is predicted the same
    assert task.resource_requirements.memory.capacity_mb == resolved.prediction.host_memory_mb
    assert task.resource_requirements.ssd.capacity_gb >= 2000  # 2TB of data, and more
    assert "2TB" in resolved.explanation
    assert str(gpu.count) in resolved.explanation


def test_smaller_cards_need_more_of_them_and_lora_fewer() -> None:
    big = resolve_job(job(model_size="3B"), Assumptions(), None).task.resource_requirements.gpu
    small = resolve_job(job(model_size="3B", gpu_type="a100-pcie-40gb"), Assumptions(), None)
    assert small.task.resource_requirements.gpu.count > big.count
    assert small.task.resource_requirements.gpu.type == "a100-pcie-40gb"
    full = resolve_job(job(), Assumptions(), None).task.resource_requirements.gpu
    lora = resolve_job(job(lora=True), Assumptions(), None).task.resource_requirements.gpu
    assert lora.count < full.count


def test_what_no_node_holds_is_refused_naming_the_field() -> None:
    with pytest.raises(Refused) as refused:
        resolve_job(job(model_size="1T"), Assumptions(), None)
    assert refused.value.errors[0].field == "model_size"
    with pytest.raises(Refused) as refused:
        resolve_job(job(gpus=1), Assumptions(), None)
    assert refused.value.errors[0].field == "gpus"
