"""Watch the bus the way an operator would: a core NATS subscription that parses events."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from crater.contracts import Event, Subjects

E = TypeVar("E", bound=Event)


class EventTap:
    """Collects every event seen on `crater.v1.>` since it started, parsed by subject.

    `raw` keeps every message as core NATS delivered it; `events` keeps each Nats-Msg-Id
    once with the same bytes, as JetStream does: a publish that JetStream drops as a
    duplicate (two replicas' outbox relays sending the same event, a retried publish) still
    reaches a core subscription, and counting it twice would end a `wait_for(count=N)` early.
    Those repeats are kept in `repeats`: a test that a decision is made once asserts there
    are none of its kind."""

    def __init__(self, connection: Client) -> None:
        self.connection = connection
        self.events: list[Event] = []
        self.raw: list[Msg] = []
        self.repeats: list[Msg] = []  # a Nats-Msg-Id seen before
        self._message_ids: set[tuple[str, bytes]] = set()
        self._changed = asyncio.Condition()

    @classmethod
    async def start(cls, nats_url: str) -> EventTap:
        tap = cls(await nats.connect(nats_url))
        await tap.connection.subscribe("crater.v1.>", cb=tap._on_message)
        await tap.connection.flush()
        return tap

    async def _on_message(self, msg: Msg) -> None:
        self.raw.append(msg)
        message_id = (msg.headers or {}).get("Nats-Msg-Id")
        if message_id is not None:
            # the same bytes again: what JetStream drops; the same id with other bytes (a
            # dead letter retried with its delivery count) follows a publish that failed
            key = (message_id, msg.data)
            if key in self._message_ids:
                self.repeats.append(msg)
                return
            self._message_ids.add(key)
        for channel in Subjects.ALL:
            prefix = channel.subject
            if msg.subject == prefix or (
                channel.node_scoped and msg.subject.startswith(prefix + ".")
            ):
                # bad input published on purpose by a test is not an event
                with contextlib.suppress(ValueError):
                    self.events.append(channel.event.model_validate_json(msg.data))
                break
        async with self._changed:
            self._changed.notify_all()

    def of(self, kind: type[E], where: Callable[[E], bool] = lambda _: True) -> list[E]:
        return [e for e in self.events if isinstance(e, kind) and where(e)]

    async def wait_for(
        self,
        kind: type[E],
        where: Callable[[E], bool] = lambda _: True,
        count: int = 1,
        timeout: float = 20.0,
    ) -> list[E]:
        async def enough() -> list[E]:
            async with self._changed:
                while len(found := self.of(kind, where)) < count:
                    await self._changed.wait()
                return found

        try:
            return await asyncio.wait_for(enough(), timeout)
        except TimeoutError:
            seen = [type(e).__name__ for e in self.events]
            raise AssertionError(
                f"waited {timeout}s for {count} {kind.__name__}; saw {len(seen)} events: "
                f"{seen[-20:]}"
            ) from None

    async def close(self) -> None:
        await self.connection.drain()


async def publish_raw(nats_url: str, subject: str, body: bytes, **headers: Any) -> None:
    """Publish bytes to JetStream as a careless or hostile producer would."""
    connection = await nats.connect(nats_url)
    try:
        await connection.jetstream().publish(subject, body, headers=headers or None)
    finally:
        await connection.close()
