"""A task's attempts: reports that end one, scale-ins, and what follows an attempt's end
(a retry by the restart policy, or the task's one `task.ended`)."""

from __future__ import annotations

from datetime import timedelta

from crater.contracts import (
    AttemptFailure,
    Event,
    FilterReason,
    NodeCondition,
    ReleaseReason,
    ReplicaReleaseRequested,
    RestartOn,
    RestartPolicy,
    TaskPending,
    TaskStatus,
    TaskStatusReported,
    derived_event_id,
)
from crater.scheduler.domain.events import (
    as_reported,
    ended,
)
from crater.scheduler.domain.ledger import Ledger
from crater.scheduler.domain.reasons import kind_of
from crater.scheduler.domain.retries import RetryIndex
from crater.scheduler.domain.state import (
    Allocation,
    PendingTask,
    SchedulerState,
)
from crater.scheduler.domain.waitlist import Waitlist

# Which attempt endings a restart policy can retry, by how the attempt's resources went back.
RESTART_ON = {
    ReleaseReason.FAILED: RestartOn.FAILURE,
    ReleaseReason.EXPIRED: RestartOn.FAILURE,
    ReleaseReason.PREEMPTED: RestartOn.PREEMPTION,
    ReleaseReason.NODE_LOST: RestartOn.NODE_LOST,
}
# Endings that say the node may be at fault: the next attempt goes elsewhere if it can.
FAILED_ON = frozenset({ReleaseReason.FAILED, ReleaseReason.EXPIRED, ReleaseReason.NODE_LOST})
# What a task's end says when its last attempt ended so.
END_STATUS = {
    ReleaseReason.SUCCEEDED: TaskStatus.SUCCEEDED,
    ReleaseReason.FAILED: TaskStatus.FAILED,
    ReleaseReason.CANCELLED: TaskStatus.CANCELLED,
    ReleaseReason.PREEMPTED: TaskStatus.FAILED,
    ReleaseReason.EXPIRED: TaskStatus.FAILED,
    ReleaseReason.NODE_LOST: TaskStatus.FAILED,
    ReleaseReason.SCALED_IN: TaskStatus.CANCELLED,
    ReleaseReason.TIME_LIMIT: TaskStatus.FAILED,
}
END_REASON = {
    ReleaseReason.EXPIRED: "its node never confirmed the reservation",
    ReleaseReason.NODE_LOST: "its node stopped answering",
    ReleaseReason.SCALED_IN: "the autoscaler removed this replica",
}


def own_report(cause: Event, task_id: str) -> TaskStatusReported | None:
    """`cause` when it is the task's own report; None when the attempt ended on another
    event (a pass run on any event: an expiry, a silent task, an orphan found)."""
    if isinstance(cause, TaskStatusReported) and cause.task_id == task_id:
        return cause
    return None


def failure_kind(
    reason: ReleaseReason, report: TaskStatusReported | None, kind: AttemptFailure | None = None
) -> AttemptFailure | None:
    """What kind of failure ended an attempt (a restart policy's on_failure_kinds), from the
    task's own report if it ended on one; None: the attempt did not fail."""
    if reason not in (ReleaseReason.FAILED, ReleaseReason.EXPIRED):
        return None
    if kind is not None:
        return kind
    if reason is ReleaseReason.FAILED and report is not None:
        return AttemptFailure.OOM if report.out_of_memory else AttemptFailure.EXIT_CODE
    return AttemptFailure.OTHER


def yield_end(allocation: Allocation) -> ReleaseReason:
    """How an allocation told to go ends when it goes: a preemption, or its time limit."""
    return ReleaseReason.TIME_LIMIT if allocation.time_limited else ReleaseReason.PREEMPTED


class Lifecycle:
    """Ends attempts and retries or ends their tasks."""

    def __init__(
        self, state: SchedulerState, retries: RetryIndex, ledger: Ledger, waitlist: Waitlist
    ) -> None:
        self.state = state
        self.retries = retries
        self.ledger = ledger
        self.waitlist = waitlist

    def on_status(self, event: TaskStatusReported) -> list[Event]:
        allocation = self.state.allocations.get(event.task_id)
        if allocation is None:
            waiting = self.state.pending.get(event.task_id)
            if event.status is TaskStatus.CANCELLED and event.allocation_id is None:
                if waiting is not None:  # cancelled before placed (or between attempts)
                    self.state.dequeue(event.task_id)
                    self.retries.stale(waiting.request.pool)
                    reason = event.message or "cancelled while waiting"
                    return [
                        ended(event.task_id, TaskStatus.CANCELLED, reason, event, waiting.attempt)
                    ]
                # Not here yet (still being profiled): it ends cancelled when it comes. (A
                # report naming an allocation is about a task that was here and has ended.)
                self.state.early_cancels.setdefault(event.task_id, False)
            # Anything else is news of an attempt that is over: the task waits or has ended.
            return []
        members = allocation.members()
        ids = {m.allocation_id for m in members}
        if event.allocation_id not in (None, *ids):
            return []  # news of an earlier allocation of the same task: not this one
        if event.status is TaskStatus.RUNNING:
            return []  # confirmed already (`Reservations.confirm`)
        # Any member's end (or a cancel) ends the attempt: every member goes back.
        if allocation.yield_by is not None and event.status is not TaskStatus.SUCCEEDED:
            return self.attempt_over(allocation, yield_end(allocation), event)
        return self.attempt_over(allocation, ReleaseReason(event.status.value), event)

    def on_release_requested(self, event: ReplicaReleaseRequested) -> list[Event]:
        """A scaled-in replica, drained: its resources go back."""
        allocation = self.state.allocations.get(event.task_id) if event.task_id else None
        if allocation is None:
            return []
        return self.attempt_over(allocation, ReleaseReason.SCALED_IN, event)

    def attempt_over(
        self,
        allocation: Allocation,
        reason: ReleaseReason,
        cause: Event,
        why: str | None = None,
        kind: AttemptFailure | None = None,
    ) -> list[Event]:
        """An attempt's resources go back (every member of a gang); then the task is retried,
        as its restart policy says, or ends: exactly one `task.ended` per task. `kind`: the
        failure's kind where the caller knows it (a node fault), else read off the cause."""
        released: list[Event] = list(self.ledger.release(allocation, reason, cause))
        task = allocation.task
        attempt = allocation.attempt
        code_not_retried = False  # the policy would retry, but not this exit code
        kind_not_retried = False  # ... nor this kind of failure
        report = own_report(cause, allocation.task_id)
        failed_as = failure_kind(reason, report, kind)
        if task is not None:
            policy = self.state.config.restart_for(task.request)
            on = RESTART_ON.get(reason)
            # The task's own exit code: not another task's report the attempt ended during.
            code = report.exit_code if reason is ReleaseReason.FAILED and report else None
            retried = on is not None and on in policy.when and attempt < policy.max_attempts
            kind_not_retried = retried and not policy.retries_kind(failed_as)
            # Exit codes judge the failures their launcher reported, not an OOM or a fault.
            code_not_retried = (
                retried
                and not kind_not_retried
                and failed_as in (None, AttemptFailure.EXIT_CODE)
                and not policy.retries_exit_code(code)
            )
            if retried and not code_not_retried and not kind_not_retried:
                failed = self.at_fault(allocation, reason)
                failed_on = tuple(sorted({*task.failed_on, *failed}))
                # A kind the policy names is said with the retry, as is a node fault's cause.
                note = None
                if failed_as is AttemptFailure.NODE_FAULT or (
                    policy.on_failure_kinds is not None and failed_as is not None
                ):
                    note = failed_as.value + (f": {why}" if why else "")
                retry = self.retry(task, attempt + 1, reason, policy, cause, failed_on, note)
                return [*released, retry]
        if why is not None:
            pass
        elif reason is ReleaseReason.PREEMPTED and allocation.lent_by is not None:
            why = f"the GPUs lent by {allocation.lent_by} were taken back"
        elif reason is ReleaseReason.TIME_LIMIT:
            why = f"it reached its time limit of {allocation.run_limit} s and was stopped"
        elif reason is ReleaseReason.PREEMPTED and allocation.yield_by is not None:
            why = "it yielded its resources to a higher-priority task"
        elif reason in (ReleaseReason.SUCCEEDED, ReleaseReason.FAILED, ReleaseReason.CANCELLED):
            why = as_reported(reason, cause)
            if code_not_retried:
                why += "; its restart policy does not retry that exit code"
        else:
            why = END_REASON.get(reason, f"its attempt ended: {reason.value}")
        if kind_not_retried and failed_as is not None:
            why += f"; its restart policy does not retry failures of kind {failed_as.value}"
        if attempt > 1:
            why += f" (attempt {attempt})"
        return [
            *released,
            ended(
                allocation.task_id,
                END_STATUS[reason],
                why,
                cause,
                attempt,
                allocation_id=allocation.allocation_id,
                release_reason=reason,
            ),
        ]

    def at_fault(self, allocation: Allocation, reason: ReleaseReason) -> set[str]:
        """The nodes an attempt's end may blame: a lost node (of a gang's, the members' nodes
        now down); every member's for a failure or an unconfirmed reservation (which member
        failed is not said); none for other ends."""
        if reason not in FAILED_ON:
            return set()
        nodes = {m.node for m in allocation.members()}
        if reason is ReleaseReason.NODE_LOST:
            down = {
                name
                for name in nodes
                if (node := self.state.cluster.get(name)) is None
                or node.condition is NodeCondition.NOT_READY
            }
            return down or nodes
        return nodes

    def retry(
        self,
        task: PendingTask,
        attempt: int,
        reason: ReleaseReason,
        policy: RestartPolicy,
        cause: Event,
        failed_on: tuple[str, ...] = (),
        note: str | None = None,
    ) -> TaskPending:
        """Queue the task again for its next attempt, after the policy's backoff; away from
        the nodes in `failed_on` while another could hold it. `note`: how the last attempt
        failed, said with the retry."""
        now = self.state.clock or cause.occurred_at
        backoff = policy.backoff_before(attempt)
        retried = PendingTask(
            task.request,
            task.prediction,
            task.full_demand,  # a wait for its first GPU model starts again with it
            task.seq,  # keeps its place in the queue
            submitted_at=now,  # a queue-time SLA counts from the new wait
            attempt=attempt,
            not_before=now + timedelta(seconds=backoff) if backoff > 0 else None,
            failed_on=failed_on,
        )
        self.waitlist.enqueue(retried)
        summary = (
            f"attempt {attempt} of {policy.max_attempts} after the last ended {reason.value}"
            + (f" ({note})" if note else "")
            + (f"; starts after a backoff of {backoff:g} s" if backoff > 0 else "")
        )
        reasons = [FilterReason(filter="RestartBackoff", code="Retrying", nodes=0, message=summary)]
        task_id = task.request.task_id
        retried.live_reasons = reasons
        retried.last_summary = summary
        retried.told_kinds = (kind_of(reasons),)
        retried.announced_at = now
        return TaskPending(
            event_id=derived_event_id(cause.event_id, f"retry:{task_id}:{attempt}"),
            occurred_at=cause.occurred_at,
            task_id=task_id,
            nodes_total=len(self.state.cluster),
            reasons=reasons,
            summary=summary,
            attempt=attempt,
        )
