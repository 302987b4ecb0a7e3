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
