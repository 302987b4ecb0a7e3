"""Inputs of the core that are not bus messages: facts the scheduler reads off the streams."""

from __future__ import annotations

from crater.contracts import Event, derived_event_id
from crater.contracts.allocations import AllocationGranted


class ReservationArmed(Event):
    """The scheduler's own grant, read back from the allocation stream: it has left the
    outbox, so its node can see it, and its reservation counts from `occurred_at` (the time
    the stream stored the grant). A grant that waited in the outbox (a restart, a slow relay)
    is not charged for the wait: its reservation cannot expire before its node could know."""

    allocation_id: str
    task_id: str

    @classmethod
    def of(cls, grant: AllocationGranted, stored_at: object) -> ReservationArmed:
        return cls(
            event_id=derived_event_id(grant.event_id, "armed"),
            occurred_at=stored_at,  # type: ignore[arg-type]  # validated as an aware datetime
            allocation_id=grant.allocation_id,
            task_id=grant.task_id,
        )
