"""Webhooks: what AllData receives about a task, and the outcome of telling it."""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Literal
from uuid import UUID

from pydantic import AwareDatetime, Field

from crater.contracts.base import Contract, Event


class WebhookDelivered(Event):
    webhook_id: str = Field(description="Stable per source event; the receiver de-duplicates.")
    source_event_id: UUID
    task_id: str
    task_status: str
    endpoint: str
    status_code: int
    attempts: int = Field(ge=1)
    latency_ms: float = Field(ge=0)


class WebhookDeadLettered(Event):
    webhook_id: str
    source_event_id: UUID
    task_id: str
    task_status: str
    endpoint: str
    attempts: int = Field(ge=1)
    last_error: str


class WebhookStatus(StrEnum):
    """The statuses AllData hears. Terminal: succeeded, failed, cancelled, rejected (exactly
    one per task); `rejected` with `duplicate_submission` is about a refused submission."""

    SCHEDULED = "scheduled"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


class AllocatedResources(Contract):
    node: str
    gpu_ids: list[int]
    cpu_cores: list[int]
    numa_node: int | None
    checkpoint_path: str | None
    environment: dict[str, str] | None = Field(
        default=None,
        description="The CRATER_* variables the scheduler hands the task (CRATER_GPU_IDS, "
        "CRATER_CPU_CORES, ...), for a launcher to inject; None in bodies recorded before it.",
    )


class WebhookBody(Contract):
    """The JSON body POSTed to AllData for one lifecycle event."""

    task_id: str
    status: WebhookStatus
    allocated_resources: AllocatedResources | None = None
    allocation_id: str | None = Field(
        default=None,
        description="On `scheduled`: the allocation a launcher confirms and reports on "
        "(POST /api/v1/allocations/{allocation_id}/confirm, /status).",
    )
    reservation_token: str | None = Field(
        default=None,
        description="On `scheduled`: the token that confirms the allocation and signs the "
        "launcher's reports (CRATER_RESERVATION_TOKEN). A credential.",
    )
    reservation_expires_at: AwareDatetime | None = Field(
        default=None,
        description="On `scheduled`: confirm before this and the reservation holds (the "
        "deadline as decided; the one that counts is this or a little later).",
    )
    event_id: UUID = Field(description="The source event's id; also the webhook-id header.")
    occurred_at: AwareDatetime = Field(description="When the source event happened.")
    reason: str | None = None
    release_reason: str | None = Field(
        default=None,
        description="For a release: why the resources went back (expired, preempted, succeeded, "
        "failed, cancelled, node-lost, scaled-in).",
    )
    sequence: int | None = Field(
        default=None,
        description="The scheduler's number for the source event: grows with each event of the "
        "task (with gaps); None for events of other producers (a node's status report).",
    )
    gang_index: int | None = Field(
        default=None,
        ge=0,
        description="A gang's webhooks come one per member (each `scheduled` with its own "
        "node and GPUs): which member this is, 0-based; None for a task that is not a gang.",
    )
    gang_size: int | None = Field(
        default=None, ge=2, description="How many members the gang has; None when not a gang."
    )
    escalated_priority: int | None = Field(
        default=None,
        description="Set on the `pending` webhook sent when the task waited past "
        "sla.max_queue_time_seconds: the priority (0..1000) it now waits at.",
    )

    attempt: int | None = Field(
        default=None,
        ge=1,
        description="Which attempt of the task (restart policy); None where it does not apply.",
    )
    duplicate_submission: bool | None = Field(
        default=None,
        description="True on a `rejected` that refuses a submission reusing a known task id: "
        "not the known task's end.",
    )
    gpu_utilization_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Set on the `running` webhook that says the task used its GPUs less than "
        "its sla.min_gpu_utilization_percent: the mean measured over the window.",
    )
    min_gpu_utilization_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="With gpu_utilization_percent: the task's sla.min_gpu_utilization_percent.",
    )
    # Left out of the JSON when None: the bodies of every other webhook read as before.
    queue_position: int | None = Field(
        default=None,
        ge=1,
        exclude_if=lambda position: position is None,
        description="On the `pending` webhook of a start estimate (task.estimated): the task's "
        "place in its pool's queue, 1 the next.",
    )
    estimated_start_at: AwareDatetime | None = Field(
        default=None,
        exclude_if=lambda moment: moment is None,
        description="On the `pending` webhook of a start estimate: when the task is estimated "
        "to start if nothing new arrives (absent: no estimate; `reason` says why).",
    )

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


class TenantBudgetWebhookBody(Contract):
    """The JSON body POSTed for `tenant.budget_exceeded`: about a tenant, not a task, so the
    same in both formats (AllData's task webhook has no place for it). Told once per tenant,
    limit, period and budget amount; the `webhook-id` header is `event_id`."""

    event: Literal["tenant.budget_exceeded"] = "tenant.budget_exceeded"
    tenant: str
    limit: Literal["soft", "hard"]
    period: Literal["monthly", "daily"]
    period_start: AwareDatetime
    period_end: AwareDatetime
    budget: Decimal = Field(description="The limit passed, in `currency` (a JSON string).")
    cost: Decimal = Field(description="Spent in the period so far (a JSON string).")
    currency: str
    held: bool = Field(description="True for a hard limit: the tenant's new work waits.")
    event_id: UUID
    occurred_at: AwareDatetime
    reason: str

    def encode(self) -> bytes:
        return self.model_dump_json().encode()
