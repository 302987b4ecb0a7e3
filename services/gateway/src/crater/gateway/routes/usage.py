"""Usage and cost of allocations (the predictor keeps the usage records)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from crater.contracts import FieldError
from crater.contracts.queries import QuerySubjects, UsageAnswer, UsageGrouping, UsageQuery
from crater.gateway.deps import BusDep, Reader
from crater.gateway.models import ANSWERS, FieldErrors, field_errors_response

router = APIRouter()

MAX_PERIOD = timedelta(days=366)


@router.get(
    "/api/v1/usage",
    response_model=UsageAnswer,
    responses={422: {"model": FieldErrors}, **ANSWERS},
)
async def usage(
    bus: BusDep,
    principal: Reader,
    since: datetime,
    until: Annotated[datetime | None, Query(description="Default: now.")] = None,
    by: UsageGrouping = "tenant",
    hourly: bool = False,
    tenant: Annotated[str | None, Query(description="Only this tenant (an admin's).")] = None,
) -> UsageAnswer | JSONResponse:
    """Allocated GPU-seconds (idle and unmeasured among them), GPU memory, cores and memory
    of every allocation held in [since, until), grouped `by` tenant, pool, GPU model or task
    (per UTC hour when `hourly`), priced when the predictor has a price file. A tenant's
    credential sees its own tenant's usage only; an admin's every tenant's, or `tenant`'s."""
    until = until or datetime.now(UTC)
    errors = []
    for name, moment in (("since", since), ("until", until)):
        if moment.tzinfo is None:
            errors.append(FieldError(field=name, reason="needs a time zone (2026-12-01T10:00Z)"))
    if not errors and until <= since:
        errors.append(FieldError(field="until", reason="must be after since"))
    if not errors and until - since > MAX_PERIOD:
        errors.append(FieldError(field="until", reason="at most 366 days after since"))
    if errors:
        return field_errors_response(422, errors)
    if not principal.sees_all:
        tenant = principal.tenant
    query = UsageQuery(since=since, until=until, by=by, hourly=hourly, tenant=tenant)
    return await bus.ask(QuerySubjects.USAGE, query, UsageAnswer, service="predictor")
