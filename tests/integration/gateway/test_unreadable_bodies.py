"""A body the gateway cannot even read (bytes that are not UTF-8 JSON) is answered as every
bad body is, 422 naming `body`, on every route that takes one: the fuzzer found FastAPI's
undocumented 400 on those whose body is a model parameter."""

from __future__ import annotations

import httpx
import pytest

NOT_UTF8 = b"\x81\x0c\x1b\xab0\x85=\x17"  # the fuzzer's example


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/schedule",
        "/api/v1/schedule?dry_run=true",
        "/api/v1/schedule/dry-run",
        "/api/v1/resolve",
        "/api/v1/allocations/alloc-1/confirm",
        "/api/v1/allocations/alloc-1/status",
        "/api/v1/tasks/t1/usage",
    ],
)
async def test_an_unreadable_body_is_a_422_naming_the_body(
    client: httpx.AsyncClient, path: str
) -> None:
    response = await client.post(
        path, content=NOT_UTF8, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["field"] == "body"
    assert error["reason"]


# A lone surrogate in a name: valid JSON, not text; it used to reach the predictor, whose
# database refused it, and the gateway answered 503 "predictor not answering" (the fuzzer).
LONE = "\\udb39P"  # the JSON escape of half a surrogate pair, then "P"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/api/v1/schedule?dry_run=true",
            '{"task_id": "t1", "task_type": "llm_sft", "model_config": {"name": "%s"}}',
            "model_config.name",
        ),
        (
            "/api/v1/schedule",
            '{"task_id": "t1", "task_type": "llm_sft", "model_config": {"name": "%s"}}',
            "model_config.name",
        ),
        (
            "/api/v1/schedule/dry-run",
            '{"resource_requirements": {"gpu": {"count": 1}}, "pool": "%s"}',
            "pool",
        ),
        (
            "/api/v1/allocations/alloc-1/confirm",
            '{"token": "%s"}',
            "token",
        ),
        (
            "/api/v1/tasks/t1/usage",
            '{"task_id": "t1", "attempt": 1, "interval_seconds": 10, "gpus": [], "source": "%s"}',
            "source",
        ),
    ],
)
async def test_a_string_that_is_not_text_is_a_422_naming_its_field(
    client: httpx.AsyncClient, path: str, body: str, field: str
) -> None:
    response = await client.post(
        path, content=(body % LONE).encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["field"] == field
    assert "lone surrogate (U+DB39)" in error["reason"]


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("GET", "/api/v1/nodes?pool=%00%C3%BC", "pool"),  # the fuzzer's 502
        ("GET", "/api/v1/tasks?tenant=a&tenant=b%00", "tenant"),
        ("GET", "/api/v1/tasks/t%00", "task_id"),
        ("POST", "/api/v1/tasks/t%00/cancel", "task_id"),
    ],
)
async def test_a_parameter_that_is_not_text_is_a_422_naming_it(
    client: httpx.AsyncClient, method: str, path: str, field: str
) -> None:
    """A NUL in a query or path parameter used to reach the scheduler, whose answer then
    failed the gateway's own check: 502 instead of the caller's mistake."""
    response = await client.request(method, path)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["field"] == field
    assert "NUL" in error["reason"]
