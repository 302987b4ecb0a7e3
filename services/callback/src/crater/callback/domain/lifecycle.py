"""What AllData is told of one task: exactly one end, and nothing out of lifecycle order. Pure.

The guard judges each delivery of a task's lifecycle webhook when it is recorded and, for
good, when it is first released for sending (claimed): it either may go or is superseded,
with a reason, and then never sent. The rule, per task and endpoint:

- The task's end is the first terminal webhook recorded for it (succeeded, failed, cancelled,
  or rejected when it is not a refused duplicate submission). It always goes; any other
  terminal of the task is superseded (`second_end`).
- A delivery placed at or after the end's position is superseded (`after_end`): nothing
  follows the end. One placed before it still goes first (the end waits for it).
- A delivery placed below one already released to the endpoint is superseded
  (`out_of_order`): it would reach AllData after an event that followed it. This is an event
  that arrived after the order wait let a later one go.
- A node's report about an allocation whose grant was never recorded, when its order wait
  runs out, is superseded (`no_grant`): it would tell `running` before `scheduled`.
- A second report about the same allocation (the node said `running` again, under another
  event id; or a second SLA breach of it) is superseded (`repeat`): it tells nothing new.
- A notice that is only true while the task runs (the SLA breach, `TaskUnderutilized`, told
  as `running`) is superseded once the task's end is recorded (`ended`), wherever it is
  placed: AllData must not hear of a running task that already ended.

A webhook that does not say its attempt (a node's `running`, `preempted`, an escalation) is
told the attempt of the latest event before it in its task's order that says one, fixed when
it is first released (`attempt_before`): AllData can tell a late report of an earlier
attempt from this one's.

Positions come from domain/ordering.py. A refused duplicate submission (`rejected` with
`duplicate_submission`) is outside the known task's lifecycle: never judged here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from crater.callback.domain.ordering import Recorded
from crater.contracts import WebhookBody, WebhookStatus

TERMINAL = frozenset(
    {
        WebhookStatus.SUCCEEDED,
        WebhookStatus.FAILED,
        WebhookStatus.CANCELLED,
        WebhookStatus.REJECTED,
    }
)


class Superseded(StrEnum):
    """Why a delivery was recorded and never sent."""

    SECOND_END = "second_end"
    AFTER_END = "after_end"
    OUT_OF_ORDER = "out_of_order"
    NO_GRANT = "no_grant"
    REPEAT = "repeat"
    ENDED = "ended"

    @property
    def explanation(self) -> str:
        return EXPLANATIONS[self]


EXPLANATIONS = {
    Superseded.SECOND_END: "the task's end was already recorded from another event",
    Superseded.AFTER_END: "it comes after the task's end",
    Superseded.OUT_OF_ORDER: "a later event of the task was already released to this endpoint",
    Superseded.NO_GRANT: "its allocation's grant did not arrive within the order wait",
    Superseded.REPEAT: "a report about the same allocation was recorded before",
    Superseded.ENDED: "it is only told while the task runs, and the task had ended",
}

# Source event types whose webhook is only true while the task runs (its attempt's usage).
WHILE_RUNNING = frozenset({"TaskUnderutilized"})


def in_lifecycle(body: WebhookBody) -> bool:
    """False for a refused duplicate submission: about the task id, not about the task."""
    return not body.duplicate_submission


def ends_task(body: WebhookBody) -> bool:
    """A terminal webhook of the task's lifecycle."""
    return body.status in TERMINAL and in_lifecycle(body)


@dataclass(frozen=True)
class End:
    """The task's end: the event that told it, and where it sits in the task's order."""

    event_id: str
    position: int


@dataclass(frozen=True)
class Told:
    """What the guard knows when it judges a delivery of one task to one endpoint."""

    end: End | None = None
    released: int | None = None  # the highest position already released to the endpoint


@dataclass(frozen=True)
class Candidate:
    """A delivery of a lifecycle webhook about to be recorded or released."""

    event_id: str
    position: int
    ends: bool = False  # a terminal webhook
    placed: bool = True  # False: a node report still waiting for its allocation's grant
    repeat: bool = False  # a second report about the same allocation
    while_running: bool = False  # only told while the task runs (WHILE_RUNNING)


def repeats(task: Sequence[Recorded], new: Recorded) -> bool:
    """Whether `new` is a report about an allocation a recorded report of the same type was
    about (only `running` reports are recorded: they say the same thing; an SLA breach about
    the allocation says something else)."""
    return new.reports and any(
        e.reports
        and e.allocation_id == new.allocation_id
        and e.event_type == new.event_type
        and e.event_id != new.event_id
        for e in task
    )


def end_after(end: End | None, candidate: Candidate) -> End | None:
    """The task's end once `candidate` is recorded: the first terminal recorded stays it."""
    if end is None and candidate.ends:
        return End(candidate.event_id, candidate.position)
    return end


def verdict(told: Told, candidate: Candidate, releasing: bool) -> Superseded | None:
    """None if the delivery may go (`releasing`: now, for good; else: so far, when it is
    recorded), or why it is superseded. `told.end` already counts `candidate` if it ends."""
    if candidate.ends:
        if told.end is None or told.end.event_id == candidate.event_id:
            return None  # the end always goes: it is the one AllData must hear
        return Superseded.SECOND_END
    if candidate.repeat:
        return Superseded.REPEAT
    if candidate.while_running and told.end is not None:
        return Superseded.ENDED
    if not candidate.placed:
        # Its place is not known until its grant is: judged when its wait runs out.
        return Superseded.NO_GRANT if releasing else None
    if told.end is not None and candidate.position >= told.end.position:
        return Superseded.AFTER_END
    if told.released is not None and candidate.position < told.released:
        return Superseded.OUT_OF_ORDER
    return None


def attempt_before(said: Sequence[tuple[int, int]], position: int) -> int | None:
    """The attempt of the latest event placed before `position` among `said` (position,
    attempt) pairs of events that say theirs; None if none does."""
    before = [(at, attempt) for at, attempt in said if at < position]
    return max(before)[1] if before else None
