"""Bad input on the bus, refused with the field and the reason; messages moved aside."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from crater.contracts.base import Event
from crater.contracts.tasks import FieldError

# A message refused because it cannot be decoded (not JSON, nested too deep, not valid UTF-8,
# not the subject's schema) fails the same way every time: moved aside at once. One whose
# handling failed may succeed later (a database that was down): retried first.
FailureKind = Literal["decode", "apply"]


class MessageRejected(Event):
    """A consumer refused a message it could not decode, validate or apply, and moved on."""

    subject: str
    consumer: str
    errors: list[FieldError]
    payload_excerpt: str = Field(max_length=512, description="The start of what was received.")
    kind: FailureKind = Field(
        default="decode",
        description="decode: refused at once, never retried; apply: handling failed on every "
        "delivery up to the limit.",
    )
    error_class: str | None = Field(
        default=None,
        max_length=256,
        description="The exception that refused it, e.g. ValidationError, IntegrityError.",
    )
    deliveries: int | None = Field(
        default=None, ge=1, description="How many times it was delivered to the consumer."
    )
    dead_letter_id: str | None = Field(
        default=None,
        max_length=256,
        description="The `event_id` of its MessageDeadLettered, when it was moved aside.",
    )


class MessageDeadLettered(Event):
    """A message a consumer gave up on, kept with everything needed to replay it: its payload
    and headers as received, where it came from, and why it failed.

    `crater dead-letters list|show|replay` reads these; a replay re-publishes `payload` to
    `subject` with `headers` (its original `Nats-Msg-Id` included, so every consumer that had
    already handled it de-duplicates it)."""

    subject: str = Field(description="Where the message was published.")
    stream: str = Field(description="The JetStream stream that held it.")
    stream_sequence: int = Field(ge=1, description="Its sequence in that stream.")
    service: str = Field(description="The service that gave up on it.")
    consumer: str = Field(description="The durable consumer that gave up on it.")
    deliveries: int = Field(ge=1, description="How many times it was delivered to the consumer.")
    kind: FailureKind
    error_class: str = Field(max_length=256, description="The exception, e.g. IntegrityError.")
    errors: list[FieldError] = Field(description="The field and the reason.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Its NATS headers as received."
    )
    payload: str | None = Field(
        default=None, description="Its body, when it is UTF-8 text (JSON is)."
    )
    payload_base64: str | None = Field(
        default=None, description="Its body in base64, when it is not UTF-8 text."
    )
    payload_bytes: int = Field(ge=0, description="The size of its body.")
    payload_omitted: bool = Field(
        default=False,
        description="The body was too large to keep here: it is read from `stream` at "
        "`stream_sequence` (while the stream still holds it).",
    )


class MessageReplayed(Event):
    """`crater dead-letters replay` re-published a dead letter's message to where it came from:
    the record of what was done (and whether JetStream took it or dropped it as a duplicate)."""

    dead_letter_id: str = Field(max_length=256, description="The MessageDeadLettered replayed.")
    dead_letter_sequence: int = Field(ge=1, description="Its sequence in CRATER_DEAD_LETTERS.")
    subject: str = Field(description="Where the message was published again.")
    stream: str = Field(description="The stream that took it.")
    stream_sequence: int | None = Field(
        default=None, ge=1, description="Its new sequence there; None when dropped as duplicate."
    )
    duplicate: bool = Field(
        description="JetStream dropped it: the stream had seen its Nats-Msg-Id within its "
        "duplicate window."
    )
