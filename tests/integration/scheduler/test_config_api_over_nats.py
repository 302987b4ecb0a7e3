"""Quotas and pools applied over the API as the scheduler runs: a real nats-server and
database, the gateway with authentication on. `PUT /api/v1/admin/quotas` is for the admin
scope only; a bad body is refused (422) naming the field, the running configuration kept; a
good one (JSON here) applies from the next event on without a restart, is in the audit log
as a configuration record, and its elastic guarantees act: a tenant borrows past its
guarantee and gives it back when another needs its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import nats
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    TaskPreempted,
    TaskProfiled,
)
from crater.gateway.apikeys import Scope, kv_bucket, kv_put, new_key
from crater.gateway.app import GatewaySettings
from crater.gateway.app import build as build_gateway
from crater.runtime.bus import publish
from crater.runtime.db import make_engine, make_session_factory
from crater.runtime.nats_server import NatsServer
from crater.scheduler import audit
from crater.scheduler.app import SchedulerSettings, build
from tests.support.events import EventTap
from tests.support.profiles import profiled
from tests.support.scheduler import node_known
from tests.support.topologies import node

RELOADS = "crater_scheduler_config_reloads_total"
QUOTAS = {
    "tenants": {
        "acme": {"guarantee": {"gpus": 2}, "borrow": {"gpus": 2}},
        "beta": {"guarantee": {"gpus": 2}},
        "legacy": {"gpus": 1},
    }
}


def submitted(task_id: str, tenant: str, gpus: int, **body: Any) -> TaskProfiled:
    return profiled(task_id, gpus, tenant=tenant, **body)


async def store_key(nats_url: str, tenant: str, scope: Scope) -> str:
    token, key = new_key(tenant, [scope], name="test")
    connection = await nats.connect(nats_url)
    try:
        await kv_put(await kv_bucket(connection.jetstream()), key)
    finally:
        await connection.close()
    return token


@asynccontextmanager
async def gateway(nats_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = build_gateway(
        GatewaySettings(nats_url=nats_url, query_timeout_seconds=5, auth="required")
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
    ):
        yield http


async def test_quotas_applied_over_the_api_take_effect_and_are_recorded(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    admin = await store_key(fresh_nats.url, "ops", Scope.ADMIN)
    reader = await store_key(fresh_nats.url, "acme", Scope.READ)
    async with TestApp(app), gateway(fresh_nats.url) as http:
        for _ in range(200):  # leading: it answers the admin subject
            if service.state.epoch is not None:
                break
            await asyncio.sleep(0.05)
        await node_known(service, node("n1", gpus=4))

        body = json.dumps(QUOTAS)
        path = "/api/v1/admin/quotas"
        denied = await http.put(path, content=body, headers={"Authorization": f"Bearer {reader}"})
        assert denied.status_code == 403
        bearer = {"Authorization": f"Bearer {admin}"}

        bad = {"tenants": {"acme": {"gpus": 1, "guarantee": {"gpus": 2}}}}
        refused = await http.put(path, content=json.dumps(bad), headers=bearer)
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["detail"]
        assert error["field"] == "tenants.acme"
        assert "a hard limit (gpus) or a guarantee, not both" in error["reason"]
        no_cohort = "pools:\n  training: {lend: {limit: {gpus: 1}}}\n"
        refused = await http.put("/api/v1/admin/pools", content=no_cohort, headers=bearer)
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["field"] == "pools.training"
        assert not service.state.scheduler.quotas.shares  # the running one kept
        empty = await http.put(path, content=b"  ", headers=bearer)
        assert empty.status_code == 422

        applied = await http.put(path, content=body, headers=bearer)
        assert applied.status_code == 200, applied.text
        answer = applied.json()
        assert answer["applied"] is True
        assert answer["tenants"] == ["acme", "beta", "legacy"]
        assert service.registry.get_sample_value(RELOADS, {"outcome": "applied"}) == 1.0
        assert service.registry.get_sample_value(RELOADS, {"outcome": "refused"}) == 2.0

        # The guarantees act: acme borrows beta's idle two cards, and gives them back.
        await publish(service.broker, submitted("a1", "acme", 2))
        await publish(service.broker, submitted("a2", "acme", 2, priority="high"))
        _, loan = await tap.wait_for(AllocationGranted, count=2)
        assert loan.task_id == "a2"
        assert "tenant acme over its guarantee: borrowing 2 GPUs (reclaimable)" in loan.explanation
        await publish(service.broker, submitted("b1", "beta", 2, priority="low"))
        [preempted] = await tap.wait_for(TaskPreempted)
        assert (preempted.task_id, preempted.reclaimed_by_tenant) == ("a2", "beta")

        # Found by fuzzing: a NUL in the file's text, or in a key the refusal names, made an
        # answer that was not JSON text (the gateway answered 500).
        nul = await http.put(path, content=b"tenants:\n  a\x00: {gpus: 1}\n", headers=bearer)
        assert nul.status_code == 422, nul.text
        assert nul.json()["detail"][0]["field"] == "body"
        escaped = 'tenants: {}\n"x\\0\\x17": 1\n'  # YAML's escapes: a NUL and a control
        odd = await http.put(path, content=escaped, headers=bearer)
        assert odd.status_code == 422, odd.text
        assert odd.json()["detail"][0]["field"] == "x\\u0000\\u0017"

    engine = make_engine(database_url)
    try:
        async with make_session_factory(engine)() as session:
            log = await audit.all_entries(session)
    finally:
        await engine.dispose()
    [reloaded] = [e for e in log if e.kind == audit.CONFIG_RELOADED]
    assert reloaded.source == audit.CONFIG
    recorded = json.loads(reloaded.input)
    assert recorded["tenant_shares"]["acme"]["borrow_limit"]["gpus"] == 2
    assert recorded["quotas"]["legacy"]["gpus"] == 1
    refusals = [json.loads(e.input) for e in log if e.kind == audit.CONFIG_REFUSED]
    assert [r["file"] for r in refusals] == ["quotas", "pools", "quotas"]
    # the grants after it are decided under it: the record comes before them
    first_grant = next(e for e in log if '"kind":"AllocationGranted"' in e.decisions)
    assert reloaded.seq < first_grant.seq
