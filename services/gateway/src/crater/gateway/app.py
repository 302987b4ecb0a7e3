"""The gateway: Crater's HTTP API. It publishes submitted tasks and asks the scheduler, over
NATS request-reply, for what it knows; it keeps nothing itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar
from uuid import UUID

import nats.errors
import nats.js.errors
from fastapi import FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from faststream.exceptions import IncorrectState
from faststream.nats import NatsBroker
from nats.js.kv import KeyValue
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from pydantic import BaseModel, Field, ValidationError

from crater.contracts import (
    Contract,
    FieldError,
    JobDescription,
    ResourcePrediction,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    TaskSubmitted,
    TaskUsageReported,
)
from crater.contracts.queries import (
    AllocationCheck,
    AllocationQuery,
    NodesAnswer,
    NodesQuery,
    PlacementAnswer,
    PlacementQuery,
    PredictionAnswer,
    PredictionQuery,
    QuerySubjects,
    ResolveAnswer,
    ResolveQuery,
    TaskPlacementAnswer,
    TaskPlacementQuery,
    TasksAnswer,
    TasksQuery,
    TaskSummary,
)
from crater.gateway.bodies import (
    BodyTooLarge,
    parse_body,
    parse_task_request,
    read_limited,
    request_errors,
    submission_id,
)
from crater.gateway.claims import (
    Claim,
    Verdict,
    body_digest,
    claim_key,
    claimed_reason,
    held,
    judge,
    known_reason,
    takeover_id,
)
from crater.gateway.observe import ObserveRequests
from crater.runtime.bus import (
    PUBLISH_ACK_TIMEOUT_SECONDS,
    ensure_streams,
    field_errors,
    publish,
)
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings

log = logging.getLogger("crater.gateway")

Answer = TypeVar("Answer", bound=Contract)
# What a NATS call raises when the server is away, the connection closed, or nobody answers.
BUS_ERRORS = (nats.errors.Error, TimeoutError, IncorrectState)
SCHEDULER_NOT_ANSWERING = "scheduler not answering"
PREDICTOR_NOT_ANSWERING = "predictor not answering"
# The task ids the gateway accepted (a JetStream key-value bucket, shared by every replica):
# each is claimed there once (claims.py), and a task still with the predictor, unknown to the
# scheduler, may yet be cancelled.
ACCEPTED_BUCKET = "crater_gateway_accepted"


class GatewaySettings(ServiceSettings):
    """Own settings from CRATER_GATEWAY_<NAME>; http_port 0 means 8080."""

    service = "gateway"
    default_port = 8080  # health and metrics when http_port is 0

    http_host: str = Field(default="127.0.0.1", description="Bind address of the HTTP API.")
    max_body_bytes: int = Field(
        default=256 * 1024, ge=1024, le=16 * 1024 * 1024, description="Largest accepted body."
    )
    query_timeout_seconds: float = Field(
        default=2.0, gt=0, le=60, description="How long to wait for the scheduler's answer."
    )
    health_timeout_seconds: float = Field(default=1.0, gt=0, le=30)
    remember_accepted_seconds: int = Field(
        default=7 * 24 * 3600,
        ge=60,
        description="How long an accepted task id is remembered, so that a task the scheduler "
        "has not heard of yet (still being profiled) can be cancelled, and its id is not "
        "submitted twice (the scheduler refuses ids it stored for good).",
    )
    abandoned_claim_seconds: float = Field(
        default=30.0,
        ge=10,
        le=3600,
        description="A task id claimed but never confirmed published (a gateway that died "
        "between the two) may be submitted again after this long; longer than any publish.",
    )


class ScheduleAccepted(BaseModel):
    task_id: str
    event_id: UUID
    status: Literal["submitted"] = "submitted"


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


def _field_errors(status: int, errors: list[FieldError]) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"detail": [e.model_dump(mode="json") for e in errors]},
    )


def _problem(status: int, detail: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail})


def _task_known(task_id: str, status: str, reason: str) -> JSONResponse:
    known = TaskKnown(
        detail=[FieldError(field="task_id", reason=reason)], task_id=task_id, status=status
    )
    return JSONResponse(status_code=409, content=known.model_dump(mode="json"))


class GatewayApi(FastAPI):
    """FastAPI with the task request's and the usage sample's schemas in the OpenAPI document:
    the schedule and usage endpoints read their bodies themselves (to bound their size and name
    fields as the bus does), so FastAPI would not otherwise know them."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema:
            return self.openapi_schema
        schema = super().openapi()
        request_schema = TaskRequest.model_json_schema(
            by_alias=True, ref_template="#/components/schemas/{model}"
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(request_schema.pop("$defs", {}))
        components["TaskRequest"] = request_schema
        usage_schema = TaskUsageReported.model_json_schema(
            by_alias=True, ref_template="#/components/schemas/{model}"
        )
        components.update(usage_schema.pop("$defs", {}))
        components["TaskUsageReported"] = usage_schema
        return schema


async def _stop(broker: NatsBroker) -> None:
    try:
        await broker.stop()
    except BUS_ERRORS:
        # Draining needs NATS; when it is away there is nothing left to flush, so just close.
        with suppress(IncorrectState):
            await broker.connection.close()


def build(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or GatewaySettings()
    service = create_service("gateway", settings)
    broker = service.broker

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await ensure_streams(settings.nats_url)
        await broker.start()
        app.state.accepted = await broker.key_value(
            ACCEPTED_BUCKET, ttl=settings.remember_accepted_seconds, history=1
        )
        log.info("gateway connected to %s", settings.nats_url)
        try:
            yield
        finally:
            await _stop(broker)
            service.tracer_provider.force_flush()

    app = GatewayApi(
        title="Crater gateway",
        version="1",
        description="Submit tasks to Crater and read what the scheduler knows.",
        lifespan=lifespan,
        separate_input_output_schemas=False,
    )
    app.state.service = service
    app.add_middleware(
        ObserveRequests,
        requests=Counter(
            "crater_gateway_requests",
            "HTTP requests answered, by method, route template and status code.",
            ["method", "route", "status"],
            registry=service.registry,
        ),
        seconds=Histogram(
            "crater_gateway_request_seconds",
            "HTTP request handling time, in seconds.",
            ["method", "route"],
            registry=service.registry,
        ),
        tracer=service.tracer_provider.get_tracer("crater.gateway"),
    )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError) -> JSONResponse:
        return _field_errors(422, request_errors(error.errors()))

    def accepted() -> KeyValue:
        bucket: KeyValue = app.state.accepted
        return bucket

    grace = timedelta(seconds=settings.abandoned_claim_seconds)
    # Longer than a publish may take (its ack timeout): a live claimer has confirmed by then.
    settle_seconds = PUBLISH_ACK_TIMEOUT_SECONDS + 1

    async def claim_of(task_id: str) -> tuple[Claim, int] | None:
        """The id's claim and its revision (for a compare-and-set), if any."""
        try:
            entry = await accepted().get(claim_key(task_id))
        except nats.js.errors.KeyNotFoundError:
            return None
        return Claim.decode(entry.value or b""), entry.revision or 0

    async def was_accepted(task_id: str) -> bool:
        """Whether this gateway (any replica) accepted `task_id` lately."""
        found = await claim_of(task_id)
        return held(found[0] if found else None, datetime.now(UTC), grace)

    async def scheduler_summary(task_id: str) -> TaskSummary | None:
        """The scheduler's view of `task_id`; None if it does not know it, or does not answer
        (then the claim alone decides here, and the scheduler refuses on the bus a duplicate
        it knows)."""
        query = TasksQuery(task_id=task_id, limit=1).model_dump_json().encode()
        try:
            # nats-py's own request: with no scheduler subscribed it fails at once (no
            # responders) instead of holding every submission for the whole timeout.
            reply = await broker.connection.request(
                QuerySubjects.TASKS, query, timeout=settings.query_timeout_seconds
            )
            answer = TasksAnswer.model_validate_json(reply.data)
        except (*BUS_ERRORS, ValidationError) as error:
            log.debug("no scheduler view of task %s: %r", task_id, error)
            return None
        return next((t for t in answer.tasks if t.task_id == task_id), None)

    async def publish_claimed(event: TaskSubmitted, claim: Claim, revision: int) -> None:
        """Publish under the claim, then mark it submitted (a failed mark is only logged: the
        claim then reads as abandoned after the grace, and a second submission is refused
        on the bus)."""
        await publish(broker, event)
        done = claim.model_copy(update={"submitted": True}).encode()
        try:
            await accepted().update(claim_key(event.task_id), done, last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, *BUS_ERRORS) as error:
            log.warning("could not confirm the claim of task %s: %r", event.task_id, error)

    async def changed(task_id: str, revision: int) -> None:
        """Wait until the id's claim changes (confirmed, freed or taken over), at most as long
        as a publish may take: a claimer still publishing settles by then."""
        deadline = asyncio.get_running_loop().time() + min(settle_seconds, grace.total_seconds())
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            found = await claim_of(task_id)
            if found is None or found[1] != revision:
                return

    async def submit(event: TaskSubmitted, body: str) -> ScheduleAccepted | JSONResponse:
        """Claim the task id, then publish: once per id across every replica (claims.py).
        `body` is the request's digest."""
        task_id, key = event.task_id, claim_key(event.task_id)
        waited = False
        for _ in range(3):  # a claim lost, freed or settled meanwhile is judged again
            found = await claim_of(task_id)
            claim, revision = found if found else (None, 0)
            now = datetime.now(UTC)
            verdict = judge(claim, event.event_id, now, grace)
            if verdict is Verdict.RETRY and claim is not None:
                # The same submission again (Idempotency-Key): published once; a claim not
                # yet confirmed is published again, and JetStream drops the copy.
                if not claim.submitted:
                    await publish_claimed(event, claim, revision)
                return ScheduleAccepted(task_id=task_id, event_id=event.event_id)
            known = await scheduler_summary(task_id)
            if known is not None:
                return _task_known(
                    task_id, known.status.value, known_reason(task_id, known.status.value)
                )
            if verdict is Verdict.KNOWN and claim is not None:
                if claim.submitted:
                    return _task_known(task_id, "submitted", claimed_reason(task_id, claim))
                # Claimed, not confirmed: its claimer is publishing, or died. Not a 409 yet:
                # a client told "known" would stop retrying a task never submitted. Waited
                # for once per request; then the client is asked to retry.
                if waited:
                    break
                waited = True
                await changed(task_id, revision)
                continue
            if verdict is Verdict.ABANDONED and claim is not None:
                event_id = takeover_id(claim, event.event_id, body)
                event = event.model_copy(update={"event_id": event_id})
            mine = Claim(event_id=event.event_id, claimed_at=now, body=body)
            try:
                if verdict is Verdict.NEW:
                    revision = await accepted().create(key, mine.encode())
                else:  # abandoned: taken over only if nobody changed it meanwhile
                    revision = await accepted().update(key, mine.encode(), last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            try:
                await publish_claimed(event, mine, revision)
            except BUS_ERRORS:
                # Not submitted: free the id for a retry, unless someone else holds it now.
                with suppress(nats.js.errors.KeyWrongLastSequenceError, *BUS_ERRORS):
                    await accepted().delete(key, last=revision)
                raise
            return ScheduleAccepted(task_id=task_id, event_id=event.event_id)
        found = await claim_of(task_id)
        if found is not None and found[0].submitted:
            return _task_known(task_id, "submitted", claimed_reason(task_id, found[0]))
        return JSONResponse(
            status_code=503,
            headers={"Retry-After": str(int(settle_seconds))},
            content={
                "detail": f"task {task_id!r} is being submitted by another request, not yet "
                "confirmed: retry (a claim never confirmed is taken over after "
                f"abandoned_claim_seconds, {grace.total_seconds():g} s)"
            },
        )

    async def ask(
        subject: str, query: Contract, answer: type[Answer], service: str = "scheduler"
    ) -> Answer | JSONResponse:
        """`service`'s answer on `subject`; a 503 naming it when it does not answer, a 502
        when its answer does not validate."""
        try:
            reply = await broker.request(
                query.model_dump_json().encode(),
                subject,
                headers={"content-type": "application/json"},
                timeout=settings.query_timeout_seconds,
            )
        except BUS_ERRORS as error:
            log.warning("no answer on %s: %r", subject, error)
            return _problem(503, f"{service} not answering")
        try:
            return answer.model_validate_json(reply.body)
        except ValidationError as error:
            log.warning("bad answer on %s: %s", subject, error)
            return _problem(502, f"{service} answered with an invalid {answer.__name__}")

    async def dry_run_task(request: TaskRequest) -> TaskDryRun | JSONResponse:
        """Ask the predictor, then the scheduler with its prediction, what a submission of
        `request` would do: the same two steps as the bus, publishing and claiming nothing."""
        predicted = await ask(
            QuerySubjects.PREDICTION, PredictionQuery(task=request), PredictionAnswer, "predictor"
        )
        if isinstance(predicted, JSONResponse):
            return predicted
        if predicted.prediction is None:  # a submission would end task.rejected, these errors
            return _field_errors(422, predicted.errors)
        query = TaskPlacementQuery(task=request, prediction=predicted.prediction)
        placed = await ask(QuerySubjects.TASK_PLACEMENT, query, TaskPlacementAnswer)
        if isinstance(placed, JSONResponse):
            return placed
        return TaskDryRun(
            task_id=request.task_id, prediction=predicted.prediction, placement=placed
        )

    @app.post(
        "/api/v1/schedule",
        status_code=202,
        response_model=ScheduleAccepted,
        responses={
            200: {
                "model": TaskDryRun,
                "description": "dry_run=true: what a submission would do; nothing submitted.",
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
                    "application/json": {"schema": {"$ref": "#/components/schemas/TaskRequest"}}
                },
            }
        },
    )
    async def schedule(
        request: Request,
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
            return _field_errors(413, [FieldError(field="body", reason=str(error))])
        parsed = parse_task_request(body, settings.max_json_depth)
        if not isinstance(parsed, TaskRequest):
            return _field_errors(422, parsed)

        if dry_run:
            answered = await dry_run_task(parsed)
            if isinstance(answered, JSONResponse):
                return answered
            # 200, not the route's 202: nothing was accepted.
            return JSONResponse(status_code=200, content=answered.model_dump(mode="json"))
        event = TaskSubmitted.from_request(parsed)
        if idempotency_key:
            event = event.model_copy(update={"event_id": submission_id(parsed, idempotency_key)})
        trace.get_current_span().set_attribute("crater.task_id", parsed.task_id)
        try:
            return await submit(event, body_digest(parsed))
        except BUS_ERRORS as error:
            log.warning("could not submit task %s: %r", parsed.task_id, error)
            return _problem(503, f"NATS unavailable: {type(error).__name__}")

    answers: dict[int | str, dict[str, Any]] = {
        503: {"model": Problem, "description": SCHEDULER_NOT_ANSWERING},
        502: {"model": Problem, "description": "The scheduler's answer did not validate."},
    }

    @app.post(
        "/api/v1/schedule/dry-run",
        response_model=PlacementAnswer,
        responses={422: {"model": FieldErrors}, **answers},
    )
    async def dry_run(query: PlacementQuery) -> PlacementAnswer | JSONResponse:
        """Where would these resources go, and why not elsewhere? Nothing is reserved."""
        return await ask(QuerySubjects.PLACEMENT, query, PlacementAnswer)

    @app.post(
        "/api/v1/resolve",
        response_model=ResolvedJob,
        responses={
            422: {"model": FieldErrors, "description": "Every invalid field and why."},
            503: {"model": Problem, "description": PREDICTOR_NOT_ANSWERING},
            502: {"model": Problem, "description": "The predictor's answer did not validate."},
        },
    )
    async def resolve(job: JobDescription) -> ResolvedJob | JSONResponse:
        """AllData's job description (framework, model size, data volume) turned into a full
        task request by the predictor: POST its `task` to /api/v1/schedule as is."""
        answer = await ask(QuerySubjects.RESOLVE, ResolveQuery(job=job), ResolveAnswer, "predictor")
        if isinstance(answer, JSONResponse):
            return answer
        if answer.task is None or answer.prediction is None:
            return _field_errors(422, answer.errors)
        return ResolvedJob(
            task=answer.task, prediction=answer.prediction, explanation=answer.explanation
        )

    @app.get("/api/v1/nodes", response_model=NodesAnswer, responses=answers)
    async def nodes(pool: str | None = None) -> NodesAnswer | JSONResponse:
        return await ask(QuerySubjects.NODES, NodesQuery(pool=pool), NodesAnswer)

    @app.get(
        "/api/v1/tasks",
        response_model=TasksAnswer,
        responses={422: {"model": FieldErrors}, **answers},
    )
    async def tasks(
        status: TaskStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    ) -> TasksAnswer | JSONResponse:
        return await ask(QuerySubjects.TASKS, TasksQuery(status=status, limit=limit), TasksAnswer)

    @app.get(
        "/api/v1/tasks/{task_id}",
        response_model=TaskSummary,
        responses={404: {"model": Problem}, **answers},
    )
    async def task(task_id: str) -> TaskSummary | JSONResponse:
        answer = await ask(QuerySubjects.TASKS, TasksQuery(task_id=task_id, limit=1), TasksAnswer)
        if isinstance(answer, JSONResponse):
            return answer
        for summary in answer.tasks:
            if summary.task_id == task_id:
                return summary
        return _problem(404, f"task {task_id!r} is not known")

    @app.post(
        "/api/v1/tasks/{task_id}/cancel",
        status_code=202,
        response_model=CancelAccepted,
        responses={
            404: {"model": Problem, "description": "No such task was ever accepted."},
            409: {"model": Problem, "description": "The task has ended already."},
            **answers,
        },
    )
    async def cancel(task_id: str) -> CancelAccepted | JSONResponse:
        """Cancel a task: a waiting one leaves the queue, a placed or running one has its
        resources released (reason `cancelled`); its status ends `cancelled`. A task accepted
        but not yet known to the scheduler (still being profiled) is cancelled as it arrives
        there, and is never placed."""
        known = await task(task_id)
        previous: TaskStatus | Literal["submitted"]
        if isinstance(known, TaskSummary):
            if known.status.is_final:
                return _problem(409, f"task {task_id!r} has ended already: {known.status.value}")
            previous = known.status
        elif known.status_code != 404:
            return known
        else:
            try:
                if not await was_accepted(task_id):
                    return known
            except BUS_ERRORS as error:
                log.warning("could not look up task %s: %r", task_id, error)
                return _problem(503, f"NATS unavailable: {type(error).__name__}")
            previous = "submitted"
        event = TaskStatusReported(
            task_id=task_id, status=TaskStatus.CANCELLED, message="cancelled through the API"
        )
        trace.get_current_span().set_attribute("crater.task_id", task_id)
        try:
            await publish(broker, event)
        except BUS_ERRORS as error:
            log.warning("could not publish the cancel of %s: %r", task_id, error)
            return _problem(503, f"NATS unavailable: {type(error).__name__}")
        return CancelAccepted(task_id=task_id, event_id=event.event_id, previous=previous)

    app.add_api_route(
        "/api/v1/tasks/{task_id}",
        cancel,
        methods=["DELETE"],
        status_code=202,
        response_model=CancelAccepted,
        responses={404: {"model": Problem}, 409: {"model": Problem}, **answers},
        summary="Cancel (same as POST /api/v1/tasks/{task_id}/cancel)",
    )

    @app.post(
        "/api/v1/tasks/{task_id}/usage",
        status_code=202,
        response_model=UsageAccepted,
        responses={
            413: {"model": FieldErrors, "description": "Body larger than max_body_bytes."},
            422: {"model": FieldErrors, "description": "Every invalid field and why."},
            503: {"model": Problem, "description": "NATS unavailable."},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/TaskUsageReported"}
                    }
                },
            }
        },
    )
    async def usage(task_id: str, request: Request) -> UsageAccepted | JSONResponse:
        """One sample of a running task's own use (crater_client.start_monitoring), published
        as it is for the predictor. A retried POST keeps its event_id and is published once."""
        try:
            body = await read_limited(
                request.stream(), settings.max_body_bytes, request.headers.get("content-length")
            )
        except BodyTooLarge as error:
            return _field_errors(413, [FieldError(field="body", reason=str(error))])
        sample = parse_body(body, TaskUsageReported, settings.max_json_depth)
        if not isinstance(sample, TaskUsageReported):
            return _field_errors(422, sample)
        if sample.task_id != task_id:
            reason = f"{sample.task_id!r} is not the task in the path, {task_id!r}"
            return _field_errors(422, [FieldError(field="task_id", reason=reason)])
        trace.get_current_span().set_attribute("crater.task_id", task_id)
        try:
            await publish(broker, sample)
        except BUS_ERRORS as error:
            log.warning("could not publish a usage sample of %s: %r", task_id, error)
            return _problem(503, f"NATS unavailable: {type(error).__name__}")
        return UsageAccepted(task_id=task_id, event_id=sample.event_id)

    launcher_answers: dict[int | str, dict[str, Any]] = {
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
        **answers,
    }

    async def launcher_report(
        allocation_id: str,
        token: str,
        status: TaskStatus,
        **fields: Any,
    ) -> ReportAccepted | JSONResponse:
        """Ask the scheduler whether it would take the report (the token, the reservation),
        answer its refusal by name, else publish the report on task.status."""
        query = AllocationQuery(allocation_id=allocation_id, reservation_token=token)
        check = await ask(QuerySubjects.ALLOCATION, query, AllocationCheck)
        if isinstance(check, JSONResponse):
            return check
        if check.verdict != "accepted" or check.task_id is None:
            code, field = VERDICT_STATUS.get(check.verdict, (409, "token"))
            reason = check.reason or check.verdict
            return _field_errors(code, [FieldError(field=field, reason=reason)])
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
            return _field_errors(422, errors)
        trace.get_current_span().set_attribute("crater.task_id", check.task_id)
        try:
            await publish(broker, report)
        except BUS_ERRORS as error:
            log.warning("could not publish a report of %s: %r", allocation_id, error)
            return _problem(503, f"NATS unavailable: {type(error).__name__}")
        return ReportAccepted(
            allocation_id=allocation_id,
            task_id=check.task_id,
            event_id=report.event_id,
            status=status,
            reservation_expires_at=None if check.running else check.reservation_expires_at,
        )

    @app.post(
        "/api/v1/allocations/{allocation_id}/confirm",
        status_code=202,
        response_model=ReportAccepted,
        responses=launcher_answers,
    )
    async def confirm_allocation(
        allocation_id: AllocationId, body: AllocationConfirm
    ) -> ReportAccepted | JSONResponse:
        """A launcher (AllData, `crater_client.run_task`) confirms the allocation it runs the
        task on, with its reservation token: the reservation no longer expires, and from now
        on the task is failed if its `running` reports (heartbeats, `/status`) stop for the
        grace. The scheduler checks the token and the reservation's real deadline first."""
        return await launcher_report(
            allocation_id,
            body.token,
            TaskStatus.RUNNING,
            message="confirmed through the API",
            heartbeat_grace_seconds=body.heartbeat_grace_seconds,
        )

    @app.post(
        "/api/v1/allocations/{allocation_id}/status",
        status_code=202,
        response_model=ReportAccepted,
        responses=launcher_answers,
    )
    async def allocation_status(
        allocation_id: AllocationId, body: AllocationStatus
    ) -> ReportAccepted | JSONResponse:
        """The launcher's report on the task: `running` (a heartbeat; the first confirms),
        `succeeded` or `failed` with the exit code and reason: the scheduler ends the task
        (task.ended, the webhook) with them."""
        return await launcher_report(
            allocation_id,
            body.token,
            body.status,
            exit_code=body.exit_code,
            message=body.reason,
            heartbeat_grace_seconds=body.heartbeat_grace_seconds,
        )

    @app.get("/healthz", response_model=Health, responses={503: {"model": Problem}})
    async def healthz() -> Health | JSONResponse:
        if await broker.ping(timeout=settings.health_timeout_seconds):
            return Health()
        return _problem(503, "NATS not connected")

    @app.get("/metrics", response_class=Response, include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def service_of(app: FastAPI) -> Service:
    """The runtime pieces behind an app made by `build` (broker, registry, tracer)."""
    service: Service = app.state.service
    return service


def create_app() -> FastAPI:
    """For `uvicorn --factory crater.gateway.app:create_app`."""
    return build()


def main() -> None:
    app = build()
    serve(app, service_of(app))


if __name__ == "__main__":
    main()
