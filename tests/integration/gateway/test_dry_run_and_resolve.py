"""Dry runs of whole tasks and job descriptions resolved, over a real stack (nats-server,
predictor, scheduler and its database, gateway): a dry run answers what the submission then
really does, and holds nothing; a resolved job is a body /api/v1/schedule accepts as is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.js.errors
import pytest
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    NodeTopologyReported,
    TaskRejected,
    TaskRequest,
    TaskSubmitted,
)
from crater.gateway.app import ACCEPTED_BUCKET
from crater.gateway.claims import claim_key
from crater.predictor.app import PredictorSettings
from crater.predictor.app import build as build_predictor
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings
from crater.scheduler.app import build as build_scheduler
from tests.integration.gateway.test_duplicate_submissions import gateway
from tests.integration.gateway.test_schedule import task
from tests.support.alldata import fixture
from tests.support.events import EventTap
from tests.support.topologies import node
from tests.unit.scheduler.test_alldata_gpu_products import A100_PCIE_40, measured

ALLDATA_TASK = fixture("alldata_task.json")
JSON = {"content-type": "application/json"}


def predictor_app(nats_url: str, tmp_path: Path) -> Any:
    db = f"sqlite+aiosqlite:///{tmp_path / 'predictor.db'}"
    return build_predictor(PredictorSettings(nats_url=nats_url, database_url=db))[1]


@pytest.fixture
async def stack(
    fresh_nats: NatsServer, database_url: str, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """Every service, and three nodes: AllData's A100 PCIe 40 GB one, two 8 x 80 GB ones."""
    scheduler, scheduler_app = build_scheduler(
        SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    )
    async with (
        TestApp(scheduler_app),
        TestApp(predictor_app(fresh_nats.url, tmp_path)),
        gateway(fresh_nats.url) as http,
    ):
        for topology in (
            measured("a100-pcie-01", *A100_PCIE_40),
            node("a100-01", gpus=8),
            node("a100-02", gpus=8),
        ):
            await publish(scheduler.broker, NodeTopologyReported(node=topology))
        for _ in range(200):
            if len((await http.get("/api/v1/nodes")).json().get("nodes", [])) == 3:
                break
            await asyncio.sleep(0.05)
        yield http


async def dry_run(http: httpx.AsyncClient, body: bytes | dict[str, Any]) -> dict[str, Any]:
    url = "/api/v1/schedule?dry_run=true"
    for _ in range(3):  # as a client does on a 503 (a service slow to answer on a busy machine)
        if isinstance(body, bytes):
            response = await http.post(url, content=body, headers=JSON)
        else:
            response = await http.post(url, json=body)
        if response.status_code != 503:
            break
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["dry_run"] is True
    return answer


def sxm_gang(task_id: str, members: int) -> dict[str, Any]:
    """A gang of 4-card members on 80 GB SXM cards only (not AllData's PCIe node)."""
    gang = task(task_id=task_id, gang_size=members)
    gpu = {"count": 4, "memory_mb": 40000, "type": "a100-sxm-80gb"}
    return {**gang, "resource_requirements": {"gpu": gpu}}


async def held_nothing(nats_url: str, tap: EventTap, task_id: str) -> None:
    """No task.submitted published, no claim of the id in the gateway's bucket."""
    await asyncio.sleep(0.3)  # anything published late would show by now
    assert tap.of(TaskSubmitted, lambda e: e.task_id == task_id) == []
    assert tap.of(AllocationGranted, lambda e: e.task_id == task_id) == []
    connection = await nats.connect(nats_url)
    try:
        bucket = await connection.jetstream().key_value(ACCEPTED_BUCKET)
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await bucket.get(claim_key(task_id))
    finally:
        await connection.close()


async def test_alldatas_task_dry_run_says_what_its_submission_then_does(
    stack: httpx.AsyncClient, tap: EventTap, fresh_nats: NatsServer
) -> None:
    answer = await dry_run(stack, ALLDATA_TASK)
    task_id = TaskRequest.model_validate_json(ALLDATA_TASK).task_id
    assert answer["task_id"] == task_id
    prediction, placement = answer["prediction"], answer["placement"]
    # Its fine-tuning method is not stated: full fine-tuning's peak is a guess (low
    # confidence), so AllData's 16 GB ask is what is placed, on its A100 PCIe node.
    assert prediction["confidence"] == "low"
    assert placement["gpu_memory_source"] == "requested"
    assert (placement["outcome"], placement["would_wait"]) == ("placed", False)
    [member] = placement["members"]
    assert member["node_id"] == "a100-pcie-01"
    by_node = {m["node_id"]: m for m in placement["misfits"]}
    assert by_node["a100-01"]["filter"] == "GpuModel"  # SXM, not PCIe
    await held_nothing(fresh_nats.url, tap, task_id)

    submitted = await stack.post("/api/v1/schedule", content=ALLDATA_TASK, headers=JSON)
    assert submitted.status_code == 202, submitted.text  # the id was free
    [granted] = await tap.wait_for(AllocationGranted, lambda e: e.task_id == task_id)
    assert (granted.node, granted.gpu_ids) == (member["node_id"], member["gpu_ids"])


async def test_a_stated_full_fine_tuning_is_refused_by_the_dry_run_as_by_the_submission(
    stack: httpx.AsyncClient, tap: EventTap, fresh_nats: NatsServer
) -> None:
    # Full fine-tuning stated: the peak is trusted, and no A100 card holds it.
    body = {**TaskRequest.model_validate_json(ALLDATA_TASK).model_dump(mode="json")}
    body.update(task_id="full-ft-1", training_config={"optimizer": "adamw"})
    answer = await dry_run(stack, body)
    prediction, placement = answer["prediction"], answer["placement"]
    assert prediction["gpu_memory_per_gpu_mb"] > 40960
    assert prediction["confidence"] == "medium"
    assert placement["gpu_memory_source"].startswith("predicted peak")
    assert (placement["outcome"], placement["members"]) == ("rejected", [])
    fields = [e["field"] for e in placement["errors"]]
    assert "resource_requirements.gpu.memory_mb" in fields
    by_node = {m["node_id"]: m for m in placement["misfits"]}
    assert by_node["a100-pcie-01"]["filter"] == "GpuMemory"
    await held_nothing(fresh_nats.url, tap, "full-ft-1")

    submitted = await stack.post("/api/v1/schedule", json=body)
    assert submitted.status_code == 202, submitted.text
    [rejected] = await tap.wait_for(TaskRejected, lambda e: e.task_id == "full-ft-1")
    assert [e.field for e in rejected.errors] == fields  # what the dry run said


async def test_a_dry_run_answers_the_node_a_submission_then_gets(
    stack: httpx.AsyncClient, tap: EventTap, fresh_nats: NatsServer
) -> None:
    answer = await dry_run(stack, task(task_id="fits-1"))
    placement = answer["placement"]
    assert (placement["outcome"], placement["would_wait"]) == ("placed", False)
    [member] = placement["members"]
    assert member["node_id"] == placement["fits"][0]["node_id"]
    assert {m["node_id"] for m in placement["misfits"]} == {"a100-pcie-01"}
    assert answer["prediction"]["model_family"] == "llama"
    await held_nothing(fresh_nats.url, tap, "fits-1")

    submitted = await stack.post("/api/v1/schedule", json=task(task_id="fits-1"))
    assert submitted.status_code == 202, submitted.text
    [granted] = await tap.wait_for(AllocationGranted, lambda e: e.task_id == "fits-1")
    assert (granted.node, granted.gpu_ids) == (member["node_id"], member["gpu_ids"])

    # The cluster changed: a gang that fitted the empty 80 GB nodes (two 4-card members on
    # each) now waits, and the dry run says so: 6 + 8 cards left hold three members.
    gang = sxm_gang("gang-1", 4)
    waits = (await dry_run(stack, gang))["placement"]
    assert (waits["outcome"], waits["would_wait"], waits["members"]) == ("waiting", True, [])
    assert "4 needed at once" in waits["summary"]
    await held_nothing(fresh_nats.url, tap, "gang-1")


async def test_a_gang_dry_run_gives_every_member_its_node(
    stack: httpx.AsyncClient, tap: EventTap, fresh_nats: NatsServer
) -> None:
    gang = sxm_gang("gang-2", 4)
    placement = (await dry_run(stack, gang))["placement"]
    assert placement["outcome"] == "placed"
    members = placement["members"]
    assert [m["member"] for m in members] == [0, 1, 2, 3]
    assert sorted(m["node_id"] for m in members) == ["a100-01", "a100-01", "a100-02", "a100-02"]
    on_one = [m["gpu_ids"] for m in members if m["node_id"] == "a100-01"]
    assert not set(on_one[0]) & set(on_one[1])  # members never share a card
    await held_nothing(fresh_nats.url, tap, "gang-2")


async def test_alldatas_job_resolves_to_a_body_schedule_accepts_as_is(
    stack: httpx.AsyncClient, tap: EventTap
) -> None:
    response = await stack.post(
        "/api/v1/resolve", content=fixture("alldata_job.json"), headers=JSON
    )
    assert response.status_code == 200, response.text
    resolved = response.json()
    request = TaskRequest.model_validate(resolved["task"])
    gpu = request.resource_requirements.gpu
    assert gpu.count >= 1
    assert gpu.memory_mb == resolved["prediction"]["gpu_memory_per_gpu_mb"]
    assert request.resource_requirements.ssd.capacity_gb >= 2000  # 2TB of data
    assert "2TB" in resolved["explanation"]

    placement = (await dry_run(stack, resolved["task"]))["placement"]
    assert placement["outcome"] == "placed"
    submitted = await stack.post("/api/v1/schedule", json=resolved["task"])
    assert submitted.status_code == 202, submitted.text
    [granted] = await tap.wait_for(AllocationGranted, lambda e: e.task_id == request.task_id)
    assert granted.node == placement["members"][0]["node_id"]


@pytest.mark.parametrize(
    ("url", "body", "field", "said"),
    [
        ("/api/v1/resolve", {"framework": "caffe"}, "framework", "pytorch, deepspeed"),
        ("/api/v1/resolve", {"model_size": "8 bananas"}, "model_size", "350M, 8B"),
        ("/api/v1/resolve", {"data_volume": "lots"}, "data_volume", "500GB, 2TB"),
        ("/api/v1/resolve", {"model_size": "1T"}, "model_size", "up to 8 GPUs"),
        ("/api/v1/schedule?dry_run=true", {"model_config": None}, "model_config", "object"),
        ("/api/v1/schedule?dry_run=true", {"priority": "urgent"}, "priority", "high, medium"),
        ("/api/v1/schedule?dry_run=maybe", {}, "dry_run", "boolean"),
    ],
)
async def test_invalid_bodies_are_refused_naming_the_field(
    stack: httpx.AsyncClient, tap: EventTap, url: str, body: dict[str, Any], field: str, said: str
) -> None:
    base = (
        {"framework": "pytorch", "model_size": "8B", "data_volume": "2TB"}
        if "resolve" in url
        else task(task_id="bad-1")
    )
    response = await stack.post(url, json={**base, **body})
    assert response.status_code == 422, response.text
    fields = {e["field"]: e["reason"] for e in response.json()["detail"]}
    assert field in fields, fields
    assert said in fields[field]
    await asyncio.sleep(0.2)
    assert tap.of(TaskSubmitted) == []


async def test_without_the_predictor_or_the_scheduler_the_answer_is_503_naming_it(
    fresh_nats: NatsServer, database_url: str, tmp_path: Path
) -> None:
    _, scheduler_app = build_scheduler(
        SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    )
    async with TestApp(scheduler_app), gateway(fresh_nats.url) as http:
        response = await http.post("/api/v1/schedule?dry_run=true", json=task())
        assert (response.status_code, response.json()) == (
            503,
            {"detail": "predictor not answering"},
        )
        job = await http.post("/api/v1/resolve", content=fixture("alldata_job.json"), headers=JSON)
        assert (job.status_code, job.json()) == (503, {"detail": "predictor not answering"})
    async with TestApp(predictor_app(fresh_nats.url, tmp_path)), gateway(fresh_nats.url) as http:
        response = await http.post("/api/v1/schedule?dry_run=true", json=task())
        assert (response.status_code, response.json()) == (
            503,
            {"detail": "scheduler not answering"},
        )
