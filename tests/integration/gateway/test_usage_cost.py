"""GET /api/v1/usage asks the predictor, scoped to the credential's tenant; `crater cost`
prints it as a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import pytest
from typer.testing import CliRunner

import crater.cli.gateway as cli_gateway
from crater.cli.main import app as cli
from crater.contracts import UsageAnswer, UsageLine, UsageQuery
from crater.contracts.queries import QuerySubjects
from crater.gateway.apikeys import Scope
from crater.runtime.nats_server import NatsServer
from tests.integration.gateway.test_auth import bearer, gateway, store_key
from tests.integration.gateway.test_queries import responder

SINCE = datetime(2026, 11, 30, 10, tzinfo=UTC)
UNTIL = datetime(2026, 11, 30, 11, tzinfo=UTC)


def line(key: str, gpu_seconds: int, cost: str) -> UsageLine:
    return UsageLine(
        key=key,
        allocations=1,
        gpu_seconds=Decimal(gpu_seconds),
        gpu_hours=Decimal(gpu_seconds) / 3600,
        idle_gpu_seconds=Decimal(0),
        unmeasured_gpu_seconds=Decimal(gpu_seconds),
        gpu_memory_gib_seconds=Decimal(0),
        cpu_core_seconds=Decimal(0),
        memory_gib_seconds=Decimal(0),
        cost=Decimal(cost),
    )


LINES = {"a": line("a", 3600, "2.5"), "b": line("b", 7200, "8")}


def answer(data: bytes) -> bytes:
    query = UsageQuery.model_validate_json(data)
    lines = [v for k, v in LINES.items() if query.tenant in (None, k)]
    total = line(
        "total", int(sum(x.gpu_seconds for x in lines)), str(sum(x.cost or 0 for x in lines))
    )
    return (
        UsageAnswer(
            since=query.since,
            until=query.until,
            by=query.by,
            currency="EUR",
            lines=lines,
            total=total,
        )
        .model_dump_json()
        .encode()
    )


async def test_a_tenant_sees_its_own_usage_an_admin_every_tenant_s(fresh_nats: NatsServer) -> None:
    seen: list[bytes] = []
    params = {"since": SINCE.isoformat(), "until": UNTIL.isoformat()}
    async with gateway(fresh_nats.url) as http:
        a_key = await store_key(fresh_nats.url, "a", Scope.READ)
        admin = await store_key(fresh_nats.url, "ops", Scope.ADMIN)
        async with responder(fresh_nats.url, QuerySubjects.USAGE, answer, seen):
            own = await http.get("/api/v1/usage", params=params, headers=bearer(a_key))
            other = await http.get(
                "/api/v1/usage", params={**params, "tenant": "b"}, headers=bearer(a_key)
            )
            everyone = await http.get("/api/v1/usage", params=params, headers=bearer(admin))
            backwards = await http.get(
                "/api/v1/usage",
                params={"since": UNTIL.isoformat(), "until": SINCE.isoformat()},
                headers=bearer(admin),
            )
        anonymous = await http.get("/api/v1/usage", params=params)
    assert own.status_code == 200
    assert [x["key"] for x in own.json()["lines"]] == ["a"]
    assert [x["key"] for x in other.json()["lines"]] == ["a"]  # its own, whatever it asks
    assert [x["key"] for x in everyone.json()["lines"]] == ["a", "b"]
    assert everyone.json()["total"]["gpu_seconds"] == "10800"
    assert backwards.status_code == 422
    assert backwards.json()["detail"][0]["field"] == "until"
    assert anonymous.status_code == 401
    assert [UsageQuery.model_validate_json(s).tenant for s in seen] == ["a", "a", None]


def fake_call(
    method: str, gateway: str, path: str, *, params: dict[str, str | int], **_: object
) -> httpx.Response:
    assert (method, path) == ("GET", "/api/v1/usage")
    query = UsageQuery(
        since=datetime.fromisoformat(str(params["since"])),
        until=datetime.fromisoformat(str(params["until"])),
        by=str(params["by"]),  # type: ignore[arg-type]
    )
    return httpx.Response(200, content=answer(query.model_dump_json().encode()))


def test_crater_cost_prints_a_table_json_and_csv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_gateway, "call", fake_call)
    window = ["--since", "2026-11-30T10:00", "--until", "2026-11-30T11:00"]
    runner = CliRunner()
    table = runner.invoke(cli, ["cost", *window])
    assert table.exit_code == 0, table.output
    assert "total" in table.output
    assert "10.50" in table.output
    as_json = runner.invoke(cli, ["cost", *window, "--by", "pool", "--json"])
    assert as_json.exit_code == 0, as_json.output
    parsed = UsageAnswer.model_validate_json(as_json.output)
    assert parsed.by == "pool"
    assert parsed.since == SINCE
    assert sum(x.gpu_seconds for x in parsed.lines) == parsed.total.gpu_seconds
    as_csv = runner.invoke(cli, ["cost", *window, "--csv"])
    assert as_csv.exit_code == 0, as_csv.output
    rows = list(csv.DictReader(io.StringIO(as_csv.output)))
    assert [(r["key"], r["gpu_seconds"], r["cost"], r["currency"]) for r in rows] == [
        ("a", "3600", "2.5", "EUR"),
        ("b", "7200", "8", "EUR"),
    ]
