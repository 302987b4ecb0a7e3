"""POSTing a webhook body to AllData over HTTP, and nothing more: no retry policy here."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

USER_AGENT = "crater-callback/0.1"
ERROR_BODY_CHARS = 200


@dataclass(frozen=True)
class Response:
    """What one POST got back; `status_code` None when no response came (timeout, refused)."""

    status_code: int | None
    latency_ms: float
    error: str | None = None
    retry_after: str | None = None


def redact(url: str) -> str:
    """The URL without credentials or query, fit for logs and metric labels."""
    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))


class WebhookSender:
    """One endpoint, HTTP Basic auth, a pooled client that is reused across deliveries."""

    def __init__(
        self,
        url: str,
        username: str,
        password: str,
        timeout_seconds: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.endpoint = redact(url)
        self.client = httpx.AsyncClient(
            auth=httpx.BasicAuth(username, password),
            timeout=timeout_seconds,
            headers={"user-agent": USER_AGENT},
            transport=transport,
        )

    async def post(self, body: bytes, webhook_id: str) -> Response:
        headers = {
            "content-type": "application/json",
            # Stable per source event: a redelivery carries the same id and AllData drops it.
            "webhook-id": webhook_id,
            # When this attempt was sent (Unix seconds), as Standard Webhooks has it.
            "webhook-timestamp": str(int(time.time())),
        }
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


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
