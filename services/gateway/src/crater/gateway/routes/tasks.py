"""The tasks the scheduler knows, cancelling one, and a running task's usage samples."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from pydantic import ValidationError

from crater.contracts import (
    FieldError,
    LendingState,
    TaskPhaseReported,
    TaskStatus,
    TaskStatusReported,
    TaskUsageReported,
)
from crater.contracts.queries import (
    AllocationCheck,
    AllocationQuery,
    AuditExplainAnswer,
    AuditExplainQuery,
    QuerySubjects,
    TasksAnswer,
    TasksQuery,
    TaskSummary,
)
from crater.gateway.auth import Authenticator, Principal
from crater.gateway.bodies import BodyTooLarge, parse_body, read_limited
from crater.gateway.bus import Bus
from crater.gateway.deps import (
    AuthDep,
    BusDep,
    Canceller,
    Reader,
    SettingsDep,
    SubmissionsDep,
    UsageReporter,
)
from crater.gateway.models import (
    ANSWERS,
    VERDICT_STATUS,
    CancelAccepted,
    FieldErrors,
    PhaseAccepted,
    PhaseStanding,
    Problem,
    UsageAccepted,
    field_errors_response,
    nats_unavailable,
    problem,
)
from crater.gateway.settings import GatewaySettings
from crater.runtime.service import BUS_ERRORS

log = logging.getLogger("crater.gateway")
# What a running task reports about itself with its reservation token.
Report = TypeVar("Report", TaskUsageReported, TaskPhaseReported)

router = APIRouter()

MAX_TASKS = 10_000  # the most a TasksQuery may ask for


@router.get(
    "/api/v1/tasks",
    response_model=TasksAnswer,
    responses={422: {"model": FieldErrors}, **ANSWERS},
)
async def tasks(
    bus: BusDep,
    principal: Reader,
    status: TaskStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> TasksAnswer | JSONResponse:
    """The tasks the scheduler knows, newest first; a tenant's credential sees its own only
    (among the scheduler's latest 10,000), an admin's every tenant's."""
    if principal.sees_all:
        query = TasksQuery(status=status, limit=limit)
        return await bus.ask(QuerySubjects.TASKS, query, TasksAnswer)
    query = TasksQuery(status=status, limit=MAX_TASKS)
    answer = await bus.ask(QuerySubjects.TASKS, query, TasksAnswer)
    if isinstance(answer, JSONResponse):
        return answer
    return TasksAnswer(tasks=[t for t in answer.tasks if t.tenant == principal.tenant][:limit])


def unknown_task(task_id: str) -> JSONResponse:
    return problem(404, f"task {task_id!r} is not known")


def hidden(
    auth: Authenticator, request: Request, principal: Principal, task_id: str
) -> JSONResponse:
    """Another tenant's task: answered as unknown (not to reveal it), logged and counted."""
    auth.refused(request, "other_tenant", f"task {task_id!r} is not tenant {principal.tenant!r}'s")
    return unknown_task(task_id)


async def known_task(bus: Bus, task_id: str) -> TaskSummary | JSONResponse:
    """The scheduler's summary of `task_id`, or the 404 (or its not answering) as a response."""
    answer = await bus.ask(QuerySubjects.TASKS, TasksQuery(task_id=task_id, limit=1), TasksAnswer)
    if isinstance(answer, JSONResponse):
        return answer
    for summary in answer.tasks:
        if summary.task_id == task_id:
            return summary
    return unknown_task(task_id)


@router.get(
    "/api/v1/tasks/{task_id}",
    response_model=TaskSummary,
    responses={404: {"model": Problem}, **ANSWERS},
)
async def task(
    task_id: str, request: Request, bus: BusDep, auth: AuthDep, principal: Reader
) -> TaskSummary | JSONResponse:
    known = await known_task(bus, task_id)
    if isinstance(known, TaskSummary) and not principal.owns(known.tenant):
        return hidden(auth, request, principal, task_id)
    return known


@router.get(
    "/api/v1/tasks/{task_id}/audit",
    response_model=AuditExplainAnswer,
    responses={
        404: {"model": Problem},
        422: {"model": FieldErrors, "description": "Every invalid parameter and why."},
        **ANSWERS,
    },
)
async def task_audit(
    task_id: str,
    request: Request,
    bus: BusDep,
    auth: AuthDep,
    principal: Reader,
    placements: bool = False,
) -> AuditExplainAnswer | JSONResponse:
    """The task's whole story from the scheduler's audit log (docs/audit.md): every decision
    about it, in order, with the decision's time and the leader epoch; with `placements`, for
    each placement the nodes each filter removed and the scores of the others, as they were
    (a replay from the nearest snapshot before it). The scheduler answers within half the
    gateway's query timeout with what it has: `truncated` true (200) and `notes` saying what
    was left out (placements past the first 5, or not replayed in time), which
    `crater audit explain TASK_ID` tells in full."""
    known = await known_task(bus, task_id)
    if isinstance(known, JSONResponse):
        return known
    if not principal.owns(known.tenant):
        return hidden(auth, request, principal, task_id)
    # half the timeout: the scheduler's reading, the reply and the lookup above fit in the rest
    budget = bus.settings.query_timeout_seconds / 2
    query = AuditExplainQuery(task_id=task_id, placements=placements, budget_seconds=budget)
    return await bus.ask(QuerySubjects.AUDIT_EXPLAIN, query, AuditExplainAnswer)


@router.post(
    "/api/v1/tasks/{task_id}/cancel",
    status_code=202,
    response_model=CancelAccepted,
    responses={
        404: {"model": Problem, "description": "No such task was ever accepted."},
        409: {"model": Problem, "description": "The task has ended already."},
        **ANSWERS,
    },
)
async def cancel(
    task_id: str,
    request: Request,
    bus: BusDep,
    submissions: SubmissionsDep,
    auth: AuthDep,
    principal: Canceller,
) -> CancelAccepted | JSONResponse:
    """Cancel a task: a waiting one leaves the queue, a placed or running one has its
    resources released (reason `cancelled`); its status ends `cancelled`. A task accepted
    but not yet known to the scheduler (still being profiled) is cancelled as it arrives
    there, and is never placed."""
    known = await known_task(bus, task_id)
    previous: TaskStatus | Literal["submitted"]
    if isinstance(known, TaskSummary):
        if not principal.owns(known.tenant):
            return hidden(auth, request, principal, task_id)
        if known.status.is_final:
            return problem(409, f"task {task_id!r} has ended already: {known.status.value}")
        previous = known.status
    elif known.status_code != 404:
        return known
    else:
        try:
            claim = await submissions.accepted_claim(task_id)
            if claim is None:
                return known
        except BUS_ERRORS as error:
            log.warning("could not look up task %s: %r", task_id, error)
            return nats_unavailable(error)
        # A claim written before claims named their tenant is an admin's to cancel.
        if not principal.sees_all and claim.tenant != principal.tenant:
            return hidden(auth, request, principal, task_id)
        previous = "submitted"
    event = TaskStatusReported(
        task_id=task_id, status=TaskStatus.CANCELLED, message="cancelled through the API"
    )
    trace.get_current_span().set_attribute("crater.task_id", task_id)
    try:
        await bus.publish(event)
    except BUS_ERRORS as error:
        log.warning("could not publish the cancel of %s: %r", task_id, error)
        return nats_unavailable(error)
    return CancelAccepted(task_id=task_id, event_id=event.event_id, previous=previous)


router.add_api_route(
    "/api/v1/tasks/{task_id}",
    cancel,
    methods=["DELETE"],
    status_code=202,
    response_model=CancelAccepted,
    responses={404: {"model": Problem}, 409: {"model": Problem}, **ANSWERS},
    summary="Cancel (same as POST /api/v1/tasks/{task_id}/cancel)",
)


# What a running task's own report (a usage sample, a phase) may be answered, by its token.
OWN_REPORT_ANSWERS: dict[int | str, dict[str, Any]] = {
    403: {"model": FieldErrors, "description": "`token`: forged or another allocation's."},
    404: {
        "model": FieldErrors | Problem,
        "description": "`allocation_id`: never granted; or a task not the credential's.",
    },
    409: {"model": FieldErrors, "description": "`token`: the allocation was released."},
    410: {"model": FieldErrors, "description": "`token`: the reservation expired."},
    413: {"model": FieldErrors, "description": "Body larger than max_body_bytes."},
    422: {"model": FieldErrors, "description": "Every invalid field and why."},
    503: {"model": Problem, "description": "NATS unavailable."},
}


def own_report_body(schema: str) -> dict[str, Any]:
    """The OpenAPI request body of a report read raw (checked by own_report, not FastAPI)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    }


@router.post(
    "/api/v1/tasks/{task_id}/usage",
    status_code=202,
    response_model=UsageAccepted,
    responses=OWN_REPORT_ANSWERS,
    openapi_extra=own_report_body("TaskUsageReported"),
)
async def usage(
    task_id: str,
    request: Request,
    settings: SettingsDep,
    bus: BusDep,
    auth: AuthDep,
    reporter: UsageReporter,
) -> UsageAccepted | JSONResponse:
    """One sample of a running task's own use (crater_client.start_monitoring), published
    as it is for the predictor. A retried POST keeps its event_id and is published once.
    With auth on: the `submit` scope, and a tenant's credential reports on its own tasks
    only (the scheduler must know the task); or, without a credential, the task's own
    reservation token in `Crater-Reservation-Token`, with the sample's `allocation_id`."""
    sample = await own_report(task_id, request, settings, bus, auth, reporter, TaskUsageReported)
    if isinstance(sample, JSONResponse):
        return sample
    return UsageAccepted(task_id=task_id, event_id=sample.event_id)


@router.post(
    "/api/v1/tasks/{task_id}/phase",
    status_code=202,
    response_model=PhaseAccepted,
    responses=OWN_REPORT_ANSWERS,
    openapi_extra=own_report_body("TaskPhaseReported"),
)
async def phase(
    task_id: str,
    request: Request,
    settings: SettingsDep,
    bus: BusDep,
    auth: AuthDep,
    reporter: UsageReporter,
) -> PhaseAccepted | JSONResponse:
    """A running task enters (`cpu`) or leaves (`gpu`) a phase in which its GPUs are idle
    (crater_client's `cpu_phase`): published for the scheduler, which lends its cards to
    inference replicas meanwhile and says where that stands on `crater.v1.task.lending`.
    Authenticated as a usage sample is: the task's own reservation token (or a credential
    with `submit` on its tenant's tasks)."""
    report = await own_report(task_id, request, settings, bus, auth, reporter, TaskPhaseReported)
    if isinstance(report, JSONResponse):
        return report
    return PhaseAccepted(task_id=task_id, event_id=report.event_id, phase=report.phase)


@router.get(
    "/api/v1/tasks/{task_id}/phase",
    response_model=PhaseStanding,
    responses={
        403: {"model": FieldErrors, "description": "`token`: forged or another allocation's."},
        404: {"model": FieldErrors, "description": "`allocation_id`: never granted."},
        409: {"model": FieldErrors, "description": "`token`: the allocation was released."},
        410: {"model": FieldErrors, "description": "`token`: the reservation expired."},
        422: {"model": FieldErrors, "description": "Every invalid field and why."},
        503: {"model": Problem, "description": "NATS unavailable."},
    },
)
async def phase_standing(
    task_id: str,
    bus: BusDep,
    _: UsageReporter,
    allocation_id: Annotated[str, Query(min_length=1, max_length=256)],
    crater_reservation_token: Annotated[str | None, Header(max_length=4096)] = None,
) -> PhaseStanding | JSONResponse:
    """Where the lending of a task's cards stands, asked with its own reservation token (as
    `crater_client.cpu_phase` does on leaving, until its cards are its own): `lent`,
    `reclaiming` (the replicas gone by `must_be_free_by`), or `returned` (nothing is lent)."""
    if not crater_reservation_token:
        reason = "required: the task's own reservation token (CRATER_RESERVATION_TOKEN)"
        missing = FieldError(field="crater-reservation-token", reason=reason)
        return field_errors_response(422, [missing])
    check = await checked_allocation(bus, task_id, allocation_id, crater_reservation_token)
    if isinstance(check, JSONResponse):
        return check
    return PhaseStanding(
        task_id=task_id,
        allocation_id=allocation_id,
        lending=check.lending or LendingState.RETURNED,
        must_be_free_by=check.must_be_free_by,
    )


async def own_report(
    task_id: str,
    request: Request,
    settings: GatewaySettings,
    bus: Bus,
    auth: Authenticator,
    reporter: Principal | str,
    kind: type[Report],
) -> Report | JSONResponse:
    """A running task's report about itself, read (bounded), checked (the path's task; the
    reservation token's allocation, held now by that task, or the credential's tenant) and
    published; or the refusal, naming the field."""
    try:
        body = await read_limited(
            request.stream(), settings.max_body_bytes, request.headers.get("content-length")
        )
    except BodyTooLarge as error:
        return field_errors_response(413, [FieldError(field="body", reason=str(error))])
    report = parse_body(body, kind, settings.max_json_depth)
    if isinstance(report, list):
        return field_errors_response(422, report)
    if report.task_id != task_id:
        reason = f"{report.task_id!r} is not the task in the path, {task_id!r}"
        return field_errors_response(422, [FieldError(field="task_id", reason=reason)])
    if isinstance(reporter, str):
        refused = await own_allocation(bus, report, reporter)
        if refused is not None:
            return refused
    elif not reporter.sees_all:
        known = await known_task(bus, task_id)
        if not isinstance(known, TaskSummary):
            return known
        if not reporter.owns(known.tenant):
            return hidden(auth, request, reporter, task_id)
    trace.get_current_span().set_attribute("crater.task_id", task_id)
    try:
        await bus.publish(report)
    except BUS_ERRORS as error:
        log.warning("could not publish a %s of %s: %r", kind.__name__, task_id, error)
        return nats_unavailable(error)
    return report


async def own_allocation(
    bus: Bus, sample: TaskUsageReported | TaskPhaseReported, token: str
) -> JSONResponse | None:
    """None when `token` is the reservation token of the sample's allocation, held now by
    its task; else the refusal, by the scheduler's verdict."""
    if sample.allocation_id is None:
        reason = "required with a reservation token: the allocation it was signed for"
        return field_errors_response(422, [FieldError(field="allocation_id", reason=reason)])
    check = await checked_allocation(bus, sample.task_id, sample.allocation_id, token)
    return check if isinstance(check, JSONResponse) else None


async def checked_allocation(
    bus: Bus, task_id: str, allocation_id: str, token: str
) -> AllocationCheck | JSONResponse:
    """The scheduler's word on `allocation_id`, when `token` is its reservation token and it
    is held now by `task_id`; else the refusal (403 forged or another's, 404 unknown, 409
    released, 410 expired, 422 a malformed id or token)."""
    try:
        query = AllocationQuery(allocation_id=allocation_id, reservation_token=token)
    except ValidationError as error:  # no allocation has such an id, no token such a form
        names = {"reservation_token": "crater-reservation-token"}
        refused = [
            FieldError(field=names.get(str(e["loc"][0]), str(e["loc"][0])), reason=e["msg"])
            for e in error.errors()
        ]
        return field_errors_response(422, refused)
    check = await bus.ask(QuerySubjects.ALLOCATION, query, AllocationCheck)
    if isinstance(check, JSONResponse):
        return check
    if check.verdict != "accepted":
        code, field = VERDICT_STATUS.get(check.verdict, (409, "token"))
        return field_errors_response(code, [FieldError(field=field, reason=check.reason or "")])
    if check.task_id != task_id:
        reason = f"allocation {allocation_id!r} is not task {task_id!r}'s"
        return field_errors_response(403, [FieldError(field="allocation_id", reason=reason)])
    return check
