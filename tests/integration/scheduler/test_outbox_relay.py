"""The outbox relay publishes a batch with every ack in flight at once, marks what JetStream
acknowledged, and leaves the rest for the next round, which doubles nothing (real nats-server,
real SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from faststream.nats import NatsBroker
from sqlalchemy import func, select

from crater.contracts import NodeCondition, NodeHealthReported
from crater.runtime.bus import ensure_streams, subject_of
from crater.runtime.nats_server import NatsServer
from crater.runtime.outbox import OutboxRelay, stage
from crater.scheduler.adapters.orm import outbox
from tests.support.events import EventTap

pytestmark = pytest.mark.integration


@pytest.fixture
async def broker(fresh_nats: NatsServer) -> AsyncIterator[NatsBroker]:
    await ensure_streams(fresh_nats.url)
    connected = NatsBroker(fresh_nats.url)
    await connected.connect()
    yield connected
    await connected.stop()


def health(n: int) -> NodeHealthReported:
    return NodeHealthReported(node_id=f"n{n}", condition=NodeCondition.READY, score=n % 100)


async def unpublished(sessions: Any) -> int:
    async with sessions() as session:
        count = await session.scalar(
            select(func.count()).select_from(outbox).where(outbox.c.published_at.is_(None))
        )
        return int(count or 0)


async def stored(server: NatsServer, event: NodeHealthReported) -> int:
    """How many messages the stream of `event` holds."""
    connection = await nats.connect(server.url)
    try:
        js = connection.jetstream()
        info = await js.stream_info(await js.find_stream_name_by_subject(subject_of(event)))
        return int(info.state.messages)
    finally:
        await connection.close()


async def test_a_batch_goes_out_at_once_in_order_and_once(
    sessions: Any, broker: NatsBroker, tap: EventTap, fresh_nats: NatsServer
) -> None:
    events = [health(n) for n in range(300)]
    async with sessions() as session, session.begin():
        await stage(session, outbox, *events)
    relay = OutboxRelay(sessions, outbox, broker, batch=256)
    before = await stored(fresh_nats, events[0])

    assert await relay.publish_pending() == 256
    assert await relay.publish_pending() == 44
    assert await relay.publish_pending() == 0
    assert await unpublished(sessions) == 0

    received = await tap.wait_for(NodeHealthReported, count=300)
    assert [e.event_id for e in received] == [e.event_id for e in events]  # staging order
    assert await stored(fresh_nats, events[0]) == before + 300


class FlakyBroker:
    """Fault injection: the acks of chosen messages never come, though the messages arrive:
    in the relay's batch (`publish_batch`: their futures never end) and in the single publish
    it tries again with (`publish`: it raises)."""

    def __init__(self, broker: NatsBroker, lost: set[str]) -> None:
        self.broker = broker
        self.lost = lost
        self.js = broker.connection.jetstream()

    @property
    def connection(self) -> FlakyBroker:
        return self

    def jetstream(self) -> FlakyBroker:
        return self

    async def publish_async(self, subject: str, payload: bytes, **options: Any) -> Any:
        acked = await self.js.publish_async(subject, payload, **options)  # it does arrive
        if options["headers"]["Nats-Msg-Id"] in self.lost:
            return asyncio.get_running_loop().create_future()  # an ack that never comes
        return acked

    async def publish(self, payload: bytes, subject: str, **options: Any) -> Any:
        result = await self.broker.publish(payload, subject, **options)  # it did arrive
        if options["headers"]["Nats-Msg-Id"] in self.lost:
            raise TimeoutError("no ack")
        return result


async def test_a_lost_ack_leaves_its_row_for_the_next_round_and_nothing_doubles(
    sessions: Any, broker: NatsBroker, tap: EventTap, fresh_nats: NatsServer
) -> None:
    events = [health(n) for n in range(20)]
    async with sessions() as session, session.begin():
        await stage(session, outbox, *events)
    lost = {str(events[3].event_id), str(events[11].event_id)}
    flaky = OutboxRelay(sessions, outbox, FlakyBroker(broker, lost))  # type: ignore[arg-type]
    before = await stored(fresh_nats, events[0])

    with pytest.raises(TimeoutError):
        await flaky.publish_pending()
    assert await unpublished(sessions) == 2  # the other 18 are marked

    relay = OutboxRelay(sessions, outbox, broker)
    assert await relay.publish_pending() == 2
    assert await unpublished(sessions) == 0
    # Both rounds published the two; JetStream kept each once (Nats-Msg-Id).
    assert await stored(fresh_nats, events[0]) == before + 20
    await tap.wait_for(NodeHealthReported, count=20)
