"""The callback against receivers that misbehave: down for a while, slow, signing with the
wrong key; and the service itself stopped mid-delivery and started again. Real nats-server,
real database, the reference receiver over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from faststream import TestApp

from crater.callback.app import CallbackSettings, build
from crater.callback.delivery import Dispatcher
from crater.callback.domain.signing import generate_secret
from crater.callback.sim.receiver import Receiver
from crater.contracts import WebhookDeadLettered, WebhookDelivered
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer, free_port
from tests.integration.callback.sequenced import Numbering, report
from tests.support.events import EventTap
from tests.support.lifecycle import granted, pending

SECRET = generate_secret()
FAST = {
    "webhook_username": "alldata",
    "webhook_password": "s3cret",
    "webhook_secret": SECRET,
    "webhook_timeout_seconds": 2.0,
    "initial_backoff_seconds": 0.05,
    "max_backoff_seconds": 0.3,
    "retry_seed": 1,
    "poll_seconds": 0.05,
    "claim_seconds": 2.5,
    "breaker_failures": 3,
    "breaker_cooldown_seconds": 0.3,
    "breaker_max_cooldown_seconds": 0.6,
}


def settings(nats: NatsServer, database_url: str, **fields: object) -> CallbackSettings:
    values: dict[str, object] = {"nats_url": nats.url, "database_url": database_url, **FAST}
    return CallbackSettings.model_validate(values | fields)


@contextlib.asynccontextmanager
async def serving(state: Receiver, port: int) -> AsyncIterator[None]:
    server = uvicorn.Server(
        uvicorn.Config(state.app(), host="127.0.0.1", port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.02)
    try:
        yield
    finally:
        server.should_exit = True
        await task


def receiver(**fields: object) -> Receiver:
    return Receiver("alldata", "s3cret", echo=False, secret=SECRET, **fields)  # type: ignore[arg-type]


def lifecycles(tasks: int) -> list[list[object]]:
    numbered = Numbering()
    return [
        [numbered(pending(f"t{n}")), numbered(granted(f"t{n}")), report(f"t{n}")]
        for n in range(tasks)
    ]


def per_task(state: Receiver) -> dict[str, list[str]]:
    got: dict[str, list[str]] = {}
    for d in state.deliveries:
        got.setdefault(d.body["task_id"], []).append(d.body["status"])
    return got


async def test_receiver_down_for_a_while_then_back_loses_nothing_and_keeps_order(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    port = free_port()
    service, app = build(
        settings(fresh_nats, database_url, webhook_url=f"http://127.0.0.1:{port}/")
    )
    state = receiver()
    async with TestApp(app):
        for events in lifecycles(4):
            for event in events:
                await publish(service.broker, event)  # type: ignore[arg-type]
        await asyncio.sleep(1.0)  # refused connections; the breaker opens
        assert tap.of(WebhookDelivered) == []
        async with serving(state, port):
            await tap.wait_for(WebhookDelivered, count=12, timeout=15)

    assert per_task(state) == {f"t{n}": ["pending", "scheduled", "running"] for n in range(4)}
    assert tap.of(WebhookDeadLettered) == []


async def test_a_slow_receiver_holds_up_neither_the_bus_nor_other_endpoints(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    slow_port, fast_port = free_port(), free_port()
    file = tmp_path / "endpoints.yaml"
    file.write_text(
        f"""
endpoints:
  - {{name: slow, url: "http://127.0.0.1:{slow_port}/", username: alldata, password: s3cret,
      secret: "{SECRET}", max_in_flight: 1, timeout_seconds: 2}}
  - {{name: fast, url: "http://127.0.0.1:{fast_port}/", username: alldata, password: s3cret,
      secret: "{SECRET}", events: [scheduled]}}
"""
    )
    slow, fast = receiver(delay_seconds=1.0), receiver()
    service, app = build(settings(fresh_nats, database_url, endpoints_file=str(file)))
    async with serving(slow, slow_port), serving(fast, fast_port), TestApp(app):
        for n in range(10):
            await publish(service.broker, granted(f"s{n}"))
        fast_done = await tap.wait_for(
            WebhookDelivered, lambda e: e.endpoint == "fast", count=10, timeout=3
        )
        # The slow endpoint has one POST at a time: at most two of ten are through by now.
        assert len(tap.of(WebhookDelivered, lambda e: e.endpoint == "slow")) <= 2
        assert len(fast_done) == 10
        # The bus is not held: a new event is recorded and sent to the fast endpoint at once.
        await publish(service.broker, granted("late"))
        await tap.wait_for(WebhookDelivered, lambda e: e.task_id == "late", timeout=2)


async def test_a_wrong_password_or_signature_dead_letters_at_once(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    port = free_port()
    state = receiver()
    url = f"http://127.0.0.1:{port}/"
    wrong_key = settings(
        fresh_nats, database_url, webhook_url=url, webhook_secret=generate_secret()
    )
    async with serving(state, port):
        service, app = build(wrong_key)
        async with TestApp(app):
            await publish(service.broker, granted("forged"))
            [dead] = await tap.wait_for(WebhookDeadLettered)
        wrong_password = settings(fresh_nats, database_url, webhook_url=url, webhook_password="x")
        service, app = build(wrong_password)
        async with TestApp(app):
            await publish(service.broker, granted("guessed"))
            await tap.wait_for(WebhookDeadLettered, count=2)
    assert (dead.task_id, dead.attempts) == ("forged", 1)
    assert dead.last_error.startswith("HTTP 401")
    assert (state.bad_signatures, state.unauthorized) == (1, 1)
    assert state.deliveries == []


async def test_killed_mid_delivery_and_restarted_delivers_once_in_effect(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    port = free_port()
    state = receiver(delay_seconds=0.5)
    config = settings(fresh_nats, database_url, webhook_url=f"http://127.0.0.1:{port}/")
    numbered = Numbering()
    first = numbered(pending("crash"))
    second = numbered(granted("crash"))
    async with serving(state, port):
        service, app = build(config)
        async with TestApp(app):
            await publish(service.broker, first)
            await publish(service.broker, second)
            while state.requests == 0:  # noqa: ASYNC110 (a counter, polled)
                await asyncio.sleep(0.01)
            # Killed: the POST under way is abandoned unrecorded and its claim is kept.
            dispatcher: Dispatcher = service.state
            for route in dispatcher.routes.values():
                for task in route.in_flight.values():
                    task.cancel()
        assert tap.of(WebhookDelivered) == []
        state.delay_seconds = 0.0
        service, app = build(config)
        async with TestApp(app):
            delivered = await tap.wait_for(WebhookDelivered, count=2, timeout=10)

    assert [d.webhook_id for d in delivered] == [str(first.event_id), str(second.event_id)]
    assert per_task(state) == {"crash": ["pending", "scheduled"]}
    assert len(state.deliveries) == 2  # the first, sent twice under one id, recorded once


async def test_killed_amid_a_batch_of_deliveries_loses_and_doubles_nothing_in_effect(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    port = free_port()
    state = receiver(delay_seconds=0.3)
    config = settings(fresh_nats, database_url, webhook_url=f"http://127.0.0.1:{port}/")
    emitted = lifecycles(12)
    async with serving(state, port):
        service, app = build(config)
        async with TestApp(app):
            for events in emitted:
                for event in events:
                    await publish(service.broker, event)  # type: ignore[arg-type]
            while state.requests < 14:  # noqa: ASYNC110 (a counter, polled)
                await asyncio.sleep(0.01)
            # Killed with a batch of POSTs under way: none of them is recorded.
            dispatcher: Dispatcher = service.state
            for route in dispatcher.routes.values():
                for task in route.in_flight.values():
                    task.cancel()
        state.delay_seconds = 0.0
        service, app = build(config)
        async with TestApp(app):
            await tap.wait_for(WebhookDelivered, count=36, timeout=20)

    assert len({d.webhook_id for d in state.deliveries}) == 36
    assert state.requests > 36  # the POSTs cut short by the kill went again...
    assert len(state.deliveries) == 36  # ...under their webhook-id: recorded once
    assert per_task(state) == {f"t{n}": ["pending", "scheduled", "running"] for n in range(12)}
