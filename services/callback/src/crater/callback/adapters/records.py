"""What the delivery log takes and hands back, and the row mapping its parts share."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from crater.callback.adapters import tables
from crater.callback.domain.lifecycle import TERMINAL, End, Superseded
from crater.callback.domain.ordering import Recorded
from crater.callback.domain.payload import WebhookFormat
from crater.callback.domain.retry import DeliveryState, Outcome
from crater.contracts import Event

CONSUMER = "callback"
NO_ENDPOINT = ""  # the endpoint recorded for deliveries skipped because none is configured

d = tables.deliveries.c
t = tables.task_events.c
k = tables.tasks.c
SETTLED = (DeliveryState.DELIVERED.value, DeliveryState.DEAD.value)
TERMINAL_STATUSES = frozenset(status.value for status in TERMINAL)

# Told of each delivery superseded, after its commit: (endpoint, reason).
SupersededHook = Callable[[str, Superseded], None]


@dataclass(frozen=True)
class Attempt:
    """One POST and what came of it; `status_code` None: no response (timeout, connection)."""

    number: int
    outcome: Outcome
    status_code: int | None
    latency_ms: float
    error: str | None


@dataclass(frozen=True)
class Enqueued:
    """An event to record: its deliveries, one per endpoint that wants it."""

    source_event_id: UUID
    endpoints: Sequence[str]
    task_id: str
    task_status: str
    event_type: str
    payload: str
    configured: bool = True  # False: no endpoint at all; one delivery recorded as skipped
    order: Recorded | None = None  # its place among its task's events (default: arrival)
    hold_seconds: float = 0.0  # the longest it waits for an earlier event of its task
    ends: bool = False  # a terminal webhook: the task's end if it is the first recorded
    lifecycle: bool = True  # False: a refused duplicate submission, outside the lifecycle
    attempt: int | None = None  # the attempt the event says it belongs to, if it says
    # Each endpoint's body format, fixed on its delivery when recorded (default: alldata).
    formats: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Settlement:
    """One attempt to record: what came of it and where the delivery stands after it."""

    delivery_id: int
    attempt: Attempt
    state: DeliveryState
    next_attempt_at: datetime | None = None
    events: tuple[Event, ...] = field(default=())


@dataclass(frozen=True)
class Due:
    """A delivery the loop may send now: the head of its (task, endpoint) queue."""

    id: int
    webhook_id: str
    endpoint: str
    task_id: str
    task_status: str
    payload: str
    attempts: int
    round: int
    attempt_limit: int | None
    format: str = WebhookFormat.CRATER.value  # what `payload` is rendered as when POSTed


@dataclass(frozen=True)
class Claimed:
    """What one claim took: the deliveries to send, and how many it superseded instead."""

    due: list[Due]
    superseded: int


@dataclass(frozen=True)
class DeliveryRow:
    """A delivery as operators see it (`crater webhooks list`)."""

    id: int
    webhook_id: str
    endpoint: str
    task_id: str
    task_status: str
    event_type: str
    state: str
    attempts: int
    round: int
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    next_attempt_at: datetime | None


def utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every time stored here is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _superseded_reason(why: Superseded, end: End | None) -> str:
    """Why a delivery was never sent, as operators read it (`crater webhooks list`)."""
    reason = f"superseded ({why.value}): {why.explanation}"
    if end is not None and why in (Superseded.SECOND_END, Superseded.AFTER_END):
        reason += f"; the end is webhook {end.event_id}"
    return reason


def _superseded_values(why: Superseded, end: End | None, now: datetime) -> dict[str, Any]:
    """A delivery recorded, never sent: its state and its reason."""
    return {
        "state": DeliveryState.SUPERSEDED.value,
        "last_error": _superseded_reason(why, end),
        "completed_at": now,
        "updated_at": now,
        "next_attempt_at": None,
        "held_until": None,
    }
