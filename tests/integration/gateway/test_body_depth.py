"""POST /api/v1/schedule refuses a body nested past CRATER_MAX_JSON_DEPTH, naming `body` and
the depth, before decoding it; nothing reaches the bus."""

from __future__ import annotations

import httpx

from tests.support.events import EventTap


async def test_a_deeply_nested_body_is_refused_naming_body_and_depth(
    client: httpx.AsyncClient, tap: EventTap
) -> None:
    deep = b'{"task_id": "deep", "task_type": "training", "x": ' + b"[" * 1000
    deep += b"]" * 1000 + b"}"
    response = await client.post(
        "/api/v1/schedule", content=deep, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["field"] == "body"
    assert "nested 1001 levels deep; at most 64 are accepted" in error["reason"]
    assert tap.events == []
