"""Task and allocation lifecycle events as the webhook body AllData expects."""

from __future__ import annotations

from crater.contracts import (
    AllocatedResources,
    AllocationGranted,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskStatusReported,
    WebhookBody,
    WebhookStatus,
)

LifecycleEvent = AllocationGranted | TaskPending | TaskRejected | TaskPreempted | TaskStatusReported


def webhook_body(event: LifecycleEvent) -> WebhookBody:
    """The body for `event`; deterministic, so a redelivered event yields the same bytes."""
    resources: AllocatedResources | None = None
    reason: str | None
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
        case TaskPending():
            status, reason = WebhookStatus.PENDING, event.summary
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
        case _:
            raise TypeError(f"no webhook for {type(event).__name__}")
    return WebhookBody(
        task_id=event.task_id,
        status=status,
        allocated_resources=resources,
        event_id=event.event_id,
        occurred_at=event.occurred_at,
        reason=reason,
    )
