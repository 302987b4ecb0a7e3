"""AllData's task body, exactly as AllData sends it, through a gateway on a real nats-server."""

from __future__ import annotations

import httpx

from crater.contracts import TaskRequest, TaskSubmitted
from tests.support.events import EventTap
from tests.unit.gateway.test_alldata_task import TASK, body


async def test_the_gateway_accepts_the_body_unchanged_and_publishes_it(
    client: httpx.AsyncClient, tap: EventTap
) -> None:
    response = await client.post(
        "/api/v1/schedule", content=TASK, headers={"content-type": "application/json"}
    )
    assert response.status_code == 202, response.text
    [event] = await tap.wait_for(
        TaskSubmitted, lambda e: e.task_id == "train-llama3-8b-20240520-001"
    )
    assert event.request() == TaskRequest.model_validate_json(TASK)
    assert (event.task_type, event.task_type_as_sent) == ("fine-tuning", "llm_finetune")
    assert event.resource_requirements.gpu.type == "a100-pcie-40gb"
    refused = await client.post("/api/v1/schedule", json=body(task_id="t2", task_type="llm_x"))
    assert refused.status_code == 422
    [detail] = refused.json()["detail"]
    assert detail["field"] == "task_type"
    assert "llm_finetune" in detail["reason"]
