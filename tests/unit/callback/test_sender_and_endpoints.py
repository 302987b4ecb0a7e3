from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest

from crater.callback.adapters.sender import WebhookSender, redact
from crater.callback.app import CallbackSettings
from crater.callback.domain.endpoints import Endpoint, parse_endpoints
from crater.callback.domain.signing import Verifier, generate_secret


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
    assert "hunter2" not in repr(CallbackSettings(webhook_password="hunter2"))


async def test_a_secret_signs_every_attempt_in_the_standard_webhooks_scheme() -> None:
    seen: list[httpx.Request] = []
    secret = generate_secret()

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    sender = WebhookSender(
        "http://alldata/hooks", "", "", 1.0, httpx.MockTransport(handle), secret=secret
    )
    await sender.post(b'{"task_id": "t"}', "wh-9")
    [request] = seen
    assert "authorization" not in request.headers  # no user: no Basic auth
    headers = request.headers
    assert headers["webhook-signature"].startswith("v1,")
    Verifier(secret).verify(
        headers["webhook-id"],
        headers["webhook-timestamp"],
        headers["webhook-signature"],
        request.content,
        now=int(headers["webhook-timestamp"]),
    )


def test_endpoints_file_names_events_credentials_and_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = generate_secret()
    monkeypatch.setenv("ALLDATA_PASSWORD", "from-env")
    endpoints = parse_endpoints(
        f"""
endpoints:
  - name: alldata
    url: https://alldata.example/hooks
    username: crater
    password: ${{ALLDATA_PASSWORD}}
    secret: {secret}
  - url: http://audit:9000/all
    events: [scheduled, failed, TaskPreempted]
    max_in_flight: 4
"""
    )
    alldata, audit = endpoints
    assert alldata.name == "alldata"
    assert alldata.password.get_secret_value() == "from-env"
    assert alldata.secret is not None
    assert alldata.secret.get_secret_value() == secret
    assert alldata.wants("TaskPending", "pending")
    assert audit.name == "http://audit:9000/all"
    assert audit.max_in_flight == 4
    assert audit.wants("AllocationGranted", "scheduled")
    assert audit.wants("TaskPreempted", "preempted")
    assert not audit.wants("TaskPending", "pending")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("endpoints: []", "at least 1"),
        ("endpoints: [{url: 'http://a/', events: [started]}]", "unknown event"),
        (
            "endpoints: [{url: 'http://a/', events: [AllocationReleased]}]",
            "AllocationReleased: no longer a webhook, use TaskEnded",
        ),
        ("endpoints: [{url: 'http://a/', secret: 'whsec_!!'}]", "base64"),
        ("endpoints: [{url: 'http://a/'}, {url: 'http://a/'}]", "unique"),
        ("endpoints: [{url: 'http://a/', colour: red}]", "Extra inputs"),
    ],
)
def test_a_bad_endpoints_file_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_endpoints(text)


def test_settings_make_one_endpoint_or_read_the_file(tmp_path: Path) -> None:
    secret = generate_secret()
    [one] = CallbackSettings(
        webhook_url="http://u:p@x/hooks", webhook_username="u", webhook_secret=secret
    ).endpoints()
    assert (one.name, one.username) == ("http://x/hooks", "u")
    assert one.secret is not None
    assert CallbackSettings(webhook_secret="  ").webhook_secret is None
    with pytest.raises(ValueError, match="base64"):
        CallbackSettings(webhook_secret="whsec_??")
    file = tmp_path / "endpoints.yaml"
    file.write_text("endpoints: [{name: a, url: 'http://a/'}, {name: b, url: 'http://b/'}]")
    settings = CallbackSettings(endpoints_file=str(file), webhook_url="http://ignored/")
    assert [e.name for e in settings.endpoints()] == ["a", "b"]
    assert CallbackSettings().endpoints() == []
    assert isinstance(Endpoint(url="http://a/"), Endpoint)
