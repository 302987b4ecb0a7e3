"""A launcher's confirmation of, and reports on, the allocation it runs a task on."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from opentelemetry import trace
from pydantic import ValidationError

from crater.contracts import FieldError, TaskStatus, TaskStatusReported
from crater.contracts.queries import AllocationCheck, AllocationQuery, QuerySubjects
from crater.gateway.bus import Bus
from crater.gateway.deps import BusDep
from crater.gateway.models import (
    ANSWERS,
    REPORT_FIELDS,
    VERDICT_STATUS,
    AllocationConfirm,
    AllocationId,
    AllocationStatus,
    FieldErrors,
    ReportAccepted,
    field_errors_response,
    nats_unavailable,
)
from crater.runtime.bus import field_errors
from crater.runtime.service import BUS_ERRORS

log = logging.getLogger("crater.gateway")

router = APIRouter()

LAUNCHER_ANSWERS: dict[int | str, dict[str, Any]] = {
    403: {
        "model": FieldErrors,
        "description": "`token`: malformed, forged, or another allocation's.",
    },
    404: {"model": FieldErrors, "description": "`allocation_id`: never granted."},
    409: {
        "model": FieldErrors,
        "description": "`token`: the allocation was released (the "
        "task ended, was cancelled, preempted, ...).",
    },
    410: {"model": FieldErrors, "description": "`token`: the reservation expired unconfirmed."},
    422: {"model": FieldErrors, "description": "Every invalid field and why."},
    **ANSWERS,
}


async def launcher_report(
    bus: Bus,
    allocation_id: str,
    token: str,
    status: TaskStatus,
    **fields: Any,
) -> ReportAccepted | JSONResponse:
    """Ask the scheduler whether it would take the report (the token, the reservation),
    answer its refusal by name, else publish the report on task.status."""
    query = AllocationQuery(allocation_id=allocation_id, reservation_token=token)
    check = await bus.ask(QuerySubjects.ALLOCATION, query, AllocationCheck)
    if isinstance(check, JSONResponse):
        return check
    if check.verdict != "accepted" or check.task_id is None:
        code, field = VERDICT_STATUS.get(check.verdict, (409, "token"))
        reason = check.reason or check.verdict
        return field_errors_response(code, [FieldError(field=field, reason=reason)])
    try:
        report = TaskStatusReported(
            task_id=check.task_id,
            status=status,
            allocation_id=allocation_id,
            reservation_token=token,
            # a `running` about a confirmed allocation says it is alive, nothing new
            heartbeat=status is TaskStatus.RUNNING and check.running,
            **fields,
        )
    except ValidationError as error:
        errors = [
            FieldError(field=REPORT_FIELDS.get(e.field, e.field), reason=e.reason)
            for e in field_errors(error)
        ]
        return field_errors_response(422, errors)
    trace.get_current_span().set_attribute("crater.task_id", check.task_id)
    try:
        await bus.publish(report)
    except BUS_ERRORS as error:
        log.warning("could not publish a report of %s: %r", allocation_id, error)
        return nats_unavailable(error)
    return ReportAccepted(
        allocation_id=allocation_id,
        task_id=check.task_id,
        event_id=report.event_id,
        status=status,
        reservation_expires_at=None if check.running else check.reservation_expires_at,
    )


@router.post(
    "/api/v1/allocations/{allocation_id}/confirm",
    status_code=202,
    response_model=ReportAccepted,
    responses=LAUNCHER_ANSWERS,
)
async def confirm_allocation(
    allocation_id: AllocationId, body: AllocationConfirm, bus: BusDep
) -> ReportAccepted | JSONResponse:
    """A launcher (AllData, `crater_client.run_task`) confirms the allocation it runs the
    task on, with its reservation token: the reservation no longer expires, and from now
    on the task is failed if its `running` reports (heartbeats, `/status`) stop for the
    grace. The scheduler checks the token and the reservation's real deadline first."""
    return await launcher_report(
        bus,
        allocation_id,
        body.token,
        TaskStatus.RUNNING,
        message="confirmed through the API",
        heartbeat_grace_seconds=body.heartbeat_grace_seconds,
    )


@router.post(
    "/api/v1/allocations/{allocation_id}/status",
    status_code=202,
    response_model=ReportAccepted,
    responses=LAUNCHER_ANSWERS,
)
async def allocation_status(
    allocation_id: AllocationId, body: AllocationStatus, bus: BusDep
) -> ReportAccepted | JSONResponse:
    """The launcher's report on the task: `running` (a heartbeat; the first confirms),
    `succeeded` or `failed` with the exit code and reason: the scheduler ends the task
    (task.ended, the webhook) with them."""
    return await launcher_report(
        bus,
        allocation_id,
        body.token,
        body.status,
        exit_code=body.exit_code,
        message=body.reason,
        heartbeat_grace_seconds=body.heartbeat_grace_seconds,
        out_of_memory=body.out_of_memory,
    )
