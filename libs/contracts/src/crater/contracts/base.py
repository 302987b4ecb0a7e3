"""The envelope every Crater event shares."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, ClassVar
from uuid import UUID, uuid4, uuid5

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1
# The most attempts a task can have (a restart policy allows 100): a bound that also keeps a
# forged attempt number inside the databases' 64-bit integers.
MAX_ATTEMPT = 10_000
# The largest integer every JSON parser reads exactly (an IEEE double's 53 bits; AllData's
# too), well inside a database's 64-bit integers even with arithmetic on it: sequence numbers
# and counts beyond it are refused up front.
MAX_EXACT_INT = 2**53


def _exact(value: int) -> int:
    if not -MAX_EXACT_INT <= value <= MAX_EXACT_INT:
        raise ValueError(f"{value} is beyond what every JSON parser reads exactly (2**53)")
    return value


# An integer any JSON parser reads exactly: for fields whose own bounds say nothing of size.
# A validator, not Field bounds: a field's own `ge`/`le` (ExactInt = Field(ge=0)) would
# otherwise lose to these in the JSON Schema (minimum -2**53 where the model says 0).
ExactInt = Annotated[int, AfterValidator(_exact)]
_DERIVED_NAMESPACE = UUID("6f1c1f0e-8a53-4c5e-9d8e-63a0a0c6e0b1")


def utc_now() -> datetime:
    return datetime.now(UTC)


class Contract(BaseModel):
    """Base of every contract model: unknown fields are refused so that typos surface."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class TraceContext(Contract):
    """W3C trace context of the span that emitted the event (also sent as message headers)."""

    traceparent: str = Field(pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
    tracestate: str | None = None


class Event(Contract):
    """Every message on the bus: a fact, named in the past tense, with a unique id.

    `event_id` is also sent as the `Nats-Msg-Id` header, so JetStream drops a re-publish
    inside the stream's duplicate window and consumers can de-duplicate on it.
    """

    subject_template: ClassVar[str] = ""

    event_id: UUID = Field(default_factory=uuid4, description="Unique id; the Nats-Msg-Id.")
    occurred_at: AwareDatetime = Field(default_factory=utc_now, description="When it happened.")
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    trace: TraceContext | None = Field(default=None, description="Emitting span, for audit.")


class TaskSequence(Contract):
    """Where an event stands among the events its producer emitted about the same task, so a
    consumer of several subjects and streams can put them back in order."""

    number: int = Field(
        ge=1,
        le=MAX_EXACT_INT,
        description="Grows with every event the producer emits about the task (not by one: "
        "a task's numbers have gaps).",
    )
    previous: int | None = Field(
        default=None,
        ge=1,
        le=MAX_EXACT_INT,
        description="The number of the producer's previous event about the task; None: this is "
        "the first, or the producer no longer knows (it restarted).",
    )

    @model_validator(mode="after")
    def _previous_comes_first(self) -> TaskSequence:
        if self.previous is not None and self.previous >= self.number:
            raise ValueError("previous must be below number")
        return self


class TaskEvent(Event):
    """An event about one task's lifecycle (granted, pending, rejected, preempted, released)."""

    task_sequence: TaskSequence | None = Field(
        default=None,
        description="Set by the scheduler: this event's place among its events about the task.",
    )


def derived_event_id(source_event_id: UUID, what: str) -> UUID:
    """A deterministic id for the event a stateless consumer emits in answer to another, so a
    redelivered input re-publishes the same id and JetStream drops the copy."""
    return uuid5(_DERIVED_NAMESPACE, f"{source_event_id}:{what}")
