"""The gateway's health and metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from crater.gateway.deps import BusDep, ServiceDep, SettingsDep
from crater.gateway.models import Health, Problem, problem

router = APIRouter()


@router.get("/healthz", response_model=Health, responses={503: {"model": Problem}})
async def healthz(bus: BusDep, settings: SettingsDep) -> Health | JSONResponse:
    if await bus.broker.ping(timeout=settings.health_timeout_seconds):
        return Health()
    return problem(503, "NATS not connected")


@router.get("/metrics", response_class=Response, include_in_schema=False)
async def metrics(service: ServiceDep) -> Response:
    return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)
