"""The gateway: Crater's HTTP API. It publishes submitted tasks and asks the scheduler, over
NATS request-reply, for what it knows; it keeps nothing itself. Settings and wiring here; the
routes in routes/, by resource."""

from __future__ import annotations

import logging
import ssl
from typing import Any

import swagger_ui_bundle
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import Counter, Histogram
from starlette.exceptions import HTTPException as StarletteHTTPException

from crater.contracts import FieldError, TaskPhaseReported, TaskRequest, TaskUsageReported
from crater.gateway import console
from crater.gateway.auth import Authenticator, Denied
from crater.gateway.bodies import request_errors
from crater.gateway.bus import Bus
from crater.gateway.deps import request_is_text
from crater.gateway.models import FieldErrors, TaskDryRun, field_errors_response
from crater.gateway.observe import ObserveRequests
from crater.gateway.routes import ROUTERS
from crater.gateway.settings import GatewaySettings
from crater.gateway.submissions import ACCEPTED_BUCKET, Submissions
from crater.runtime.service import Service, create_service, serve

__all__ = [
    "ACCEPTED_BUCKET",
    "GatewayApi",
    "GatewaySettings",
    "TaskDryRun",
    "build",
    "create_app",
    "main",
    "service_of",
]

log = logging.getLogger("crater.gateway")


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
        phase_schema = TaskPhaseReported.model_json_schema(
            by_alias=True, ref_template="#/components/schemas/{model}"
        )
        components.update(phase_schema.pop("$defs", {}))
        components["TaskPhaseReported"] = phase_schema
        document_field_errors(schema)
        add_auth_answers(schema)
        return schema


def document_field_errors(schema: dict[str, Any]) -> None:
    """Every operation that takes a parameter or a body may answer 422, and always in the
    gateway's own shape (`FieldErrors`, see `request_errors`), never FastAPI's default
    `HTTPValidationError`: the fuzzer found a NUL in `pool` answered in a shape the document
    did not promise."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    field_errors = FieldErrors.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(field_errors.pop("$defs", {}))
    components["FieldErrors"] = field_errors
    answer = {
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FieldErrors"}}}
    }
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            answers = operation.setdefault("responses", {})
            if operation.get("parameters") or operation.get("requestBody") or "422" in answers:
                described = answers.get("422", {}).get("description")
                answers["422"] = {
                    "description": described or "Every invalid field or parameter and why.",
                    **answer,
                }
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


# What a route that needs a credential may answer with auth `required` (docs/security.md).
AUTH_ANSWERS = {
    "401": "No credential, or an unknown, revoked, expired or invalid one (WWW-Authenticate).",
    "403": "The credential lacks the route's scope, or names another tenant (`tenant`).",
    "429": "This credential's rate limit is exceeded (Retry-After).",
}


def add_auth_answers(schema: dict[str, Any]) -> None:
    """The auth refusals on every /api/v1 operation but the launcher's (its reservation token
    is its proof), and the bearer scheme."""
    problem_ref = {
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    }
    for path, operations in schema.get("paths", {}).items():
        if not path.startswith("/api/v1/") or path.startswith("/api/v1/allocations/"):
            continue
        for operation in operations.values():
            operation["security"] = [{"bearer": []}]
            answers = operation.setdefault("responses", {})
            for code, description in AUTH_ANSWERS.items():
                answers.setdefault(code, {"description": description, **problem_ref})
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key (`crater tokens create`) or an OIDC JWT; with auth `off` "
        "none is needed.",
    }


async def invalid_request(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return field_errors_response(422, request_errors(error.errors()))


# FastAPI's answer to a body it cannot read (bytes that are not UTF-8 JSON, a broken form):
# an undocumented 400, found by the fuzzer. The gateway answers it as every bad body: 422.
UNPARSED_BODY = "There was an error parsing the body"


async def http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, StarletteHTTPException)
    if error.status_code == 400 and error.detail == UNPARSED_BODY:
        reason = "not valid JSON (UTF-8): the body could not be parsed"
        return field_errors_response(422, [FieldError(field="body", reason=reason)])
    return await http_exception_handler(request, error)


async def denied(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, Denied)
    authenticator: Authenticator = request.app.state.auth
    return authenticator.answer(request, error)


def build(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or GatewaySettings()
    service = create_service("gateway", settings)
    bus = Bus(service.broker, settings)
    submissions = Submissions(bus, settings)
    auth = Authenticator(settings, service.broker, service.registry)

    async def connected() -> None:
        log.info("gateway connected to %s", settings.nats_url)

    service.after_startup += [submissions.open, auth.open, connected]

    app = GatewayApi(
        title="Crater gateway",
        version="1",
        description="Submit tasks to Crater and read what the scheduler knows.",
        lifespan=lambda _: service.lifespan(),
        separate_input_output_schemas=False,
        docs_url=None,  # served below from local assets, not a CDN
        redoc_url=None,
        dependencies=[Depends(request_is_text)],
    )
    serve_docs_locally(app)
    app.state.service = service
    app.state.settings = settings
    app.state.bus = bus
    app.state.submissions = submissions
    app.state.auth = auth
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
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Denied, denied)
    for router in ROUTERS:
        app.include_router(router)
    if settings.console:
        console.mount(app, settings, service)
    return app


SWAGGER_ASSETS = "/docs/assets"


def serve_docs_locally(app: FastAPI) -> None:
    """Swagger UI at /docs with its JavaScript and CSS from the installed swagger-ui bundle:
    no browser is sent to a CDN, and the docs work where nothing outside is reachable."""
    app.mount(
        SWAGGER_ASSETS,
        StaticFiles(directory=swagger_ui_bundle.swagger_ui_path),
        name="swagger-assets",
    )

    async def swagger(_: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url=f"{SWAGGER_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER_ASSETS}/favicon-32x32.png",
        )

    app.add_api_route("/docs", swagger, methods=["GET"], include_in_schema=False)


def service_of(app: FastAPI) -> Service:
    """The runtime pieces behind an app made by `build` (broker, registry, tracer)."""
    service: Service = app.state.service
    return service


def create_app() -> FastAPI:
    """For `uvicorn --factory crater.gateway.app:create_app`."""
    return build()


def tls_options(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn's TLS options: HTTPS when a certificate is set; mTLS (a client certificate
    from `tls_ca_certs` required in the handshake) when `tls_client_cert_required`."""
    if settings.tls_certfile is None:
        return {}
    return {
        "ssl_certfile": str(settings.tls_certfile),
        "ssl_keyfile": str(settings.tls_keyfile),
        "ssl_ca_certs": str(settings.tls_ca_certs) if settings.tls_ca_certs else None,
        "ssl_cert_reqs": ssl.CERT_REQUIRED
        if settings.tls_client_cert_required
        else ssl.CERT_OPTIONAL
        if settings.tls_ca_certs
        else ssl.CERT_NONE,
    }


def main() -> None:
    app = build()
    service = service_of(app)
    settings: GatewaySettings = app.state.settings
    tls = tls_options(settings)
    if not tls:
        serve(app, service)
        return
    uvicorn.run(
        app,
        host=settings.http_host,
        port=service.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        lifespan="on",
        **tls,
    )


if __name__ == "__main__":
    main()
