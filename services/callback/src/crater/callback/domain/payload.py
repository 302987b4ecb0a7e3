"""Task and allocation lifecycle events as the webhook body AllData expects."""

from __future__ import annotations

from crater.contracts import (
    AllocatedResources,
    AllocationGranted,
    TaskEnded,
    TaskEscalated,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskStatus,
    TaskStatusReported,
    WebhookBody,
    WebhookStatus,
)

LifecycleEvent = (
    AllocationGranted
    | TaskPending
    | TaskEscalated
    | TaskRejected
    | TaskPreempted
    | TaskEnded
    | TaskStatusReported
)


def has_webhook(event: LifecycleEvent) -> bool:
    """Whether AllData is told of the event. Of a node's (or the gateway's) reports only
    `running` is: the scheduler's `task.ended` says how a task ended, once, and a report's
    `succeeded`, `failed` or `cancelled` is only what one node saw."""
    if isinstance(event, TaskStatusReported):
        return event.status is TaskStatus.RUNNING
    return True


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
            # The task's end; or, as a duplicate, a refused submission that leaves it be.
            status = WebhookStatus.REJECTED
            reason = "; ".join(f"{e.field}: {e.reason}" for e in event.errors) or "rejected"
        case TaskPreempted():
            status = WebhookStatus.PREEMPTED
            reason = (
                f"preempted by {event.preempted_by} on {event.node}; "
                f"grace period {event.grace_period_seconds} s"
            )
        case TaskEnded():
            status, reason = WebhookStatus(event.status.value), event.reason
        case TaskStatusReported():
            status, reason = WebhookStatus(event.status.value), event.message
        case _:
            raise TypeError(f"no webhook for {type(event).__name__}")
    return WebhookBody(
        task_id=event.task_id,
        status=status,
        allocated_resources=resources,
        event_id=event.event_id,
        occurred_at=event.occurred_at,
        reason=reason,
        release_reason=event.release_reason if isinstance(event, TaskEnded) else None,
        sequence=event.task_sequence.number
        if not isinstance(event, TaskStatusReported) and event.task_sequence
        else None,
        gang_index=gang_index,
        gang_size=gang_size,
        escalated_priority=event.escalated_priority if isinstance(event, TaskEscalated) else None,
        attempt=event.attempt
        if isinstance(event, TaskPending | AllocationGranted | TaskEnded)
        else None,
        duplicate_submission=event.duplicate if isinstance(event, TaskRejected) else None,
    )


def with_attempt(payload: str, attempt: int) -> str:
    """A recorded body told the attempt it belongs to (before it is first sent: a repeat
    sends these bytes again)."""
    body = WebhookBody.model_validate_json(payload)
    return body.model_copy(update={"attempt": attempt}).encode().decode()
