"""Submitting a task (or asking what a submission would do) and resolving a job description."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace

from crater.contracts import FieldError, JobDescription, TaskRequest, TaskSubmitted
from crater.contracts.queries import (
    PlacementAnswer,
    PlacementQuery,
    PredictionAnswer,
    PredictionQuery,
    QuerySubjects,
    ResolveAnswer,
    ResolveQuery,
    TaskPlacementAnswer,
    TaskPlacementQuery,
)
from crater.gateway.auth import Authenticator, Denied, Principal, submitted_as
from crater.gateway.bodies import (
    ArrayUnreadable,
    BodyTooLarge,
    is_array,
    parse_task_batch,
    parse_task_request,
    read_limited,
    submission_id,
)
from crater.gateway.bus import Bus
from crater.gateway.claims import body_digest
from crater.gateway.deps import BusDep, Reader, SettingsDep, SubmissionsDep, Submitter
from crater.gateway.models import (
    ANSWERS,
    PREDICTOR_NOT_ANSWERING,
    BatchResult,
    FieldErrors,
    Problem,
    ResolvedJob,
    ScheduleAccepted,
    ScheduleBatchAnswer,
    TaskDryRun,
    TaskKnown,
    field_errors_response,
    nats_unavailable,
)
from crater.gateway.settings import GatewaySettings
from crater.gateway.submissions import Submissions
from crater.runtime.service import BUS_ERRORS

log = logging.getLogger("crater.gateway")

router = APIRouter()


async def dry_run_task(bus: Bus, request: TaskRequest) -> TaskDryRun | JSONResponse:
    """Ask the predictor, then the scheduler with its prediction, what a submission of
    `request` would do: the same two steps as the bus, publishing and claiming nothing."""
    predicted = await bus.ask(
        QuerySubjects.PREDICTION, PredictionQuery(task=request), PredictionAnswer, "predictor"
    )
    if isinstance(predicted, JSONResponse):
        return predicted
    if predicted.prediction is None:  # a submission would end task.rejected, these errors
        return field_errors_response(422, predicted.errors)
    query = TaskPlacementQuery(task=request, prediction=predicted.prediction)
    placed = await bus.ask(QuerySubjects.TASK_PLACEMENT, query, TaskPlacementAnswer)
    if isinstance(placed, JSONResponse):
        return placed
    return TaskDryRun(task_id=request.task_id, prediction=predicted.prediction, placement=placed)


@router.post(
    "/api/v1/schedule",
    status_code=202,
    response_model=ScheduleAccepted,
    responses={
        200: {
            "model": TaskDryRun,
            "description": "dry_run=true: what a submission would do; nothing submitted.",
        },
        207: {
            "model": ScheduleBatchAnswer,
            "description": "The array form: each element's own status and answer, in order.",
        },
        503: {
            "model": Problem,
            "description": "NATS unavailable, or the task id is being submitted by another "
            "request not yet confirmed (Retry-After); dry_run=true: the predictor or the "
            "scheduler not answering.",
        },
        409: {
            "model": TaskKnown,
            "description": "The task id is known already (its status says how far it "
            "got): a task id is used once, an ended task's too.",
        },
        413: {"model": FieldErrors, "description": "Body larger than max_body_bytes."},
        422: {"model": FieldErrors, "description": "Every invalid field and why."},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/TaskRequest"},
                            {
                                "type": "array",
                                "items": {"$ref": "#/components/schemas/TaskRequest"},
                                "minItems": 1,
                                "description": "A burst: up to max_batch_tasks tasks, "
                                "answered 207 with each one's outcome.",
                            },
                        ]
                    }
                }
            },
        }
    },
)
async def schedule(
    request: Request,
    principal: Submitter,
    settings: SettingsDep,
    bus: BusDep,
    submissions: SubmissionsDep,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=256, description="Retries with the same key and body submit once."),
    ] = None,
    dry_run: Annotated[
        bool,
        Query(
            description="Answer (200) what a submission would do: the prediction, the node "
            "(every gang member's), or why it would wait or be rejected. Nothing is "
            "submitted, the task id is not taken, nothing is reserved."
        ),
    ] = False,
) -> ScheduleAccepted | JSONResponse:
    try:
        body = await read_limited(
            request.stream(), settings.max_body_bytes, request.headers.get("content-length")
        )
    except BodyTooLarge as error:
        return field_errors_response(413, [FieldError(field="body", reason=str(error))])
    if is_array(body):
        if dry_run:
            reason = "a dry run takes one task, not an array"
            return field_errors_response(422, [FieldError(field="dry_run", reason=reason)])
        return await submit_batch(request, body, principal, settings, submissions, idempotency_key)
    parsed = parse_task_request(body, settings.max_json_depth)
    if not isinstance(parsed, TaskRequest):
        return field_errors_response(422, parsed)
    parsed = submitted_as(principal, parsed)

    if dry_run:
        answered = await dry_run_task(bus, parsed)
        if isinstance(answered, JSONResponse):
            return answered
        # 200, not the route's 202: nothing was accepted.
        return JSONResponse(status_code=200, content=answered.model_dump(mode="json"))
    event = TaskSubmitted.from_request(parsed)
    if idempotency_key:
        event = event.model_copy(update={"event_id": submission_id(parsed, idempotency_key)})
    trace.get_current_span().set_attribute("crater.task_id", parsed.task_id)
    try:
        return await submissions.submit(event, body_digest(parsed))
    except BUS_ERRORS as error:
        log.warning("could not submit task %s: %r", parsed.task_id, error)
        return nats_unavailable(error)


async def submit_batch(
    request: Request,
    body: bytes,
    principal: Principal,
    settings: GatewaySettings,
    submissions: Submissions,
    idempotency_key: str | None,
) -> JSONResponse:
    """The array form: each element judged and submitted as a single body would be, up to
    `batch_concurrency` at once (claims, publishes and their acks overlap instead of one
    after the other); 207 with each element's own status and answer, in order. An element is
    never 202 before JetStream has its message."""
    try:
        parsed = parse_task_batch(body, settings.max_json_depth, settings.max_batch_tasks)
    except ArrayUnreadable as error:
        return field_errors_response(422, error.errors)
    authenticator: Authenticator = request.app.state.auth
    limit = asyncio.Semaphore(settings.batch_concurrency)
    first_of: dict[str, int] = {}

    async def one(index: int, item: TaskRequest | list[FieldError]) -> BatchResult:
        if isinstance(item, list):
            return BatchResult.of(index, None, field_errors_response(422, item))
        try:
            task = submitted_as(principal, item)
        except Denied as error:  # counted and logged as every denial
            return BatchResult.of(index, item.task_id, authenticator.answer(request, error))
        earlier = first_of.setdefault(task.task_id, index)
        if earlier != index:
            reason = f"repeats element {earlier}'s task id: a task id is used once"
            refused = field_errors_response(422, [FieldError(field="task_id", reason=reason)])
            return BatchResult.of(index, task.task_id, refused)
        event = TaskSubmitted.from_request(task)
        if idempotency_key:  # each element its own key: a retried array submits each once
            event_id = submission_id(task, f"{idempotency_key}#{index}")
            event = event.model_copy(update={"event_id": event_id})
        async with limit:
            try:
                answer = await submissions.submit(event, body_digest(task))
            except BUS_ERRORS as error:
                log.warning("could not submit task %s: %r", task.task_id, error)
                answer = nats_unavailable(error)
        return BatchResult.of(index, task.task_id, answer)

    results = await asyncio.gather(*(one(i, item) for i, item in enumerate(parsed)))
    trace.get_current_span().set_attribute("crater.batch_size", len(results))
    answer = ScheduleBatchAnswer(
        accepted=sum(r.status == 202 for r in results),
        refused=sum(r.status != 202 for r in results),
        results=results,
    )
    return JSONResponse(status_code=207, content=answer.model_dump(mode="json"))


@router.post(
    "/api/v1/schedule/dry-run",
    response_model=PlacementAnswer,
    responses={422: {"model": FieldErrors}, **ANSWERS},
)
async def dry_run(query: PlacementQuery, bus: BusDep, _: Reader) -> PlacementAnswer | JSONResponse:
    """Where would these resources go, and why not elsewhere? Nothing is reserved."""
    return await bus.ask(QuerySubjects.PLACEMENT, query, PlacementAnswer)


@router.post(
    "/api/v1/resolve",
    response_model=ResolvedJob,
    responses={
        422: {"model": FieldErrors, "description": "Every invalid field and why."},
        503: {"model": Problem, "description": PREDICTOR_NOT_ANSWERING},
        502: {"model": Problem, "description": "The predictor's answer did not validate."},
    },
)
async def resolve(job: JobDescription, bus: BusDep, _: Reader) -> ResolvedJob | JSONResponse:
    """AllData's job description (framework, model size, data volume) turned into a full
    task request by the predictor: POST its `task` to /api/v1/schedule as is."""
    answer = await bus.ask(QuerySubjects.RESOLVE, ResolveQuery(job=job), ResolveAnswer, "predictor")
    if isinstance(answer, JSONResponse):
        return answer
    if answer.task is None or answer.prediction is None:
        return field_errors_response(422, answer.errors)
    return ResolvedJob(
        task=answer.task, prediction=answer.prediction, explanation=answer.explanation
    )
