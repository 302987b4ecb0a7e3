"""What the console reads, and from whom: the services' request-reply queries (as the REST
API asks them) and, for one node, the latest topology, health and metrics messages kept in
their streams (as `crater diagnose --node` reads them). Nothing here changes anything."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TypeVar

import nats.js.errors
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from crater.contracts import (
    Contract,
    FleetsAnswer,
    FleetsQuery,
    NodeHealthReported,
    NodeMetricsReported,
    NodesAnswer,
    NodesQuery,
    NodeTopologyReported,
    PoolsAnswer,
    PoolsQuery,
    QuerySubjects,
    Streams,
    Subjects,
    TasksAnswer,
    TasksQuery,
    TaskSummary,
    WebhookDeliveriesAnswer,
    WebhookDeliveriesQuery,
)
from crater.gateway.auth import Principal
from crater.gateway.bus import Bus
from crater.runtime.service import BUS_ERRORS

log = logging.getLogger("crater.gateway.console")

Answer = TypeVar("Answer", bound=Contract)
Stored = TypeVar("Stored", bound=BaseModel)


@dataclass(frozen=True)
class Unavailable:
    """A service that did not answer (or answered nonsense), in words for the page."""

    detail: str


async def ask(
    bus: Bus, subject: str, query: Contract, answer: type[Answer], service: str
) -> Answer | Unavailable:
    found = await bus.ask(subject, query, answer, service)
    if isinstance(found, JSONResponse):
        detail = json.loads(bytes(found.body)).get("detail", f"{service} not answering")
        return Unavailable(str(detail))
    return found


def own_tenant(principal: Principal) -> str | None:
    """The tenant a principal is confined to; None: it sees every tenant."""
    return None if principal.sees_all else principal.tenant


async def pools(bus: Bus, principal: Principal) -> PoolsAnswer | Unavailable:
    query = PoolsQuery(tenant=own_tenant(principal))
    return await ask(bus, QuerySubjects.POOLS, query, PoolsAnswer, "scheduler")


async def tasks(bus: Bus, principal: Principal, query: TasksQuery) -> TasksAnswer | Unavailable:
    """The tasks asked for, a tenant's own only (its tenant is forced into the query)."""
    mine = own_tenant(principal)
    if mine is not None:
        query = query.model_copy(update={"tenant": mine})
    return await ask(bus, QuerySubjects.TASKS, query, TasksAnswer, "scheduler")


async def task(bus: Bus, principal: Principal, task_id: str) -> TaskSummary | Unavailable | None:
    """One task (with its history, holdings and prediction); None when unknown or not the
    principal's to see (the same answer, not to reveal another tenant's task)."""
    found = await ask(
        bus, QuerySubjects.TASKS, TasksQuery(task_id=task_id, limit=1), TasksAnswer, "scheduler"
    )
    if isinstance(found, Unavailable):
        return found
    summary = next((t for t in found.tasks if t.task_id == task_id), None)
    if summary is None or not principal.owns(summary.tenant):
        return None
    return summary


async def webhooks(bus: Bus, task_id: str) -> WebhookDeliveriesAnswer | Unavailable:
    query = WebhookDeliveriesQuery(task_id=task_id)
    return await ask(bus, QuerySubjects.WEBHOOKS, query, WebhookDeliveriesAnswer, "callback")


async def nodes(bus: Bus) -> NodesAnswer | Unavailable:
    return await ask(bus, QuerySubjects.NODES, NodesQuery(), NodesAnswer, "scheduler")


async def fleets(bus: Bus) -> FleetsAnswer | Unavailable:
    return await ask(bus, QuerySubjects.FLEETS, FleetsQuery(), FleetsAnswer, "autoscaler")


async def latest(bus: Bus, stream: str, subject: str, model: type[Stored]) -> Stored | None:
    """The latest message on `subject` kept in `stream`; None when there is none (or NATS
    does not answer, or it does not validate: logged)."""
    try:
        message = await bus.broker.connection.jetstream().get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return None
    except BUS_ERRORS as error:
        log.warning("could not read the latest %s from %s: %r", subject, stream, error)
        return None
    try:
        return model.model_validate_json(message.data or b"")
    except ValidationError as error:
        log.warning("the latest %s does not validate: %s", subject, error)
        return None


@dataclass(frozen=True)
class NodeReports:
    topology: NodeTopologyReported | None
    health: NodeHealthReported | None
    metrics: NodeMetricsReported | None


async def node_reports(bus: Bus, node_id: str) -> NodeReports:
    """A node's latest topology, health and metrics as its probe reported them."""
    return NodeReports(
        await latest(
            bus,
            Streams.NODE_TOPOLOGY.name,
            Subjects.NODE_TOPOLOGY.for_node(node_id),
            NodeTopologyReported,
        ),
        await latest(
            bus,
            Streams.NODE_TELEMETRY.name,
            Subjects.NODE_HEALTH.for_node(node_id),
            NodeHealthReported,
        ),
        await latest(
            bus,
            Streams.NODE_TELEMETRY.name,
            Subjects.NODE_METRICS.for_node(node_id),
            NodeMetricsReported,
        ),
    )
