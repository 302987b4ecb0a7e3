"""A gateway on a test's own nats-server, its lifespan run as uvicorn would run it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from crater.gateway.app import GatewaySettings, build
from crater.runtime.nats_server import NatsServer


@pytest.fixture
async def client(fresh_nats: NatsServer) -> AsyncIterator[httpx.AsyncClient]:
    app = build(GatewaySettings(nats_url=fresh_nats.url, query_timeout_seconds=0.5))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway"
        ) as http,
    ):
        yield http
