"""crater_client sends its token (argument, else CRATER_API_TOKEN) as a bearer token; a 429
is an `Unavailable` with the Retry-After."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from crater_client.client import CraterClient, Unavailable

SEEN: list[str | None] = []


class Gateway(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        SEEN.append(self.headers.get("Authorization"))
        limited = self.path.startswith("/api/v1/tasks/limited")
        body = json.dumps({"detail": "rate limit"} if limited else {"tasks": []}).encode()
        self.send_response(429 if limited else 200)
        if limited:
            self.send_header("Retry-After", "7")
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_token_is_sent(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    SEEN.clear()
    monkeypatch.delenv("CRATER_API_TOKEN", raising=False)
    CraterClient(url).list()
    CraterClient(url, token="crt_x").list()
    monkeypatch.setenv("CRATER_API_TOKEN", "crt_env")
    CraterClient(url).list()
    assert SEEN == [None, "Bearer crt_x", "Bearer crt_env"]
    with pytest.raises(Unavailable) as limited:
        CraterClient(url).get("limited")
    assert (limited.value.status, limited.value.retry_after) == (429, 7.0)
