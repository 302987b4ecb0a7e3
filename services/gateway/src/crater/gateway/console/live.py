"""Live updates for the console: one subscription on the bus for the whole gateway, shared by
every browser, turned into throttled "this panel changed" notices.

The hub subscribes once (core NATS: no consumer, no ack, nothing replayed) to the subjects
`nats_permissions.WATCHES` grants the gateway. Each message names the panels it changes
(`topics_of`); a panel's notice goes out at most once per `interval` seconds however many
events arrive (the first at once, the rest of a burst folded into one), and only to the
browsers that show that panel. A notice carries no data: the browser asks for the panel again
(htmx), through the same authentication and tenant scoping as the page itself, so a
notice tells a tenant nothing but that something changed.

The hub also keeps the latest health and metrics message of each node as it passes (raw
bytes; decoded only when shown), for the nodes page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel, ValidationError

from crater.contracts import NodeHealthReported, NodeMetricsReported
from crater.contracts.catalog import PREFIX
from crater.runtime.nats_permissions import WATCHES

log = logging.getLogger("crater.gateway.console")

# The panels a notice may name: a page's, or one node's (`node-<id>`).
PANELS = ("pools", "tasks", "nodes", "fleets")
NODE_TOPIC = "node-"
Message = TypeVar("Message", bound=BaseModel)
Subscribe = Callable[..., Awaitable[Subscription]]
# Telemetry older than this is dropped from the cache (a node gone for good).
FORGET_SECONDS = 3600.0


def node_topic(node_id: str) -> str:
    return f"{NODE_TOPIC}{node_id}"


def topics_of(subject: str) -> tuple[str, ...]:
    """The panels an event on `subject` may change."""
    parts = subject.removeprefix(f"{PREFIX}.").split(".")
    entity = parts[0]
    if entity == "task":
        return ("tasks", "pools")
    if entity == "allocation":
        return ("tasks", "pools", "nodes", "fleets")
    if entity == "webhook":
        return ("tasks",)
    if entity in ("scale", "inference"):
        return ("fleets",)
    if entity == "node" and len(parts) == 3:
        kind, node = parts[1], parts[2]
        if kind == "topology":
            return ("nodes", node_topic(node), "pools")
        return ("nodes", node_topic(node))  # metrics, health (pools: see LiveHub.on_message)
    return ()


def wanted_topics(text: str) -> frozenset[str]:
    """The topics a browser asks for (`?topics=tasks,node-a100-01`), unknown ones left out."""
    asked = {t.strip() for t in text.split(",")}
    return frozenset(
        t for t in asked if t in PANELS or (t.startswith(NODE_TOPIC) and 0 < len(t) <= 80)
    )


@dataclass(eq=False)
class Listener:
    """One browser's event stream: the topics it shows, and those changed since it last
    looked."""

    topics: frozenset[str]
    pending: set[str] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, topic: str) -> None:
        if topic in self.topics:
            self.pending.add(topic)
            self.wake.set()

    async def changed(self, timeout: float) -> list[str]:
        """The topics changed since the last call, waiting up to `timeout` seconds for one;
        [] when none came."""
        if not self.pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)
        self.wake.clear()
        found, self.pending = sorted(self.pending), set()
        return found


@dataclass
class Telemetry:
    """The latest health and metrics message of each node, as they passed."""

    health: dict[str, tuple[float, bytes]] = field(default_factory=dict)
    metrics: dict[str, tuple[float, bytes]] = field(default_factory=dict)
    conditions: dict[str, str] = field(default_factory=dict)

    def keep(self, kind: str, node: str, data: bytes, now: float) -> bool:
        """Keep a message; True when a health report changes the node's condition."""
        if kind == "metrics":
            self.metrics[node] = (now, data)
            return False
        self.health[node] = (now, data)
        try:
            condition = NodeHealthReported.model_validate_json(data).condition.value
        except ValidationError:
            return False
        previous = self.conditions.get(node)
        self.conditions[node] = condition
        return previous is not None and previous != condition

    def latest_metrics(self, now: float | None = None) -> dict[str, NodeMetricsReported]:
        return self._decoded(self.metrics, NodeMetricsReported, now)

    def latest_health(self, now: float | None = None) -> dict[str, NodeHealthReported]:
        return self._decoded(self.health, NodeHealthReported, now)

    @staticmethod
    def _decoded(
        kept: dict[str, tuple[float, bytes]], model: type[Message], now: float | None
    ) -> dict[str, Message]:
        now = time.monotonic() if now is None else now
        for node in [n for n, (at, _) in kept.items() if now - at > FORGET_SECONDS]:
            del kept[node]
        found: dict[str, Message] = {}
        for node, (_, data) in kept.items():
            with contextlib.suppress(ValidationError):
                found[node] = model.model_validate_json(data)
        return found


class Throttle:
    """Calls `fire(topic)` at most once per `interval` seconds per topic: the first touch at
    once (on the next turn of the loop, folding a burst), later ones when the interval since
    the last call has passed."""

    def __init__(self, interval: float, fire: Callable[[str], None]) -> None:
        self.interval = interval
        self.fire = fire
        self.last: dict[str, float] = {}
        self.scheduled: dict[str, asyncio.TimerHandle] = {}

    def touch(self, topic: str) -> None:
        if topic in self.scheduled:
            return
        loop = asyncio.get_running_loop()
        wait = max(0.0, self.last.get(topic, -math.inf) + self.interval - loop.time())
        self.scheduled[topic] = loop.call_later(wait, self._due, topic)

    def _due(self, topic: str) -> None:
        del self.scheduled[topic]
        self.last[topic] = asyncio.get_running_loop().time()
        self.fire(topic)

    def cancel(self) -> None:
        for handle in self.scheduled.values():
            handle.cancel()
        self.scheduled.clear()


class LiveHub:
    """The gateway's one subscription for the console, its listeners and its telemetry."""

    def __init__(self, subscribe: Subscribe, interval: float) -> None:
        # `subscribe(subject, cb=...)`: the NATS connection's (any callable, in tests)
        self._subscribe = subscribe
        self.listeners: set[Listener] = set()
        self.telemetry = Telemetry()
        self.throttle = Throttle(interval, self._notify)
        self._subscriptions: list[Subscription] = []
        self._starting: asyncio.Lock | None = None
        self.started = False

    async def start(self) -> None:
        """Subscribe, once (the first console request does it); a failure is retried by the
        next request."""
        if self.started:
            return
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self.started:
                return
            for subject in WATCHES["gateway"]:
                self._subscriptions.append(await self._subscribe(subject, cb=self.on_message))
            self.started = True
            log.info("console watching %d subjects", len(self._subscriptions))

    async def close(self) -> None:
        self.throttle.cancel()
        for subscription in self._subscriptions:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        self._subscriptions.clear()
        self.started = False

    async def on_message(self, message: Msg) -> None:
        self.received(message.subject, message.data)

    def received(self, subject: str, data: bytes) -> None:
        topics = topics_of(subject)
        parts = subject.split(".")
        telemetry = len(parts) == 5 and parts[2] == "node" and parts[3] in ("metrics", "health")
        if telemetry and self.telemetry.keep(parts[3], parts[4], data, time.monotonic()):
            topics = (*topics, "pools")  # a node's condition changed: the ready counts
        if not self.listeners:
            return
        for topic in topics:
            self.throttle.touch(topic)

    def _notify(self, topic: str) -> None:
        for listener in self.listeners:
            listener.offer(topic)

    @contextlib.contextmanager
    def listen(self, topics: frozenset[str]) -> Iterator[Listener]:
        listener = Listener(topics)
        self.listeners.add(listener)
        try:
            yield listener
        finally:
            self.listeners.discard(listener)
