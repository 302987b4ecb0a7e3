"""Usage samples a running task posts about itself, through a gateway on a real nats-server."""

from __future__ import annotations

from typing import Any

import httpx

from crater.contracts import GpuPhase, TaskPhaseReported, TaskUsageReported
from tests.support.events import EventTap


def sample(task_id: str = "train-1", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task_id": task_id,
        "allocation_id": "alloc-1",
        "attempt": 1,
        "interval_seconds": 10,
        "gpus": [{"gpu_id": 0, "utilization_percent": 42.5, "memory_used_mb": 30000}],
        "host_memory_used_mb": 2048,
    }
    return body | overrides


async def test_a_sample_is_published_as_sent(client: httpx.AsyncClient, tap: EventTap) -> None:
    response = await client.post("/api/v1/tasks/train-1/usage", json=sample())
    assert response.status_code == 202, response.text
    [event] = await tap.wait_for(TaskUsageReported)
    assert str(event.event_id) == response.json()["event_id"]
    assert (event.task_id, event.gpu_utilization_percent) == ("train-1", 42.5)
    assert event.gpus[0].memory_used_mb == 30000


async def test_a_bad_sample_is_refused_naming_the_field(client: httpx.AsyncClient) -> None:
    cases = [
        ("train-1", sample("other"), "task_id", "not the task in the path"),
        (
            "train-1",
            sample(gpus=[{"gpu_id": 0, "utilization_percent": 140, "memory_used_mb": 1}]),
            "gpus.0.utilization_percent",
            "less than or equal to 100",
        ),
        ("train-1", sample(interval_seconds=0), "interval_seconds", "greater than 0"),
        ("train-1", sample(surprise=1), "surprise", "Extra inputs"),
    ]
    for path_id, body, field, reason in cases:
        response = await client.post(f"/api/v1/tasks/{path_id}/usage", json=body)
        assert response.status_code == 422, (field, response.text)
        [error] = response.json()["detail"]
        assert error["field"] == field
        assert reason in error["reason"]
    huge = sample(source="x" * 300_000)
    response = await client.post("/api/v1/tasks/train-1/usage", json=huge)
    assert response.status_code == 413
    assert response.json()["detail"][0]["field"] == "body"


async def test_a_phase_report_is_published_and_a_bad_one_refused_naming_the_field(
    client: httpx.AsyncClient, tap: EventTap
) -> None:
    body = {"task_id": "train-1", "allocation_id": "alloc-1", "phase": "cpu"}
    response = await client.post(
        "/api/v1/tasks/train-1/phase", json=body | {"expected_seconds": 60}
    )
    assert response.status_code == 202, response.text
    assert response.json()["phase"] == "cpu"
    [event] = await tap.wait_for(TaskPhaseReported)
    assert str(event.event_id) == response.json()["event_id"]
    assert (event.task_id, event.phase, event.expected_seconds) == ("train-1", GpuPhase.CPU, 60)
    cases = [
        (body | {"task_id": "other"}, "task_id", "not the task in the path"),
        (body | {"phase": "idle"}, "phase", "'cpu' or 'gpu'"),
        (body | {"expected_seconds": 0}, "expected_seconds", "greater than 0"),
        ({"task_id": "train-1", "phase": "gpu"}, "allocation_id", "Field required"),
    ]
    for sent, field, reason in cases:
        refused = await client.post("/api/v1/tasks/train-1/phase", json=sent)
        assert refused.status_code == 422, (field, refused.text)
        [error] = refused.json()["detail"]
        assert error["field"] == field
        assert reason in error["reason"]
