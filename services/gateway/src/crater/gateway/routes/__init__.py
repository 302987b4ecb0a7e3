"""The gateway's HTTP routes by resource, in the order the OpenAPI document lists them."""

from __future__ import annotations

from fastapi import APIRouter

from crater.gateway.routes import admin, allocations, nodes, ops, schedule, tasks, usage

ROUTERS: tuple[APIRouter, ...] = (
    schedule.router,
    nodes.router,
    tasks.router,
    allocations.router,
    usage.router,
    admin.router,
    ops.router,
)
