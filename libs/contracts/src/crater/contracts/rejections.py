"""Bad input on the bus, refused with the field and the reason."""

from __future__ import annotations

from pydantic import Field

from crater.contracts.base import Event
from crater.contracts.tasks import FieldError


class MessageRejected(Event):
    """A consumer refused a message it could not parse or validate, and moved on."""

    subject: str
    consumer: str
    errors: list[FieldError]
    payload_excerpt: str = Field(max_length=512, description="The start of what was received.")
