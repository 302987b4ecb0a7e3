"""Reservations: a grant armed, confirmed (`running`, the token checked), expired
unconfirmed or yielded past its grace, and tasks whose launcher stopped its heartbeats."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from crater.contracts import (
    Event,
    FieldError,
    ReleaseReason,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.lifecycle import Lifecycle, yield_end
from crater.scheduler.domain.state import (
    Allocation,
    SchedulerState,
    consumed_until,
)
from crater.scheduler.domain.tokens import token_refusal

# A time after every expiry: the floor when nothing can expire.
NEVER = datetime.max.replace(tzinfo=UTC)


class Reservations:
    """Confirms, checks and expires reservations."""

    def __init__(self, state: SchedulerState, lifecycle: Lifecycle) -> None:
        self.state = state
        self.lifecycle = lifecycle

    def confirm(self, event: TaskStatusReported) -> None:
        """A node reports the task running: its reservation (the member named, or every
        member) is confirmed and no longer expires. A launcher's report (with the token) is
        also a heartbeat: from the first, the member is failed if they stop."""
        allocation = self.state.allocations.get(event.task_id)
        if allocation is None:
            return
        for member in allocation.members():
            if event.allocation_id in (None, member.allocation_id):
                member.running = True
                if event.reservation_token is not None:
                    member.heartbeat_grace = (
                        event.heartbeat_grace_seconds
                        or member.heartbeat_grace
                        or self.state.config.task_heartbeat_grace_seconds
                    )
                    member.heard_at = max(member.heard_at or event.occurred_at, event.occurred_at)
                    self.state.heartbeating.add(event.task_id)

    def report_refusal(self, event: TaskStatusReported) -> FieldError | None:
        """Why a task report cannot be taken (None: it can). A report carrying a token about
        an allocation held now must carry that allocation's own token, and a `running` that
        would confirm it must come before its reservation's real deadline; once a launcher
        confirmed an allocation with the token, reports about it without the token are
        refused (with `require_report_tokens`, every running/succeeded/failed one). Cancels
        without a token (the gateway's, an operator's) are taken. A report naming an
        allocation the task does not hold now (forged, another's, an earlier attempt's) is
        refused with that reason; reports about an ended task are taken and change nothing."""
        head = self.state.allocations.get(event.task_id)
        members = head.members() if head is not None else []
        if (
            event.allocation_id is not None
            and members
            and all(m.allocation_id != event.allocation_id for m in members)
        ):
            held = ", ".join(repr(m.allocation_id) for m in members)
            return FieldError(
                field="allocation_id",
                reason=f"task {event.task_id!r} does not hold allocation "
                f"{event.allocation_id!r} (it holds {held}): a report on another allocation, "
                "or an earlier attempt's, changes nothing",
            )
        token = event.reservation_token
        if token is None:
            if event.status is TaskStatus.CANCELLED:
                return None
            for member in members:
                if member.heartbeat_grace is not None and event.allocation_id in (
                    None,
                    member.allocation_id,
                ):
                    return FieldError(
                        field="reservation_token",
                        reason=f"missing: allocation {member.allocation_id!r} was confirmed by "
                        "its launcher with its reservation token; every report about it must "
                        "carry that token",
                    )
            if self.state.config.require_report_tokens and members:
                return FieldError(
                    field="reservation_token",
                    reason="missing: this scheduler takes a task's running, succeeded or failed "
                    "only with its allocation's reservation token "
                    "(CRATER_SCHEDULER_REQUIRE_REPORT_TOKENS)",
                )
            return None
        named = next((m for m in members if m.allocation_id == event.allocation_id), None)
        if named is None:
            return None
        member = named
        why = token_refusal(
            self.state.config.token_secret, token, member.allocation_id, member.task_id, member.node
        )
        if why is not None:
            return FieldError(field="reservation_token", reason=why)
        if (
            event.status is TaskStatus.RUNNING
            and not member.running
            and member.armed
            and event.occurred_at > member.expires_at
        ):
            return FieldError(field="reservation_token", reason=expired_refusal(member))
        return None

    def allocation_check(
        self, allocation_id: str, token: str, at: datetime
    ) -> tuple[Allocation, FieldError | None] | None:
        """An allocation held now and why a launcher's `running` with `token`, sent at `at`,
        would be refused (None: taken); None when it is not held. The judgement of
        `report_refusal`, asked before the report is sent (the gateway's synchronous answer)."""
        head = self.state.allocations.get(self.state.held_by.get(allocation_id, ""))
        for member in head.members() if head is not None else ():
            if member.allocation_id == allocation_id:
                report = TaskStatusReported(
                    task_id=member.task_id,
                    status=TaskStatus.RUNNING,
                    allocation_id=allocation_id,
                    reservation_token=token,
                    occurred_at=at,
                )
                return member, self.report_refusal(report)
        return None

    def on_armed(self, event: ReservationArmed) -> None:
        """The grant has left the outbox: its reservation runs from when the stream took it."""
        head = self.state.allocations.get(event.task_id)
        if head is None:
            return  # ended already
        for member in head.members():
            if member.allocation_id == event.allocation_id and not member.armed:
                member.armed = True
                request = member.task.request if member.task is not None else None
                member.expires_at = event.occurred_at + self.state.config.reservation_for(request)
                if self.state.expiry_floor is not None:
                    self.state.expiry_floor = min(self.state.expiry_floor, member.expires_at)

    def expire_reservations(self, now: datetime, cause: Event) -> list[Event]:
        """Allocations whose task never confirmed it runs, past their reservation, and
        preempted ones past their grace period, go back (a gang: all its members)."""
        if self.state.expiry_floor is not None and self.state.expiry_floor >= now:
            return []  # nothing can have expired yet
        expired: list[Allocation] = []
        yielded: list[Allocation] = []
        for a in self.state.allocations.values():
            if a.yield_by is not None:
                # Told to stop: it yields (its node stops it, maybe before it confirmed), it
                # does not expire.
                if a.yield_by < now:
                    yielded.append(a)
            elif any(self.unconfirmed(m, now) for m in a.members()):
                expired.append(a)
        released: list[Event] = []
        for a in sorted(expired, key=lambda a: a.task_id):
            released += self.lifecycle.attempt_over(a, ReleaseReason.EXPIRED, cause)
        for a in sorted(yielded, key=lambda a: a.task_id):
            released += self.lifecycle.attempt_over(a, yield_end(a), cause)
        self.state.expiry_floor = min(
            (t for a in self.state.allocations.values() for t in expiries(a)), default=NEVER
        )
        return released

    def unconfirmed(self, member: Allocation, now: datetime) -> bool:
        """Whether `member`'s node has truly not confirmed it in time: its reservation, counted
        from when the grant left the outbox, is over, and the task reports of that time have
        been consumed (or, none being that recent, a further lag allowance is over too)."""
        if member.running or not member.armed or member.expires_at >= now:
            return False
        if self.state.expiries_held_until is not None and now < self.state.expiries_held_until:
            return False
        reported = consumed_until(
            self.state.reports_clock, now, self.state.config.confirmation_lag_seconds
        )
        return member.expires_at < reported

    def fail_silent_tasks(self, now: datetime, cause: Event) -> list[Event]:
        """Tasks held to heartbeats whose launcher has been silent past its grace fail (their
        restart policy may retry them). Silence is measured, like a node's, to how far the
        task reports have been consumed (a lagging stream or a restart never makes a live task
        look silent), and not while reports a restarted scheduler never acknowledged may
        still be on their way."""
        if not self.state.heartbeating:
            return []
        if self.state.expiries_held_until is not None and now < self.state.expiries_held_until:
            return []
        heard = consumed_until(
            self.state.reports_clock, now, self.state.config.confirmation_lag_seconds
        )
        silent: list[tuple[Allocation, Allocation]] = []
        for task_id in sorted(self.state.heartbeating):
            head = self.state.allocations.get(task_id)
            if head is None:
                self.state.heartbeating.discard(task_id)
                continue
            held = [m for m in head.members() if m.heartbeat_grace is not None]
            if not held:  # a later attempt no launcher has confirmed yet
                self.state.heartbeating.discard(task_id)
            for member in held:
                grace = member.heartbeat_grace or 0.0
                if member.heard_at is None or member.yield_by is not None:
                    continue
                if member.heard_at + timedelta(seconds=grace) < heard:
                    silent.append((head, member))
                    break
        failed: list[Event] = []
        for head, member in silent:
            self.state.heartbeating.discard(head.task_id)
            why = (
                f"no heartbeat for {member.heartbeat_grace:g} s: allocation "
                f"{member.allocation_id!r} on {member.node} was last reported running at "
                f"{member.heard_at:%Y-%m-%dT%H:%M:%SZ} by its launcher, which stopped reporting"
            )
            failed += self.lifecycle.attempt_over(head, ReleaseReason.FAILED, cause, why=why)
        return failed


def expired_refusal(member: Allocation) -> str:
    """Why a confirmation after the reservation's real deadline is refused."""
    return (
        f"expired: the reservation of allocation {member.allocation_id!r} ended unconfirmed "
        f"at {member.expires_at:%Y-%m-%dT%H:%M:%S.%fZ}; it is released, and the task is "
        "retried or ends (expired)"
    )


def expiries(allocation: Allocation) -> Iterator[datetime]:
    """When `allocation` (a gang: any member) could expire or must have yielded."""
    for member in allocation.members():
        if not member.running and member.armed:
            yield member.expires_at
    if allocation.yield_by is not None:
        yield allocation.yield_by
