"""The web console over a real nats-server and the gateway's own authentication (auth
`required`, a keys file): signing in and out, session cookies, tenant scoping, assets served
locally, and the live event stream; stand-in services answer the queries (as in
test_queries). The browser test is tests/e2e/test_console_browser.py."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import uvicorn

from crater.contracts import (
    HealthCheck,
    NodeCondition,
    NodeHealthReported,
    NodeMetricsReported,
    NodesAnswer,
    NodeSummary,
    NodeTopologyReported,
    PoolsAnswer,
    PoolsQuery,
    TasksAnswer,
    TasksQuery,
)
from crater.contracts.queries import QuerySubjects
from crater.gateway.apikeys import Scope, new_key, read_keys_file, write_keys_file
from crater.gateway.app import GatewaySettings, build
from crater.runtime.nats_server import NatsServer, free_port
from tests.integration.gateway.test_auth import A_TASK, B_TASK
from tests.integration.gateway.test_queries import responder
from tests.support.events import publish_raw
from tests.support.topologies import node

pytestmark = pytest.mark.integration


def keys(path: Path) -> dict[str, str]:
    """A keys file with an admin, a tenant reader, a key without `read`; their tokens."""
    tokens = {}
    stored = []
    for name, tenant, scopes in (
        ("admin", "ops", [Scope.ADMIN]),
        ("reader", "a", [Scope.READ]),
        ("submitter", "a", [Scope.SUBMIT]),
    ):
        token, key = new_key(tenant, scopes, name=name)
        tokens[name] = token
        stored.append(key)
    write_keys_file(path, stored)
    return tokens


def answer_tasks(seen: list[TasksQuery]) -> Any:
    def answer(data: bytes) -> bytes:
        query = TasksQuery.model_validate_json(data)
        seen.append(query)
        known = [
            t
            for t in (A_TASK, B_TASK)
            if query.task_id in (None, t.task_id) and query.tenant in (None, t.tenant)
        ]
        return TasksAnswer(tasks=known).model_dump_json().encode()

    return answer


def answer_pools(seen: list[PoolsQuery]) -> Any:
    def answer(data: bytes) -> bytes:
        seen.append(PoolsQuery.model_validate_json(data))
        return PoolsAnswer(pools=[], quotas=[]).model_dump_json().encode()

    return answer


@asynccontextmanager
async def console(
    nats_url: str, keys_file: Path, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = build(
        GatewaySettings(
            nats_url=nats_url,
            auth="required",
            api_keys_file=keys_file,
            query_timeout_seconds=0.5,
            **settings,
        )
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
    ):
        yield http


async def sign_in(
    http: httpx.AsyncClient, token: str, next: str = "/console/tasks"
) -> httpx.Response:
    return await http.post("/console/login", data={"api_key": token, "next": next})


async def test_a_page_without_a_session_goes_to_the_login_page_and_back(
    fresh_nats: NatsServer, tmp_path: Path
) -> None:
    tokens = keys(tmp_path / "keys.yaml")
    async with console(fresh_nats.url, tmp_path / "keys.yaml") as http:
        page = await http.get("/console/tasks?status=pending")
        assert page.status_code == 303
        assert page.headers["location"] == "/console/login?next=/console/tasks%3Fstatus%3Dpending"
        panel = await http.get("/console/panels/tasks", headers={"HX-Request": "true"})
        assert panel.status_code == 401
        assert panel.headers["HX-Redirect"].startswith("/console/login")
        login = await http.get(page.headers["location"])
        assert login.status_code == 200
        assert 'name="api_key"' in login.text
        assert 'method="post"' in login.text

        wrong = await sign_in(http, "crt_not-a-key")
        assert wrong.status_code == 401
        assert "not known" in wrong.text
        assert "set-cookie" not in wrong.headers
        lacking = await sign_in(http, tokens["submitter"])
        assert lacking.status_code == 403
        assert "`read` scope" in lacking.text

        signed = await sign_in(http, tokens["reader"], "/console/tasks?status=pending")
        assert signed.status_code == 303
        assert signed.headers["location"] == "/console/tasks?status=pending"
        cookie = signed.headers["set-cookie"]
        assert cookie.startswith("crater_console=")
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "samesite=strict" in cookie.lower()
        assert "Path=/console" in cookie
        assert tokens["reader"] not in cookie  # the token itself is never stored
        # no sign-in by GET (a link or an image on another site cannot sign anyone in)
        assert (await http.get("/console/login?api_key=" + tokens["reader"])).status_code == 200
        assert (await http.get("/console/logout")).status_code == 405


async def test_a_tenant_sees_its_own_tasks_and_quota_an_admin_every_tenants(
    fresh_nats: NatsServer, tmp_path: Path
) -> None:
    tokens = keys(tmp_path / "keys.yaml")
    asked: list[TasksQuery] = []
    pools: list[PoolsQuery] = []
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            responder(fresh_nats.url, QuerySubjects.TASKS, answer_tasks(asked), [])
        )
        await stack.enter_async_context(
            responder(fresh_nats.url, QuerySubjects.POOLS, answer_pools(pools), [])
        )
        http = await stack.enter_async_context(console(fresh_nats.url, tmp_path / "keys.yaml"))
        await sign_in(http, tokens["reader"])
        page = await http.get("/console/tasks?tenant=b")  # asking for another tenant's
        assert page.status_code == 200
        assert 'data-task="a-1"' in page.text
        assert "b-1" not in page.text
        assert asked[-1].tenant == "a"
        assert 'name="tenant"' not in page.text  # no tenant filter for a tenant
        assert "no task b-1 is known" in (await http.get("/console/panels/tasks/b-1")).text
        await http.get("/console/pools")
        assert pools[-1].tenant == "a"

        await http.post("/console/logout")
        http.cookies.clear()
        await sign_in(http, tokens["admin"])
        page = await http.get("/console/tasks")
        assert 'data-task="a-1"' in page.text
        assert 'data-task="b-1"' in page.text
        assert asked[-1].tenant is None
        assert "ops (admin)" in page.text
        filtered = await http.get("/console/panels/tasks?tenant=b&q=b-")
        assert 'data-task="b-1"' in filtered.text
        assert (asked[-1].tenant, asked[-1].search) == ("b", "b-")
        await http.get("/console/pools")
        assert pools[-1].tenant is None


async def test_signing_out_and_revoking_the_key_end_the_session(
    fresh_nats: NatsServer, tmp_path: Path
) -> None:
    path = tmp_path / "keys.yaml"
    tokens = keys(path)
    async with console(fresh_nats.url, path) as http:
        await sign_in(http, tokens["reader"])
        cookie = http.cookies["crater_console"]
        assert (await http.get("/console/fleets")).status_code == 200
        out = await http.post("/console/logout")
        assert out.status_code == 303
        assert 'crater_console=""' in out.headers["set-cookie"]
        assert "Max-Age=0" in out.headers["set-cookie"]

        http.cookies.set("crater_console", cookie, path="/console")  # a stolen copy
        assert (await http.get("/console/fleets")).status_code == 200
        revoked = [
            k.model_copy(update={"revoked": datetime.now(UTC)}) if k.name == "reader" else k
            for k in read_keys_file(path)
        ]
        write_keys_file(path, revoked)
        gone = await http.get("/console/fleets")
        assert gone.status_code == 303
        assert "revoked" in gone.headers["location"]
        http.cookies.set("crater_console", cookie[:-3] + "abc", path="/console")
        assert (await http.get("/console/fleets")).status_code == 303  # forged


async def test_every_asset_a_page_loads_comes_from_the_gateway(
    fresh_nats: NatsServer, tmp_path: Path
) -> None:
    tokens = keys(tmp_path / "keys.yaml")
    async with console(fresh_nats.url, tmp_path / "keys.yaml") as http:
        await sign_in(http, tokens["admin"])
        for path in ("/console/login", "/console/pools", "/console/nodes/x"):
            page = await http.get(path)
            linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
            assert all(link.startswith("/") for link in linked), linked
            for asset in (link for link in linked if "/static/" in link):
                got = await http.get(asset)
                assert got.status_code == 200, asset
                assert len(got.content) > 500, asset


async def test_the_event_stream_tells_each_panel_once_per_interval(
    fresh_nats: NatsServer, tmp_path: Path
) -> None:
    tokens = keys(tmp_path / "keys.yaml")
    app = build(
        GatewaySettings(
            nats_url=fresh_nats.url,
            auth="required",
            api_keys_file=tmp_path / "keys.yaml",
            console_refresh_seconds=1.0,
        )
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    publisher = await nats.connect(fresh_nats.url)
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            assert (await http.get("/console/events?topics=tasks")).status_code == 401
            await sign_in(http, tokens["reader"])
            events: list[str] = []
            async with http.stream("GET", "/console/events?topics=tasks,fleets") as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = stream.aiter_lines()
                assert await anext(lines) == "retry: 2000"

                async def collect() -> None:
                    async for line in lines:
                        if line.startswith("event: "):
                            events.append(line.removeprefix("event: "))

                reader = asyncio.create_task(collect())
                for n in range(30):  # a burst: 30 task events, and nodes' metrics
                    await publisher.publish("crater.v1.task.pending", b"{}")
                    await publisher.publish(f"crater.v1.node.metrics.n{n}", b"{}")
                await publisher.flush()
                await asyncio.sleep(0.6)
                assert events == ["tasks"]  # once, at once; no nodes panel is shown here
                await publisher.publish("crater.v1.task.ended", b"{}")
                await publisher.publish("crater.v1.scale.decided", b"{}")
                await publisher.flush()
                await asyncio.sleep(1.0)
                reader.cancel()
                assert events == ["tasks", "fleets", "tasks"]  # tasks again, 1 s after
    finally:
        await publisher.close()
        server.should_exit = True
        await serving


async def test_a_node_shows_its_latest_reports_from_the_streams_and_its_topology(
    fresh_nats: NatsServer, tmp_path: Path
) -> None:
    tokens = keys(tmp_path / "keys.yaml")
    topology = node("a100-01", gpus=8)
    summary = NodesAnswer(
        nodes=[
            NodeSummary(
                node_id="a100-01",
                pool="default",
                condition=NodeCondition.READY,
                gpu_model=topology.gpus[0].model,
                gpu_memory_mb=81920,
                gpus_total=8,
                gpus_free=6,
                cpu_cores_total=32,
                cpu_cores_free=30,
                memory_mb_total=512_000,
                memory_mb_free=500_000,
            )
        ]
    )
    health = NodeHealthReported(
        node_id="a100-01",
        condition=NodeCondition.READY,
        score=90,
        checks=[HealthCheck(name="gpu-ecc", passed=False, detail="3 uncorrected errors")],
    )
    metrics = NodeMetricsReported(
        node_id="a100-01", cpu_utilization_percent=42.0, memory_used_mb=1, memory_total_mb=2
    )
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            responder(
                fresh_nats.url,
                QuerySubjects.NODES,
                lambda _: summary.model_dump_json().encode(),
                [],
            )
        )
        http = await stack.enter_async_context(console(fresh_nats.url, tmp_path / "keys.yaml"))
        await sign_in(http, tokens["reader"])
        assert "a100-01" in (await http.get("/console/nodes")).text  # the hub subscribes
        for subject, event in (
            ("crater.v1.node.topology.a100-01", NodeTopologyReported(node=topology)),
            ("crater.v1.node.health.a100-01", health),
            ("crater.v1.node.metrics.a100-01", metrics),
        ):
            await publish_raw(fresh_nats.url, subject, event.model_dump_json().encode())
        page = await http.get("/console/nodes/a100-01")
        assert page.status_code == 200
        assert "<svg" in page.text
        assert page.text.count('class="t-gpu"') == 8
        assert "3 uncorrected errors" in page.text
        assert 'sse-connect="/console/events?topics=node-a100-01"' in page.text
        assert "42 %" in page.text
        listed = await http.get("/console/panels/nodes")  # the hub's copy of the reports
        assert "42 %" in listed.text
        assert "failing: gpu-ecc" in listed.text
        panel = await http.get("/console/panels/nodes/a100-01?follow=<script>")
        assert 'hx-trigger="sse:nodes"' in panel.text
        assert "no such node" in (await http.get("/console/nodes/a1.*")).text
