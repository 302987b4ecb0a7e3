"""The webhook sender over its free list of httpcore connections (adapters/connections.py)
against a real server on loopback, HTTP and HTTPS: keep-alive connections reused, closed ones
replaced, a stale one retried once on a fresh one, every kind of answer body, redirects not
followed, timeouts and refusals said as over httpx's own transport, idle connections closed on
shutdown, httpx's transport kept where a proxy is configured."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from crater.callback.adapters.sender import WebhookSender
from crater.runtime import dev_pki
from crater.runtime.nats_server import free_port

pytestmark = pytest.mark.integration


@dataclass
class Seen:
    head: str
    body: bytes


@dataclass
class Server:
    """Answers each request with `answer(number)` (raw bytes; None: close without one)."""

    answer: Callable[[int], bytes | None]
    port: int = 0
    requests: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed: int = 0
    delay: float = 0.0
    close_idle: bool = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                length = next(
                    int(line.split(":")[1])
                    for line in head.split("\r\n")
                    if line.lower().startswith("content-length:")
                )
                self.requests.append(Seen(head, await reader.readexactly(length)))
                if self.delay:
                    await asyncio.sleep(self.delay)
                answer = self.answer(len(self.requests))
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_idle:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


Serve = Callable[[Server], Awaitable[None]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.Server] = []

    async def start(server: Server) -> None:
        server.port = free_port()
        servers.append(await asyncio.start_server(server.handle, "127.0.0.1", server.port))

    yield start
    for running in servers:
        running.close()


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def sender(server: Server, timeout: float = 2.0, **kwargs: object) -> WebhookSender:
    url = f"http://127.0.0.1:{server.port}/hooks?x=1"
    return WebhookSender(url, "alldata", "pa:ss", timeout, **kwargs)  # type: ignore[arg-type]


async def test_posts_with_auth_and_headers_on_one_kept_alive_connection(serve: Serve) -> None:
    server = Server(lambda _: OK)
    await serve(server)
    webhooks = sender(server)
    assert webhooks.free_list is not None  # not httpx's pool
    for n in range(3):
        response = await webhooks.post(b'{"n": %d}' % n, f"id-{n}", {"crater-attempt": "1"})
        assert (response.status_code, response.error) == (200, None)
    await webhooks.aclose()
    assert server.connections == 1
    first = server.requests[0]
    lines = first.head.split("\r\n")
    assert lines[0] == "POST /hooks?x=1 HTTP/1.1"
    headers = {
        name.lower(): value for name, value in (line.split(": ", 1) for line in lines[1:] if line)
    }
    assert headers["host"] == f"127.0.0.1:{server.port}"
    assert headers["authorization"] == "Basic " + base64.b64encode(b"alldata:pa:ss").decode()
    assert headers["content-type"] == "application/json"
    assert headers["webhook-id"] == "id-0"
    assert headers["webhook-timestamp"].isdigit()
    assert headers["crater-attempt"] == "1"
    assert first.body == b'{"n": 0}'


async def test_error_answers_keep_status_excerpt_and_retry_after(serve: Serve) -> None:
    chunked = (
        b"HTTP/1.1 503 Busy\r\ntransfer-encoding: chunked\r\nRetry-After: 7\r\n\r\n"
        b"5\r\nslow \r\n4\r\ndown\r\n0\r\n\r\n"
    )
    answers = {1: chunked, 2: b"HTTP/1.1 429 No\r\ncontent-length: 0\r\n\r\n", 3: OK}
    server = Server(answers.__getitem__)
    await serve(server)
    webhooks = sender(server)
    busy = await webhooks.post(b"{}", "a")
    assert (busy.status_code, busy.error, busy.retry_after) == (503, "HTTP 503: slow down", "7")
    limited = await webhooks.post(b"{}", "b")
    assert (limited.status_code, limited.error, limited.retry_after) == (429, "HTTP 429", None)
    assert (await webhooks.post(b"{}", "c")).status_code == 200
    await webhooks.aclose()
    assert server.connections == 1  # both bodies read to their end: the connection kept


async def test_closed_connections_are_replaced(serve: Serve) -> None:
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
    server = Server(lambda n: closing if n == 1 else OK)
    await serve(server)
    webhooks = sender(server)
    assert (await webhooks.post(b"{}", "a")).status_code == 200
    assert (await webhooks.post(b"{}", "b")).status_code == 200  # a new connection
    assert server.connections == 2
    # the server drops an idle connection: the next POST goes on a fresh one
    server.close_idle = True
    assert (await webhooks.post(b"{}", "c")).status_code == 200
    await asyncio.sleep(0.1)
    assert (await webhooks.post(b"{}", "d")).status_code == 200
    await webhooks.aclose()
    assert [r.body for r in server.requests] == [b"{}"] * 4


async def test_a_reused_connection_failing_before_any_answer_is_tried_once_more(
    serve: Serve,
) -> None:
    # the second request, on the kept connection, is read and dropped without an answer
    server = Server(lambda n: None if n == 2 else OK)
    await serve(server)
    webhooks = sender(server)
    assert (await webhooks.post(b"{}", "a")).status_code == 200
    again = await webhooks.post(b"{}", "b")
    assert (again.status_code, again.error) == (200, None)
    await webhooks.aclose()
    assert server.connections == 2
    ids = [r.head.split("webhook-id: ")[1].split("\r\n")[0] for r in server.requests]
    assert ids == ["a", "b", "b"]  # the same webhook-id: the receiver drops a repeat


async def test_redirects_are_answers_not_followed(serve: Serve) -> None:
    moved = b"HTTP/1.1 302 Found\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n"
    server = Server(lambda _: moved)
    await serve(server)
    webhooks = sender(server)
    response = await webhooks.post(b"{}", "a")
    await webhooks.aclose()
    assert (response.status_code, response.error) == (302, "HTTP 302")
    assert len(server.requests) == 1


async def test_at_most_max_connections_and_idle_ones_closed_on_shutdown(serve: Serve) -> None:
    server = Server(lambda _: OK, delay=0.05)
    await serve(server)
    webhooks = sender(server, max_connections=2)
    answers = await asyncio.gather(*(webhooks.post(b"{}", f"id-{n}") for n in range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    assert server.connections == 2
    assert webhooks.free_list is not None
    assert webhooks.free_list.idle_connections == 2
    await webhooks.aclose()
    assert webhooks.free_list.idle_connections == 0
    for _ in range(50):
        if server.closed == 2:
            break
        await asyncio.sleep(0.01)
    assert server.closed == 2  # the server saw both closed


async def test_no_answer_is_a_status_of_none(serve: Serve) -> None:
    server = Server(lambda _: OK, delay=1.0)
    await serve(server)
    slow = await sender(server, timeout=0.2).post(b"{}", "a")
    assert (slow.status_code, slow.error) == (None, "timeout: ReadTimeout")
    hung_up = Server(lambda _: None)
    await serve(hung_up)
    dropped = await sender(hung_up).post(b"{}", "b")
    assert dropped.status_code is None
    assert dropped.error is not None
    assert dropped.error.startswith("connection error: ")
    nobody = Server(lambda _: OK)
    nobody.port = free_port()  # nothing listens there
    refused = await sender(nobody).post(b"{}", "c")
    assert refused.status_code is None
    assert refused.error is not None
    assert refused.error.startswith("connection error: ")


async def test_a_handshake_never_answered_is_a_connect_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes the TCP connection, never answers the TLS hello
        writer.close()

    port = free_port()
    running = await asyncio.start_server(silent, "127.0.0.1", port)
    try:
        webhooks = WebhookSender(f"https://127.0.0.1:{port}/hooks", timeout_seconds=0.2)
        response = await webhooks.post(b"{}", "a")
        await webhooks.aclose()
    finally:
        running.close()
    assert (response.status_code, response.error) == (None, "timeout: ConnectTimeout")


async def test_more_than_max_connections_at_once_wait_up_to_the_timeout(serve: Serve) -> None:
    server = Server(lambda _: OK, delay=0.5)
    await serve(server)
    webhooks = sender(server, timeout=1.0, max_connections=1)
    first, second = await asyncio.gather(webhooks.post(b"{}", "a"), webhooks.post(b"{}", "b"))
    await webhooks.aclose()
    assert (first.status_code, first.error) == (200, None)
    assert (second.status_code, second.error) == (200, None)  # waited its turn: 0.5 s
    assert server.connections == 1


async def test_one_waiting_longer_than_the_timeout_for_a_connection_is_a_pool_timeout() -> None:
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")
            for _ in range(10):  # the body a byte each 0.1 s: no read waits 0.4 s
                await asyncio.sleep(0.1)
                writer.write(b"x")
                await writer.drain()
        writer.close()

    port = free_port()
    running = await asyncio.start_server(trickle, "127.0.0.1", port)
    webhooks = WebhookSender(f"http://127.0.0.1:{port}/", timeout_seconds=0.4, max_connections=1)
    try:
        first = asyncio.create_task(webhooks.post(b"{}", "a"))
        await asyncio.sleep(0.05)
        second = await webhooks.post(b"{}", "b")
        assert (second.status_code, second.error) == (None, "timeout: PoolTimeout")
        assert ((await first).status_code, (await first).error) == (200, None)
    finally:
        await webhooks.aclose()
        running.close()


async def test_a_proxy_in_the_environment_keeps_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    webhooks = WebhookSender("http://alldata.example/hooks")
    assert webhooks.free_list is None
    await webhooks.aclose()
    monkeypatch.setenv("NO_PROXY", "alldata.example")
    bypassing = WebhookSender("http://alldata.example/hooks")
    assert bypassing.free_list is not None
    await bypassing.aclose()


async def test_https_with_the_trust_httpx_would_use(
    serve: Serve,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pki = dev_pki.prepare(tmp_path / "pki")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    server = Server(lambda _: OK)
    server.port = free_port()
    running = await asyncio.start_server(server.handle, "127.0.0.1", server.port, ssl=tls)
    url = f"https://localhost:{server.port}/hooks"
    try:
        # certifi's authorities do not know the development CA: refused, as httpx would
        untrusted = await WebhookSender(url).post(b"{}", "a")
        assert untrusted.status_code is None
        assert untrusted.error is not None
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.error
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_cert))
        trusted = WebhookSender(url)
        for webhook_id in ("b", "c"):
            response = await trusted.post(b"{}", webhook_id)
            assert (response.status_code, response.error) == (200, None)
        await trusted.aclose()
        assert server.connections == 1  # one kept alive (the refused handshake never got in)
    finally:
        running.close()
