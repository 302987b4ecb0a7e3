"""`crater submit --dry-run` prints a task's dry run readably: the prediction, each member's
node, why it would wait or be rejected, and the node tables."""

from __future__ import annotations

import pytest

from crater.cli import dry_run
from crater.contracts import TaskRequest
from crater.contracts.tasks import TrainingConfig
from crater.gateway.app import TaskDryRun
from crater.predictor.domain.estimate import predict
from tests.support.alldata import fixture
from tests.unit.scheduler.test_alldata_gpu_products import A100_PCIE_40, measured
from tests.unit.scheduler.test_core import cluster
from tests.unit.scheduler.test_dry_run_task import node


def printed(request: TaskRequest, capsys: pytest.CaptureFixture[str], *nodes: object) -> str:
    scheduler, _ = cluster(*nodes)
    prediction = predict(request)
    answer = TaskDryRun(
        task_id=request.task_id,
        prediction=prediction,
        placement=scheduler.dry_run_task(request, prediction),
    )
    dry_run.print_dry_run(answer.model_dump_json().encode())
    return capsys.readouterr().out


def test_a_placed_gang_shows_every_members_node(capsys: pytest.CaptureFixture[str]) -> None:
    request = TaskRequest.model_validate(
        {
            "task_id": "gang-1",
            "task_type": "inference",
            "model_config": {"name": "meta-llama/Llama-2-7b-hf"},
            "resource_requirements": {"gpu": {"count": 1}},
            "gang_size": 2,
        }
    )
    out = printed(request, capsys, node("a-01", gpus=1), node("a-02", gpus=1))
    assert "gang-1 (dry run, nothing submitted)" in out
    assert "would be placed" in out
    assert "a-01" in out
    assert "a-02" in out
    assert "2/2 nodes fit" in out


def test_alldatas_task_shows_the_node_it_would_get(capsys: pytest.CaptureFixture[str]) -> None:
    # its fine-tuning method is not stated: the prediction is a guess, AllData's ask stands
    request = TaskRequest.model_validate_json(fixture("alldata_task.json"))
    out = printed(request, capsys, measured("a100-pcie-01", *A100_PCIE_40))
    assert "would be placed" in out
    assert "a100-pcie-01" in out
    assert "low" in out


def test_a_stated_full_fine_tuning_shows_why_it_would_be_rejected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    alldata = TaskRequest.model_validate_json(fixture("alldata_task.json"))
    request = alldata.model_copy(update={"training_config": TrainingConfig()})
    out = printed(request, capsys, measured("a100-pcie-01", *A100_PCIE_40))
    assert "would be rejected" in out
    assert "rejected: resource_requirements.gpu.memory_mb" in out
    assert "GpuMemory" in out
