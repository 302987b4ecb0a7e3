"""The NATS JetStream side of every service: broker, streams, typed durable subscribers,
publishing with de-duplication ids, and refusal of bad input."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
from faststream import AckPolicy
from faststream._internal.middlewares import BaseMiddleware
from faststream.message import StreamMessage
from faststream.nats import (
    DeliverPolicy,
    JStream,
    NatsBroker,
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
from nats.aio.msg import Msg
from nats.js.errors import BadRequestError
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from crater.contracts import (
    Channel,
    Event,
    FieldError,
    MessageRejected,
    Streams,
    StreamSpec,
    Subjects,
)
from crater.contracts.catalog import channel_for
from crater.runtime.telemetry import current_trace_context

log = logging.getLogger("crater.bus")

MAX_MESSAGE_BYTES = 1024 * 1024
# Every handler names its message parameter `event`; rejections report paths below it.
HANDLER_PARAMETER = "event"
# How long to wait for JetStream's ack of a publish: nats-py's 0.5 s default is too short on a
# loaded 2-core machine, and a retry is safe (the Nats-Msg-Id de-duplicates it).
PUBLISH_ACK_TIMEOUT_SECONDS = 5.0
Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])

_RETENTION = {
    "limits": RetentionPolicy.LIMITS,
    "interest": RetentionPolicy.INTEREST,
    "workqueue": RetentionPolicy.WORK_QUEUE,
}


def stream_config(spec: StreamSpec) -> StreamConfig:
    """The JetStream configuration of a catalog stream."""
    return StreamConfig(
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


class Rejections:
    """Counts and publishes refusals of bad input for one service."""

    def __init__(self, broker: NatsBroker, service: str, registry: CollectorRegistry) -> None:
        self.broker = broker
        self.service = service
        self.counter = Counter(
            "crater_messages_rejected",
            "Messages refused as malformed or invalid.",
            ["subject"],
            registry=registry,
        )

    async def reject(self, subject: str, body: bytes, errors: list[FieldError]) -> None:
        self.counter.labels(subject=subject).inc()
        log.warning(
            "rejected message on %s: %s",
            subject,
            "; ".join(f"{e.field}: {e.reason}" for e in errors),
        )
        event = MessageRejected(
            subject=subject,
            consumer=self.service,
            errors=errors,
            payload_excerpt=body[:512].decode("utf-8", "replace")[:512],
        )
        await publish(self.broker, event)

    def middleware(self) -> Callable[..., BaseMiddleware]:
        rejections = self

        class RejectInvalidMessages(BaseMiddleware):
            """Turns a body that is not JSON or fails validation into a MessageRejected event;
            the message is then acknowledged, so the consumer moves on."""

            async def consume_scope(self, call_next: Any, msg: StreamMessage[Any]) -> Any:
                try:
                    return await call_next(msg)
                except ValidationError as error:
                    await rejections.reject(_subject(msg), msg.body, _explain(msg.body, error))
                    return None

        return RejectInvalidMessages


def _subject(msg: StreamMessage[Any]) -> str:
    raw = getattr(msg, "raw_message", None)
    return str(getattr(raw, "subject", "") or "")


def _explain(body: bytes, error: ValidationError) -> list[FieldError]:
    try:
        json.loads(body)
    except ValueError as bad_json:
        return [FieldError(field="body", reason=f"not valid JSON: {bad_json}")]
    return field_errors(error, root=HANDLER_PARAMETER)


# Node-scoped subjects carry the node id: as a metric label that is a series per node (10,000
# nodes made /metrics take seconds to render). Metrics name the channel's wildcard instead.
_NODE_SCOPED_PREFIXES = tuple(
    (f"{channel.subject}.", channel.wildcard) for channel in Subjects.ALL if channel.node_scoped
)


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
    nats_url: str,
    service: str,
    registry: CollectorRegistry,
    tracer_provider: TracerProvider | None,
) -> tuple[NatsBroker, Rejections]:
    broker = NatsBroker(
        nats_url,
        middlewares=(
            NatsTelemetryMiddleware(tracer_provider=tracer_provider),
            ChannelMetricsMiddleware(registry=registry, app_name=service, metrics_prefix="crater"),
        ),
        # FastStream logs every message at INFO by default: too slow for hot paths.
        log_level=logging.DEBUG,
        name=f"crater-{service}",
    )
    rejections = Rejections(broker, service, registry)
    broker.add_middleware(rejections.middleware())
    return broker, rejections


def subject_of(event: Event) -> str:
    channel = channel_for(type(event))
    if not channel.node_scoped:
        return channel.subject
    node_id = getattr(event, "node_id", None) or event.node.node_id  # type: ignore[attr-defined]
    return channel.for_node(str(node_id))


def encode(event: Event) -> bytes:
    return event.model_dump_json().encode()


async def publish(broker: NatsBroker, event: Event) -> None:
    """Publish to JetStream and wait for the stream's ack; `event_id` is the de-dup id."""
    if event.trace is None:
        context = current_trace_context()
        if context is not None:
            event = event.model_copy(update={"trace": context})
    await publish_raw(
        broker,
        subject=subject_of(event),
        stream=channel_for(type(event)).stream.name,
        payload=encode(event),
        event_id=str(event.event_id),
        traceparent=event.trace.traceparent if event.trace else None,
    )


async def publish_raw(
    broker: NatsBroker,
    *,
    subject: str,
    stream: str,
    payload: bytes,
    event_id: str,
    traceparent: str | None,
) -> None:
    """The one place that publishes: de-dup id header, and, when no span is active (the
    outbox relay), the emitting span's context as parent so the trace stays one."""
    headers = {"Nats-Msg-Id": event_id, "content-type": "application/json"}
    token = None
    if traceparent and not otel_trace.get_current_span().get_span_context().is_valid:
        token = otel_context.attach(extract({"traceparent": traceparent}))
    try:
        await broker.publish(
            payload, subject, headers=headers, stream=stream, timeout=PUBLISH_ACK_TIMEOUT_SECONDS
        )
    finally:
        if token is not None:
            otel_context.detach(token)


def durable(
    broker: NatsBroker,
    channel: Channel,
    service: str,
    *,
    batch: int = 64,
    name: str | None = None,
    deliver_policy: DeliverPolicy | None = None,
) -> Callable[[Handler], Handler]:
    """A durable pull consumer for `channel`; the message is acked after the handler returns
    (so after its own commit) and redelivered if the handler raises."""
    durable_name = (
        f"{service}-{name or channel.subject.removeprefix('crater.v1.').replace('.', '-')}"
    )
    return _pull_consumer(
        broker,
        channel.wildcard,
        channel.stream.name,
        durable_name,
        batch,
        channel.description,
        deliver_policy,
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
) -> Callable[[Handler], Handler]:
    """The durable pull subscriber both `durable` and `durable_stream` register: acked after
    the handler returns, nacked (redelivered) if it raises."""
    subscriber = broker.subscriber(
        subject,
        stream=JStream(stream_name, declare=False),
        durable=durable_name,
        deliver_policy=deliver_policy,
        pull_sub=PullSub(batch_size=batch, timeout=1.0),
        ack_policy=AckPolicy.NACK_ON_ERROR,
        title=f"{durable_name}:{subject}",
        description=description,
    )

    def register(handler: Handler) -> Handler:
        subscriber(handler)
        return handler

    return register


async def ensure_streams(nats_url: str) -> None:
    """Create or update every catalog stream before any service consumes or publishes.

    Done over its own short connection because FastStream's broker only connects when it
    starts its subscribers, and those need their streams to exist already.
    """
    connection = await nats.connect(nats_url, connect_timeout=5)
    try:
        js = connection.jetstream()
        for spec in Streams.ALL:
            config = stream_config(spec)
            try:
                await js.add_stream(config=config)
            except BadRequestError:
                await js.update_stream(config=config)
    finally:
        await connection.close()


__all__ = [
    "MAX_MESSAGE_BYTES",
    "Rejections",
    "Subjects",
    "durable",
    "durable_stream",
    "encode",
    "ensure_streams",
    "field_errors",
    "make_broker",
    "metric_subject",
    "publish",
    "publish_raw",
    "stream_config",
    "subject_of",
]
