"""How a process connects to NATS: URL, its own user and password, TLS. One place builds the
options for nats-py (`connect`) and for FastStream's broker (`security`)."""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesParser
from typing import Any

import nats
import nats.aio.client
from faststream.nats.security import NatsSecurity, NatsUserPassword
from nats.aio.client import Client

from crater.runtime.settings import ServiceSettings

# Reconnecting, for a process that runs until stopped: forever, a short wait (with jitter, so
# a cluster's clients do not all come back at once) and pings that notice a dead server in
# seconds (PING_INTERVAL * MAX_OUTSTANDING_PINGS) when no TCP reset says so at once.
RECONNECT_TIME_WAIT_SECONDS = 0.5
RECONNECT_JITTER_SECONDS = 0.5
PING_INTERVAL_SECONDS = 2
MAX_OUTSTANDING_PINGS = 2


class _TlsEofNoise(logging.Filter):
    """asyncio warns `returning true from eof_received() has no effect when using ssl` each
    time the far end closes a TLS connection nats-py made (nats-py's protocol asks to keep
    the transport half open, which TLS cannot): nothing is wrong, and a CLI command must not
    print it to the person who ran it (`crater diagnose`, `dead-letters` on `crater up`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received()" not in record.getMessage()


if not any(isinstance(f, _TlsEofNoise) for f in logging.getLogger("asyncio").filters):
    logging.getLogger("asyncio").addFilter(_TlsEofNoise())


class NatsHeaderParser:
    """What nats-py's client parses each message's headers with (`_hdr_parser.parsebytes`),
    without the email package: nats-py hands the `Name: value` lines of a NATS header block to
    `email.parser.BytesParser`, about a fifth of the CPU a batch consumer spends per message
    (issue #19). The lines NATS writes, plain ASCII `Name: value`, give here what the email
    parser gives (the name as written, the value without its leading blanks, a repeated name's
    last value in its first place); anything else (a folded line, a name with blanks, a
    non-ASCII byte) goes to the email parser itself."""

    _email = BytesParser()

    def parsebytes(self, raw: bytes) -> Mapping[str, str] | Message:
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            return self._email.parsebytes(raw)
        headers: dict[str, str] = {}
        for line in text.split("\r\n"):
            if not line:
                break  # the end of the header block
            name, colon, value = line.partition(":")
            if not colon or not name or name[0] in " \t" or name != name.strip() or " " in name:
                return self._email.parsebytes(raw)
            if "\r" in value or "\n" in value:
                return self._email.parsebytes(raw)
            headers[name] = value.lstrip(" \t")
        return headers


# nats-py makes its client's parser from this name (nats.aio.client.Client.__init__ only).
if getattr(nats.aio.client, "BytesParser", None) is BytesParser:
    setattr(nats.aio.client, "BytesParser", NatsHeaderParser)  # noqa: B010 - not exported


def reconnect_options() -> dict[str, Any]:
    """nats-py's (and FastStream's broker's) reconnect keyword arguments for a service."""
    return {
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": RECONNECT_TIME_WAIT_SECONDS
        + random.uniform(0, RECONNECT_JITTER_SECONDS),
        "ping_interval": PING_INTERVAL_SECONDS,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
    }


@dataclass(frozen=True)
class NatsConnection:
    """`url`: one server, or a cluster's seeds comma-separated (`servers`)."""

    url: str
    user: str | None = None
    password: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def of(cls, settings: ServiceSettings) -> NatsConnection:
        password = settings.nats_password.get_secret_value() if settings.nats_password else None
        return cls(
            url=settings.nats_url,
            user=settings.nats_user,
            password=password,
            tls_ca=settings.nats_tls_ca,
            tls_cert=settings.nats_tls_cert,
            tls_key=settings.nats_tls_key,
        )

    @classmethod
    def coerce(cls, nats_or_url: NatsConnection | str) -> NatsConnection:
        return nats_or_url if isinstance(nats_or_url, NatsConnection) else cls(nats_or_url)

    @property
    def servers(self) -> list[str]:
        """Every seed URL in `url`."""
        return [u.strip() for u in self.url.split(",") if u.strip()]

    def ssl_context(self) -> ssl.SSLContext | None:
        """Verifying the server against `tls_ca`; presenting `tls_cert` if given."""
        if not (self.tls_ca or self.tls_cert or any(u.startswith("tls://") for u in self.servers)):
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context

    def security(self) -> NatsSecurity | None:
        """For FastStream's NatsBroker(security=...)."""
        context = self.ssl_context()
        if self.user is not None:
            return NatsUserPassword(self.user, self.password or "", ssl_context=context)
        if context is not None:
            return NatsSecurity(ssl_context=context)
        return None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for nats.connect."""
        options: dict[str, Any] = {}
        context = self.ssl_context()
        if context is not None:
            options["tls"] = context
        if self.user is not None:
            options["user"] = self.user
            options["password"] = self.password or ""
        return options

    async def connect(self, **kwargs: Any) -> Client:
        """A connection to any of the seeds; `kwargs` over nats-py's defaults (a short-lived
        connection keeps those: a CLI gives up rather than retry forever)."""
        return await nats.connect(self.servers, **self.options(), **kwargs)
