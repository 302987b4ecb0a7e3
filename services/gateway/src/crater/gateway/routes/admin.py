"""An operator's routes (the `admin` scope): a new pools or quotas file, applied by the
scheduler without a restart (docs/pools.md, "Reloading over the API")."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from crater.contracts import FieldError
from crater.contracts.queries import (
    CONFIG_TEXT_MAX,
    ConfigApplied,
    ConfigApply,
    ConfigFile,
    QuerySubjects,
)
from crater.gateway.bodies import BodyTooLarge, read_limited
from crater.gateway.deps import Administrator, BusDep, SettingsDep
from crater.gateway.models import ANSWERS, FieldErrors, field_errors_response
from crater.runtime.jsondepth import NotText, check_text

router = APIRouter()

RESPONSES: dict[int | str, dict[str, object]] = {
    **ANSWERS,
    413: {"model": FieldErrors, "description": "Body larger than max_body_bytes."},
    422: {
        "model": FieldErrors,
        "description": "Refused, the running configuration kept: every invalid field and why.",
    },
}
BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/yaml": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "object"}},
        },
    }
}


@router.put(
    "/api/v1/admin/pools",
    response_model=ConfigApplied,
    responses=RESPONSES,
    openapi_extra=BODY,
    summary="Apply a new pools file",
)
async def put_pools(
    request: Request, principal: Administrator, settings: SettingsDep, bus: BusDep
) -> ConfigApplied | JSONResponse:
    """The body is a pools file (YAML or JSON, as `CRATER_SCHEDULER_POOLS_FILE` holds):
    validated and applied from the scheduler's next decision on (200, what runs now), or
    refused naming each field (422). The file on disk is not written."""
    return await _apply("pools", request, principal.subject, settings.max_body_bytes, bus)


@router.put(
    "/api/v1/admin/quotas",
    response_model=ConfigApplied,
    responses=RESPONSES,
    openapi_extra=BODY,
    summary="Apply a new quotas file",
)
async def put_quotas(
    request: Request, principal: Administrator, settings: SettingsDep, bus: BusDep
) -> ConfigApplied | JSONResponse:
    """The body is a quotas file (YAML or JSON, as `CRATER_SCHEDULER_QUOTAS_FILE` holds):
    hard limits and elastic guarantees, validated and applied from the scheduler's next
    decision on (200), or refused naming each field (422). The file on disk is not written."""
    return await _apply("quotas", request, principal.subject, settings.max_body_bytes, bus)


async def _apply(
    file: ConfigFile, request: Request, who: str, limit: int, bus: BusDep
) -> ConfigApplied | JSONResponse:
    limit = min(limit, CONFIG_TEXT_MAX)  # what the scheduler takes over NATS
    try:
        body = await read_limited(request.stream(), limit, request.headers.get("content-length"))
    except BodyTooLarge as error:
        return field_errors_response(413, [FieldError(field="body", reason=str(error))])
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"not UTF-8 text: {error.reason} at byte {error.start}"
        return field_errors_response(422, [FieldError(field="body", reason=reason)])
    try:
        check_text("body", text)  # a NUL: the file's text could not travel as JSON text
    except NotText as error:
        return field_errors_response(422, [FieldError(field=error.field, reason=error.what)])
    if not text.strip():
        reason = f"empty: send the whole {file} file"
        return field_errors_response(422, [FieldError(field="body", reason=reason)])
    query = ConfigApply(file=file, text=text, requested_by=who)
    answer = await bus.ask(QuerySubjects.CONFIG_APPLY, query, ConfigApplied)
    if isinstance(answer, JSONResponse) or answer.applied:
        return answer
    return field_errors_response(422, answer.errors)
