"""Task and allocation lifecycle events as the webhook body AllData expects."""

from __future__ import annotations

from crater.contracts import (
    AllocatedResources,
    AllocationGranted,
    AllocationReleased,
    ReleaseReason,
    TaskEscalated,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskStatusReported,
    WebhookBody,
    WebhookStatus,
)

LifecycleEvent = (
    AllocationGranted
    | AllocationReleased
    | TaskPending
    | TaskEscalated
    | TaskRejected
    | TaskPreempted
    | TaskStatusReported
)

# What AllData hears when a task's resources go back; `release_reason` says exactly why.
RELEASE_STATUS = {
    ReleaseReason.SUCCEEDED: WebhookStatus.SUCCEEDED,
    ReleaseReason.FAILED: WebhookStatus.FAILED,
    ReleaseReason.CANCELLED: WebhookStatus.CANCELLED,
    ReleaseReason.PREEMPTED: WebhookStatus.PREEMPTED,
    # The task never confirmed it runs within its reservation: it will not run.
    ReleaseReason.EXPIRED: WebhookStatus.FAILED,
    ReleaseReason.NODE_LOST: WebhookStatus.FAILED,
    ReleaseReason.SCALED_IN: WebhookStatus.CANCELLED,
}
RELEASE_EXPLANATION = {
    ReleaseReason.EXPIRED: "the task never reported running within its reservation",
    ReleaseReason.NODE_LOST: "its node stopped answering",
    ReleaseReason.SCALED_IN: "the autoscaler removed this replica",
    ReleaseReason.PREEMPTED: "it yielded to a higher-priority task",
}


def webhook_body(event: LifecycleEvent) -> WebhookBody:
    """The body for `event`; deterministic, so a redelivered event yields the same bytes."""
    resources: AllocatedResources | None = None
    reason: str | None
    gang_index: int | None = None
    gang_size: int | None = None
    match event:
        case AllocationGranted():
            status = WebhookStatus.SCHEDULED
            resources = AllocatedResources(
                node=event.node,
                gpu_ids=list(event.gpu_ids),
                cpu_cores=list(event.cpu_cores),
                numa_node=event.numa_node,
                checkpoint_path=event.checkpoint_path,
            )
            reason = event.explanation
            if event.gang_size > 1:  # a gang is told member by member: each names its own
                gang_index, gang_size = event.gang_index, event.gang_size
        case TaskPending():
            status, reason = WebhookStatus.PENDING, event.summary
        case TaskEscalated():
            # Still waiting, now one class higher: AllData hears it as a `pending` that says so.
            status = WebhookStatus.PENDING
            reason = (
                f"escalated: waited {event.waited_seconds:g} s, past its "
                f"max_queue_time_seconds {event.max_queue_time_seconds}; priority "
                f"{event.priority} -> {event.escalated_priority}"
            )
        case TaskRejected():
            # AllData has no "rejected": a task that can never run has failed, and says why.
            status = WebhookStatus.FAILED
            reason = "; ".join(f"{e.field}: {e.reason}" for e in event.errors) or "rejected"
        case TaskPreempted():
            status = WebhookStatus.PREEMPTED
            reason = (
                f"preempted by {event.preempted_by} on {event.node}; "
                f"grace period {event.grace_period_seconds} s"
            )
        case TaskStatusReported():
            status, reason = WebhookStatus(event.status.value), event.message
        case AllocationReleased():
            status = RELEASE_STATUS.get(event.reason, WebhookStatus.FAILED)
            gpus = ",".join(map(str, event.gpu_ids)) or "none"
            reason = f"{event.allocation_id} released on {event.node} (GPUs {gpus}): {event.reason}"
            if event.reason in RELEASE_EXPLANATION:
                reason += f", {RELEASE_EXPLANATION[event.reason]}"
        case _:
            raise TypeError(f"no webhook for {type(event).__name__}")
    return WebhookBody(
        task_id=event.task_id,
        status=status,
        allocated_resources=resources,
        event_id=event.event_id,
        occurred_at=event.occurred_at,
        reason=reason,
        release_reason=event.reason.value if isinstance(event, AllocationReleased) else None,
        sequence=event.task_sequence.number
        if not isinstance(event, TaskStatusReported) and event.task_sequence
        else None,
        gang_index=gang_index,
        gang_size=gang_size,
        escalated_priority=event.escalated_priority if isinstance(event, TaskEscalated) else None,
    )
