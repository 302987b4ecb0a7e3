"""Load metrics for a home-grown inference server: an ASGI middleware that measures each HTTP
request and serves the figures as a Prometheus page the autoscaler scrapes (metrics format
`asgi`, docs/autoscaling.md, Reading real replicas), as vLLM, TGI and Triton serve theirs.

    from crater_client.serving import ServingMetrics
    app = ServingMetrics(app, max_concurrent=8)   # FastAPI, Starlette, any ASGI app

Per request it observes the time to the first byte of the response body (a streaming
server's time to first token) and, for a response sent in several chunks, the mean time
between them (its time per output token). With `max_concurrent` it also admits at most that
many requests at once, as an engine's batch does, and the others wait in its queue: their
wait is observed and the requests waiting are a gauge, so the autoscaler judges queueing, not
the server's own work. Without it, nothing queues in the middleware and the time to first
byte is what is judged. Its own page (`metrics_path`, /metrics) is answered directly; health
probes (`unmeasured`) pass through unmeasured.

Needs prometheus-client (`pip install crater-client[serving]`); the rest of crater_client
keeps to the standard library.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# The names the autoscaler reads (crater.autoscaler.adapters.exposition, format asgi).
FIRST_BYTE = "crater_serving_time_to_first_byte_seconds"
QUEUE = "crater_serving_queue_time_seconds"
PER_CHUNK = "crater_serving_time_per_chunk_seconds"
WAITING = "crater_serving_requests_waiting"
RUNNING = "crater_serving_requests_running"
# Paths passed through unmeasured: health probes are not load.
PROBES = ("/healthz", "/readyz", "/livez", "/health")
# vLLM's buckets for time to first token and for time per output token, so a page reads at
# the resolution of the engines' own.
FIRST_BYTE_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
PER_CHUNK_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip


class ServingMetrics:
    """The ASGI middleware (see the module). `registry`: where its metrics go (a fresh one by
    default, so two apps in one process do not share them)."""

    def __init__(
        self,
        app: App,
        *,
        max_concurrent: int | None = None,
        metrics_path: str = "/metrics",
        unmeasured: tuple[str, ...] = PROBES,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, not {max_concurrent}")
        self.app = app
        self.metrics_path = metrics_path
        self.unmeasured = frozenset(unmeasured)
        self.registry = registry or CollectorRegistry()
        self._slots = asyncio.Semaphore(max_concurrent) if max_concurrent else None
        self.first_byte = Histogram(
            FIRST_BYTE,
            "Time from a request's arrival to the first byte of its response body.",
            buckets=FIRST_BYTE_BUCKETS,
            registry=self.registry,
        )
        self.queue = (
            Histogram(
                QUEUE,
                "Time a request waited for one of the max_concurrent slots.",
                buckets=FIRST_BYTE_BUCKETS,
                registry=self.registry,
            )
            if self._slots
            else None
        )
        self.per_chunk = Histogram(
            PER_CHUNK,
            "Mean time between the body chunks of a response sent in several.",
            buckets=PER_CHUNK_BUCKETS,
            registry=self.registry,
        )
        self.waiting = Gauge(WAITING, "Requests waiting for a slot.", registry=self.registry)
        self.running = Gauge(RUNNING, "Requests being served.", registry=self.registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.unmeasured:
            await self.app(scope, receive, send)
            return
        if scope.get("path") == self.metrics_path:
            await self._page(send)
            return
        arrived = time.perf_counter()
        if self._slots is not None:
            self.waiting.inc()
            try:
                await self._slots.acquire()
            finally:
                self.waiting.dec()
            assert self.queue is not None
            self.queue.observe(time.perf_counter() - arrived)
        self.running.inc()
        chunks: list[float] = []

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                chunks.append(time.perf_counter())
                if len(chunks) == 1:
                    self.first_byte.observe(chunks[0] - arrived)
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            self.running.dec()
            if self._slots is not None:
                self._slots.release()
            if len(chunks) > 1:
                self.per_chunk.observe((chunks[-1] - chunks[0]) / (len(chunks) - 1))

    async def _page(self, send: Send) -> None:
        body = generate_latest(self.registry)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", CONTENT_TYPE_LATEST.encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


__all__ = ["ServingMetrics"]
