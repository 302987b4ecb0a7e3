"""The callback's consume -> record: each lifecycle event's deliveries recorded (group
commit, each stream in its order), then the delivery loop woken; app.py only subscribes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from crater.callback.adapters.store import DeliveryLog, Enqueued
from crater.callback.delivery import Dispatcher
from crater.callback.domain.endpoints import Endpoint
from crater.callback.domain.lifecycle import ends_task, in_lifecycle
from crater.callback.domain.ordering import Recorded
from crater.callback.domain.payload import (
    BUDGET_EXCEEDED,
    TENANT_KEY,
    LifecycleEvent,
    budget_body,
    has_webhook,
    webhook_body,
)
from crater.contracts import (
    AllocationGranted,
    Channel,
    Event,
    Streams,
    Subjects,
    TaskEvent,
    TaskStatusReported,
    TaskUnderutilized,
    TenantBudgetExceeded,
)

log = logging.getLogger("crater.callback")


class Recorder:
    """What the consumers do: record an event's deliveries and wake the delivery loop.

    Group commit: the events handed in while a commit is under way are recorded together in
    the next one, in the order they came (each stream's consumption order, so one task's
    events of one stream keep theirs); a handler returns, and its message is acked, once its
    event is committed. If a batch fails, its events are recorded one by one, so one bad
    event fails only its own message (redelivered).
    """

    def __init__(
        self,
        delivery_log: DeliveryLog,
        endpoints: list[Endpoint],
        dispatcher: Dispatcher,
        order_wait_seconds: float = 30.0,
    ) -> None:
        self.log = delivery_log
        self.endpoints = endpoints
        self.dispatcher = dispatcher
        self.order_wait_seconds = order_wait_seconds
        self._unrecorded: list[tuple[Enqueued, asyncio.Future[int | None]]] = []
        self._recording: asyncio.Task[None] | None = None

    async def record(self, event: LifecycleEvent) -> int | None:
        """Record the event's deliveries: how many (0 for an event that is no webhook), or
        None if it was recorded before."""
        if not has_webhook(event):
            return 0
        return await self._committed(self._queue(self._enqueued(event)))

    async def record_budget(self, event: TenantBudgetExceeded) -> int | None:
        """Record a tenant's budget passed: one delivery per endpoint that wants it, queued
        under the tenant (`@tenant/<name>`), outside any task's lifecycle and order. How many
        were recorded, or None if it was recorded before."""
        body = budget_body(event)
        event_type = type(event).__name__
        return await self._committed(
            self._queue(
                Enqueued(
                    source_event_id=event.event_id,
                    endpoints=[e.name for e in self.endpoints if e.wants(event_type, "")],
                    formats={e.name: e.format for e in self.endpoints},
                    task_id=f"{TENANT_KEY}{event.tenant}",
                    task_status=BUDGET_EXCEEDED,
                    event_type=event_type,
                    payload=body.encode().decode(),
                    configured=bool(self.endpoints),
                    lifecycle=False,
                )
            )
        )

    async def _committed(self, committed: asyncio.Future[int | None]) -> int | None:
        created = await asyncio.shield(committed)
        if created:
            self.dispatcher.wake()
        return created

    def _queue(self, event: Enqueued) -> asyncio.Future[int | None]:
        """Hand the event to the next commit (its place in the batch is taken now)."""
        committed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._unrecorded.append((event, committed))
        if self._recording is None or self._recording.done():
            self._recording = asyncio.create_task(self._record_batches())
        return committed

    async def record_batch(self, events: Sequence[Event]) -> list[BaseException | None]:
        """A pull batch of one stream, in stream order, each event as its subject's model
        (`CONSUMED`): recorded in the next group commit, in that order. Returns each one's
        outcome: None once committed (or when it is nothing to tell AllData), else why not
        (that message alone is delivered again)."""
        taken = [self._take(event) for event in events]
        outcomes: list[BaseException | None] = []
        for committed in taken:
            try:
                if committed is not None:
                    await self._committed(committed)
            except Exception as error:
                outcomes.append(error)
            else:
                outcomes.append(None)
        return outcomes

    def _take(self, event: Event) -> asyncio.Future[int | None] | None:
        if isinstance(event, LifecycleEvent):
            if not has_webhook(event):
                return None  # a node's terminal report: task.ended tells the end
            return self._queue(self._enqueued(event))
        if isinstance(event, TaskEvent):
            # No webhook, but its number may be the previous of one that has: noted.
            return self._note(event)
        return None

    def _note(self, event: TaskEvent) -> asyncio.Future[int | None] | None:
        """A numbered task event with no webhook, recorded so it completes its chain."""
        sequence = event.task_sequence
        if sequence is None:
            return None
        task_id = str(getattr(event, "task_id"))  # noqa: B009 - every task event has one
        return self._queue(
            Enqueued(
                source_event_id=event.event_id,
                endpoints=[],
                task_id=task_id,
                task_status="",
                event_type=type(event).__name__,
                payload="",
                order=Recorded(str(event.event_id), sequence.number, sequence.previous),
            )
        )

    async def _record_batches(self) -> None:
        while self._unrecorded:
            batch, self._unrecorded = self._unrecorded, []
            try:
                created = await self.log.enqueue_many([event for event, _ in batch])
            except Exception:
                log.debug("recording %d events together failed; one by one", len(batch))
                await self._record_one_by_one(batch)
                continue
            for (_, committed), count in zip(batch, created, strict=True):
                if not committed.done():
                    committed.set_result(count)

    async def _record_one_by_one(
        self, batch: list[tuple[Enqueued, asyncio.Future[int | None]]]
    ) -> None:
        for event, committed in batch:
            try:
                [count] = await self.log.enqueue_many([event])
            except Exception as error:
                if not committed.done():
                    committed.set_exception(error)
                continue
            if not committed.done():
                committed.set_result(count)

    def _enqueued(self, event: LifecycleEvent) -> Enqueued:
        body = webhook_body(event)
        event_type = type(event).__name__
        status = body.status.value
        return Enqueued(
            source_event_id=event.event_id,
            endpoints=[e.name for e in self.endpoints if e.wants(event_type, status)],
            formats={e.name: e.format for e in self.endpoints},
            task_id=body.task_id,
            task_status=status,
            event_type=event_type,
            payload=body.encode().decode(),
            configured=bool(self.endpoints),
            order=order_of(event),
            hold_seconds=self.order_wait_seconds,
            ends=ends_task(body),
            lifecycle=in_lifecycle(body),
            attempt=body.attempt,
        )


# The subjects the callback turns into webhooks, and what each carries (of task.status, only
# `running`: payload.has_webhook).
LIFECYCLE_CHANNELS: dict[str, Channel] = {
    channel.subject: channel
    for channel in (
        Subjects.ALLOCATION_GRANTED,
        Subjects.TASK_PENDING,
        Subjects.TASK_ESCALATED,
        Subjects.TASK_ESTIMATED,
        Subjects.TASK_REJECTED,
        Subjects.TASK_PREEMPTED,
        Subjects.TASK_ENDED,
        Subjects.TASK_STATUS,
        Subjects.TASK_UNDERUTILIZED,
    )
}


# Numbered task events on the consumed streams that AllData is not told of (allocation.released:
# the end, or the next attempt's `pending`, says what AllData needs): recorded all the same,
# as links in their task's chain.
NUMBERED_ELSEWHERE: dict[str, Channel] = {
    channel.subject: channel
    for channel in Subjects.ALL
    if channel.stream in (Streams.TASKS, Streams.ALLOCATIONS)
    and issubclass(channel.event, TaskEvent)
    and channel.subject not in LIFECYCLE_CHANNELS
}

# What the stream consumers read, by subject; the streams' other subjects (task.submitted,
# task.profiled, ...: nothing to tell AllData) are acked and skipped unread.
CONSUMED: dict[str, type[Event]] = {
    subject: channel.event
    for subject, channel in {**LIFECYCLE_CHANNELS, **NUMBERED_ELSEWHERE}.items()
}


def order_of(event: LifecycleEvent) -> Recorded:
    """What places the event among its task's events: the scheduler's number, or for a node's
    report, or an SLA breach, the allocation it is about (it comes after that allocation's
    grant)."""
    event_id = str(event.event_id)
    if isinstance(event, TaskStatusReported | TaskUnderutilized):
        return Recorded(event_id, allocation_id=event.allocation_id)
    sequence = event.task_sequence
    return Recorded(
        event_id,
        number=sequence.number if sequence else None,
        previous=sequence.previous if sequence else None,
        allocation_id=event.allocation_id if isinstance(event, AllocationGranted) else None,
        grants=isinstance(event, AllocationGranted),
    )
