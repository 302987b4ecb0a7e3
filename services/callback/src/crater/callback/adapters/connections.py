"""An httpx transport keeping a free list of httpcore connections per origin, one request at
a time on each: what `WebhookSender` POSTs through.

Why not httpx's own transport: its pool (httpcore's `AsyncConnectionPool`) looks at every
connection it holds for each request it sends (whether it expired, whether its socket is
readable): about 3 ms of CPU per POST with 32 connections (an endpoint's `max_in_flight`),
which made webhooks the callback's largest cost per task (issue #19). Here a request takes an
idle connection of its origin from a list (checking that one only: its keep-alive expiry, and
whether the server closed it) or opens a new one; httpcore's `AsyncHTTPConnection` does the
HTTP/1.1, the TLS (with the context httpx builds: `httpx.create_ssl_context()`, which honours
SSL_CERT_FILE and SSL_CERT_DIR) and keep-alive. The connection goes back to the list when the
response is closed, if it can take another request. A reused connection that fails before any
answer (the server closed it as we sent) is tried once more on a fresh one: receivers drop a
repeated `webhook-id`. At most `max_connections` requests at once; one waiting longer than the
pool timeout raises `httpx.PoolTimeout`, as httpx's pool does. httpcore's errors are raised as
httpx's of the same name, as httpx's transport does. No proxies: `WebhookSender` keeps httpx's
own transport where one is configured for the URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator

import httpcore
import httpx

KEEPALIVE_EXPIRY_SECONDS = 5.0  # httpx's default (httpx.Limits)

# httpcore's exceptions and the httpx ones raised for them (as httpx's own transport does);
# the most specific class of an error's MRO found here wins.
_ERRORS: dict[type[Exception], type[httpx.HTTPError]] = {
    httpcore.TimeoutException: httpx.TimeoutException,
    httpcore.ConnectTimeout: httpx.ConnectTimeout,
    httpcore.ReadTimeout: httpx.ReadTimeout,
    httpcore.WriteTimeout: httpx.WriteTimeout,
    httpcore.PoolTimeout: httpx.PoolTimeout,
    httpcore.NetworkError: httpx.NetworkError,
    httpcore.ConnectError: httpx.ConnectError,
    httpcore.ReadError: httpx.ReadError,
    httpcore.WriteError: httpx.WriteError,
    httpcore.ProxyError: httpx.ProxyError,
    httpcore.UnsupportedProtocol: httpx.UnsupportedProtocol,
    httpcore.ProtocolError: httpx.ProtocolError,
    httpcore.LocalProtocolError: httpx.LocalProtocolError,
    httpcore.RemoteProtocolError: httpx.RemoteProtocolError,
}

# Failures of a reused connection before any answer that a fresh connection may not meet.
_STALE = (httpcore.NetworkError, httpcore.RemoteProtocolError)


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as error:
        for kind in type(error).__mro__:
            mapped = _ERRORS.get(kind)
            if mapped is not None:
                raise mapped(str(error)) from error
        raise


class FreeListTransport(httpx.AsyncBaseTransport):
    """Idle httpcore connections kept per origin, one request at a time on each."""

    def __init__(
        self,
        max_connections: int,
        *,
        keepalive_expiry: float = KEEPALIVE_EXPIRY_SECONDS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._ssl_context = ssl_context
        self._slots = asyncio.Semaphore(max_connections)
        # by origin: (scheme, host, port), httpcore.Origin is not hashable
        self._idle: dict[tuple[bytes, bytes, int], list[httpcore.AsyncHTTPConnection]] = {}
        self._closed = False

    @property
    def idle_connections(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl_context is None:  # only for https, built once: loading certifi is slow
            self._ssl_context = httpx.create_ssl_context()
        return self._ssl_context

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        if url.raw_scheme not in (b"http", b"https"):
            raise httpx.UnsupportedProtocol(
                "Request URL is missing an 'http://' or 'https://' protocol."
            )
        if not url.raw_host:
            raise httpx.UnsupportedProtocol("Request URL is missing a host.")
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        await self._acquire(request.extensions.get("timeout", {}).get("pool"))
        try:
            with _as_httpx_errors():
                connection, response = await self._send(core)
        except BaseException:
            self._slots.release()
            raise
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(self, core.url.origin, connection, response),
            extensions=response.extensions,
        )

    async def _acquire(self, timeout: float | None) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # at once
            return
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout(
                f"no free connection within {timeout} s ({self.max_connections} in use)"
            ) from None

    async def _send(
        self, request: httpcore.Request
    ) -> tuple[httpcore.AsyncHTTPConnection, httpcore.Response]:
        origin = request.url.origin
        idle = self._idle.get((origin.scheme, origin.host, origin.port))
        while idle:
            connection = idle.pop()
            if connection.has_expired() or not connection.is_idle():
                await connection.aclose()
                continue
            try:
                return connection, await connection.handle_async_request(request)
            except _STALE:
                await connection.aclose()
                break  # closed by the server as we sent: once more, on a fresh one
            except BaseException:
                await connection.aclose()
                raise
        connection = httpcore.AsyncHTTPConnection(
            origin,
            ssl_context=self.ssl_context() if origin.scheme == b"https" else None,
            keepalive_expiry=self.keepalive_expiry,
        )
        try:
            return connection, await connection.handle_async_request(request)
        except BaseException:
            await connection.aclose()
            raise

    async def _release(
        self, origin: httpcore.Origin, connection: httpcore.AsyncHTTPConnection
    ) -> None:
        try:
            if self._closed or not connection.is_idle():
                await connection.aclose()
            else:
                key = (origin.scheme, origin.host, origin.port)
                self._idle.setdefault(key, []).append(connection)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                with contextlib.suppress(httpcore.NetworkError, OSError):  # closing anyway
                    await connection.aclose()


class _Body(httpx.AsyncByteStream):
    """A response's body; closing it hands its connection back to the transport."""

    def __init__(
        self,
        transport: FreeListTransport,
        origin: httpcore.Origin,
        connection: httpcore.AsyncHTTPConnection,
        response: httpcore.Response,
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._connection = connection
        self._response = response
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for part in self._response.aiter_stream():
                yield part

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            with _as_httpx_errors():
                await self._response.aclose()
        finally:
            await self._transport._release(self._origin, self._connection)


__all__ = ["KEEPALIVE_EXPIRY_SECONDS", "FreeListTransport"]
