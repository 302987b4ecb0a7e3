"""POSTing a webhook body to one endpoint over HTTP, and nothing more: no retry policy here.

Each attempt carries HTTP Basic auth (when a user is configured) and the Standard Webhooks
headers: `webhook-id` (stable per source event), `webhook-timestamp` (this attempt) and, when
the endpoint has a secret, `webhook-signature` (over the bytes sent); plus whatever headers the
caller adds (the `crater-*` ones, domain/payload.py).

httpx sends them, through the free list of httpcore connections of `connections.py` rather than
httpx's pool (which costs ~3 ms of CPU per POST with 32 connections, issue #19); through httpx's
own transport when a test gives one, or where a proxy is configured for the URL (HTTP_PROXY,
HTTPS_PROXY, ALL_PROXY, NO_PROXY: httpx decides as it would for any request).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from crater.callback.adapters.connections import FreeListTransport
from crater.callback.domain.endpoints import Endpoint, redact
from crater.callback.domain.signing import sign

USER_AGENT = "crater-callback/0.2"
ERROR_BODY_CHARS = 200

__all__ = ["Response", "WebhookSender", "redact"]


@dataclass(frozen=True)
class Response:
    """What one POST got back; `status_code` None when no response came (timeout, refused)."""

    status_code: int | None
    latency_ms: float
    error: str | None = None
    retry_after: str | None = None


class WebhookSender:
    """One endpoint: its credentials, its secret, a pooled client reused across deliveries."""

    def __init__(
        self,
        url: str,
        username: str = "",
        password: str = "",
        timeout_seconds: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        secret: str | None = None,
        name: str | None = None,
        max_connections: int = 32,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.endpoint = name or redact(url)
        self.secret = secret
        self.clock = clock
        auth = httpx.BasicAuth(username, password) if username or password else None
        self.client = httpx.AsyncClient(
            auth=auth,
            timeout=timeout_seconds,
            headers={"user-agent": USER_AGENT},
            transport=transport,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )
        # Not proxied (httpx's own choice of transport for the URL): the free list.
        self.free_list: FreeListTransport | None = None
        if transport is None and _direct(self.client, url):
            self.free_list = FreeListTransport(max_connections)
            self.client = httpx.AsyncClient(
                auth=auth,
                timeout=timeout_seconds,
                headers={"user-agent": USER_AGENT},
                transport=self.free_list,
            )

    @classmethod
    def for_endpoint(
        cls, endpoint: Endpoint, transport: httpx.AsyncBaseTransport | None = None
    ) -> WebhookSender:
        return cls(
            endpoint.url,
            endpoint.username,
            endpoint.password.get_secret_value(),
            endpoint.timeout_seconds,
            transport,
            secret=endpoint.secret.get_secret_value() if endpoint.secret else None,
            name=endpoint.name,
            max_connections=endpoint.max_in_flight,
        )

    def headers(
        self, body: bytes, webhook_id: str, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        timestamp = int(self.clock())
        headers = {
            **(extra or {}),
            "content-type": "application/json",
            # Stable per source event: a redelivery carries the same id and AllData drops it.
            "webhook-id": webhook_id,
            # When this attempt was sent (Unix seconds): receivers refuse stale ones (replays).
            "webhook-timestamp": str(timestamp),
        }
        if self.secret:
            headers["webhook-signature"] = sign(self.secret, webhook_id, timestamp, body)
        return headers

    async def post(
        self, body: bytes, webhook_id: str, extra: Mapping[str, str] | None = None
    ) -> Response:
        headers = self.headers(body, webhook_id, extra)
        started = time.perf_counter()
        try:
            response = await self.client.post(self.url, content=body, headers=headers)
        except httpx.TimeoutException as error:
            return Response(None, _ms_since(started), f"timeout: {type(error).__name__}")
        except httpx.TransportError as error:
            detail = str(error) or type(error).__name__
            return Response(None, _ms_since(started), f"connection error: {detail}")
        latency_ms = _ms_since(started)
        if response.is_success:
            return Response(response.status_code, latency_ms)
        excerpt = response.text[:ERROR_BODY_CHARS].strip()
        return Response(
            response.status_code,
            latency_ms,
            f"HTTP {response.status_code}" + (f": {excerpt}" if excerpt else ""),
            response.headers.get("retry-after"),
        )

    async def aclose(self) -> None:
        await self.client.aclose()


def _direct(client: httpx.AsyncClient, url: str) -> bool:
    """Whether `client` (made without a transport, so minding the environment's proxies) would
    send to `url` without a proxy."""
    try:
        return client._transport_for_url(httpx.URL(url)) is client._transport
    except httpx.InvalidURL:
        return False  # httpx says so on each POST


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
