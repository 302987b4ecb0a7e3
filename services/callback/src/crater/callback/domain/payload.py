"""Task and allocation lifecycle events as webhooks: the body recorded per event (Crater's typed
`WebhookBody`), and what is POSTed from it to an endpoint in its format.

Formats (per endpoint): `alldata`, the default, is exactly the shape AllData parses
(tests/fixtures/alldata/alldata_webhook.json: `gpu_ids` and `numa_node` as strings); `crater`
is the typed `WebhookBody`. Either way the `crater-*` headers carry what a receiver needs to
de-duplicate and order (the `webhook-id` header is the event id). Rendering is a pure function
of the recorded body and the format, so every attempt of a delivery sends the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from crater.contracts import (
    AllocatedResources,
    AllocationGranted,
    TaskEnded,
    TaskEscalated,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskStartEstimated,
    TaskStatus,
    TaskStatusReported,
    TaskUnderutilized,
    TenantBudgetExceeded,
    TenantBudgetWebhookBody,
    WebhookBody,
    WebhookStatus,
)

LifecycleEvent = (
    AllocationGranted
    | TaskPending
    | TaskEscalated
    | TaskStartEstimated
    | TaskRejected
    | TaskPreempted
    | TaskEnded
    | TaskStatusReported
    | TaskUnderutilized
)


class WebhookFormat(StrEnum):
    """What an endpoint is POSTed: AllData's own shape, or Crater's typed body."""

    ALLDATA = "alldata"
    CRATER = "crater"


def has_webhook(event: LifecycleEvent) -> bool:
    """Whether AllData is told of the event. Of a node's (or the gateway's) reports only
    `running` is, and not a launcher's heartbeat (a `running` repeated): the scheduler's
    `task.ended` says how a task ended, once, and a report's `succeeded`, `failed` or
    `cancelled` is only what one node saw."""
    if isinstance(event, TaskStatusReported):  # a launcher's heartbeat is not news
        return event.status is TaskStatus.RUNNING and not event.heartbeat
    return True


def webhook_body(event: LifecycleEvent) -> WebhookBody:
    """The body for `event`; deterministic, so a redelivered event yields the same bytes."""
    resources: AllocatedResources | None = None
    reason: str | None
    gang_index: int | None = None
    gang_size: int | None = None
    granted = event if isinstance(event, AllocationGranted) else None
    match event:
        case AllocationGranted():
            status = WebhookStatus.SCHEDULED
            resources = AllocatedResources(
                node=event.node,
                gpu_ids=list(event.gpu_ids),
                cpu_cores=list(event.cpu_cores),
                numa_node=event.numa_node,
                checkpoint_path=event.checkpoint_path,
                environment=dict(event.environment),
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
        case TaskStartEstimated():
            # Still waiting, now with a place and a time: AllData hears it as a `pending`.
            status, reason = WebhookStatus.PENDING, event.estimate
        case TaskRejected():
            # The task's end; or, as a duplicate, a refused submission that leaves it be.
            status = WebhookStatus.REJECTED
            reason = "; ".join(f"{e.field}: {e.reason}" for e in event.errors) or "rejected"
        case TaskPreempted():
            status = WebhookStatus.PREEMPTED
            reason = f"{event.cause()} on {event.node}; grace period {event.grace_period_seconds} s"
        case TaskEnded():
            status, reason = WebhookStatus(event.status.value), event.reason
        case TaskStatusReported():
            status, reason = WebhookStatus(event.status.value), event.message
        case TaskUnderutilized():
            # An SLA breach of a task that still runs: AllData's parser knows `running`.
            status = WebhookStatus.RUNNING
            reason = (
                f"GPU utilization {event.measured_gpu_utilization_percent:.1f}% over "
                f"{event.window_seconds:g} s ({event.samples} samples), below the task's "
                f"sla.min_gpu_utilization_percent {event.min_gpu_utilization_percent:g}%"
            )
        case _:
            raise TypeError(f"no webhook for {type(event).__name__}")
    return WebhookBody(
        task_id=event.task_id,
        status=status,
        allocated_resources=resources,
        allocation_id=granted.allocation_id if granted else None,
        reservation_token=granted.reservation_token if granted else None,
        reservation_expires_at=granted.reservation_expires_at if granted else None,
        event_id=event.event_id,
        occurred_at=event.occurred_at,
        reason=reason,
        release_reason=event.release_reason if isinstance(event, TaskEnded) else None,
        sequence=event.task_sequence.number
        if not isinstance(event, TaskStatusReported | TaskUnderutilized) and event.task_sequence
        else None,
        gang_index=gang_index,
        gang_size=gang_size,
        escalated_priority=event.escalated_priority if isinstance(event, TaskEscalated) else None,
        attempt=event.attempt
        if isinstance(
            event,
            TaskPending | TaskStartEstimated | AllocationGranted | TaskEnded | TaskUnderutilized,
        )
        else None,
        duplicate_submission=event.duplicate if isinstance(event, TaskRejected) else None,
        gpu_utilization_percent=event.measured_gpu_utilization_percent
        if isinstance(event, TaskUnderutilized)
        else None,
        min_gpu_utilization_percent=event.min_gpu_utilization_percent
        if isinstance(event, TaskUnderutilized)
        else None,
        queue_position=event.queue_position if isinstance(event, TaskStartEstimated) else None,
        estimated_start_at=event.estimated_start_at
        if isinstance(event, TaskStartEstimated)
        else None,
    )


# A tenant's webhooks are queued under this key, which no task id can be (a task id starts
# with a letter or digit), so they are ordered among themselves and never among a task's.
TENANT_KEY = "@tenant/"
BUDGET_EXCEEDED = "budget_exceeded"  # its delivery's status in the log (not a task status)


def budget_body(event: TenantBudgetExceeded) -> TenantBudgetWebhookBody:
    """The body for a tenant's budget passed; deterministic, like a task's."""
    return TenantBudgetWebhookBody(
        tenant=event.tenant,
        limit=event.limit,
        period=event.period,
        period_start=event.period_start,
        period_end=event.period_end,
        budget=event.budget,
        cost=event.cost,
        currency=event.currency,
        held=event.limit == "hard",
        event_id=event.event_id,
        occurred_at=event.occurred_at,
        reason=event.reason,
    )


def with_attempt(payload: str, attempt: int) -> str:
    """A recorded body told the attempt it belongs to (before it is first sent: a repeat
    sends these bytes again)."""
    body = WebhookBody.model_validate_json(payload)
    return body.model_copy(update={"attempt": attempt}).encode().decode()


@dataclass(frozen=True)
class Rendered:
    """What one attempt of a delivery POSTs: the body and the `crater-*` headers."""

    body: bytes
    headers: dict[str, str]


def render(payload: str, format: WebhookFormat | str) -> Rendered:
    """The bytes and headers POSTed to an endpoint of `format` for a recorded body. The
    `crater` format sends the recorded bytes as they are (a body recorded before formats
    existed goes out exactly as it did); a tenant's body (`tenant.budget_exceeded`) goes as
    recorded in every format, with `crater-event` naming it."""
    recorded = json.loads(payload)
    if str(recorded.get("event", "")).startswith("tenant."):  # a tenant's: the same shape
        tenant = TenantBudgetWebhookBody.model_validate(recorded)
        return Rendered(
            payload.encode(),
            {
                "crater-format": WebhookFormat(format).value,
                "crater-event": tenant.event,
                "crater-occurred-at": tenant.model_dump(mode="json")["occurred_at"],
            },
        )
    body = WebhookBody.model_validate(recorded)
    headers = crater_headers(body, WebhookFormat(format))
    if format == WebhookFormat.CRATER:
        return Rendered(payload.encode(), headers)
    # Compact and in insertion order: deterministic, and the fixture's key order.
    text = json.dumps(alldata_body(body), separators=(",", ":"), ensure_ascii=False)
    return Rendered(text.encode(), headers)


def alldata_body(body: WebhookBody) -> dict[str, Any]:
    """The body as AllData parses it. `scheduled`: exactly alldata_webhook.json's keys, in its
    order and with its types (`gpu_ids` and `numa_node` strings, `numa_node` null when the
    node has no NUMA placement). Any other status: `task_id`, `status`, `reason` (null when
    none), plus `duplicate_submission: true` on a refused duplicate submission only, and
    `gpu_utilization_percent` / `min_gpu_utilization_percent` on the SLA breach only."""
    shaped: dict[str, Any] = {"task_id": body.task_id, "status": body.status.value}
    resources = body.allocated_resources
    if body.status is WebhookStatus.SCHEDULED and resources is not None:
        shaped["allocated_resources"] = {
            "node": resources.node,
            "gpu_ids": [str(gpu) for gpu in resources.gpu_ids],
            "cpu_cores": list(resources.cpu_cores),
            "numa_node": None if resources.numa_node is None else str(resources.numa_node),
            "checkpoint_path": resources.checkpoint_path,
        }
        return shaped
    shaped["reason"] = body.reason
    if body.duplicate_submission:
        # Not the task's end: a receiver must not read this `rejected` as one.
        shaped["duplicate_submission"] = True
    if body.gpu_utilization_percent is not None:
        shaped["gpu_utilization_percent"] = body.gpu_utilization_percent
        shaped["min_gpu_utilization_percent"] = body.min_gpu_utilization_percent
    return shaped


# Body fields a receiver needs to de-duplicate and order, as headers (name, field); only
# those the body has a value for are sent.
HEADER_FIELDS = (
    ("crater-occurred-at", "occurred_at"),
    ("crater-sequence", "sequence"),
    ("crater-attempt", "attempt"),
    ("crater-gang-index", "gang_index"),
    ("crater-gang-size", "gang_size"),
    # on `scheduled`: what a launcher confirms the allocation with (the `alldata` body has
    # no place for them)
    ("crater-allocation-id", "allocation_id"),
    ("crater-reservation-token", "reservation_token"),
    ("crater-reservation-expires-at", "reservation_expires_at"),
    # on a start estimate's `pending` (the `alldata` body has no place for them either)
    ("crater-queue-position", "queue_position"),
    ("crater-estimated-start-at", "estimated_start_at"),
)


def crater_headers(body: WebhookBody, format: WebhookFormat) -> dict[str, str]:
    """`crater-format` and the ordering fields of HEADER_FIELDS, as the JSON body writes them
    (the same on every format, so a receiver can switch formats without losing them)."""
    values = body.model_dump(mode="json", include={field for _, field in HEADER_FIELDS})
    headers = {"crater-format": format.value}
    for name, field in HEADER_FIELDS:
        if values.get(field) is not None:  # a field left out of the JSON when None: absent
            headers[name] = str(values[field])
    return headers
