"""One task's events in order across subjects and streams: where each recorded event goes in
its task's queue, and whether it waits for an earlier one that has not arrived yet. Pure.

The rule (positions order a task's deliveries to each endpoint; equal ones go by arrival):

- An event the scheduler numbered (`task_sequence` n, previous p) goes at 2n. It waits until
  its chain of predecessors (p, p's previous, ...) is recorded: an event published earlier on
  the other stream, or consumed late, still goes first. The wait is bounded (the caller
  stamps a deadline): a lost earlier event delays its task, it never blocks it.
- A node's report about an allocation (`task.status` with `allocation_id`) goes right after
  that allocation's grant (before what the scheduler emitted next, such as the release the
  report caused), and waits for the grant the same way.
- Any other event (no number, no allocation: a rejection by the predictor, a cancel through
  the gateway, a report about an allocation never seen) goes after everything recorded for
  its task so far.

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
        elif event.allocation_id is not None and not event.grants:
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
    position, so it sorts between the scheduler's numbered events)."""
    if new.number is not None:
        return replace(new, position=2 * new.number, waiting=True)
    top = max((e.position for e in recorded), default=0)
    return replace(new, position=top | 1, waiting=True)


def _chain_recorded(event: Recorded, numbered: Mapping[int, Recorded]) -> bool:
    previous = event.previous
    while previous is not None:
        before = numbered.get(previous)
        if before is None:
            return False
        previous = before.previous  # always below: TaskSequence refuses anything else
    return True
