"""What every Crater service process is made of: a broker with tracing, metrics and bad-input
refusal; an ASGI app serving /healthz and /metrics beside the consumers; a clean shutdown."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import uvicorn
from faststream.asgi import AsgiFastStream, make_ping_asgi
from faststream.exceptions import IncorrectState
from faststream.nats import NatsBroker
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, make_asgi_app
from sqlalchemy.ext.asyncio import async_sessionmaker

from crater.contracts import Streams, StreamSpec
from crater.runtime.bus import (
    DeliveryPolicy,
    Rejections,
    align_consumers,
    ensure_streams,
    make_broker,
)
from crater.runtime.db import make_engine, make_session_factory, upgrade_to_head_async
from crater.runtime.leadership import GatedConsumer, Leadership
from crater.runtime.nats_connection import NatsConnection
from crater.runtime.nats_permissions import SERVICES, is_node_identity, streams_of
from crater.runtime.settings import ServiceSettings
from crater.runtime.telemetry import make_registry, make_tracer_provider

Hook = Callable[[], Awaitable[None]]
# What a NATS call raises when the server is away, the connection closed, or nobody answers.
BUS_ERRORS = (nats.errors.Error, TimeoutError, IncorrectState)


@dataclass
class Service:
    name: str
    settings: ServiceSettings
    broker: NatsBroker
    rejections: Rejections
    registry: CollectorRegistry
    tracer_provider: TracerProvider
    on_startup: list[Hook] = field(default_factory=list)
    after_startup: list[Hook] = field(default_factory=list)
    on_shutdown: list[Hook] = field(default_factory=list)
    after_shutdown: list[Hook] = field(default_factory=list)
    state: Any = None  # the service's own object, reachable by tests and tools
    leadership: Leadership | None = None  # of a service that elects a leader

    @property
    def nats(self) -> NatsConnection:
        """URL, user and TLS this service connects with (its settings)."""
        return NatsConnection.of(self.settings)

    @property
    def streams(self) -> tuple[StreamSpec, ...]:
        """The streams it declares on start: with an identity of its own, the ones it touches
        (its permissions allow no others); as a node (`node-<id>`), none; without, every
        catalog stream."""
        user = self.settings.nats_user
        if user and is_node_identity(user):
            return streams_of(user)
        if user and self.name in SERVICES:
            return streams_of(self.name)
        return Streams.ALL

    @property
    def port(self) -> int:
        """The HTTP port: the settings' http_port, or when 0 the service's own default."""
        port = self.settings.http_port or self.settings.default_port
        if port is None:
            raise ValueError(f"{self.name}: http_port is 0 and its settings name no default_port")
        return port

    def consume(self, consumer: GatedConsumer) -> None:
        """Run `consumer` (a batch consumer) while the service runs: started once the broker
        is, stopped first on shutdown; call it before `asgi`, which takes the hooks as they
        are then. (A leader's: `LeaderGate.add` instead.)"""
        self.after_startup.insert(0, consumer.start)
        self.on_shutdown.insert(0, consumer.stop)

    def database(self, migrations_dir: Path) -> async_sessionmaker[Any]:
        """The service's database: its Alembic migrations applied first on start (unless
        CRATER_MIGRATE_ON_START=false), the engine disposed only after the consumers stopped,
        so no handler in flight loses its connection."""
        engine = make_engine(self.settings.database_url)

        async def migrate() -> None:
            if self.settings.migrate_on_start:
                await upgrade_to_head_async(self.settings.database_url, migrations_dir)

        self.on_startup.insert(0, migrate)
        self.after_shutdown.append(engine.dispose)
        return make_session_factory(engine)

    def asgi(self, routes: Sequence[tuple[str, Any]] = ()) -> AsgiFastStream:
        """The FastStream app: streams ensured first, consumers started, health and metrics."""

        async def declare_streams() -> None:
            await ensure_streams(self.nats, self.streams, self.settings.stream_replicas)
            await align_consumers(self.nats, self.broker)

        async def flush_traces() -> None:
            self.tracer_provider.force_flush()

        return AsgiFastStream(
            self.broker,
            asgi_routes=[
                ("/healthz", make_ping_asgi(self.broker, timeout=5.0)),
                ("/metrics", make_asgi_app(self.registry)),
                *routes,
            ],
            on_startup=[declare_streams, *self.on_startup],
            after_startup=list(self.after_startup),
            on_shutdown=[*self.on_shutdown, flush_traces],
            after_shutdown=list(self.after_shutdown),
            logger=logging.getLogger(f"crater.{self.name}"),
        )

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """The same start and stop for an app of its own (the gateway's FastAPI) instead of
        `asgi`: streams ensured, `on_startup`, the broker started, `after_startup`; on leaving,
        `on_shutdown`, the broker drained (closed when NATS is away), traces flushed,
        `after_shutdown`."""
        await ensure_streams(self.nats, self.streams, self.settings.stream_replicas)
        for hook in self.on_startup:
            await hook()
        await self.broker.start()
        for hook in self.after_startup:
            await hook()
        try:
            yield
        finally:
            for hook in self.on_shutdown:
                await hook()
            await stop_broker(self.broker)
            self.tracer_provider.force_flush()
            for hook in self.after_shutdown:
                await hook()


async def stop_broker(broker: NatsBroker) -> None:
    """Drain and stop `broker`; when NATS is away there is nothing left to flush: just close."""
    try:
        await broker.stop()
    except BUS_ERRORS:
        with suppress(IncorrectState):
            await broker.connection.close()


def create_service(name: str, settings: ServiceSettings) -> Service:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    if settings.development:  # in production the settings were refused (ServiceSettings)
        for unsafe in settings.unsafe_defaults():
            logging.getLogger(f"crater.{name}").warning("development mode: %s", unsafe)
    registry = make_registry()
    tracer_provider = make_tracer_provider(name, settings.trace_file)
    broker, rejections = make_broker(
        NatsConnection.of(settings), name, registry, tracer_provider, DeliveryPolicy.of(settings)
    )
    return Service(name, settings, broker, rejections, registry, tracer_provider)


def serve(app: Any, service: Service) -> None:
    """Run until SIGINT/SIGTERM; uvicorn's lifespan then stops consumers and drains NATS."""
    uvicorn.run(
        app,
        host=service.settings.http_host,
        port=service.port,
        log_level=service.settings.log_level.lower(),
        access_log=False,
        lifespan="on",
    )
