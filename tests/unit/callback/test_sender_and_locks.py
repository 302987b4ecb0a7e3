from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest

from crater.callback.adapters.sender import WebhookSender, redact
from crater.callback.app import CallbackSettings, heartbeat
from crater.callback.delivery import TaskLocks


def sender_with(handler: httpx.MockTransport, url: str = "http://alldata/hooks") -> WebhookSender:
    return WebhookSender(url, "alldata", "secret", 1.0, transport=handler)


async def test_posts_json_with_basic_auth_and_webhook_headers() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    sender = sender_with(httpx.MockTransport(handle))
    response = await sender.post(b'{"task_id": "t"}', "3f2a")
    await sender.aclose()
    assert response.status_code == 204
    assert response.error is None
    assert response.latency_ms >= 0
    [request] = seen
    assert request.method == "POST"
    assert str(request.url) == "http://alldata/hooks"
    assert (
        request.headers["authorization"] == "Basic " + base64.b64encode(b"alldata:secret").decode()
    )
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == "3f2a"
    assert request.headers["webhook-timestamp"].isdigit()
    assert json.loads(request.content) == {"task_id": "t"}


async def test_error_responses_keep_status_excerpt_and_retry_after() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, text="slow down", headers={"Retry-After": "3"})

    sender = sender_with(httpx.MockTransport(handle))
    response = await sender.post(b"{}", "id")
    assert (response.status_code, response.retry_after) == (429, "3")
    assert response.error == "HTTP 429: slow down"


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (httpx.ReadTimeout("slow"), "timeout: ReadTimeout"),
        (httpx.ConnectError("refused"), "connection error: refused"),
    ],
)
async def test_no_response_is_a_status_of_none(raised: Exception, expected: str) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise raised

    response = await sender_with(httpx.MockTransport(handle)).post(b"{}", "id")
    assert response.status_code is None
    assert response.error == expected


def test_endpoint_label_carries_no_credentials() -> None:
    assert redact("https://u:p@alldata.example/hooks?token=x") == "https://alldata.example/hooks"
    assert sender_with(httpx.MockTransport(lambda r: httpx.Response(200))).endpoint == (
        "http://alldata/hooks"
    )


def test_blank_webhook_url_means_unset() -> None:
    assert CallbackSettings(webhook_url="  ").webhook_url is None
    assert CallbackSettings(webhook_url="http://x/").webhook_url == "http://x/"
    assert "secret" not in repr(CallbackSettings(webhook_password="secret"))


async def test_task_locks_serialise_one_task_in_arrival_order_and_are_dropped() -> None:
    locks = TaskLocks()
    order: list[str] = []

    async def work(task: str, label: str, pause: float) -> None:
        async with locks.hold(task):
            order.append(f"{label} start")
            await asyncio.sleep(pause)
            order.append(f"{label} end")

    await asyncio.gather(work("a", "a1", 0.02), work("a", "a2", 0), work("b", "b1", 0))
    assert order.index("a1 end") < order.index("a2 start")
    assert order.index("b1 end") < order.index("a1 end")  # other tasks do not wait
    assert len(locks) == 0


async def test_heartbeat_extends_the_ack_deadline_while_work_goes_on() -> None:
    class Message:
        beats = 0

        async def in_progress(self) -> None:
            self.beats += 1
            if self.beats == 2:
                raise ConnectionError("gone")  # tolerated: the work goes on

    message = Message()
    async with heartbeat(message, every=0.01):  # type: ignore[arg-type]
        await asyncio.sleep(0.06)
    beats = message.beats
    assert beats >= 3
    await asyncio.sleep(0.03)
    assert message.beats == beats  # stopped with the work
