"""The leading autoscaler answers `crater.v1.query.fleets` over a real nats-server."""

from __future__ import annotations

import asyncio

import nats
from faststream import TestApp

from crater.autoscaler.app import AutoscalerSettings, build
from crater.contracts import FleetsAnswer, FleetsQuery, QuerySubjects, ScaleDecided
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.autoscaler.test_autoscaler_over_nats import slow
from tests.support.events import EventTap


async def ask(url: str, query: FleetsQuery) -> FleetsAnswer:
    connection = await nats.connect(url)
    try:
        reply = await connection.request(
            QuerySubjects.FLEETS, query.model_dump_json().encode(), timeout=5
        )
        return FleetsAnswer.model_validate_json(reply.data)
    finally:
        await connection.close()


async def test_the_leader_answers_each_fleet_with_its_decisions(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    service, app = build(AutoscalerSettings(nats_url=fresh_nats.url, strategy="rule"))
    async with TestApp(app):
        await publish(service.broker, slow("chat"))
        [decision] = await tap.wait_for(ScaleDecided)
        answer = await ask(fresh_nats.url, FleetsQuery())
        for _ in range(50):  # the tap may see the decision before the handler returned
            if answer.fleets and answer.fleets[0].decisions:
                break
            await asyncio.sleep(0.1)
            answer = await ask(fresh_nats.url, FleetsQuery())
        [fleet] = answer.fleets
        assert (fleet.service, fleet.p95_latency_ms, fleet.gpu_memory_pressure) == (
            "chat",
            450.0,
            0.93,
        )
        assert [d.event_id for d in fleet.decisions] == [decision.event_id]
        assert answer.strategy == "rule"
        assert (await ask(fresh_nats.url, FleetsQuery(service="other"))).fleets == []
