"""The delivery policy's arithmetic and the dead letter's shape, without a server."""

from __future__ import annotations

import base64
from dataclasses import replace

from crater.contracts import FieldError
from crater.runtime.bus import (
    MAX_DELIVER_MARGIN,
    MAX_MESSAGE_BYTES,
    MAX_REDELIVERY_DELAY_SECONDS,
    Delivery,
    DeliveryPolicy,
    dead_letter,
    encode,
)
from crater.runtime.settings import ServiceSettings

DELIVERY = Delivery(
    subject="crater.v1.task.status",
    stream="CRATER_TASKS",
    stream_sequence=7,
    consumer="scheduler-task-status",
    deliveries=5,
    headers={"Nats-Msg-Id": "abc", "content-type": "application/json"},
)
ERRORS = [FieldError(field="body", reason="IntegrityError: duplicate key")]


def test_the_defaults_are_the_settings_defaults() -> None:
    settings = ServiceSettings()
    assert DeliveryPolicy() == DeliveryPolicy.of(settings)
    assert DeliveryPolicy().max_deliveries == 5


def test_redeliveries_wait_longer_each_time_up_to_a_cap() -> None:
    policy = DeliveryPolicy(
        max_deliveries=12, max_outage_deliveries=9, redelivery_delay_seconds=3.0
    )
    assert [policy.redelivery_delay(n) for n in range(1, 5)] == [3.0, 6.0, 12.0, 24.0]
    assert policy.redelivery_delay(12) == MAX_REDELIVERY_DELAY_SECONDS
    assert policy.server_max_deliver == 12 + MAX_DELIVER_MARGIN


def test_a_dead_letter_keeps_the_message_as_received_and_has_a_stable_id() -> None:
    letter = dead_letter("scheduler", DELIVERY, b'{"a": 1}', "apply", "IntegrityError", ERRORS)
    assert letter.payload == '{"a": 1}'
    assert letter.payload_base64 is None
    assert letter.headers == DELIVERY.headers
    assert (letter.subject, letter.stream, letter.stream_sequence) == (
        "crater.v1.task.status",
        "CRATER_TASKS",
        7,
    )
    again = dead_letter("scheduler", DELIVERY, b'{"a": 1}', "apply", "IntegrityError", ERRORS)
    assert again.event_id == letter.event_id  # a second attempt is de-duplicated
    other = dead_letter(
        "callback", replace(DELIVERY, consumer="callback-tasks"), b"{}", "apply", "X", ERRORS
    )
    assert other.event_id != letter.event_id  # another consumer's is its own


def test_a_body_that_is_not_utf8_is_kept_in_base64() -> None:
    body = b"\xff\xfe{"
    letter = dead_letter("probe", DELIVERY, body, "decode", "UnicodeDecodeError", ERRORS)
    assert letter.payload is None
    assert base64.b64decode(letter.payload_base64 or "") == body


def test_a_body_too_large_for_the_letter_is_left_out_and_the_letter_fits() -> None:
    body = b'"' * 600_000  # escaped, each quote doubles: past the limit
    letter = dead_letter("probe", DELIVERY, body, "decode", "JSONDecodeError", ERRORS)
    assert letter.payload_omitted
    assert (letter.payload, letter.payload_base64) == (None, None)
    assert letter.payload_bytes == 600_000
    assert len(encode(letter)) < MAX_MESSAGE_BYTES
    small = dead_letter("probe", DELIVERY, b'"' * 1000, "decode", "JSONDecodeError", ERRORS)
    assert not small.payload_omitted


def test_an_unreachable_dependency_is_retried_far_longer_than_a_bad_message() -> None:
    from sqlalchemy import exc

    from crater.runtime.bus import unavailable

    policy = DeliveryPolicy(max_deliveries=5, max_outage_deliveries=50)
    down = exc.OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))
    wrapped = RuntimeError("the commit failed")
    wrapped.__cause__ = down
    bad = exc.IntegrityError("INSERT", {}, Exception("duplicate key value"))
    nul = exc.DataError("INSERT", {}, Exception("invalid byte sequence 0x00"))
    assert unavailable(down)
    assert unavailable(wrapped)  # found along the cause chain
    assert unavailable(TimeoutError())
    assert not unavailable(bad)
    assert not unavailable(nul)
    assert not unavailable(ValueError("no"))
    assert policy.limit_for(down) == 50
    assert policy.limit_for(bad) == 5
    assert policy.server_max_deliver == 50 + MAX_DELIVER_MARGIN
