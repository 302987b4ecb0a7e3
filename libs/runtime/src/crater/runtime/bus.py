"""The NATS JetStream side of every service: broker, streams, typed durable subscribers,
publishing with de-duplication ids, and refusal of bad input."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID, uuid5
from weakref import WeakKeyDictionary

import nats
import nats.errors
import nats.js.errors
from faststream import AckPolicy
from faststream._internal.middlewares import BaseMiddleware
from faststream.exceptions import HandlerException, NackMessage, RejectMessage
from faststream.message import StreamMessage, decode_message
from faststream.nats import (
    DeliverPolicy,
    JStream,
    NatsBroker,
    NatsRouter,
    PullSub,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.prometheus import NatsPrometheusMiddleware
from faststream.nats.prometheus.provider import (
    BatchNatsMetricsSettingsProvider,
    NatsMetricsSettingsProvider,
    settings_provider_factory,
)
from faststream.prometheus import ConsumeAttrs, MetricsSettingsProvider
from faststream.prometheus.middleware import PrometheusMiddleware
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError
from sqlalchemy import exc as sqlalchemy_exc

from crater.contracts import (
    Channel,
    Event,
    FailureKind,
    FieldError,
    MessageDeadLettered,
    MessageRejected,
    Streams,
    StreamSpec,
    Subjects,
    derived_event_id,
)
from crater.contracts.catalog import channel_for
from crater.runtime.jsondepth import NotText, TooDeep, check_json_depth, check_json_text
from crater.runtime.leadership import EPOCH_HEADER, DeposedLeader, EpochGuard
from crater.runtime.nats_connection import NatsConnection, reconnect_options
from crater.runtime.settings import ServiceSettings
from crater.runtime.telemetry import current_trace_context
from crater.runtime.together import Together

log = logging.getLogger("crater.bus")

MAX_MESSAGE_BYTES = 1024 * 1024
# Every handler names its message parameter `event`; rejections report paths below it.
HANDLER_PARAMETER = "event"
# How long to wait for JetStream's ack of one publish attempt: nats-py's 0.5 s default is too
# short on a loaded 2-core machine, and a retry is safe (the Nats-Msg-Id de-duplicates it).
PUBLISH_ACK_TIMEOUT_SECONDS = 2.0
# A publish is retried on what a stream-leader election or a server's loss answers (a timeout,
# no responders, 503) for this long in all, 0.1 s apart doubling to 1 s, with jitter: a
# stream whose leader died elects another within about 4 to 9 s (nats-server's raft timeouts).
PUBLISH_RETRY_SECONDS = 20.0
PUBLISH_RETRY_FIRST_DELAY = 0.1
PUBLISH_RETRY_MAX_DELAY = 1.0
# The longest a publish may take before its error is raised: the last attempt's ack included.
PUBLISH_GIVE_UP_SECONDS = PUBLISH_RETRY_SECONDS + PUBLISH_ACK_TIMEOUT_SECONDS
# What JetStream answers while a stream has no leader, or a server was just lost.
TRANSIENT_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    asyncio.TimeoutError,
)
# At most this many servers hold a copy of a stream when CRATER_STREAM_REPLICAS is 0 (auto).
MAX_AUTO_REPLICAS = 3
# The longest wait before a failed message is delivered again.
MAX_REDELIVERY_DELAY_SECONDS = 300.0
# JetStream's max_deliver is set this far above the service's own limit (a backstop).
MAX_DELIVER_MARGIN = 3
# How long `ensure_streams` and `key_value` wait for JetStream: a cluster just started elects
# its meta leader first (a few seconds), and until then answers 503 or not at all.
ENSURE_STREAMS_SECONDS = 30.0
Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])
T = TypeVar("T")

_RETENTION = {
    "limits": RetentionPolicy.LIMITS,
    "interest": RetentionPolicy.INTEREST,
    "workqueue": RetentionPolicy.WORK_QUEUE,
}


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    """The JetStream configuration of a catalog stream, kept on `replicas` servers."""
    return StreamConfig(
        num_replicas=replicas,
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=_RETENTION[spec.retention.value],
        max_age=spec.max_age_seconds or None,
        duplicate_window=spec.duplicate_window_seconds,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_msg_size=MAX_MESSAGE_BYTES,
        storage=StorageType.FILE,
    )


def field_errors(error: ValidationError, root: str | None = None) -> list[FieldError]:
    """Pydantic's errors as (field path, reason) pairs, the form every rejection uses.

    `root` is a leading path element to drop: a handler's parameter name.
    """
    errors = []
    for e in error.errors(include_url=False):
        loc = list(e["loc"])
        if root is not None and loc[:1] == [root]:
            loc = loc[1:]
        errors.append(FieldError(field=".".join(str(p) for p in loc) or "body", reason=e["msg"]))
    return errors


_SHARED = ServiceSettings.model_fields


@dataclass(frozen=True)
class DeliveryPolicy:
    """How a service's consumers treat a message they cannot handle (from ServiceSettings)."""

    # One source for the defaults: the settings every service reads.
    max_deliveries: int = _SHARED["max_deliveries"].default
    max_outage_deliveries: int = _SHARED["max_outage_deliveries"].default
    redelivery_delay_seconds: float = _SHARED["redelivery_delay_seconds"].default
    max_json_depth: int = _SHARED["max_json_depth"].default

    @classmethod
    def of(cls, settings: ServiceSettings) -> DeliveryPolicy:
        return cls(
            max_deliveries=settings.max_deliveries,
            max_outage_deliveries=settings.max_outage_deliveries,
            redelivery_delay_seconds=settings.redelivery_delay_seconds,
            max_json_depth=settings.max_json_depth,
        )

    def redelivery_delay(self, deliveries: int) -> float:
        """The wait before delivery `deliveries + 1`: doubling, so a poison message or a
        database that is down never turns into a hot redelivery loop."""
        return min(
            self.redelivery_delay_seconds * 2.0 ** max(deliveries - 1, 0),
            MAX_REDELIVERY_DELAY_SECONDS,
        )

    @property
    def server_max_deliver(self) -> int:
        """JetStream's own limit on the consumer, a backstop above ours: reached only when
        handling never ends (the process is killed on the message, or overruns ack_wait)."""
        return max(self.max_deliveries, self.max_outage_deliveries) + MAX_DELIVER_MARGIN

    def limit_for(self, error: BaseException) -> int:
        """Deliveries allowed before dead-lettering: many more when `error` says something the
        handler needs is unreachable, which is no fault of the message."""
        return self.max_outage_deliveries if unavailable(error) else self.max_deliveries


@dataclass(frozen=True)
class Delivery:
    """Where a JetStream delivery came from and how often it was delivered."""

    subject: str
    stream: str
    stream_sequence: int
    consumer: str
    deliveries: int
    headers: dict[str, str]


def _delivery(msg: StreamMessage[Any]) -> Delivery | None:
    """The JetStream side of a message; None for a core NATS one (a request)."""
    return delivery_of(getattr(msg, "raw_message", None))


def delivery_of(raw: Any) -> Delivery | None:
    """The JetStream side of a raw nats-py message; None for a core NATS one (a request)."""
    if not isinstance(raw, Msg) or not raw.reply or not raw.reply.startswith("$JS.ACK."):
        return None
    metadata = raw.metadata
    return Delivery(
        subject=raw.subject,
        stream=metadata.stream,
        stream_sequence=metadata.sequence.stream,
        consumer=metadata.consumer,
        deliveries=metadata.num_delivered,
        headers=dict(raw.headers or {}),
    )


@dataclass(frozen=True)
class Inbound:
    """A message as the refusal of bad input sees it, whoever consumed it: FastStream's
    per-message subscriber (`durable`) or a batch consumer (crater.runtime.batches)."""

    body: bytes
    subject: str
    headers: Mapping[str, Any]
    delivery: Delivery | None  # None: a core NATS request
    content_type: str | None = None

    @classmethod
    def of(cls, msg: StreamMessage[Any]) -> Inbound:
        delivery = _delivery(msg)
        return cls(
            body=msg.body,
            subject=delivery.subject if delivery else _subject(msg),
            headers=msg.headers,
            delivery=delivery,
            content_type=msg.content_type,
        )

    async def decode(self) -> Any:
        """The body as FastStream decodes it (by its content type; JSON when it has none)."""
        return decode_message(self)  # type: ignore[arg-type]  # reads .body, .content_type


# What `Rejections.admit` returns for a message it refused (a core NATS request: nothing to
# terminate; a JetStream delivery's refusal ends in an ack decision raised instead).
REFUSED: Any = object()


class Rejections:
    """Refuses what a service's consumers cannot take, names the reason, and moves on.

    A message that cannot be decoded (nested too deep, not UTF-8, not JSON, not the subject's
    schema) fails the same way every time: refused and dead-lettered at once. One whose handler
    raises anything else may succeed later (a database that was down), so it is redelivered
    after a growing delay, and moved to the dead-letter stream once it has failed
    `max_deliveries` times. Either way a MessageRejected names the reason, and the message is
    terminated so JetStream never delivers it again; the messages behind it go on.
    """

    def __init__(
        self,
        broker: NatsBroker,
        service: str,
        registry: CollectorRegistry,
        policy: DeliveryPolicy | None = None,
    ) -> None:
        self.broker = broker
        self.service = service
        self.policy = policy or DeliveryPolicy()
        self.epochs = EpochGuard()  # the leaders heard from: a deposed one's late messages
        self.counter = Counter(
            "crater_messages_rejected",
            "Messages refused: undecodable, invalid, or failing on every delivery.",
            ["subject"],
            registry=registry,
        )
        self.decode_refused = Counter(
            "crater_messages_decode_refused",
            "Messages refused before handling: nested too deep, not UTF-8, not JSON, invalid.",
            ["subject", "reason"],
            registry=registry,
        )
        self.redelivered = Counter(
            "crater_messages_redelivered",
            "Deliveries whose handling failed, handed back to JetStream to retry after a delay.",
            ["subject"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            "crater_messages_dead_lettered",
            "Messages moved to the dead-letter stream (CRATER_DEAD_LETTERS).",
            ["subject", "consumer", "reason"],
            registry=registry,
        )

    async def reject(
        self,
        subject: str,
        body: bytes,
        errors: list[FieldError],
        **details: Any,
    ) -> None:
        """Count, log once and publish a MessageRejected; `details` are its optional fields."""
        self.counter.labels(subject=metric_subject(subject)).inc()
        log.warning(
            "rejected message on %s: %s",
            subject,
            _clip("; ".join(f"{e.field}: {e.reason}" for e in errors)),
        )
        event = MessageRejected(
            subject=subject,
            consumer=self.service,
            errors=errors,
            payload_excerpt=body[:512].decode("utf-8", "replace")[:512],
            **details,
        )
        await publish(self.broker, event)

    async def admit(
        self, message: Inbound, decode: Callable[[], Awaitable[Any]] | None = None
    ) -> Any:
        """The message's decoded body (`decode`: the consumer's own decoding, by default
        `message.decode`), once it passed every check made before handling: JSON depth, text,
        decoding, the node its subject names, the epoch of the leader that sent it. A message
        that fails one is refused (`refuse`): a JetStream delivery ends in an ack decision
        raised (terminate; handed back if it could not be dead-lettered), a core NATS request
        in REFUSED returned."""
        delivery = message.delivery
        try:
            check_json_depth(message.body, self.policy.max_json_depth)
            check_json_text(message.body)
            body = await (decode or message.decode)()
        except NotText as error:
            not_text = FieldError(field=error.field, reason=error.what)
            await self.refuse(message, error, [not_text])
            return REFUSED
        except Exception as error:
            await self.undecodable(message, error)
            return REFUSED
        if (wrong := node_mismatch(message.subject, body)) is not None:
            await self.refuse(message, NodeMismatch(wrong.reason), [wrong])
            return REFUSED
        stored = (delivery.stream, delivery.stream_sequence) if delivery else (None, None)
        if (stale := self.epochs.stale(message.headers, *stored)) is not None:
            field = FieldError(field=f"headers.{EPOCH_HEADER}", reason=stale)
            await self.refuse(message, DeposedLeader(stale), [field])
            return REFUSED
        return body

    async def undecodable(self, message: Inbound, error: Exception) -> None:
        """Refuse a message that cannot be decoded: never retried."""
        await self.refuse(message, error, _explain(message.body, error))

    async def refuse(self, message: Inbound, error: Exception, errors: list[FieldError]) -> None:
        """Refuse a message before handling, for what it is (never retried): dead-lettered,
        and a MessageRejected naming `errors`."""
        reason = type(error).__name__
        self.decode_refused.labels(subject=metric_subject(message.subject), reason=reason).inc()
        if message.delivery is None:  # a core NATS request: nothing to keep or to terminate
            await self.reject(message.subject, message.body, errors, error_class=reason)
            return
        await self._give_up(message.body, message.delivery, "decode", error, errors)

    async def failed(self, body: bytes, delivery: Delivery, error: Exception) -> None:
        """A handler raised: redeliver after a delay, or give up once the limit is reached.
        Always ends in a FastStream ack exception (nack with delay, or terminate)."""
        reason = _describe(error)
        limit = self.policy.limit_for(error)
        if delivery.deliveries < limit:
            delay = self.policy.redelivery_delay(delivery.deliveries)
            self.redelivered.labels(subject=metric_subject(delivery.subject)).inc()
            # One line per delivery, no traceback: the bounded log of a poison message.
            log.warning(
                "%s failed on %s (stream %s #%d), delivery %d of %d; retrying in %.1f s: %s",
                delivery.consumer,
                delivery.subject,
                delivery.stream,
                delivery.stream_sequence,
                delivery.deliveries,
                limit,
                delay,
                _clip(reason),
            )
            raise NackMessage(delay=delay)
        log.error(
            "%s failed on %s (stream %s #%d) %d times; moving it to %s",
            delivery.consumer,
            delivery.subject,
            delivery.stream,
            delivery.stream_sequence,
            delivery.deliveries,
            Streams.DEAD_LETTERS.name,
            exc_info=error,
        )
        errors = [
            FieldError(
                field="body",
                reason=_clip(f"{reason} (on each of {delivery.deliveries} deliveries)"),
            )
        ]
        await self._give_up(body, delivery, "apply", error, errors)

    async def _give_up(
        self,
        body: bytes,
        delivery: Delivery,
        kind: FailureKind,
        error: Exception,
        errors: list[FieldError],
    ) -> None:
        """Dead-letter the message, say so, and terminate it; if the dead letter cannot be
        published, the message is handed back instead, so it is never lost."""
        reason = type(error).__name__
        letter = dead_letter(self.service, delivery, body, kind, reason, errors)
        try:
            await publish(self.broker, letter)
            await self.reject(
                delivery.subject,
                body,
                errors,
                kind=kind,
                error_class=reason,
                deliveries=delivery.deliveries,
                dead_letter_id=str(letter.event_id),
                event_id=derived_event_id(letter.event_id, "rejected"),
            )
        except Exception as publishing:
            delay = self.policy.redelivery_delay(delivery.deliveries)
            log.warning(
                "could not dead-letter %s #%d: %r; handing it back for %.1f s",
                delivery.stream,
                delivery.stream_sequence,
                publishing,
                delay,
            )
            raise NackMessage(delay=delay) from publishing
        self.dead_lettered.labels(
            subject=metric_subject(delivery.subject), consumer=delivery.consumer, reason=reason
        ).inc()
        raise RejectMessage()  # JetStream's term: never delivered again

    def middleware(self) -> Callable[..., BaseMiddleware]:
        rejections = self

        class RefusePoisonMessages(BaseMiddleware):
            """Decodes first (depth checked before), so a decode failure is told apart from a
            failure to apply; every failure becomes a rejection or a delayed redelivery."""

            async def consume_scope(self, call_next: Any, msg: StreamMessage[Any]) -> Any:
                message = Inbound.of(msg)
                if await rejections.admit(message, msg.decode) is REFUSED:
                    return None
                try:
                    return await call_next(msg)
                except HandlerException:
                    raise  # an ack decision already taken
                except ValidationError as error:
                    await rejections.undecodable(message, error)
                    return None
                except Exception as error:
                    if message.delivery is None:
                        raise  # a request: its caller hears of it
                    await rejections.failed(msg.body, message.delivery, error)
                    raise  # not reached: failed() always raises an ack decision

        return RefusePoisonMessages


_DEAD_LETTER_NAMESPACE = UUID("b7e0c2d4-5f1a-4e8b-9c3d-2a6f8e1b0d57")
# Room for the NATS headers of the dead letter itself (its id, content type, trace context).
_HEADER_ROOM = 8 * 1024


def dead_letter(
    service: str,
    delivery: Delivery,
    body: bytes,
    kind: FailureKind,
    error_class: str,
    errors: list[FieldError],
) -> MessageDeadLettered:
    """The dead letter of one delivery. Its id is derived from the stream position and the
    consumer, so dead-lettering the same message twice (a crash before the term) keeps one.
    A payload that would not fit in it (JSON escaping can grow a body sixfold) is left out:
    the original stream still holds it at its sequence."""
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    letter = MessageDeadLettered(
        event_id=uuid5(
            _DEAD_LETTER_NAMESPACE,
            f"{delivery.stream}:{delivery.stream_sequence}:{delivery.consumer}",
        ),
        subject=delivery.subject,
        stream=delivery.stream,
        stream_sequence=delivery.stream_sequence,
        service=service,
        consumer=delivery.consumer,
        deliveries=delivery.deliveries,
        kind=kind,
        error_class=error_class,
        errors=errors,
        headers=delivery.headers,
        payload=text,
        payload_base64=None if text is not None else base64.b64encode(body).decode(),
        payload_bytes=len(body),
    )
    if len(encode(letter)) <= MAX_MESSAGE_BYTES - _HEADER_ROOM:
        return letter
    return letter.model_copy(
        update={"payload": None, "payload_base64": None, "payload_omitted": True}
    )


# What a handler raises when a dependency is down rather than when the message is bad.
_UNREACHABLE: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    sqlalchemy_exc.OperationalError,
    sqlalchemy_exc.InterfaceError,
    sqlalchemy_exc.DisconnectionError,
    sqlalchemy_exc.TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.TimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)


def unavailable(error: BaseException) -> bool:
    """Whether `error` (or what caused it) says a database, NATS or another service could not
    be reached: the same message may well be handled once it is back."""
    seen: BaseException | None = error
    for _ in range(8):  # a short cause chain: SQLAlchemy wraps the driver's error
        if seen is None:
            return False
        if isinstance(seen, _UNREACHABLE):
            return True
        if isinstance(seen, sqlalchemy_exc.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _describe(error: BaseException) -> str:
    """`Class: message`, first line only: a database error goes on with the statement and its
    parameters, which belong in the one traceback logged, not in every line and event."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _clip(text: str, limit: int = 500) -> str:
    """Bounded log lines and reasons: a database error can quote a whole statement."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _subject(msg: StreamMessage[Any]) -> str:
    raw = getattr(msg, "raw_message", None)
    return str(getattr(raw, "subject", "") or "")


def _explain(body: bytes, error: Exception) -> list[FieldError]:
    """Why a message could not be decoded, as (field, reason) pairs."""
    if isinstance(error, TooDeep):
        return [FieldError(field="body", reason=str(error))]
    if isinstance(error, RecursionError):
        return [FieldError(field="body", reason=f"nested too deeply to decode: {error}")]
    if isinstance(error, UnicodeDecodeError):
        return [FieldError(field="body", reason=f"not UTF-8 text: {error}")]
    if isinstance(error, ValidationError):
        try:
            json.loads(body)
        except ValueError as bad_json:
            return [FieldError(field="body", reason=f"not valid JSON: {bad_json}")]
        except RecursionError as deep:
            return [FieldError(field="body", reason=f"nested too deeply to decode: {deep}")]
        return field_errors(error, root=HANDLER_PARAMETER)
    if isinstance(error, ValueError):
        return [FieldError(field="body", reason=f"not valid JSON: {error}")]
    return [FieldError(field="body", reason=_clip(_describe(error)))]


# Node-scoped subjects carry the node id: as a metric label that is a series per node (10,000
# nodes made /metrics take seconds to render). Metrics name the channel's wildcard instead.
_NODE_SCOPED_PREFIXES = tuple(
    (f"{channel.subject}.", channel.wildcard) for channel in Subjects.ALL if channel.node_scoped
)
# Where each node-scoped channel's body names its node: `node_id`, or its topology's.
_NODE_ID_PATHS = {
    f"{channel.subject}.": ("node_id",)
    if "node_id" in channel.event.model_fields
    else ("node", "node_id")
    for channel in Subjects.ALL
    if channel.node_scoped
}


class NodeMismatch(ValueError):
    """A node-scoped message whose body names another node than its subject does."""


def node_mismatch(subject: str, body: Any) -> FieldError | None:
    """Why a node-scoped message's body does not name its subject's node; None when it does
    (or the subject is not node-scoped). NATS permissions bind a node's credential to its
    subjects (`node-<id>`), so this check binds the body too: node-a cannot speak for node-b."""
    for prefix, path in _NODE_ID_PATHS.items():
        if not subject.startswith(prefix):
            continue
        named: Any = body
        for key in path:
            named = named.get(key) if isinstance(named, dict) else None
        node = subject.removeprefix(prefix)
        if named is None or named == node:
            return None  # a missing node id is the schema's to refuse
        return FieldError(
            field=".".join(path),
            reason=_clip(f"the body names node {named!r}, its subject {subject} node {node!r}"),
        )
    return None


def metric_subject(subject: str) -> str:
    """`subject` as a metric label: node-scoped subjects folded into their channel's wildcard."""
    for prefix, wildcard in _NODE_SCOPED_PREFIXES:
        if subject.startswith(prefix):
            return wildcard
    return subject


class _ChannelLabels(NatsMetricsSettingsProvider):
    def get_consume_attrs_from_message(self, msg: StreamMessage[Msg]) -> ConsumeAttrs:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = metric_subject(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: Any) -> str:
        return metric_subject(super().get_publish_destination_name_from_cmd(cmd))


class _BatchChannelLabels(BatchNatsMetricsSettingsProvider):
    def get_consume_attrs_from_message(self, msg: StreamMessage[list[Msg]]) -> ConsumeAttrs:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = metric_subject(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: Any) -> str:
        return metric_subject(super().get_publish_destination_name_from_cmd(cmd))


def _channel_labels(msg: Any) -> MetricsSettingsProvider[Any] | None:
    """FastStream's NATS metrics settings, with subjects folded by `metric_subject`."""
    chosen = settings_provider_factory(msg)
    if isinstance(chosen, BatchNatsMetricsSettingsProvider):
        return _BatchChannelLabels()
    if isinstance(chosen, NatsMetricsSettingsProvider):
        return _ChannelLabels()
    return chosen


class ChannelMetricsMiddleware(NatsPrometheusMiddleware):
    """FastStream's Prometheus middleware, labelled by channel rather than by node subject."""

    def __init__(self, *, registry: CollectorRegistry, app_name: str, metrics_prefix: str) -> None:
        PrometheusMiddleware.__init__(
            self,
            settings_provider_factory=_channel_labels,
            registry=registry,
            app_name=app_name,
            metrics_prefix=metrics_prefix,
        )


def make_broker(
    nats_url: str | NatsConnection,
    service: str,
    registry: CollectorRegistry,
    tracer_provider: TracerProvider | None,
    policy: DeliveryPolicy | None = None,
) -> tuple[NatsBroker, Rejections]:
    """The service's broker; given a `NatsConnection`, as its user and over its TLS."""
    connection = NatsConnection.coerce(nats_url)
    broker = NatsBroker(
        connection.servers,
        security=connection.security(),
        **reconnect_options(),
        middlewares=(
            NatsTelemetryMiddleware(tracer_provider=tracer_provider),
            ChannelMetricsMiddleware(registry=registry, app_name=service, metrics_prefix="crater"),
        ),
        # FastStream logs every message at INFO by default: too slow for hot paths.
        log_level=logging.DEBUG,
        name=f"crater-{service}",
    )
    rejections = Rejections(broker, service, registry, policy)
    broker.add_middleware(rejections.middleware())
    _WIRING[broker] = Wiring(rejections, registry, tracer_provider)
    return broker, rejections


@dataclass(frozen=True)
class Wiring:
    """What `make_broker` gave a broker, for the consumers registered on it later: its
    refusal of bad input (and delivery policy), metrics registry and tracer provider."""

    rejections: Rejections
    registry: CollectorRegistry
    tracer_provider: TracerProvider | None


def wiring(broker: NatsBroker) -> Wiring | None:
    """The broker's `Wiring`; None for one `make_broker` did not make."""
    return _WIRING.get(broker)


def policy_of(broker: NatsBroker) -> DeliveryPolicy:
    found = _WIRING.get(broker)
    return found.rejections.policy if found is not None else DeliveryPolicy()


def remember_durable(broker: NatsBroker, stream: str, durable_name: str) -> None:
    """Register a durable consumer of `broker` for `align_consumers`."""
    _DURABLES.setdefault(broker, []).append((stream, durable_name))


# Each broker's wiring, for the consumers registered on it (`_pull_consumer`, batch
# consumers), and those consumers as (stream, durable name), for `align_consumers`.
_WIRING: WeakKeyDictionary[NatsBroker, Wiring] = WeakKeyDictionary()
_DURABLES: WeakKeyDictionary[NatsBroker, list[tuple[str, str]]] = WeakKeyDictionary()


def subject_of(event: Event) -> str:
    channel = channel_for(type(event))
    if not channel.node_scoped:
        return channel.subject
    node_id = getattr(event, "node_id", None) or event.node.node_id  # type: ignore[attr-defined]
    return channel.for_node(str(node_id))


def encode(event: Event) -> bytes:
    return event.model_dump_json().encode()


async def publish(
    broker: NatsBroker, event: Event, extra_headers: Mapping[str, str] | None = None
) -> None:
    """Publish to JetStream and wait for the stream's ack; `event_id` is the de-dup id."""
    if event.trace is None:
        context = current_trace_context()
        if context is not None:
            event = event.model_copy(update={"trace": context})
    message = outgoing(event)
    await publish_raw(
        broker,
        subject=message.subject,
        stream=message.stream,
        payload=message.payload,
        event_id=message.event_id,
        traceparent=message.traceparent,
        extra_headers=extra_headers,
    )


async def publish_raw(
    broker: NatsBroker,
    *,
    subject: str,
    stream: str,
    payload: bytes,
    event_id: str,
    traceparent: str | None,
    extra_headers: Mapping[str, str] | None = None,
) -> None:
    """The one place that publishes: de-dup id header, and, when no span is active (the
    outbox relay), the emitting span's context as parent so the trace stays one.
    `extra_headers`: a leader's epoch (crater.runtime.leadership)."""
    headers = {"Nats-Msg-Id": event_id, "content-type": "application/json", **(extra_headers or {})}
    token = None
    if traceparent and not otel_trace.get_current_span().get_span_context().is_valid:
        token = otel_context.attach(extract({"traceparent": traceparent}))
    try:
        await retry_transient(
            lambda: broker.publish(
                payload,
                subject,
                headers=headers,
                stream=stream,
                timeout=PUBLISH_ACK_TIMEOUT_SECONDS,
            ),
            what=f"publish to {subject}",
        )
    finally:
        if token is not None:
            otel_context.detach(token)


@dataclass(frozen=True)
class Outgoing:
    """One message of `publish_batch`: where it goes, its body, its de-dup id, and the trace
    context it carries (the span that caused it)."""

    subject: str
    stream: str
    payload: bytes
    event_id: str
    traceparent: str | None = None


def outgoing(event: Event) -> Outgoing:
    """`event` as a message of `publish_batch`, carrying its own trace context."""
    return Outgoing(
        subject=subject_of(event),
        stream=channel_for(type(event)).stream.name,
        payload=encode(event),
        event_id=str(event.event_id),
        traceparent=event.trace.traceparent if event.trace else None,
    )


# One JetStream context per connection: its asynchronous publishes share one reply inbox.
_JETSTREAMS: WeakKeyDictionary[Client, JetStreamContext] = WeakKeyDictionary()


def _jetstream(connection: Client) -> JetStreamContext:
    found = _JETSTREAMS.get(connection)
    if found is None:
        found = _JETSTREAMS[connection] = connection.jetstream()
    return found


async def publish_batch(
    broker: NatsBroker,
    messages: Sequence[Outgoing],
    extra_headers: Mapping[str, str] | None = None,
) -> list[BaseException | None]:
    """Publish `messages` in their order, every one sent before any ack is awaited, the acks
    then awaited together: one round trip for the batch instead of one each. Straight on the
    connection (no per-message middleware): each message carries its own trace context as its
    `traceparent` header and its event id as Nats-Msg-Id, as `publish_raw` would give it.

    A message whose ack does not come in time, or is an error, is published again on its own
    (`publish_raw`, with its retries): its Nats-Msg-Id lets JetStream drop it if it had in fact
    arrived. Returns each message's outcome: None once JetStream holds it, else the error."""
    if not messages:
        return []
    js = _jetstream(broker.connection)
    sent: list[asyncio.Future[Any] | BaseException] = []
    for message in messages:
        headers = {
            "Nats-Msg-Id": message.event_id,
            "content-type": "application/json",
            **(extra_headers or {}),
        }
        if message.traceparent:
            headers["traceparent"] = message.traceparent
        try:
            sent.append(
                await js.publish_async(
                    message.subject,
                    message.payload,
                    wait_stall=PUBLISH_ACK_TIMEOUT_SECONDS,
                    stream=message.stream,
                    headers=headers,
                )
            )
        except Exception as error:  # the connection is away, or too many acks outstanding
            sent.append(error)
    waiting = [f for f in sent if isinstance(f, asyncio.Future)]
    if waiting:
        _, late = await asyncio.wait(waiting, timeout=PUBLISH_ACK_TIMEOUT_SECONDS)
        for future in late:
            future.cancel()  # frees its slot among the acks outstanding
    again = [
        i
        for i, outcome in enumerate(sent)
        if not isinstance(outcome, asyncio.Future)
        or outcome.cancelled()
        or outcome.exception() is not None
    ]
    outcomes: list[BaseException | None] = [None] * len(messages)
    if again:
        retried = await asyncio.gather(
            *(
                publish_raw(
                    broker,
                    subject=messages[i].subject,
                    stream=messages[i].stream,
                    payload=messages[i].payload,
                    event_id=messages[i].event_id,
                    traceparent=messages[i].traceparent,
                    extra_headers=extra_headers,
                )
                for i in again
            ),
            return_exceptions=True,
        )
        for i, outcome in zip(again, retried, strict=True):
            outcomes[i] = outcome
    return outcomes


class PublishTogether:
    """Publishes from many concurrent callers sent together (`Together` over
    `publish_batch`, acks awaited together). Each caller still returns only once JetStream
    holds its own message (or raises its own error), so a 202 is never answered early: only
    the serial wait for one ack after another is gone. For a service's request handlers (the
    gateway's submissions)."""

    def __init__(self, broker: NatsBroker, max_batch: int = 256) -> None:
        async def send(messages: list[Outgoing]) -> list[BaseException | None]:
            return await publish_batch(broker, messages)

        self._together: Together[Outgoing, None] = Together(send, max_batch)

    async def publish(self, event: Event) -> None:
        """`event` on the bus, in the current span's trace unless it names its own."""
        if event.trace is None:
            context = current_trace_context()
            if context is not None:
                event = event.model_copy(update={"trace": context})
        await self._together(outgoing(event))


async def retry_transient(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: str,
    seconds: float = PUBLISH_RETRY_SECONDS,
    errors: tuple[type[BaseException], ...] = TRANSIENT_PUBLISH_ERRORS,
) -> T:
    """`attempt()`, again on `errors` (what a stream-leader election or a lost server
    answers) for `seconds` in all, the delay doubling from 0.1 s to 1 s with jitter; then the
    last error is raised. Safe for a publish: its Nats-Msg-Id de-duplicates a retry."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    delay = PUBLISH_RETRY_FIRST_DELAY
    tries = 0
    while True:
        try:
            result = await attempt()
        except errors as error:
            tries += 1
            if loop.time() + delay > deadline:
                raise
            log.info("%s: %s; retry %d in %.2f s", what, _describe(error), tries, delay)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, PUBLISH_RETRY_MAX_DELAY)
            continue
        if tries:
            log.info("%s: done after %d retries", what, tries)
        return result


def replicas_for(connection: Client, wanted: int) -> int:
    """The replicas of what Crater declares: `wanted` (CRATER_STREAM_REPLICAS), or when 0
    (auto) 1 on a server alone and MAX_AUTO_REPLICAS on one that is part of a cluster (its INFO
    names a cluster)."""
    if wanted:
        return wanted
    info: dict[str, Any] = getattr(connection, "_server_info", None) or {}
    return MAX_AUTO_REPLICAS if info.get("cluster") else 1


async def key_value(broker: NatsBroker, bucket: str, replicas: int, **config: Any) -> KeyValue:
    """The KV bucket `bucket` (FastStream's `broker.key_value`, `config` its settings) on
    `replicas_for(replicas)` servers; one that exists on another number is updated to it."""
    connection = broker.connection
    wanted = replicas_for(connection, replicas)
    js = connection.jetstream()

    async def declare() -> KeyValue:
        try:
            info = await js.stream_info(f"KV_{bucket}")
        except NotFoundError:
            info = None
        if info is not None and info.config.num_replicas != wanted:
            await js.update_stream(config=info.config.evolve(num_replicas=wanted))
            log.info("KV %s: replicas %s -> %d", bucket, info.config.num_replicas, wanted)
        return await broker.key_value(bucket, replicas=wanted, **config)

    # A cluster still electing its meta leader answers 503: wait as `ensure_streams` does.
    return await retry_transient(declare, what=f"KV {bucket}", seconds=ENSURE_STREAMS_SECONDS)


def durable(
    broker: NatsBroker,
    channel: Channel,
    service: str,
    *,
    batch: int = 64,
    name: str | None = None,
    deliver_policy: DeliverPolicy | None = None,
    router: NatsRouter | None = None,
) -> Callable[[Handler], Handler]:
    """A durable pull consumer for `channel`; the message is acked after the handler returns
    (so after its own commit) and redelivered if the handler raises. On `router` (a leader's
    subscribers, crater.runtime.leadership.LeaderGate) it runs only while the router does."""
    durable_name = f"{service}-{name or channel.short_name}"
    return _pull_consumer(
        broker,
        channel.wildcard,
        channel.stream.name,
        durable_name,
        batch,
        channel.description,
        deliver_policy,
        router,
    )


def durable_stream(
    broker: NatsBroker,
    stream: StreamSpec,
    service: str,
    *,
    batch: int = 64,
    name: str | None = None,
) -> Callable[[Handler], Handler]:
    """One durable pull consumer for every subject of `stream`, in stream order: for a
    consumer that must see several subjects' events in the order they were published. The
    handler takes the raw message (`message: NatsMessage`) and dispatches on its subject;
    acked after the handler returns, redelivered if it raises."""
    if len(stream.subjects) != 1:
        raise ValueError(f"{stream.name} has {len(stream.subjects)} subjects; one is needed")
    durable_name = f"{service}-{name or stream.name.removeprefix('CRATER_').lower()}"
    return _pull_consumer(
        broker, stream.subjects[0], stream.name, durable_name, batch, stream.description
    )


def _pull_consumer(
    broker: NatsBroker,
    subject: str,
    stream_name: str,
    durable_name: str,
    batch: int,
    description: str,
    deliver_policy: DeliverPolicy | None = None,
    router: NatsRouter | None = None,
) -> Callable[[Handler], Handler]:
    """The durable pull subscriber both `durable` and `durable_stream` register: acked after
    the handler returns; if it raises, redelivered after a delay up to the broker's delivery
    limit, then dead-lettered (`Rejections`)."""
    policy = policy_of(broker)
    remember_durable(broker, stream_name, durable_name)
    subscriber = (router or broker).subscriber(
        subject,
        stream=JStream(stream_name, declare=False),
        durable=durable_name,
        deliver_policy=deliver_policy,
        # Set when the consumer is created; one that exists keeps its own.
        config=ConsumerConfig(max_deliver=policy.server_max_deliver, filter_subjects=[]),
        pull_sub=PullSub(batch_size=batch, timeout=1.0),
        ack_policy=AckPolicy.NACK_ON_ERROR,
        title=f"{durable_name}:{subject}",
        description=description,
    )

    def register(handler: Handler) -> Handler:
        subscriber(handler)
        return handler

    return register


async def align_consumers(nats_url: str | NatsConnection, broker: NatsBroker) -> None:
    """Give the broker's durable consumers that already exist JetStream's backstop for its
    delivery limit (`max_deliver`): nats-py binds to an existing consumer as it is, so one
    created before the limit (or under another limit) would otherwise keep its own."""
    wanted = policy_of(broker).server_max_deliver
    connection = await NatsConnection.coerce(nats_url).connect(connect_timeout=5)
    try:
        js = connection.jetstream()
        for stream, durable_name in _DURABLES.get(broker, []):
            # A loaded cluster may let a JetStream API call time out: retried, as
            # `ensure_streams` waits, rather than failing the service's start.
            try:
                info = await retry_transient(
                    functools.partial(js.consumer_info, stream, durable_name),
                    what=f"consumer info {durable_name}",
                    seconds=ENSURE_STREAMS_SECONDS,
                )
            except NotFoundError:
                continue  # created with it when the subscriber starts
            if info.config.max_deliver != wanted:
                config = info.config.evolve(max_deliver=wanted)
                await retry_transient(
                    functools.partial(js.add_consumer, stream, config=config),
                    what=f"align {durable_name}",
                    seconds=ENSURE_STREAMS_SECONDS,
                )
                log.info("%s: max_deliver %s -> %d", durable_name, info.config.max_deliver, wanted)
    finally:
        await connection.close()


async def ensure_streams(
    nats_url: str | NatsConnection,
    streams: Sequence[StreamSpec] = Streams.ALL,
    replicas: int = 0,
) -> int:
    """Create or update the catalog's streams (every one, or `streams`: those a service with an
    identity of its own may declare) before any service consumes or publishes, each on
    `replicas_for(replicas)` servers (CRATER_STREAM_REPLICAS; a stream kept on another number is
    updated to it); returns that number.

    Done over its own short connection because FastStream's broker only connects when it
    starts its subscribers, and those need their streams to exist already.
    """
    connection = await NatsConnection.coerce(nats_url).connect(connect_timeout=5)
    try:
        js = connection.jetstream()
        wanted = replicas_for(connection, replicas)
        for spec in streams:
            config = stream_config(spec, wanted)

            async def declare(config: StreamConfig = config) -> None:
                try:
                    await js.add_stream(config=config)
                except BadRequestError:
                    await js.update_stream(config=config)

            await retry_transient(
                declare, what=f"declare {spec.name}", seconds=ENSURE_STREAMS_SECONDS
            )
        return wanted
    finally:
        await connection.close()


__all__ = [
    "MAX_MESSAGE_BYTES",
    "REFUSED",
    "Delivery",
    "DeliveryPolicy",
    "Inbound",
    "NodeMismatch",
    "Outgoing",
    "PublishTogether",
    "Rejections",
    "Subjects",
    "Wiring",
    "align_consumers",
    "dead_letter",
    "delivery_of",
    "durable",
    "durable_stream",
    "encode",
    "ensure_streams",
    "field_errors",
    "key_value",
    "make_broker",
    "metric_subject",
    "node_mismatch",
    "outgoing",
    "policy_of",
    "publish",
    "publish_batch",
    "publish_raw",
    "remember_durable",
    "replicas_for",
    "retry_transient",
    "stream_config",
    "subject_of",
    "wiring",
]
