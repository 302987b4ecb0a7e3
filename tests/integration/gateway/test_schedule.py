"""POST /api/v1/schedule over a real nats-server: what is accepted reaches the bus, what is
not is refused naming every field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import nats
import pytest

from crater.contracts import Streams, TaskSubmitted
from crater.runtime.nats_server import NatsServer
from tests.support.events import EventTap

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def task(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task_id": "train-42",
        "task_type": "training",
        "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "bf16"},
        "resource_requirements": {"gpu": {"count": 2, "memory_mb": 40000, "type": "A100"}},
        "priority": "high",
    }
    body.update(overrides)
    return body


async def test_valid_task_is_accepted_and_published_in_the_callers_trace(
    client: httpx.AsyncClient, tap: EventTap
) -> None:
    response = await client.post(
        "/api/v1/schedule",
        json=task(),
        headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
    )
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["task_id"] == "train-42"
    assert accepted["status"] == "submitted"

    [event] = await tap.wait_for(TaskSubmitted, lambda e: e.task_id == "train-42")
    assert str(event.event_id) == accepted["event_id"]
    assert event.model_spec.name == "meta-llama/Llama-2-7b-hf"
    assert event.resource_requirements.gpu.count == 2
    # One trace from the HTTP call to the message: the event and its headers carry it.
    assert event.trace is not None
    assert event.trace.traceparent.split("-")[1] == TRACE_ID
    [raw] = [m for m in tap.raw if m.subject == "crater.v1.task.submitted"]
    assert raw.headers is not None
    assert raw.headers["traceparent"].split("-")[1] == TRACE_ID
    assert raw.headers["Nats-Msg-Id"] == accepted["event_id"]


async def test_the_data_path_fields_reach_the_bus_as_sent(
    client: httpx.AsyncClient, tap: EventTap
) -> None:
    needs = {"gpu": {"count": 2, "pcie_bandwidth_gbps": 25}, "ssd": {"capacity_gb": 500}}
    response = await client.post(
        "/api/v1/schedule", json=task(task_id="data-path-1", resource_requirements=needs)
    )
    assert response.status_code == 202, response.text
    [event] = await tap.wait_for(TaskSubmitted, lambda e: e.task_id == "data-path-1")
    assert event.resource_requirements.gpu.pcie_bandwidth_gbps == 25
    assert event.resource_requirements.ssd.capacity_gb == 500


BAD_BODIES = [
    pytest.param(b'{"task_id": "t", oops', {"body"}, "Invalid JSON", id="malformed-json"),
    pytest.param(b'"a task"', {"body"}, "object", id="not-an-object"),
    pytest.param(b"[]", {"body"}, "empty array", id="an-empty-array"),
    pytest.param(b'[{"task_id": "t"}', {"body"}, "not a JSON array", id="a-broken-array"),
    pytest.param(
        task(resource_requirements={"gpu": {"count": "two"}}),
        {"resource_requirements.gpu.count"},
        "integer",
        id="wrong-type",
    ),
    pytest.param(
        task(resource_requirements={"gpu": {"count": -1}}),
        {"resource_requirements.gpu.count"},
        "greater than or equal to 0",
        id="negative-gpu-count",
    ),
    pytest.param(
        task(resource_requirements={"gpu": {"count": 1, "pcie_bandwidth_gbps": 0}}),
        {"resource_requirements.gpu.pcie_bandwidth_gbps"},
        "greater than 0",
        id="zero-pcie-bandwidth",
    ),
    pytest.param(
        task(resource_requirements={"gpu": {"count": 1, "pcie_bandwidth_gbps": "fast"}}),
        {"resource_requirements.gpu.pcie_bandwidth_gbps"},
        "number",
        id="pcie-bandwidth-not-a-number",
    ),
    pytest.param(task(task_type="quantum"), {"task_type"}, "training", id="unknown-task-type"),
    pytest.param(
        {k: v for k, v in task().items() if k != "model_config"},
        {"model_config"},
        "Field required",
        id="missing-model-config",
    ),
    pytest.param(task(colour="blue"), {"colour"}, "Extra inputs", id="unknown-field"),
    pytest.param(
        task(task_id="", priority="urgent", gang_size=0),
        {"task_id", "priority", "gang_size"},
        "",
        id="several-fields",
    ),
]


@pytest.mark.parametrize(("body", "fields", "reason"), BAD_BODIES)
async def test_invalid_bodies_are_refused_naming_every_field(
    client: httpx.AsyncClient, body: bytes | dict[str, Any], fields: set[str], reason: str
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post(
        "/api/v1/schedule", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert {d["field"] for d in detail} == fields
    assert all(d["reason"] for d in detail)
    assert any(reason in d["reason"] for d in detail)


async def test_nothing_invalid_reaches_the_bus(client: httpx.AsyncClient, tap: EventTap) -> None:
    assert (await client.post("/api/v1/schedule", json=task(task_type="x"))).status_code == 422
    assert (await client.post("/api/v1/schedule", json=task(task_id="ok"))).status_code == 202
    await tap.wait_for(TaskSubmitted, lambda e: e.task_id == "ok")
    assert [e.task_id for e in tap.of(TaskSubmitted)] == ["ok"]


async def test_oversized_bodies_are_refused_naming_the_limit(client: httpx.AsyncClient) -> None:
    huge = task(data_config={"train_dataset": "x" * 300_000})
    response = await client.post("/api/v1/schedule", json=huge)
    assert response.status_code == 413
    [error] = response.json()["detail"]
    assert error["field"] == "body"
    assert "262144-byte limit" in error["reason"]

    async def streamed() -> Any:  # chunked: no Content-Length to refuse it up front
        for _ in range(300):
            yield b"x" * 1024

    response = await client.post("/api/v1/schedule", content=streamed())
    assert response.status_code == 413


async def test_a_retry_with_the_same_idempotency_key_is_stored_once(
    client: httpx.AsyncClient, fresh_nats: NatsServer
) -> None:
    headers = {"Idempotency-Key": "alldata-7f3"}
    first = await client.post("/api/v1/schedule", json=task(), headers=headers)
    again = await client.post("/api/v1/schedule", json=task(), headers=headers)
    other = await client.post("/api/v1/schedule", json=task(task_id="train-43"), headers=headers)
    assert first.status_code == again.status_code == other.status_code == 202
    assert first.json()["event_id"] == again.json()["event_id"] != other.json()["event_id"]
    connection = await nats.connect(fresh_nats.url)
    try:
        info = await connection.jetstream().stream_info(Streams.TASKS.name)
    finally:
        await connection.close()
    assert info.state.messages == 2


async def test_nats_gone_gives_503_and_an_unhealthy_health_check(
    client: httpx.AsyncClient, fresh_nats: NatsServer
) -> None:
    assert (await client.get("/healthz")).status_code == 200
    fresh_nats.stop()
    response = await client.post("/api/v1/schedule", json=task())
    assert response.status_code == 503
    assert "NATS unavailable" in response.json()["detail"]
    assert (await client.get("/healthz")).status_code == 503


async def test_an_array_is_a_burst_each_element_with_its_own_outcome(
    client: httpx.AsyncClient, tap: EventTap
) -> None:
    burst = [
        task(task_id="burst-0"),
        task(task_id="burst-1", task_type="quantum"),  # refused alone, naming its field
        task(task_id="burst-2"),
        task(task_id="burst-0"),  # the same id twice in one array
        "not a task",
    ]
    response = await client.post("/api/v1/schedule", json=burst)
    assert response.status_code == 207, response.text
    answer = response.json()
    assert (answer["accepted"], answer["refused"]) == (2, 3)
    results = answer["results"]
    assert [r["index"] for r in results] == [0, 1, 2, 3, 4]
    assert [r["status"] for r in results] == [202, 422, 202, 422, 422]
    assert results[1]["body"]["detail"][0]["field"] == "task_type"
    assert "repeats element 0" in results[3]["body"]["detail"][0]["reason"]
    assert results[4]["task_id"] is None
    # Accepted means on the stream: both are there, nothing refused is.
    await tap.wait_for(TaskSubmitted, lambda e: e.task_id == "burst-2")
    await tap.wait_for(TaskSubmitted, lambda e: e.task_id == "burst-0")
    assert sorted(e.task_id for e in tap.of(TaskSubmitted)) == ["burst-0", "burst-2"]
    for r in (results[0], results[2]):
        [event] = [e for e in tap.of(TaskSubmitted) if e.task_id == r["task_id"]]
        assert str(event.event_id) == r["body"]["event_id"]
    # Sent again: the known ids are 409 each, as a single body would be.
    again = (await client.post("/api/v1/schedule", json=burst[:1])).json()["results"]
    assert again[0]["status"] == 409


async def test_an_array_too_long_or_dry_run_is_refused_whole(client: httpx.AsyncClient) -> None:
    many = [task(task_id=f"t{i}") for i in range(501)]
    content = json.dumps(many, separators=(",", ":")).encode()
    assert len(content) < 256 * 1024
    too_long = await client.post(
        "/api/v1/schedule", content=content, headers={"content-type": "application/json"}
    )
    assert too_long.status_code == 422, too_long.text
    assert "at most 500 (max_batch_tasks)" in too_long.json()["detail"][0]["reason"]
    dry = await client.post("/api/v1/schedule?dry_run=true", json=[task()])
    assert dry.status_code == 422
    assert dry.json()["detail"][0]["field"] == "dry_run"


async def test_an_array_with_nats_gone_is_503_for_each_element(
    client: httpx.AsyncClient, fresh_nats: NatsServer
) -> None:
    fresh_nats.stop()
    response = await client.post(
        "/api/v1/schedule", json=[task(task_id="gone-0"), task(task_id="gone-1")]
    )
    assert response.status_code == 207, response.text
    answer = response.json()
    assert (answer["accepted"], answer["refused"]) == (0, 2)
    for result in answer["results"]:
        assert result["status"] == 503
        assert "NATS unavailable" in result["body"]["detail"]
