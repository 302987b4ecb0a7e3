"""Batch consumers: a durable JetStream pull consumer whose handler takes a whole pull batch.

FastStream's subscriber runs each message through its own machinery (parsing, dependency
injection, a tracing span, metrics, logging middleware): about 1 ms of CPU per message, more
than a scheduling decision. A batch consumer fetches with nats-py directly and runs the
handler once per batch, so a service can apply the batch in one pass and one transaction:

- each message first passes the very checks `durable`'s do (`Rejections.admit`: JSON depth,
  text, decoding, the node its subject names, the epoch of the leader that sent it, then the
  subject's schema), and a message that fails one is refused and dead-lettered, or handed
  back, exactly as there; a message of a subject a stream consumer has no model for is acked
  unread (only its leader's epoch noted);
- the handler gets the valid ones in stream order and returns one outcome each: None once
  applied (the message is then acked), or the error, which goes through the same redelivery
  and dead-letter policy as a per-message handler's (`Rejections.failed`): one message's
  failure never redelivers or loses the others;
- one tracing span per batch, linked to each message's incoming trace context (the handler
  gets that context with each message, for what it publishes in consequence); metrics counted
  per batch; nothing logged per message;
- a batch is what is there now, or the first message to come, at once; with `linger`, a batch
  short of the batch size waits up to that long for more first: for a stream of many small
  messages that arrive spread out (heartbeats) and cost little one by one but much per
  commit, one commit for many.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar, cast
from weakref import WeakKeyDictionary

from faststream.exceptions import AckMessage, HandlerException, NackMessage, RejectMessage
from faststream.nats import DeliverPolicy, NatsBroker
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DEFAULT_PREFIX, ConsumerConfig, StatusCode
from nats.js.errors import NotFoundError
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Link, SpanContext, SpanKind
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import ValidationError

from crater.contracts import Channel, Event, StreamSpec, TraceContext
from crater.runtime.bus import (
    REFUSED,
    Delivery,
    Inbound,
    Rejections,
    delivery_of,
    remember_durable,
    wiring,
)
from crater.runtime.telemetry import incoming_span_context, trace_context_of

log = logging.getLogger("crater.batches")

E = TypeVar("E", bound=Event)
# What a batch handler says of each message it was given: None once applied, else the error.
Outcome = BaseException | None
# How long the consumer waits for a message before it looks again (at its pull request).
FETCH_WAIT_SECONDS = 1.0
# A pull request expires after this long and another is sent; one lost with a connection (no
# expiry status comes) is replaced this much later. Short: what the server sends to a stopped
# consumer's request before it expires waits out the ack deadline (as FastStream's 1 s fetch).
PULL_EXPIRES_SECONDS = 1.0
PULL_LOST_SECONDS = 0.5
# JetStream's own default limit on a consumer's delivered and unacked messages.
DEFAULT_MAX_ACK_PENDING = 1000
# The pause after a pull that failed for another reason than no message (NATS away, the
# consumer gone, a raft leader being elected).
FETCH_ERROR_PAUSE_SECONDS = 0.5


@dataclass(frozen=True)
class Received(Generic[E]):
    """One valid message of a batch, as its handler gets it."""

    event: E
    delivery: Delivery
    stored_at: datetime  # when its stream stored it
    # The context it came with (its traceparent header, else its body's): what the handler
    # gives what it publishes in consequence, so a task's trace goes on through it.
    trace: TraceContext | None


BatchHandler = Callable[[list[Received[E]]], Awaitable[Sequence[Outcome]]]


class BatchMetrics:
    """Counted once per batch, not per message."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.messages = Counter(
            "crater_batch_consumed_messages",
            "Messages a batch consumer settled, by outcome: acked (applied), nacked (handed "
            "back to be delivered again) or terminated (refused, dead-lettered).",
            ["consumer", "outcome"],
            registry=registry,
        )
        self.size = Histogram(
            "crater_batch_size_messages",
            "Messages in one pull batch a batch consumer handled.",
            ["consumer"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=registry,
        )
        self.seconds = Histogram(
            "crater_batch_handling_seconds",
            "Time a batch consumer took over one pull batch, checks, handler and acks.",
            ["consumer"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )


_METRICS: WeakKeyDictionary[CollectorRegistry, BatchMetrics] = WeakKeyDictionary()


def batch_metrics(registry: CollectorRegistry) -> BatchMetrics:
    """The registry's batch metrics, made once (a registry refuses a name twice)."""
    found = _METRICS.get(registry)
    if found is None:
        found = _METRICS[registry] = BatchMetrics(registry)
    return found


class Puller:
    """Keeps one pull request open on a durable consumer and hands out what it delivered:
    every message there now, up to the batch size, or else the first to come, at once.

    nats-py's `fetch` of a batch, once it has to wait, waits for the whole batch or its
    timeout (a lone message would wait a second for company), and a fetch it gave up on
    leaves a late status that ends the next one early. Here the request stays open while
    messages are handled (they arrive meanwhile), and a new one is sent once it is used up,
    expired or ended by the server. Public nats-py calls only: an inbox subscription and the
    JetStream API's next-message request (what `fetch` itself sends)."""

    def __init__(self, connection: Client, stream: str, durable: str, batch: int) -> None:
        self.connection = connection
        self.subject = f"{DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.batch = batch
        self.inbox = connection.new_inbox()
        self.arrived: deque[Msg] = deque()
        self.ready = asyncio.Event()
        self.subscription: Subscription | None = None
        self.asked = 0  # messages the open request may still deliver
        self.expires_at = 0.0
        self.trouble: str | None = None  # why the server ended the last request early

    async def start(self) -> None:
        self.subscription = await self.connection.subscribe(self.inbox, cb=self._on_message)

    async def _on_message(self, msg: Msg) -> None:
        status = JetStreamContext.is_status_msg(msg)
        if status == StatusCode.CONTROL_MESSAGE:
            return  # a heartbeat
        if status is not None:
            # The request ended: expired (408), or the server ended it (409: the consumer
            # deleted, a leadership change, too many waiting).
            self.asked = 0
            if status != StatusCode.REQUEST_TIMEOUT:
                self.trouble = f"{status} {(msg.headers or {}).get('Description', '')}"
            self.ready.set()
            return
        self.asked -= 1
        self.arrived.append(msg)
        self.ready.set()

    async def next_batch(self, wait: float, linger: float = 0.0) -> list[Msg]:
        """What was delivered and not yet handed out, up to the batch size; when nothing
        was, the first to come within `wait` (then [] if none came). With `linger`, a batch
        short of the batch size waits up to that long from its first message for more."""
        loop = asyncio.get_running_loop()
        await self._keep_asking(loop)
        await self._arrivals(wait)
        if linger > 0 and self.arrived:
            deadline = loop.time() + linger
            while len(self.arrived) < self.batch and loop.time() < deadline:
                await self._keep_asking(loop)
                await self._arrivals(deadline - loop.time(), more=True)
        return [self.arrived.popleft() for _ in range(min(self.batch, len(self.arrived)))]

    async def _keep_asking(self, loop: asyncio.AbstractEventLoop) -> None:
        """A new pull request once the open one is used up, expired or ended."""
        if self.asked <= 0 or loop.time() >= self.expires_at:
            if self.trouble is not None:
                trouble, self.trouble = self.trouble, None
                log.debug("%s: pull request ended: %s", self.subject, trouble)
                await asyncio.sleep(FETCH_ERROR_PAUSE_SECONDS)
            await self._ask(loop.time())

    async def _arrivals(self, wait: float, more: bool = False) -> None:
        """Wait up to `wait` for a message (`more`: for one more than are here)."""
        if self.arrived and not more:
            return
        self.ready.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self.ready.wait()

    async def _ask(self, now: float) -> None:
        # Twice the batch: the next batch arrives while this one is handled.
        asked = 2 * self.batch
        expires = int(PULL_EXPIRES_SECONDS * 1_000_000_000)
        request = json.dumps({"batch": asked, "expires": expires}).encode()
        await self.connection.publish(self.subject, request, reply=self.inbox)
        self.asked = asked
        self.expires_at = now + PULL_EXPIRES_SECONDS + PULL_LOST_SECONDS

    async def stop(self) -> list[Msg]:
        """Stop taking messages; returns those delivered and never handed out."""
        subscription, self.subscription = self.subscription, None
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        left, self.arrived = list(self.arrived), deque()
        return left


class BatchConsumer(Generic[E]):
    """A durable pull consumer of `channel` that hands `handler` whole batches (see the
    module's text). Started and stopped by its owner: a `LeaderGate` (only the leader
    consumes) or the service (`Service.consume`)."""

    def __init__(
        self,
        broker: NatsBroker,
        channel: Channel | StreamSpec,
        service: str,
        handler: BatchHandler[E],
        *,
        batch: int = 64,
        name: str | None = None,
        deliver_policy: DeliverPolicy | None = None,
        models: Mapping[str, type[Event]] | None = None,
        linger: float = 0.0,
    ) -> None:
        wired = wiring(broker)
        if wired is None:
            raise ValueError("a batch consumer needs a broker made by make_broker")
        self.broker = broker
        self.rejections: Rejections = wired.rejections
        self.metrics = batch_metrics(wired.registry)
        provider = wired.tracer_provider or otel_trace.get_tracer_provider()
        self.tracer = provider.get_tracer("crater.runtime.batches")
        self.handler = handler
        if isinstance(channel, Channel):
            model = channel.event
            self.models: Callable[[str], type[Event] | None] = lambda _: model
            self.subject = channel.wildcard
            self.stream_name = channel.stream.name
            self.durable_name = f"{service}-{name or channel.short_name}"
        else:  # every subject of a stream, in stream order (`durable_stream`'s batch form)
            if len(channel.subjects) != 1 or models is None:
                raise ValueError(f"{channel.name}: a stream of one subject, and its models")
            self.models = models.get
            self.subject = channel.subjects[0]
            self.stream_name = channel.name
            self.durable_name = f"{service}-{name or channel.name.removeprefix('CRATER_').lower()}"
        self.batch = batch
        self.linger = linger
        self.deliver_policy = deliver_policy
        self.span_name = f"{self.durable_name} process"
        self._puller: Puller | None = None
        self._task: asyncio.Task[None] | None = None
        self._running = False
        self._fetching = False
        remember_durable(broker, self.stream_name, self.durable_name)

    async def start(self) -> None:
        """Create the durable consumer when it does not exist yet (with the service's
        delivery backstop; one that exists is taken as it is, as nats-py's pull_subscribe
        does) and start pulling."""
        if self._task is not None:
            return
        connection = self.broker.connection
        js = connection.jetstream()
        try:
            await js.consumer_info(self.stream_name, self.durable_name)
        except NotFoundError:
            config = ConsumerConfig(
                name=self.durable_name,
                durable_name=self.durable_name,
                filter_subject=self.subject,
                max_deliver=self.rejections.policy.server_max_deliver,
                # The puller asks for two batches at once; JetStream's default cap on
                # unacked messages (1,000) would cut a batch of more than 500 short.
                max_ack_pending=max(DEFAULT_MAX_ACK_PENDING, 2 * self.batch),
            )
            if self.deliver_policy is not None:
                config.deliver_policy = self.deliver_policy
            await js.add_consumer(self.stream_name, config=config)
        self._puller = Puller(connection, self.stream_name, self.durable_name, self.batch)
        await self._puller.start()
        self._running = True
        self._task = asyncio.create_task(self._run(), name=f"batch-consumer-{self.durable_name}")

    async def stop(self) -> None:
        """Stop pulling; a batch being handled is finished first (its acks sent), and what
        was delivered but not yet handled is handed back at once (nak), for the next
        consumer (a new leader) to take without waiting for the ack deadline."""
        self._running = False
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            if self._fetching:
                task.cancel()  # waiting for messages: nothing in hand to finish
            with contextlib.suppress(asyncio.CancelledError):
                await task
        puller, self._puller = self._puller, None
        if puller is not None:
            for msg in await puller.stop():
                with contextlib.suppress(Exception):
                    await msg.nak()

    async def _run(self) -> None:
        while self._running and self._puller is not None:
            self._fetching = True
            try:
                messages = await self._puller.next_batch(FETCH_WAIT_SECONDS, self.linger)
            except Exception as error:  # NATS away: ask again later
                log.debug("%s: pull failed: %r", self.durable_name, error)
                await asyncio.sleep(FETCH_ERROR_PAUSE_SECONDS)
                continue
            finally:
                self._fetching = False
            if not messages:
                continue
            try:
                await self.consume(messages)
            except Exception:
                # Left unacked, the batch is delivered again after the consumer's ack wait.
                log.exception("%s: a batch of %d failed", self.durable_name, len(messages))

    async def consume(self, messages: list[Msg]) -> None:
        """Check, handle and settle one pull batch."""
        started = time.perf_counter()
        settled: Tally[str] = Tally()
        contexts = [incoming_span_context(msg.headers) for msg in messages]
        with self.tracer.start_as_current_span(
            self.span_name,
            kind=SpanKind.CONSUMER,
            links=[Link(context) for context in contexts if context is not None],
            attributes={
                "messaging.system": "nats",
                "messaging.operation.type": "process",
                "messaging.destination.name": self.subject,
                "messaging.consumer.group.name": self.durable_name,
                "messaging.batch.message_count": len(messages),
            },
        ):
            admitted: list[tuple[Msg, Inbound, Received[E]]] = []
            for msg, context in zip(messages, contexts, strict=True):
                checked = await self._admit(msg, context, settled)
                if checked is not None:
                    admitted.append((msg, *checked))
            if admitted:
                await self._handle(admitted, settled)
        self.metrics.size.labels(consumer=self.durable_name).observe(len(messages))
        self.metrics.seconds.labels(consumer=self.durable_name).observe(
            time.perf_counter() - started
        )
        for outcome, count in settled.items():
            self.metrics.messages.labels(consumer=self.durable_name, outcome=outcome).inc(count)

    async def _admit(
        self, msg: Msg, context: SpanContext | None, settled: Tally[str]
    ) -> tuple[Inbound, Received[E]] | None:
        """The message and its event once it passed the checks `durable`'s messages pass;
        None when it was refused (and settled). `context`: the span its headers name."""
        headers = msg.headers or {}
        delivery = delivery_of(msg)
        if delivery is None:  # not a JetStream delivery: nothing to settle
            return None
        inbound = Inbound(
            body=msg.data,
            subject=msg.subject,
            headers=headers,
            delivery=delivery,
            content_type=headers.get("content-type"),
        )
        model = self.models(msg.subject)
        if model is None:
            # A subject of the stream this consumer has no use for: acked unread (its body is
            # neither decoded nor checked), its leader's epoch heard all the same.
            self.rejections.epochs.stale(headers, delivery.stream, delivery.stream_sequence)
            await msg.ack()
            settled["skipped"] += 1
            return None
        try:
            body = await self.rejections.admit(inbound)
            if body is REFUSED:  # not reached for a JetStream delivery: its refusal raises
                return None
            event = model.model_validate(body)
        except HandlerException as decision:
            await self._settle(msg, decision, settled)
            return None
        except ValidationError as error:  # the subject's schema: refused as `durable` does
            await self._settle_by(msg, self.rejections.undecodable(inbound, error), settled)
            return None
        if context is None and event.trace is not None:  # no header: the body's
            context = incoming_span_context(None, event.trace)
        received: Received[E] = Received(
            event=cast(E, event),  # the model its subject names: E's, or the stream's
            delivery=delivery,
            stored_at=msg.metadata.timestamp,
            trace=trace_context_of(context) if context is not None else None,
        )
        return inbound, received

    async def _handle(
        self, admitted: list[tuple[Msg, Inbound, Received[E]]], settled: Tally[str]
    ) -> None:
        """Run the handler on the batch's valid messages, then settle each by its outcome."""
        outcomes: list[Outcome]
        try:
            outcomes = list(await self.handler([received for _, _, received in admitted]))
            if len(outcomes) != len(admitted):
                raise RuntimeError(
                    f"the handler of {self.durable_name} returned {len(outcomes)} outcomes "
                    f"for {len(admitted)} messages"
                )
        except Exception as error:  # the batch failed as a whole: each message alike
            outcomes = [error] * len(admitted)
        for (msg, inbound, received), outcome in zip(admitted, outcomes, strict=True):
            if outcome is None:
                await msg.ack()
                settled["acked"] += 1
            elif isinstance(outcome, HandlerException):
                await self._settle(msg, outcome, settled)
            elif isinstance(outcome, ValidationError):
                await self._settle_by(msg, self.rejections.undecodable(inbound, outcome), settled)
            elif isinstance(outcome, Exception):
                failed = self.rejections.failed(inbound.body, received.delivery, outcome)
                await self._settle_by(msg, failed, settled)
            else:
                raise outcome  # a BaseException (cancelled): not the message's doing

    async def _settle_by(self, msg: Msg, step: Awaitable[None], settled: Tally[str]) -> None:
        """Settle `msg` by the ack decision `step` (a `Rejections` refusal or failure, which
        dead-letters or hands back) ends in."""
        try:
            await step
        except HandlerException as decision:
            await self._settle(msg, decision, settled)
        else:  # every refusal of a JetStream delivery raises its decision: never reached
            await msg.term()
            settled["terminated"] += 1

    @staticmethod
    async def _settle(msg: Msg, decision: HandlerException, settled: Tally[str]) -> None:
        """Apply an ack decision as FastStream's subscriber would."""
        if isinstance(decision, NackMessage):
            await msg.nak(delay=decision.extra_options.get("delay"))
            settled["nacked"] += 1
        elif isinstance(decision, RejectMessage):
            await msg.term()
            settled["terminated"] += 1
        elif isinstance(decision, AckMessage):
            await msg.ack()
            settled["acked"] += 1


def batch_durable(
    broker: NatsBroker,
    channel: Channel,
    service: str,
    *,
    batch: int = 64,
    name: str | None = None,
    deliver_policy: DeliverPolicy | None = None,
    linger: float = 0.0,
) -> Callable[[BatchHandler[E]], BatchConsumer[E]]:
    """`durable`'s batch form: a decorator making the handler a `BatchConsumer` of `channel`
    under the same durable name (`<service>-<name or the channel's short name>`), so it takes
    over a consumer `durable` made, where it stands. Its owner starts and stops it."""

    def register(handler: BatchHandler[E]) -> BatchConsumer[E]:
        return BatchConsumer(
            broker,
            channel,
            service,
            handler,
            batch=batch,
            name=name,
            deliver_policy=deliver_policy,
            linger=linger,
        )

    return register


def batch_durable_stream(
    broker: NatsBroker,
    stream: StreamSpec,
    service: str,
    models: Mapping[str, type[Event]],
    *,
    batch: int = 64,
    name: str | None = None,
) -> Callable[[BatchHandler[Event]], BatchConsumer[Event]]:
    """`durable_stream`'s batch form: every subject of `stream` in stream order, under the
    same durable name, so it takes over that consumer where it stands. Each message is
    checked against the model `models` names for its subject; one of a subject it names none
    for is acked and skipped (counted), never handed to the handler."""

    def register(handler: BatchHandler[Event]) -> BatchConsumer[Event]:
        return BatchConsumer(
            broker, stream, service, handler, batch=batch, name=name, models=models
        )

    return register


__all__ = [
    "FETCH_WAIT_SECONDS",
    "BatchConsumer",
    "BatchHandler",
    "BatchMetrics",
    "Outcome",
    "Received",
    "batch_durable",
    "batch_durable_stream",
    "batch_metrics",
]
