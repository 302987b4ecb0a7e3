"""Fixtures of the runtime's integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from faststream.nats import NatsBroker

from crater.runtime.bus import ensure_streams
from crater.runtime.nats_connection import NatsConnection
from crater.runtime.nats_server import NatsServer


@pytest.fixture
async def broker(fresh_nats: NatsServer) -> AsyncIterator[NatsBroker]:
    """A started broker on the test's own nats-server, Crater's streams declared."""
    await ensure_streams(NatsConnection(fresh_nats.url))
    broker = NatsBroker(fresh_nats.url)
    await broker.start()
    yield broker
    await broker.stop()
