"""Start-time estimates: the production core run forward on a copy of its state.

Every waiting task gets its place in its pool's queue order and the time it would start if
nothing new arrived: a copy of the core (`snapshot`) is fed, in event-time order, the end of
each running task at its expected end (`expected_run_seconds`, else its time limit, its own
or its pool's), a `running` for each grant the copy makes (its node confirming at once, the
task then ending after its own expected run time), and a clock tick at each of the core's
own timers (time limits, yield deadlines, retry backoffs, ageing steps, queue-time SLAs,
victims free to go): the same `Scheduler.handle` the service and the simulators run, so the
estimate follows every rule (priority, fair share, backfill, gangs, preemption, quotas).
A waiting task's estimated start is the time the copy grants it.

No estimate (None, with the reason) when the copy never grants it within the bounds: it waits
behind a running task that states no run time, or behind one that never fits. The copy is
thrown away; the live core is never touched (its decisions are the same with or without an
estimate, tested). Deterministic: event times only.

Cost: one deep copy of the core and one `handle` per synthetic event (about two per task that
runs or starts in the forecast, plus the timer ticks), bounded by `max_events` and
`horizon_seconds`: the service computes it on a tasks query, at most once per
`CRATER_SCHEDULER_ESTIMATE_INTERVAL_SECONDS`, copy and run off the event loop.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from uuid import UUID, uuid5

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeCondition,
    NodeHealthReported,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.state import Allocation

_IDS = UUID("6c1f3b0e-52a4-4d8e-9a1b-666f72656361")
# Far past any horizon: the copy's nodes never fall silent (no heartbeats are fed to it).
_NEVER_SILENT = 10 * 366 * 86_400.0
# A deadline the core compares strictly (`yield_by < now`) is ticked just after it.
_JUST_AFTER = timedelta(milliseconds=1)
# The node id of the copy's clock ticks: no node has it, so a tick only moves the clock.
CLOCK_NODE = "crater-forecast-clock"


@dataclass(frozen=True)
class Estimate:
    """A waiting task's place in its pool's queue and its estimated start."""

    task_id: str
    pool: str
    position: int  # 1: the first of its pool's queue order
    start_at: datetime | None  # None: no estimate (see `note`)
    note: str


@dataclass
class Forecast:
    """Every waiting task's estimate, as of the core's clock `at`."""

    at: datetime | None
    estimates: dict[str, Estimate] = field(default_factory=dict)
    events: int = 0  # synthetic events the copy was fed
    complete: bool = True  # False: stopped at a bound with tasks still waiting


def snapshot(core: Scheduler) -> Scheduler:
    """A copy of `core` to run forward: nothing it does reaches `core` (take it while no
    event is being decided: the service holds its decision lock; the run may then go on
    while decisions do)."""
    return copy.deepcopy(core)


def expected_end(core: Scheduler, head: Allocation, now: datetime) -> datetime | None:
    """When a held task is expected to end: its yield deadline when told to go; else its
    grant's time plus its expected run time (`SchedulerConfig.expected_run_for`); one that
    ran past that ends now (its limit, if later, still stops it: the core enforces it);
    None: unknown (it states no run time, nor does its pool)."""
    if head.yield_by is not None:
        return head.yield_by
    request = head.task.request if head.task is not None else None
    expected = None if request is None else core.config.expected_run_for(request)
    if expected is None or head.granted_at is None:
        return None
    return max(now, head.granted_at + timedelta(seconds=expected))


def run_forward(
    clone: Scheduler,
    horizon_seconds: float = 7 * 86_400.0,
    max_events: int = 20_000,
) -> Forecast:
    """Run `clone` (a `snapshot`, consumed) forward until every waiting task is granted, or
    nothing more happens, or a bound is reached; see the module's docstring."""
    now = clone.clock
    positions = queue_positions(clone)  # before the copy moves: the queue as it is
    result = Forecast(at=now)
    if now is None or not clone.pending:
        result.estimates = _estimates(positions, now, {}, {}, complete=True)
        return result
    # Its nodes never fall silent and its reports need no token: a forecast has neither.
    clone.config = replace(
        clone.config,
        heartbeat_timeout_seconds=_NEVER_SILENT,
        node_lost_seconds=_NEVER_SILENT,
        require_report_tokens=False,
    )
    clone.heartbeating.clear()
    unknown: dict[str, int] = {}  # pool -> held tasks with no expected end, there
    ends: list[tuple[datetime, int, str, str]] = []
    order = itertools.count()

    def expect(head: Allocation, at: datetime) -> None:
        if head.yield_by is not None:
            return  # told to go: the copy releases it at its deadline (a `_next_timer`)
        end = expected_end(clone, head, at)
        if end is not None:
            heapq.heappush(ends, (end, next(order), head.task_id, head.allocation_id))
            return
        for pool in _pools_held(clone, head):
            unknown[pool] = unknown.get(pool, 0) + 1

    for head in clone.allocations.values():
        for member in head.members():
            member.running, member.heartbeat_grace = True, None  # as its node confirmed it
        expect(head, now)
    wanted = set(clone.pending)
    started: dict[str, datetime] = {}
    horizon = now + timedelta(seconds=horizon_seconds)
    while wanted - started.keys() and result.events < max_events:
        timer = _next_timer(clone)
        end_at = ends[0][0] if ends else None
        if end_at is None and timer is None:
            break  # nothing more will happen: what still waits has no estimate
        if end_at is not None and (timer is None or end_at <= timer):
            when, _, task_id, allocation_id = heapq.heappop(ends)
            event: Event = TaskStatusReported(
                event_id=uuid5(_IDS, f"end:{allocation_id}"),
                occurred_at=when,
                task_id=task_id,
                allocation_id=allocation_id,
                status=TaskStatus.SUCCEEDED,
            )
        else:
            assert timer is not None
            when = timer
            event = NodeHealthReported(
                event_id=uuid5(_IDS, f"tick:{result.events}"),
                occurred_at=when,
                node_id=CLOCK_NODE,
                condition=NodeCondition.READY,
                score=100,
            )
        if when > horizon:
            break
        result.events += 1
        for decision in clone.handle(event):
            if not isinstance(decision, AllocationGranted):
                continue
            at = decision.occurred_at
            started.setdefault(decision.task_id, at)
            result.events += 1
            clone.handle(
                TaskStatusReported(
                    event_id=uuid5(_IDS, f"running:{decision.allocation_id}"),
                    occurred_at=at,
                    task_id=decision.task_id,
                    allocation_id=decision.allocation_id,
                    status=TaskStatus.RUNNING,
                )
            )
            granted = clone.allocations.get(decision.task_id)
            if decision.gang_index == 0 and granted is not None:
                expect(granted, at)
    result.complete = not (wanted - started.keys())
    result.estimates = _estimates(positions, now, started, unknown, result.complete)
    return result


def forecast(core: Scheduler, horizon_seconds: float = 7 * 86_400.0) -> Forecast:
    """`run_forward` on a `snapshot` of `core`."""
    return run_forward(snapshot(core), horizon_seconds)


def _next_timer(core: Scheduler) -> datetime | None:
    """The earliest time at which the core decides something by itself (no event needed
    beyond the clock): a time limit, a yield deadline, a retry's backoff, a victim free to
    go, an ageing step, a queue-time SLA, a victim's cooldown ending."""
    now = core.clock
    due = [
        heap[0][0]
        for heap in (core.limits, core.backoffs, core.wakeups, core.ageing, core.victims_due)
        if heap
    ]
    if core.deadlines:
        due.append(core.deadlines[0][0] + _JUST_AFTER)  # escalated once strictly past
    due += [a.yield_by + _JUST_AFTER for a in core.allocations.values() if a.yield_by is not None]
    later = [t for t in due if now is None or t > now]
    return min(later, default=None)


def queue_positions(core: Scheduler) -> dict[str, tuple[str, int]]:
    """Each waiting task's pool and place in that pool's queue order (1: first)."""
    counts: dict[str, int] = {}
    positions: dict[str, tuple[str, int]] = {}
    for task in core.waitlist.queue():
        pool = task.request.pool
        counts[pool] = counts.get(pool, 0) + 1
        positions[task.request.task_id] = (pool, counts[pool])
    return positions


def _pools_held(core: Scheduler, head: Allocation) -> set[str]:
    """The pools a held task keeps capacity from: its own, and its nodes' (borrowed)."""
    pools = {head.pool}
    for member in head.members():
        node = core.cluster.get(member.node)
        if node is not None:
            pools.add(node.topology.pool)
    return pools


def _estimates(
    positions: dict[str, tuple[str, int]],
    now: datetime | None,
    started: dict[str, datetime],
    unknown: dict[str, int],
    complete: bool,
) -> dict[str, Estimate]:
    """Each waiting task's place with its estimated start and a one-line note."""
    out: dict[str, Estimate] = {}
    for task_id, (pool, position) in positions.items():
        start = started.get(task_id)
        held = unknown.get(pool, 0)
        if start is not None:
            wait = max(0.0, (start - now).total_seconds()) if now is not None else 0.0
            note = f"estimated to start in {wait:.0f} s (position {position} in pool {pool})"
        elif held:
            note = (
                f"no estimate: {held} task{'s' if held != 1 else ''} holding pool {pool}'s "
                "nodes state no run time (expected_run_seconds or max_run_seconds) and the "
                "pool sets no max_run_seconds"
            )
        elif not complete:
            note = "no estimate within the forecast's bounds"
        else:
            note = "no estimate: it would not start even once the tasks known now have ended"
        out[task_id] = Estimate(task_id, pool, position, start, note)
    return out


# A start estimate is told again (`task.estimated`) when its start moved by more than this,
# or by more than this share of the wait that was told, whichever is larger: a queue that
# only drifts does not flood the receiver, a real change reaches it.
RETELL_SECONDS = 60.0
RETELL_SHARE = 0.25


@dataclass(frozen=True)
class Told:
    """The estimate last told of a waiting task, and as of when (the core's clock)."""

    attempt: int
    start_at: datetime | None
    at: datetime


def worth_telling(before: Told | None, attempt: int, estimate: Estimate) -> bool:
    """Whether `estimate` is news against what was told `before`: the first one of this
    attempt, one that gains or loses its start time, or a start that moved materially."""
    if before is None or before.attempt != attempt:
        return True
    if (before.start_at is None) != (estimate.start_at is None):
        return True
    if before.start_at is None or estimate.start_at is None:
        return False
    told_wait = max((before.start_at - before.at).total_seconds(), 0.0)
    moved = abs((estimate.start_at - before.start_at).total_seconds())
    return moved > max(RETELL_SECONDS, RETELL_SHARE * told_wait)
