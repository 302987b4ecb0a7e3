"""Time limits: a task that has held its grant for its limit (`max_run_seconds`, its own or
its pool's) is told to checkpoint and stop, as a preemption victim is (`task.preempted` with
`time_limit_seconds`, the grace period), and goes back at the deadline as `time-limit`.

Deterministic: the limit counts from the grant's event time (`Allocation.granted_at`, stored
with the allocation) and is judged against the core's clock, never the wall clock; a restart
rebuilds the heap from the stored grants (`Scheduler.restore`)."""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta

from crater.contracts import Event
from crater.scheduler.domain.preemptor import Preemptor
from crater.scheduler.domain.state import Allocation, SchedulerState


class TimeLimits:
    """Tells the tasks whose time limit has come to stop."""

    def __init__(self, state: SchedulerState, preemptor: Preemptor) -> None:
        self.state = state
        self.preemptor = preemptor

    def enforce(self, now: datetime, cause: Event) -> list[Event]:
        """Every task whose limit is at or before `now`, not already told to go, is told to
        stop by `now` plus the grace period. Each limit is one heap entry, popped once."""
        due: list[Allocation] = []
        while self.state.limits and self.state.limits[0][0] <= now:
            _, allocation_id, task_id = heapq.heappop(self.state.limits)
            head = self.state.allocations.get(task_id)
            if head is None or head.allocation_id != allocation_id or head.yield_by is not None:
                continue  # ended, a later attempt's, or yielding already (it goes anyway)
            due.append(head)
        if len(self.state.limits) > 2 * len(self.state.allocations) + 1024:
            self.compact()
        decisions: list[Event] = []
        grace = timedelta(seconds=self.state.config.grace_period_seconds)
        for head in sorted(due, key=lambda a: a.task_id):
            decisions += self.preemptor.order_yield(
                head, now + grace, cause, None, None, time_limit=head.run_limit
            )
        return decisions

    def compact(self) -> None:
        """Drop the entries of tasks that ended (or were told to go) before their limit: each
        stays in the heap until its time otherwise, which for long limits is a long time."""
        live = [
            (when, allocation_id, task_id)
            for when, allocation_id, task_id in self.state.limits
            if (head := self.state.allocations.get(task_id)) is not None
            and head.allocation_id == allocation_id
            and head.yield_by is None
        ]
        heapq.heapify(live)
        self.state.limits = live
