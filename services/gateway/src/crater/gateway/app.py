"""The gateway: Crater's HTTP API. It publishes submitted tasks and asks the scheduler, over
NATS request-reply, for what it knows; it keeps nothing itself."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Any, Literal, TypeVar
from uuid import UUID

import nats.errors
import nats.js.errors
from fastapi import FastAPI, Header, Query, Request
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
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    TaskSubmitted,
)
from crater.contracts.queries import (
    NodesAnswer,
    NodesQuery,
    PlacementAnswer,
    PlacementQuery,
    QuerySubjects,
    TasksAnswer,
    TasksQuery,
    TaskSummary,
)
from crater.gateway.bodies import (
    BodyTooLarge,
    parse_task_request,
    read_limited,
    request_errors,
    submission_id,
)
from crater.gateway.observe import ObserveRequests
from crater.runtime.bus import ensure_streams, publish
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings

log = logging.getLogger("crater.gateway")

Answer = TypeVar("Answer", bound=Contract)
# What a NATS call raises when the server is away, the connection closed, or nobody answers.
BUS_ERRORS = (nats.errors.Error, TimeoutError, IncorrectState)
SCHEDULER_NOT_ANSWERING = "scheduler not answering"
# The task ids the gateway accepted (a JetStream key-value bucket, shared by every replica):
# a task still with the predictor is unknown to the scheduler, yet may be cancelled.
ACCEPTED_BUCKET = "crater_gateway_accepted"


class GatewaySettings(ServiceSettings):
    """Own settings from CRATER_GATEWAY_<NAME>; http_port 0 means 8080."""

    service = "gateway"

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
        "has not heard of yet (still being profiled) can be cancelled.",
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


class FieldErrors(BaseModel):
    """Every field that is wrong and why; `body` means the body as a whole."""

    detail: list[FieldError]


class Problem(BaseModel):
    detail: str


class Health(BaseModel):
    status: Literal["ok"] = "ok"


def _field_errors(status: int, errors: list[FieldError]) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"detail": [e.model_dump(mode="json") for e in errors]},
    )


def _problem(status: int, detail: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail})


def accepted_key(task_id: str) -> str:
    """A key-value key for `task_id`: task ids may hold ':', which keys may not."""
    return base64.urlsafe_b64encode(task_id.encode()).decode()


class GatewayApi(FastAPI):
    """FastAPI with the task request's schema in the OpenAPI document: the schedule endpoint
    reads its body itself (to bound its size and name fields as the bus does), so FastAPI
    would not otherwise know the schema."""

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

    async def was_accepted(task_id: str) -> bool:
        """Whether this gateway (any replica) accepted `task_id` lately."""
        try:
            await accepted().get(accepted_key(task_id))
        except nats.js.errors.KeyNotFoundError:
            return False
        return True

    async def ask(subject: str, query: Contract, answer: type[Answer]) -> Answer | JSONResponse:
        try:
            reply = await broker.request(
                query.model_dump_json().encode(),
                subject,
                headers={"content-type": "application/json"},
                timeout=settings.query_timeout_seconds,
            )
        except BUS_ERRORS as error:
            log.warning("no answer on %s: %r", subject, error)
            return _problem(503, SCHEDULER_NOT_ANSWERING)
        try:
            return answer.model_validate_json(reply.body)
        except ValidationError as error:
            log.warning("bad answer on %s: %s", subject, error)
            return _problem(502, f"scheduler answered with an invalid {answer.__name__}")

    @app.post(
        "/api/v1/schedule",
        status_code=202,
        response_model=ScheduleAccepted,
        responses={
            413: {"model": FieldErrors, "description": "Body larger than max_body_bytes."},
            422: {"model": FieldErrors, "description": "Every invalid field and why."},
            503: {"model": Problem, "description": "NATS unavailable."},
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

        event = TaskSubmitted.from_request(parsed)
        if idempotency_key:
            event = event.model_copy(update={"event_id": submission_id(parsed, idempotency_key)})
        trace.get_current_span().set_attribute("crater.task_id", parsed.task_id)
        try:
            await publish(broker, event)
        except BUS_ERRORS as error:
            log.warning("could not publish task %s: %r", parsed.task_id, error)
            return _problem(503, f"NATS unavailable: {type(error).__name__}")
        try:
            await accepted().put(accepted_key(parsed.task_id), event.event_id.bytes)
        except BUS_ERRORS as error:
            # Submitted all the same: only a cancel before the scheduler knows it will miss.
            log.warning("could not remember task %s as accepted: %r", parsed.task_id, error)
        return ScheduleAccepted(task_id=event.task_id, event_id=event.event_id)

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
