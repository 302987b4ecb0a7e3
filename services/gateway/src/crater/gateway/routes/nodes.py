"""The nodes the scheduler knows."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from crater.contracts.queries import NodesAnswer, NodesQuery, QuerySubjects
from crater.gateway.deps import BusDep, Reader
from crater.gateway.models import ANSWERS

router = APIRouter()


@router.get("/api/v1/nodes", response_model=NodesAnswer, responses=ANSWERS)
async def nodes(bus: BusDep, _: Reader, pool: str | None = None) -> NodesAnswer | JSONResponse:
    return await bus.ask(QuerySubjects.NODES, NodesQuery(pool=pool), NodesAnswer)
