"""Per-request metrics and tracing, as plain ASGI middleware so the endpoint runs inside the
span's context (the broker's telemetry middleware then puts it in published headers)."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext

from opentelemetry.propagate import extract
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from prometheus_client import Counter, Histogram
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"


def route_of(scope: Scope) -> str:
    """The route template (`/api/v1/tasks/{task_id}`), so labels stay few; the router sets
    `scope["route"]` when it matches."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class ObserveRequests:
    def __init__(
        self,
        app: ASGIApp,
        *,
        requests: Counter,
        seconds: Histogram,
        tracer: Tracer,
        traced_prefix: str = "/api/",
    ) -> None:
        self.app = app
        self.requests = requests
        self.seconds = seconds
        self.tracer = tracer
        self.traced_prefix = traced_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = str(scope["method"])
        status = 500  # what the client gets if the app raises before answering

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        # Health checks and scrapes are not worth a trace; API calls continue the caller's.
        span_scope: AbstractContextManager[Span | None] = nullcontext()
        if str(scope["path"]).startswith(self.traced_prefix):
            span_scope = self.tracer.start_as_current_span(
                f"{method} {scope['path']}",
                context=extract(Headers(scope=scope)),
                kind=SpanKind.SERVER,
                attributes={"http.request.method": method},
            )
        started = time.perf_counter()
        with span_scope as span:
            try:
                await self.app(scope, receive, send_observed)
            finally:
                route = route_of(scope)
                self.requests.labels(method=method, route=route, status=str(status)).inc()
                self.seconds.labels(method=method, route=route).observe(
                    time.perf_counter() - started
                )
                if span is not None:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
