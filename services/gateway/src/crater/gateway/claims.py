"""Claims on task ids: how the gateway's replicas, which keep no database, agree that a task
id is submitted once.

Each accepted task id has one entry in a JetStream key-value bucket shared by every replica.
A submission first *claims* the id (an atomic create: of two replicas, one wins), then
publishes, then marks the claim *submitted*. A replica that dies between the claim and that
mark leaves an unconfirmed claim: once it is older than a grace longer than any publish can
take, the id may be claimed again (a compare-and-set on the entry's revision, so again only
one replica wins). If the dead replica's publish did get through, the second submission
reaches the scheduler as a duplicate and is refused there (`task.rejected`, `duplicate`):
never dropped in silence, never placed twice.

The functions here are pure; the app does the bucket I/O."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta
from enum import Enum
from uuid import UUID

from pydantic import BaseModel, ValidationError

# An entry written before claims had a body held the event id's 16 bytes, and was written
# after the publish: such a claim was submitted.
_LEGACY_LENGTH = 16
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Claim(BaseModel):
    """What the bucket holds for one task id."""

    event_id: UUID  # the task.submitted that claimed it
    claimed_at: datetime
    submitted: bool = False  # JetStream acknowledged the publish
    body: str | None = None  # the request's digest (`body_digest`)
    tenant: str | None = None  # whose task (None: written before claims named it)

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def decode(cls, value: bytes) -> Claim:
        """The claim in an entry. A value no gateway wrote holds the id all the same: read
        as a submission of some other event, so the id is refused rather than reused."""
        if len(value) == _LEGACY_LENGTH:
            return cls(event_id=UUID(bytes=value), claimed_at=_EPOCH, submitted=True)
        try:
            return cls.model_validate_json(value)
        except ValidationError:
            return cls(event_id=UUID(int=0), claimed_at=_EPOCH, submitted=True)


class Verdict(Enum):
    NEW = "new"  # nobody claimed the id: claim it
    RETRY = "retry"  # the same submission again (same event id): accepted, published once
    ABANDONED = "abandoned"  # claimed, never confirmed, past the grace: claim it again
    KNOWN = "known"  # another submission holds the id: refused


def judge(claim: Claim | None, event_id: UUID, now: datetime, grace: timedelta) -> Verdict:
    """What a submission with `event_id` may do, given the id's claim."""
    if claim is None:
        return Verdict.NEW
    if claim.event_id == event_id:
        return Verdict.RETRY
    if not claim.submitted and now - claim.claimed_at >= grace:
        return Verdict.ABANDONED
    return Verdict.KNOWN


def takeover_id(claim: Claim, event_id: UUID, body: str) -> UUID:
    """The event id to publish under when taking over an abandoned claim: the same body as
    the abandoned submission goes out under its event id, so that if its publish did get
    through, JetStream (or the consumers' inboxes) drop this copy; another body is a new
    submission (refused on the bus if the first did get through)."""
    return claim.event_id if claim.body == body else event_id


def body_digest(request: BaseModel) -> str:
    """A digest of a request as validated (so spacing and key order do not matter)."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


def held(claim: Claim | None, now: datetime, grace: timedelta) -> bool:
    """Whether the id counts as accepted: submitted, or claimed within the grace."""
    return claim is not None and (claim.submitted or now - claim.claimed_at < grace)


def claim_key(task_id: str) -> str:
    """A key-value key for `task_id`: task ids may hold ':', which keys may not."""
    return base64.urlsafe_b64encode(task_id.encode()).decode()


def known_reason(task_id: str, status: str) -> str:
    """Why a submission reusing `task_id` is refused (the 409's and the bus's wording)."""
    return (
        f"task {task_id!r} is known already (status {status}): a task id is used once, an "
        f"ended task's too; this submission is refused and {task_id!r} is unchanged: "
        "submit under a new task_id"
    )


def claimed_reason(task_id: str, claim: Claim) -> str:
    """Why, for an id accepted here that the scheduler does not know (yet)."""
    when = claim.claimed_at.isoformat(timespec="seconds")
    return (
        f"task {task_id!r} was accepted at {when} (event {claim.event_id}) and is not known "
        "to the scheduler yet: still being profiled, or refused by the predictor (then "
        f"task.rejected said why); a task id is used once: this submission is refused, "
        "submit under a new task_id"
    )
