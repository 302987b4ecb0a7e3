"""Claims on task ids, judged without I/O."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from crater.contracts import TaskRequest
from crater.gateway.claims import (
    Claim,
    Verdict,
    body_digest,
    claim_key,
    claimed_reason,
    held,
    judge,
    known_reason,
    takeover_id,
)

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
GRACE = timedelta(seconds=30)
MINE, OTHER = uuid4(), uuid4()


def claim(age_s: float, submitted: bool, event_id: object = OTHER) -> Claim:
    return Claim.model_validate(
        {
            "event_id": event_id,
            "claimed_at": NOW - timedelta(seconds=age_s),
            "submitted": submitted,
        }
    )


@pytest.mark.parametrize(
    ("found", "verdict"),
    [
        pytest.param(None, Verdict.NEW, id="unclaimed"),
        pytest.param(claim(0, False, MINE), Verdict.RETRY, id="same-event-claimed"),
        pytest.param(claim(999, True, MINE), Verdict.RETRY, id="same-event-submitted"),
        pytest.param(claim(999, True), Verdict.KNOWN, id="submitted-long-ago"),
        pytest.param(claim(29.9, False), Verdict.KNOWN, id="claimed-within-grace"),
        pytest.param(claim(30, False), Verdict.ABANDONED, id="claimed-past-grace"),
    ],
)
def test_judge(found: Claim | None, verdict: Verdict) -> None:
    assert judge(found, MINE, NOW, GRACE) is verdict


def test_held_means_submitted_or_claimed_within_the_grace() -> None:
    assert not held(None, NOW, GRACE)
    assert held(claim(999, True), NOW, GRACE)
    assert held(claim(1, False), NOW, GRACE)
    assert not held(claim(31, False), NOW, GRACE)


def test_claims_round_trip_and_older_values_read_as_submitted() -> None:
    original = claim(5, False)
    assert Claim.decode(original.encode()) == original
    legacy = Claim.decode(MINE.bytes)  # what gateways wrote before claims: after the publish
    assert (legacy.event_id, legacy.submitted) == (MINE, True)
    assert judge(legacy, OTHER, NOW, GRACE) is Verdict.KNOWN
    # A value no gateway wrote still holds the id: refused, never reused.
    foreign = Claim.decode(b"not a claim")
    assert foreign.submitted
    assert judge(foreign, MINE, NOW, GRACE) is Verdict.KNOWN


def test_a_takeover_with_the_same_body_reuses_the_abandoned_event_id() -> None:
    request = TaskRequest.model_validate(
        {"task_id": "t", "task_type": "training", "model_config": {"name": "m"}}
    )
    reordered = TaskRequest.model_validate_json(
        '{"model_config": {"name": "m"},  "task_type": "training", "task_id": "t"}'
    )
    assert body_digest(request) == body_digest(reordered)  # the body as validated
    abandoned = claim(60, False).model_copy(update={"body": body_digest(request)})
    assert takeover_id(abandoned, MINE, body_digest(request)) == OTHER
    other = TaskRequest.model_validate({**request.model_dump(by_alias=True), "priority": "low"})
    assert takeover_id(abandoned, MINE, body_digest(other)) == MINE
    assert takeover_id(claim(60, False), MINE, body_digest(request)) == MINE  # no digest kept


def test_keys_hold_any_task_id() -> None:
    task_id = "ns:team/job 7"
    assert base64.urlsafe_b64decode(claim_key(task_id)).decode() == task_id
    assert ":" not in claim_key(task_id)


def test_reasons_name_the_task_its_status_and_what_to_do() -> None:
    known = known_reason("t-1", "succeeded")
    assert "'t-1'" in known
    assert "status succeeded" in known
    assert "new task_id" in known
    pending = claimed_reason("t-1", claim(3, True))
    assert str(OTHER) in pending
    assert "not known to the scheduler yet" in pending
