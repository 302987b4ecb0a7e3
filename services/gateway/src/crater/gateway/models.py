"""What the gateway's HTTP API takes and answers beyond the contracts, and its error bodies."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from crater.contracts import (
    Contract,
    FieldError,
    GpuPhase,
    LendingState,
    ResourcePrediction,
    TaskRequest,
    TaskStatus,
)
from crater.contracts.queries import TaskPlacementAnswer

SCHEDULER_NOT_ANSWERING = "scheduler not answering"
PREDICTOR_NOT_ANSWERING = "predictor not answering"


class ScheduleAccepted(BaseModel):
    task_id: str
    event_id: UUID
    status: Literal["submitted"] = "submitted"


class BatchResult(BaseModel):
    """One element of an array submission: the status and the answer a single body with
    this element would have had."""

    index: int = Field(ge=0, description="The element's place in the array, from 0.")
    task_id: str | None = Field(description="Its task id; None when it could not be read.")
    status: int = Field(description="202 accepted, or the refusal's status (409, 422, 403, 503).")
    body: dict[str, Any] = Field(
        description="The answer: ScheduleAccepted for 202, else FieldErrors, TaskKnown or "
        "Problem, as for a single body."
    )

    @classmethod
    def of(
        cls, index: int, task_id: str | None, answer: ScheduleAccepted | JSONResponse
    ) -> BatchResult:
        if isinstance(answer, JSONResponse):
            return cls(
                index=index,
                task_id=task_id,
                status=answer.status_code,
                body=json.loads(bytes(answer.body)),
            )
        return cls(index=index, task_id=task_id, status=202, body=answer.model_dump(mode="json"))


class ScheduleBatchAnswer(BaseModel):
    """The array form's answer (207): every element's outcome, in order."""

    accepted: int = Field(ge=0, description="Elements accepted (202).")
    refused: int = Field(ge=0, description="Elements refused, each with its reason.")
    results: list[BatchResult]


class CancelAccepted(BaseModel):
    task_id: str
    event_id: UUID
    status: Literal["cancelling"] = "cancelling"
    previous: TaskStatus | Literal["submitted"] = Field(
        description="The task's status when cancelled; `submitted`: accepted here, not yet "
        "known to the scheduler (the cancel waits for it there)."
    )


class UsageAccepted(BaseModel):
    task_id: str
    event_id: UUID


class PhaseAccepted(BaseModel):
    """A phase report published: where the lending stands comes on `crater.v1.task.lending`."""

    task_id: str
    event_id: UUID
    phase: GpuPhase


class PhaseStanding(BaseModel):
    """Where the lending of a task's cards stands (the scheduler's word, now)."""

    task_id: str
    allocation_id: str
    lending: LendingState = Field(
        description="`lent`, `reclaiming` (replicas leaving), `returned` (nothing is lent)."
    )
    must_be_free_by: datetime | None = Field(
        default=None, description="`reclaiming`: when the replicas are gone at the latest."
    )


class AllocationConfirm(Contract):
    """A launcher confirms the allocation it runs the task on."""

    token: str = Field(
        min_length=1,
        max_length=256,
        description="The allocation's reservation token (the `scheduled` webhook, "
        "CRATER_RESERVATION_TOKEN).",
    )
    heartbeat_grace_seconds: float | None = Field(
        default=None,
        ge=5,
        le=86_400,
        description="Fail the task when no `running` comes for this long (default the "
        "scheduler's CRATER_SCHEDULER_TASK_HEARTBEAT_GRACE_SECONDS).",
    )


class AllocationStatus(Contract):
    """A launcher's report on the task it runs: `running` (again: a heartbeat), `succeeded`
    or `failed` (the task's end, with its exit code and why)."""

    token: str = Field(min_length=1, max_length=256, description="The reservation token.")
    status: Literal[TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED]
    exit_code: int | None = Field(
        default=None, ge=-255, le=255, description="On succeeded or failed only."
    )
    reason: str | None = Field(default=None, max_length=2048, description="Said in task.ended.")
    heartbeat_grace_seconds: float | None = Field(default=None, ge=5, le=86_400)
    out_of_memory: bool = Field(
        default=False,
        description="On failed: it ran out of memory (host or GPU), a failure of kind oom "
        "that restart_policy.on_failure_kinds can key on.",
    )


class ReportAccepted(BaseModel):
    """The report is on the bus; the scheduler, which checks the token again, decides."""

    allocation_id: str
    task_id: str
    event_id: UUID
    status: TaskStatus
    reservation_expires_at: datetime | None = Field(
        description="The reservation's real deadline (confirmed: it no longer expires)."
    )


# A launcher's refusal by the scheduler's verdict: the status, and the field it names.
VERDICT_STATUS: dict[str, tuple[int, str]] = {
    "forged": (403, "token"),
    "unknown": (404, "allocation_id"),
    "released": (409, "token"),
    "expired": (410, "token"),
}
AllocationId = Annotated[str, Path(min_length=1, max_length=64)]
# The report's fields under the names the HTTP body gives them.
REPORT_FIELDS = {"reservation_token": "token", "message": "reason"}


class FieldErrors(BaseModel):
    """Every field that is wrong and why; `body` means the body as a whole."""

    detail: list[FieldError]


class TaskKnown(BaseModel):
    """A submission reusing a task id Crater knows: refused, and the known task unchanged.
    A task id is used once, an ended task's too."""

    detail: list[FieldError] = Field(description="`task_id` and why.")
    task_id: str
    status: TaskStatus | Literal["submitted"] = Field(
        description="The known task's status; `submitted`: accepted here, not yet known to "
        "the scheduler (being profiled, or refused by the predictor)."
    )


class Problem(BaseModel):
    detail: str


class TaskDryRun(Contract):
    """What submitting the task would do now; nothing was submitted, claimed or reserved."""

    task_id: str
    dry_run: Literal[True] = True
    prediction: ResourcePrediction = Field(
        description="What the predictor would predict (its learned correction included)."
    )
    placement: TaskPlacementAnswer = Field(
        description="Where the scheduler would put it (every gang member), or why it would "
        "wait or be rejected."
    )


class ResolvedJob(Contract):
    """A job description resolved: `task` is a body to POST to /api/v1/schedule as is."""

    task: TaskRequest
    prediction: ResourcePrediction
    explanation: str


class Health(BaseModel):
    status: Literal["ok"] = "ok"


# The answers of a route that asks the scheduler.
ANSWERS: dict[int | str, dict[str, Any]] = {
    503: {"model": Problem, "description": SCHEDULER_NOT_ANSWERING},
    502: {"model": Problem, "description": "The scheduler's answer did not validate."},
}


def field_errors_response(status: int, errors: list[FieldError]) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"detail": [e.model_dump(mode="json") for e in errors]},
    )


def problem(status: int, detail: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail})


def nats_unavailable(error: BaseException) -> JSONResponse:
    return problem(503, f"NATS unavailable: {type(error).__name__}")


def task_known(task_id: str, status: str, reason: str) -> JSONResponse:
    known = TaskKnown(
        detail=[FieldError(field="task_id", reason=reason)], task_id=task_id, status=status
    )
    return JSONResponse(status_code=409, content=known.model_dump(mode="json"))
