"""The nodes the scheduler knows, and an operator's cordon of one of their cards."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse
from pydantic import Field, ValidationError

from crater.contracts import Contract, FieldError, GpuCordonRequested
from crater.contracts.queries import NodesAnswer, NodesQuery, QuerySubjects
from crater.gateway.deps import Administrator, BusDep, Reader
from crater.gateway.models import ANSWERS, FieldErrors, field_errors_response, nats_unavailable
from crater.runtime.bus import field_errors
from crater.runtime.service import BUS_ERRORS

router = APIRouter()
log = logging.getLogger("crater.gateway")


class CordonBody(Contract):
    reason: str = Field(default="", max_length=512, description="Why, for the record.")


class CordonAccepted(Contract):
    """The request is on the bus; the scheduler applies it at its next event."""

    node_id: str
    gpu: int
    cordon: bool
    event_id: str


CORDON_ANSWERS: dict[int | str, dict[str, object]] = {
    **ANSWERS,
    404: {"model": FieldErrors, "description": "No such node, or no such card on it."},
    422: {"model": FieldErrors, "description": "A field out of range, named."},
}


@router.get("/api/v1/nodes", response_model=NodesAnswer, responses=ANSWERS)
async def nodes(bus: BusDep, _: Reader, pool: str | None = None) -> NodesAnswer | JSONResponse:
    return await bus.ask(QuerySubjects.NODES, NodesQuery(pool=pool), NodesAnswer)


@router.post(
    "/api/v1/admin/nodes/{node_id}/gpus/{gpu}/cordon",
    response_model=CordonAccepted,
    status_code=202,
    responses=CORDON_ANSWERS,
    summary="Cordon one card of a node",
)
async def cordon(
    node_id: str,
    gpu: int,
    bus: BusDep,
    principal: Administrator,
    body: Annotated[CordonBody | None, Body()] = None,
) -> CordonAccepted | JSONResponse:
    """No new work lands on the card; what runs there goes on. The cordon stays until an
    operator lifts it (uncordon)."""
    reason = body.reason if body is not None else ""
    return await _request(bus, node_id, gpu, True, reason, principal.subject)


@router.post(
    "/api/v1/admin/nodes/{node_id}/gpus/{gpu}/uncordon",
    response_model=CordonAccepted,
    status_code=202,
    responses=CORDON_ANSWERS,
    summary="Lift the cordon of one card of a node",
)
async def uncordon(
    node_id: str, gpu: int, bus: BusDep, principal: Administrator
) -> CordonAccepted | JSONResponse:
    """Whatever put it there: a fault the probe reported (that occurrence stays lifted while
    the probe reports it; a new one cordons again) or an operator."""
    return await _request(bus, node_id, gpu, False, "", principal.subject)


async def _request(
    bus: BusDep, node_id: str, gpu: int, on: bool, reason: str, who: str
) -> CordonAccepted | JSONResponse:
    try:
        event = GpuCordonRequested(
            node_id=node_id, gpu=gpu, cordon=on, reason=reason, requested_by=who
        )
    except ValidationError as error:
        return field_errors_response(422, field_errors(error))
    known = await bus.ask(QuerySubjects.NODES, NodesQuery(), NodesAnswer)
    if isinstance(known, JSONResponse):
        return known
    node = next((n for n in known.nodes if n.node_id == node_id), None)
    if node is None:
        reason = f"the scheduler knows no node {node_id}"
        return field_errors_response(404, [FieldError(field="node_id", reason=reason)])
    if gpu >= node.gpus_total:
        reason = f"{node_id} has {node.gpus_total} GPUs (0..{node.gpus_total - 1})"
        return field_errors_response(404, [FieldError(field="gpu", reason=reason)])
    try:
        await bus.publish(event)
    except BUS_ERRORS as error:
        log.warning("could not publish a cordon of %s GPU %d: %r", node_id, gpu, error)
        return nats_unavailable(error)
    log.info("%s GPU %d of %s (%s)", "cordon" if on else "uncordon", gpu, node_id, who)
    return CordonAccepted(node_id=node_id, gpu=gpu, cordon=on, event_id=str(event.event_id))
