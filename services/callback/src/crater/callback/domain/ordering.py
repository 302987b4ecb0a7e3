"""One task's events in order across subjects and streams: where each recorded event goes in
its task's queue, and whether it waits for an earlier one that has not arrived yet. Pure.

The rule (positions order a task's deliveries to each endpoint; equal ones go by arrival):

- An event the scheduler numbered (`task_sequence` n, previous p) goes at 2n. It waits until
  its chain of predecessors (p, p's previous, ...) is recorded: an event published earlier on
  the other stream, or consumed late, still goes first. The wait is bounded (the caller
  stamps a deadline): a lost earlier event delays its task, it never blocks it.
- A node's report about an allocation (`task.status` with `allocation_id`; likewise an SLA
  breach, `task.underutilized`, measured on it) goes right after that allocation's grant
  (before what the scheduler emitted next, such as the release the report caused), and waits
  for the grant the same way.
- Any other event (no number, no allocation: a rejection by the predictor, a report with no
  allocation) goes after everything recorded for its task so far; one that ends the task
  strictly after it, never level with an earlier arrival.

Waiting events are placed again whenever another event of their task is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Recorded:
    """An event of one task as the callback recorded it."""

    event_id: str
    number: int | None = None  # the scheduler's task_sequence.number
    previous: int | None = None
    allocation_id: str | None = None
    grants: bool = False  # an AllocationGranted: reports about allocation_id come after it
    position: int = 0
    waiting: bool = True
    ends: bool = False  # the task's end (placed on arrival only; not kept)
    event_type: str = ""  # the source event's type: a repeat is one of the same type

    @property
    def reports(self) -> bool:
        """A node's report about an allocation: its place is right after that grant."""
        return self.allocation_id is not None and not self.grants


@dataclass(frozen=True)
class Placement:
    position: int
    waiting: bool


def arrange(events: Sequence[Recorded]) -> dict[str, Placement]:
    """New placements of the waiting events among `events` (all recorded events of one task,
    a new arrival among them with `waiting` set), keyed by event id; settled ones keep theirs."""
    numbered = {e.number: e for e in events if e.number is not None}
    grants = {e.allocation_id: e for e in events if e.grants and e.allocation_id}
    placements: dict[str, Placement] = {}
    for event in events:
        if not event.waiting:
            continue
        if event.number is not None:
            placement = Placement(2 * event.number, not _chain_recorded(event, numbered))
        elif event.reports and event.allocation_id is not None:
            grant = grants.get(event.allocation_id)
            if grant is None:
                placement = Placement(event.position, True)
            else:
                placement = Placement(grant.position + 1, False)
        else:
            placement = Placement(event.position, False)
        if placement != Placement(event.position, event.waiting):
            placements[event.event_id] = placement
    return placements


def arrival(new: Recorded, recorded: Sequence[Recorded]) -> Recorded:
    """`new` as it arrives: numbered at 2n, anything else after all recorded so far (an odd
    position, so it sorts between the scheduler's numbered events). Level with an earlier
    arrival at the top, it goes after it by arrival; an end goes strictly above, so whatever
    sits at its position arrived after it."""
    if new.number is not None:
        return replace(new, position=2 * new.number, waiting=True)
    top = max((e.position for e in recorded), default=0)
    position = top + 2 if new.ends and top % 2 else top | 1
    return replace(new, position=position, waiting=True)


def place(task: list[Recorded], order: Recorded) -> tuple[Recorded, dict[str, Placement]]:
    """Place a new event among its task's recorded ones (`task`, updated in place): the event
    as placed, and the task's earlier events that moved or went free."""
    new = arrival(order, task)
    placements = arrange([*task, new])
    placement = placements.pop(new.event_id, Placement(new.position, new.waiting))
    new = replace(new, position=placement.position, waiting=placement.waiting)
    for i, recorded in enumerate(task):
        if recorded.event_id in placements:
            moved = placements[recorded.event_id]
            task[i] = replace(recorded, position=moved.position, waiting=moved.waiting)
    task.append(new)
    return new, placements


def _chain_recorded(event: Recorded, numbered: Mapping[int, Recorded]) -> bool:
    previous = event.previous
    while previous is not None:
        before = numbered.get(previous)
        if before is None:
            return False
        previous = before.previous  # always below: TaskSequence refuses anything else
    return True
