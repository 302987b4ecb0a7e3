"""The routes' FastAPI dependencies: what `build` put on the app's state. Async, so FastAPI
calls them on the event loop, not in its thread pool."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.exceptions import RequestValidationError

from crater.gateway.apikeys import Scope
from crater.gateway.auth import Authenticator, Principal, require
from crater.gateway.bus import Bus
from crater.gateway.settings import GatewaySettings
from crater.gateway.submissions import Submissions
from crater.runtime.jsondepth import NotText, check_json_text, check_text
from crater.runtime.service import Service


async def service(request: Request) -> Service:
    found: Service = request.app.state.service
    return found


async def settings(request: Request) -> GatewaySettings:
    found: GatewaySettings = request.app.state.settings
    return found


async def bus(request: Request) -> Bus:
    found: Bus = request.app.state.bus
    return found


async def submissions(request: Request) -> Submissions:
    found: Submissions = request.app.state.submissions
    return found


async def auth(request: Request) -> Authenticator:
    found: Authenticator = request.app.state.auth
    return found


ServiceDep = Annotated[Service, Depends(service)]
SettingsDep = Annotated[GatewaySettings, Depends(settings)]
BusDep = Annotated[Bus, Depends(bus)]
SubmissionsDep = Annotated[Submissions, Depends(submissions)]
AuthDep = Annotated[Authenticator, Depends(auth)]
# The caller, holding the scope the route needs (OPEN, every scope, with auth off).
Submitter = Annotated[Principal, Depends(require(Scope.SUBMIT))]
Reader = Annotated[Principal, Depends(require(Scope.READ))]
Canceller = Annotated[Principal, Depends(require(Scope.CANCEL))]
Administrator = Annotated[Principal, Depends(require(Scope.ADMIN))]


async def usage_reporter(
    request: Request,
    crater_reservation_token: Annotated[
        str | None,
        Header(
            max_length=4096,
            description="Without an Authorization header: the reservation token the task "
            "was started with (CRATER_RESERVATION_TOKEN).",
        ),
    ] = None,
) -> Principal | str:
    """Who may report a task's usage: a credential with `submit`, or, with authentication
    on and no Authorization header, the reservation token the task was started with (the
    route checks it with the scheduler)."""
    authenticator: Authenticator = request.app.state.auth
    token = crater_reservation_token
    if authenticator.required and token and not request.headers.get("authorization"):
        return token
    return await require(Scope.SUBMIT)(request)


UsageReporter = Annotated[Principal | str, Depends(usage_reporter)]


async def request_is_text(request: Request) -> None:
    """Every route's parameters and body, before its models: a string that is not Unicode
    text (a lone surrogate or NUL: `%00` in a query, an escape in JSON) is refused with its
    field, as on the bus; past this, no service is asked about text its database or its
    answer's encoder cannot take. Bodies over the size limit, or of unknown length, are left
    to the route, which refuses or reads them itself (bounded)."""
    parameters = [("path", name, str(value)) for name, value in request.path_params.items()]
    parameters += [("query", name, value) for name, value in request.query_params.multi_items()]
    for kind, name, value in parameters:
        try:
            check_text(name, value)
        except NotText as error:
            raise RequestValidationError(
                [{"loc": (kind, error.field), "msg": error.what, "type": "value_error"}]
            ) from None
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    length = request.headers.get("content-length", "")
    limit: int = request.app.state.settings.max_body_bytes
    if not length.isdigit() or int(length) > limit:
        return
    try:
        check_json_text(await request.body())
    except NotText as error:
        location = ("body", *error.field.split("."))
        raise RequestValidationError(
            [{"loc": location, "msg": error.what, "type": "value_error"}]
        ) from None
