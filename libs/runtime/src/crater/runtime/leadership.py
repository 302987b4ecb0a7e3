"""Leader election on a NATS key-value lease: one process of a service decides, the others
wait as hot standbys and take over when the leader's lease lapses (docs/operations.md, HA).

Why a NATS KV lease: every service already holds a NATS connection (the autoscaler has no
database), a KV write is a compare-and-set on the key's last revision, linearizable on the
bucket's RAFT group when it is replicated, and the revision that won the lease only grows,
so it is the leader's *epoch*: a fencing token the database (the scheduler's
`scheduler_leadership` row) and consumers (the `Crater-Epoch` header) compare against.

The lease: the leader rewrites its key every `renew_seconds` with `update(last=revision)`. A
standby watches the key's revision with its own monotonic clock (no clock is compared across
hosts): unchanged for `duration_seconds`, the lease has lapsed, and the standby writes it with
`update(last=that revision)`; of several standbys, one write wins. A leader whose renewals fail
(NATS away) keeps trying: the fences, not the clock, keep a deposed one from acting. A clean
shutdown deletes the key, so a standby takes over at once. A standby's looks that fail (its
NATS server lost, the bucket electing a raft leader) do not restart its watch: the revision
unchanged since means no renewal since, so a lease that lapsed meanwhile is taken soon after
the bucket takes writes again (`grace_seconds` later: a leader that was only cut off renews
first), not a whole lease later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from faststream.nats import NatsBroker, NatsRouter
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel, Field, model_validator

log = logging.getLogger("crater.leadership")
T = TypeVar("T")

LEASES_BUCKET = "crater_leases"
# How long a standby's look at the key (or its write taking it) waits for an answer: one sent
# on a connection to a server that just died is never answered, and nats-py would wait out its
# JetStream timeout (5 s) before the standby looked again. The leader's renewals keep that
# timeout: a renewal that landed but whose answer came late would depose it.
LOOK_TIMEOUT_SECONDS = 1.0
EPOCH_HEADER = "Crater-Epoch"  # "<service>:<epoch>" on what a leader publishes


class Deposed(Exception):
    """This process is no longer the leader: another took the lease (a higher epoch), or it
    could not renew in time. It must stop deciding; what it had not committed is redone by
    the new leader (its messages were not acked)."""


@dataclass(frozen=True)
class LeaseTiming:
    """Kubernetes' leases are 15 s / 10 s / 2 s; Crater's target is a takeover within 3 s,
    so shorter: a leader renews four times per lease, a standby looks eight times."""

    duration_seconds: float = 2.0
    renew_seconds: float = 0.5
    retry_seconds: float = 0.25

    @property
    def grace_seconds(self) -> float:
        """After the bucket was unwritable: how long a standby waits once it takes writes
        again before it takes a lapsed lease (two renewals of a leader that is alive)."""
        return 2 * self.renew_seconds

    def __post_init__(self) -> None:
        if not 0 < self.renew_seconds < self.duration_seconds:
            raise ValueError("renew_seconds must be above 0 and below duration_seconds")
        if not 0 < self.retry_seconds <= self.duration_seconds:
            raise ValueError("retry_seconds must be above 0 and at most duration_seconds")


def default_holder(service: str) -> str:
    """Who holds a lease, for logs and the key's value: service, host and pid."""
    return f"{service}@{socket.gethostname()}:{os.getpid()}"


def epoch_header(service: str, epoch: int) -> dict[str, str]:
    return {EPOCH_HEADER: f"{service}:{epoch}"}


def parse_epoch_header(value: str) -> tuple[str, int] | None:
    """("scheduler", 17) from "scheduler:17"; None when malformed."""
    service, _, number = value.rpartition(":")
    if not service or not number.isdigit() or len(number) > 18:
        return None
    return service, int(number)


class Lease:
    """One service's lease in the `crater_leases` bucket, under the service's name."""

    def __init__(
        self,
        bucket: KeyValue,
        name: str,
        holder: str,
        timing: LeaseTiming | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bucket = bucket
        self.name = name
        self.holder = holder
        self.timing = timing or LeaseTiming()
        self.clock = clock
        self.epoch: int | None = None  # the revision that won it, while held
        self._revision = 0  # the last revision written by us (the next CAS's `last`)
        # A standby's watch, kept across failed looks: the key's revision as last seen and
        # since when (by this clock), and since when the bucket takes writes again after a
        # failure (-inf: none seen).
        self._seen: int | None = None
        self._seen_since = 0.0
        self._writable_since: float | None = -math.inf

    def _value(self, epoch: int | None) -> bytes:
        return json.dumps(
            {
                "holder": self.holder,
                "epoch": epoch,
                "since": datetime.now(UTC).isoformat(),
            }
        ).encode()

    async def acquire(self) -> int:
        """Wait until this process holds the lease; returns its epoch. A failed look (NATS
        away, the bucket without a raft leader) raises; the next call carries on watching."""
        try:
            return await self._acquire()
        except BaseException:
            self._writable_since = None  # unwritable (as far as this process can tell)
            raise

    async def _acquire(self) -> int:
        while True:
            try:
                revision = await _answer(self.bucket.create(self.name, self._value(None)))
                return self._won(revision)
            except KeyWrongLastSequenceError:
                pass  # held, or held once: look at it (the bucket's leader answered)
            if self._writable_since is None:
                self._writable_since = self.clock()
            try:
                entry = await _answer(self.bucket.get(self.name))
            except KeyNotFoundError:
                continue  # deleted between the two: create again
            current = entry.revision or 0
            now = self.clock()
            if current != self._seen:
                self._seen, self._seen_since = current, now
            elif (
                now - self._seen_since >= self.timing.duration_seconds
                and now - self._writable_since >= self.timing.grace_seconds
            ):
                with contextlib.suppress(KeyWrongLastSequenceError):
                    revision = await _answer(
                        self.bucket.update(self.name, self._value(None), last=current)
                    )
                    holder = _holder_of(entry.value)
                    log.warning(
                        "%s: the lease of %s lapsed (unrenewed for %.1f s): taking over",
                        self.name,
                        holder,
                        self.clock() - self._seen_since,
                    )
                    return self._won(revision)
            await asyncio.sleep(self.timing.retry_seconds)

    def _won(self, revision: int) -> int:
        self._seen, self._writable_since = None, -math.inf
        self.epoch = self._revision = revision
        log.info("%s: %s leads, epoch %d", self.name, self.holder, revision)
        return revision

    async def renew(self) -> None:
        """Rewrite the key; Deposed if another wrote it since (or it is gone)."""
        if self.epoch is None:
            raise Deposed(f"{self.name}: not held")
        try:
            self._revision = await self.bucket.update(
                self.name, self._value(self.epoch), last=self._revision
            )
        except (KeyWrongLastSequenceError, KeyNotFoundError) as error:
            epoch, self.epoch = self.epoch, None
            raise Deposed(f"{self.name}: epoch {epoch} lost the lease ({error})") from error

    async def keep(self) -> None:
        """Renew until deposed (raises Deposed when another wrote the key). A renewal that
        fails because NATS is away (a server lost, the bucket electing its leader) is retried
        and this process keeps leading: a standby cannot take over while it cannot reach the
        key either, and if it did, the fences refuse this one's commits and publishes. So a
        lost NATS server costs no change of leader."""
        failing_since: float | None = None
        while True:
            await asyncio.sleep(self.timing.renew_seconds)
            try:
                await self.renew()
            except Deposed:
                raise
            except Exception as error:  # NATS unreachable, a timeout: retried
                if failing_since is None:
                    failing_since = self.clock()
                    log.warning("%s: renewing the lease failed (%r); retrying", self.name, error)
                continue
            if failing_since is not None:
                log.warning(
                    "%s: the lease renewed again after %.1f s of failures",
                    self.name,
                    self.clock() - failing_since,
                )
                failing_since = None

    async def release(self) -> None:
        """On a clean shutdown: delete the key (if still ours) so a standby need not wait."""
        if self.epoch is None:
            return
        self.epoch = None
        with contextlib.suppress(Exception):
            await self.bucket.delete(self.name, last=self._revision)


async def _answer(call: Awaitable[T]) -> T:
    """A standby's call to the bucket, given up after LOOK_TIMEOUT_SECONDS (TimeoutError)."""
    return await asyncio.wait_for(call, LOOK_TIMEOUT_SECONDS)


def _holder_of(value: bytes | None) -> str:
    try:
        return str(json.loads(value or b"{}").get("holder", "?"))
    except ValueError:
        return "?"


class Leadership:
    """Runs `lead` while this process holds the lease and `follow` when it loses it, for as
    long as the service runs: acquire, lead, keep the lease; deposed, step down and wait
    again. `lead` returns once the leader's work is started; `step_down` stops it."""

    def __init__(
        self,
        lease: Lease,
        lead: Callable[[int], Awaitable[None]],
        step_down: Callable[[], Awaitable[None]],
        on_change: Callable[[int | None], None] = lambda _: None,
    ) -> None:
        self.lease = lease
        self.lead = lead
        self.step_down = step_down
        self.on_change = on_change
        self.leading = asyncio.Event()
        self.deposed = asyncio.Event()  # set on a deposition noticed outside `keep` (a fence)
        self._task: asyncio.Task[None] | None = None

    @property
    def epoch(self) -> int | None:
        return self.lease.epoch if self.leading.is_set() else None

    async def start(self, wait_seconds: float = 1.0) -> None:
        """Compete from now on, in the background; returns once this process leads, or after
        `wait_seconds` as a standby (a lease free at start is taken before the service says
        it started, so a lone process answers at once)."""
        self._task = asyncio.create_task(self._run(), name=f"leadership-{self.lease.name}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_seconds):
                await self.leading.wait()

    def lost(self) -> None:
        """Called where a fence refused this leader (the database saw a higher epoch)."""
        self.deposed.set()

    async def _run(self) -> None:
        while True:
            self.on_change(None)
            try:
                epoch = await self.lease.acquire()
            except Exception as error:  # NATS away: keep trying, as a standby
                log.warning("%s: cannot look at the lease (%r); retrying", self.lease.name, error)
                await asyncio.sleep(self.lease.timing.retry_seconds)
                continue
            self.deposed.clear()
            # Renewed from now on, through the takeover too: one that waits (the consumers
            # electing raft leaders after a NATS server's loss) is no lapse to a standby.
            keeping = asyncio.create_task(self.lease.keep())
            try:
                await self.lead(epoch)
            except Exception as error:  # Deposed by the fence, or the takeover failed
                keeping.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await keeping
                log.error("%s: taking over as epoch %d failed: %r", self.lease.name, epoch, error)
                await self.lease.release()
                await self._stand_down()
                await asyncio.sleep(self.lease.timing.retry_seconds)
                continue
            except BaseException:  # cancelled: the service stops
                keeping.cancel()
                raise
            self.leading.set()
            self.on_change(epoch)
            fenced = asyncio.create_task(self.deposed.wait())
            try:
                done, _ = await asyncio.wait({keeping, fenced}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (keeping, fenced):
                    task.cancel()
            if keeping in done and (failure := keeping.exception()) is not None:
                log.error("stepping down: %s", failure)
            else:
                log.error("stepping down: a fence refused epoch %s", epoch)
                self.lease.epoch = None
            await self._stand_down()

    async def _stand_down(self) -> None:
        self.leading.clear()
        self.on_change(None)
        try:
            await self.step_down()
        except Exception:
            log.exception("stepping down failed")

    async def stop(self) -> None:
        """On shutdown: stop competing, and hand the lease back if held."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.leading.clear()
        await self.lease.release()


class DeposedLeader(ValueError):
    """A message published by a leader after a newer one was heard from."""


class EpochGuard:
    """What a consumer has heard of each service's leaders (in this process). A JetStream
    message stamped with an epoch is refused when its stream stored it after a message of a
    newer epoch of that service: its leader had been succeeded when it published (a zombie
    that had not noticed yet). One stored before — consumed late: redelivered after the
    replica that took it was lost, or behind a backlog — was published while its leader led,
    and passes, however many newer epochs were heard since. A core NATS message (no stream
    order) is refused when its epoch is below the highest heard. Unstamped messages pass."""

    KEEP_EPOCHS = 64  # per service and stream: the newest, with the first position of each

    def __init__(self) -> None:
        self.highest: dict[str, int] = {}
        # (service, stream) -> {epoch: the lowest stream sequence heard stamped with it}
        self.first: dict[tuple[str, str], dict[int, int]] = {}

    def stale(
        self,
        headers: Mapping[str, Any] | None,
        stream: str | None = None,
        sequence: int | None = None,
    ) -> str | None:
        """Why a message with these headers is refused; None to take it. `stream` and
        `sequence`: where JetStream stored it (None for a core NATS message)."""
        value = (headers or {}).get(EPOCH_HEADER)
        if not isinstance(value, str):
            return None
        parsed = parse_epoch_header(value)
        if parsed is None:
            return f"malformed {EPOCH_HEADER} {value[:64]!r}: expected <service>:<epoch>"
        service, epoch = parsed
        highest = self.highest.get(service, 0)
        if stream is None or sequence is None:
            if epoch < highest:
                return (
                    f"published by a deposed {service} leader: epoch {epoch}, "
                    f"while epoch {highest} leads"
                )
        else:
            firsts = self.first.setdefault((service, stream), {})
            before = [(at, new) for new, at in firsts.items() if new > epoch and at < sequence]
            if before:
                at, newer = min(before)
                return (
                    f"published by a deposed {service} leader: epoch {epoch}, stored in "
                    f"{stream} at {sequence}, after epoch {newer}'s message at {at}"
                )
            if sequence < firsts.get(epoch, sequence + 1):
                firsts[epoch] = sequence
                for old in sorted(firsts)[: -self.KEEP_EPOCHS]:
                    del firsts[old]
        self.highest[service] = max(highest, epoch)
        return None


# Binding the leader's durable consumers after a NATS server was lost: a consumer whose raft
# leader was on it answers no lookup until the others elect another (nats-server's 4-9 s), and
# a lookup sent meanwhile is never answered: it waits out nats-py's JetStream timeout (5 s).
# So the gate looks with this short timeout, again and again, and binds once they answer.
CONSUMER_LOOK_SECONDS = 1.0
CONSUMER_LOOK_PAUSE_SECONDS = 0.1
CONSUMER_WAIT_SECONDS = 30.0  # then the subscribers are started anyway (and may fail)


class GatedConsumer(Protocol):
    """A consumer a `LeaderGate` starts and stops besides its router's subscribers: a batch
    consumer (crater.runtime.batches.BatchConsumer)."""

    stream_name: str
    durable_name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LeaderGate:
    """The subscribers only the leader runs (its durable consumers, the queries it answers):
    registered on `router` when the app is built (`durable(..., router=gate.router)`), or
    added (`add`: batch consumers), started when this process leads, stopped when it steps
    down. A standby binds no consumer, so it takes none of the leader's messages."""

    def __init__(self, broker: NatsBroker) -> None:
        self.broker = broker
        self.router = NatsRouter()
        self.consumers: list[GatedConsumer] = []
        self._included = False

    def add(self, consumer: GatedConsumer) -> None:
        self.consumers.append(consumer)

    def durables(self) -> list[tuple[str, str]]:
        """(stream, durable name) of each JetStream durable consumer on the router, and of
        each one added."""
        found = []
        for subscriber in self.router.subscribers:
            stream = getattr(subscriber, "stream", None)
            name = getattr(getattr(subscriber, "config", None), "durable_name", None)
            if stream is not None and isinstance(name, str):
                found.append((stream.name, name))
        found += [(c.stream_name, c.durable_name) for c in self.consumers]
        return found

    async def open(self) -> None:
        waited = await self.consumers_answering()
        if waited > CONSUMER_LOOK_SECONDS:
            log.warning("the leader's consumers answered after %.1f s (electing a leader)", waited)
        if not self._included:
            self.broker.include_router(self.router)
            self._included = True
        for subscriber in self.router.subscribers:
            await subscriber.start()
        for consumer in self.consumers:
            await consumer.start()

    async def consumers_answering(self, wait_seconds: float = CONSUMER_WAIT_SECONDS) -> float:
        """Wait until each durable consumer answers a lookup (it has a raft leader; one not
        made yet is made when its subscriber starts), at most `wait_seconds`; returns the
        seconds waited."""
        from crater.runtime.bus import TRANSIENT_PUBLISH_ERRORS  # the bus imports this module

        loop = asyncio.get_running_loop()
        started = loop.time()
        js = self.broker.connection.jetstream()
        for stream, name in self.durables():
            while True:
                try:
                    await js.consumer_info(stream, name, timeout=CONSUMER_LOOK_SECONDS)
                    break
                except NotFoundError:
                    break
                except TRANSIENT_PUBLISH_ERRORS as error:
                    if loop.time() - started > wait_seconds:
                        log.warning("consumer %s on %s does not answer: %r", name, stream, error)
                        return loop.time() - started
                    await asyncio.sleep(CONSUMER_LOOK_PAUSE_SECONDS)
        return loop.time() - started

    async def close(self) -> None:
        for consumer in self.consumers:
            with contextlib.suppress(Exception):
                await consumer.stop()
        for subscriber in self.router.subscribers:
            with contextlib.suppress(Exception):
                await subscriber.stop()


class LeaseSettings(BaseModel):
    """The lease settings of a service that elects a leader (mixed into its settings)."""

    lease_seconds: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="Leader election: how long a leader's lease lasts unrenewed before a "
        "standby takes over (docs/operations.md, high availability).",
    )
    lease_renew_seconds: float = Field(
        default=0.5, gt=0, le=30, description="How often the leader renews its lease."
    )
    lease_retry_seconds: float = Field(
        default=0.25, gt=0, le=30, description="How often a standby looks at the lease."
    )

    @property
    def lease_timing(self) -> LeaseTiming:
        return LeaseTiming(self.lease_seconds, self.lease_renew_seconds, self.lease_retry_seconds)

    @model_validator(mode="after")
    def _timing_consistent(self) -> LeaseSettings:
        self.lease_timing  # noqa: B018 - raises on renew/retry not below the lease
        return self


async def open_lease(
    broker: NatsBroker,
    service: str,
    timing: LeaseTiming,
    replicas: int,
    holder: str | None = None,
) -> Lease:
    """`service`'s lease in the crater_leases bucket (made if missing, on `replicas` servers as
    CRATER_STREAM_REPLICAS says), held as `holder` (default: this process)."""
    from crater.runtime.bus import key_value  # the bus imports this module's EpochGuard

    bucket = await key_value(broker, LEASES_BUCKET, replicas, history=1)
    return Lease(bucket, service, holder or default_holder(service), timing)


def leadership_gauges(registry: CollectorRegistry) -> Callable[[int | None], None]:
    """`Leadership.on_change` for a service's /metrics: crater_leader (1 while this process
    leads) and crater_leader_epoch (its epoch; 0 as a standby)."""
    leading = Gauge("crater_leader", "1 while this process leads its service.", registry=registry)
    epoch = Gauge("crater_leader_epoch", "The epoch this process leads with.", registry=registry)

    def observe(held: int | None) -> None:
        leading.set(0 if held is None else 1)
        epoch.set(held or 0)

    return observe
