"""The console's pages, the panels they refresh, signing in and out, and the event stream.

Every page is served whole (server-rendered, readable without script); each page's panel is
also served alone under /console/panels/..., which htmx fetches again when the event stream
(/console/events, server-sent events) says that panel changed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from crater.contracts import TasksQuery, TaskStatus
from crater.contracts.nodes import NODE_ID_PATTERN
from crater.gateway.auth import Authenticator, Denied, Principal
from crater.gateway.console import data, views
from crater.gateway.console.live import LiveHub, node_topic, wanted_topics
from crater.gateway.console.session import (
    COOKIE,
    COOKIE_PATH,
    LoginRequired,
    Sessions,
    console_principal,
    sign_in,
)
from crater.gateway.console.topology import topology_svg
from crater.gateway.deps import BusDep

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(prefix="/console", include_in_schema=False)
Viewer = Annotated[Principal, Depends(console_principal)]
PAGES = ("pools", "tasks", "nodes", "fleets")
KEEP_ALIVE_SECONDS = 15.0
LOGIN_FIELD_BYTES = 4096


def hub(request: Request) -> LiveHub:
    found: LiveHub = request.app.state.console_hub
    return found


def now() -> datetime:
    return datetime.now(UTC)


def page(
    request: Request,
    name: str,
    principal: Principal | None,
    *,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """A template filled in: a whole page, or one panel (templates named _*.html)."""
    auth: Authenticator = request.app.state.auth
    who = None
    if principal is not None and auth.required:
        who = f"{principal.tenant}{' (admin)' if principal.sees_all else ''}"
    return templates.TemplateResponse(
        request,
        name,
        {"who": who, "pages": PAGES, "auth_required": auth.required, **context},
        status_code=status_code,
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


async def started(request: Request) -> None:
    """The hub's subscription, made by the first console request (retried if it failed)."""
    await hub(request).start()


# ---- signing in and out ----------------------------------------------------------------


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if target and re.fullmatch(r"/console(/[A-Za-z0-9_./?=&%-]*)?", target) and "//" not in target:
        return target
    return "/console/pools"


@router.get("/login")
async def login_page(request: Request, next: str | None = None, why: str = "") -> Response:
    auth: Authenticator = request.app.state.auth
    if not auth.required:
        return RedirectResponse(safe_next(next), status_code=303)
    return page(request, "login.html", None, next=safe_next(next), why=why[:200])


@router.post("/login")
async def login(request: Request) -> Response:
    """The login form (POST only: the key never goes in a URL): a valid API key with `read`
    gets a session cookie."""
    auth: Authenticator = request.app.state.auth
    sessions: Sessions = request.app.state.console_sessions
    body = await request.body()
    fields = parse_qs(body[: LOGIN_FIELD_BYTES * 2].decode(errors="replace"))
    token = (fields.get("api_key") or [""])[0][:LOGIN_FIELD_BYTES]
    target = safe_next((fields.get("next") or [""])[0])
    if not auth.required:
        return RedirectResponse(target, status_code=303)
    try:
        _, cookie = await sign_in(auth, sessions, token)
    except Denied as denied:
        auth.refused(request, denied.reason, f"console sign-in: {denied.detail}")
        return page(
            request, "login.html", None, next=target, why=denied.detail, status_code=denied.status
        )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=sessions.max_age,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/console/login", status_code=303)
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


# ---- pages ------------------------------------------------------------------------------


@router.get("")
async def home() -> Response:
    return RedirectResponse("/console/pools", status_code=303)


@router.get("/pools", dependencies=[Depends(started)])
async def pools_page(request: Request, bus: BusDep, principal: Viewer) -> Response:
    return page(request, "pools.html", principal, **await pools_context(bus, principal))


@router.get("/panels/pools")
async def pools_panel(request: Request, bus: BusDep, principal: Viewer) -> Response:
    return page(request, "_pools.html", principal, **await pools_context(bus, principal))


async def pools_context(bus: BusDep, principal: Principal) -> dict[str, Any]:
    answer = await data.pools(bus, principal)
    if isinstance(answer, data.Unavailable):
        return {"problem": answer.detail, "view": None}
    return {"problem": None, "view": views.pools_view(answer)}


TaskFilter = Annotated[str, Query(max_length=128)]


def tasks_query(status: str, pool: str, tenant: str, q: str) -> TasksQuery:
    return TasksQuery(
        status=TaskStatus(status) if status in TaskStatus.__members__.values() else None,
        pool=pool.strip() or None,
        tenant=tenant.strip() or None,
        search=q.strip() or None,
        limit=200,
    )


async def tasks_context(
    bus: BusDep, principal: Principal, status: str, pool: str, tenant: str, q: str
) -> dict[str, Any]:
    answer = await data.tasks(bus, principal, tasks_query(status, pool, tenant, q))
    context: dict[str, Any] = {
        "filters": {"status": status, "pool": pool, "tenant": tenant, "q": q},
        "statuses": [s.value for s in TaskStatus],
        "sees_all": principal.sees_all,
    }
    if isinstance(answer, data.Unavailable):
        return {**context, "problem": answer.detail, "rows": []}
    at = now()
    return {**context, "problem": None, "rows": [views.task_row(t, at) for t in answer.tasks]}


@router.get("/tasks", dependencies=[Depends(started)])
async def tasks_page(
    request: Request,
    bus: BusDep,
    principal: Viewer,
    status: TaskFilter = "",
    pool: TaskFilter = "",
    tenant: TaskFilter = "",
    q: TaskFilter = "",
    task: TaskFilter = "",
) -> Response:
    context = await tasks_context(bus, principal, status, pool, tenant, q)
    detail = await task_context(bus, principal, task) if task else {}
    return page(request, "tasks.html", principal, selected=task, **context, **detail)


@router.get("/panels/tasks")
async def tasks_panel(
    request: Request,
    bus: BusDep,
    principal: Viewer,
    status: TaskFilter = "",
    pool: TaskFilter = "",
    tenant: TaskFilter = "",
    q: TaskFilter = "",
) -> Response:
    context = await tasks_context(bus, principal, status, pool, tenant, q)
    return page(request, "_tasks.html", principal, **context)


async def task_context(bus: BusDep, principal: Principal, task_id: str) -> dict[str, Any]:
    found = await data.task(bus, principal, task_id)
    if found is None:
        return {"task_id": task_id, "detail": None, "problem": f"no task {task_id} is known"}
    if isinstance(found, data.Unavailable):
        return {"task_id": task_id, "detail": None, "problem": found.detail}
    deliveries = await data.webhooks(bus, task_id)
    at = now()
    return {
        "task_id": task_id,
        "detail": views.task_detail(found, at),
        "problem": None,
        "webhooks_problem": deliveries.detail if isinstance(deliveries, data.Unavailable) else None,
        "deliveries": []
        if isinstance(deliveries, data.Unavailable)
        else [views.delivery_row(d, at) for d in deliveries.deliveries],
    }


@router.get("/panels/tasks/{task_id}")
async def task_panel(request: Request, task_id: str, bus: BusDep, principal: Viewer) -> Response:
    return page(request, "_task.html", principal, **await task_context(bus, principal, task_id))


async def nodes_context(request: Request, bus: BusDep) -> dict[str, Any]:
    answer = await data.nodes(bus)
    if isinstance(answer, data.Unavailable):
        return {"problem": answer.detail, "rows": []}
    telemetry = hub(request).telemetry
    metrics, health = telemetry.latest_metrics(), telemetry.latest_health()
    at = now()
    rows = [
        views.node_row(n, metrics.get(n.node_id), health.get(n.node_id), at) for n in answer.nodes
    ]
    return {"problem": None, "rows": rows}


@router.get("/nodes", dependencies=[Depends(started)])
async def nodes_page(request: Request, bus: BusDep, principal: Viewer) -> Response:
    return page(request, "nodes.html", principal, **await nodes_context(request, bus))


@router.get("/panels/nodes")
async def nodes_panel(request: Request, bus: BusDep, principal: Viewer) -> Response:
    return page(request, "_nodes.html", principal, **await nodes_context(request, bus))


def valid_node(node_id: str) -> str | None:
    return node_id if re.fullmatch(NODE_ID_PATTERN, node_id) else None


async def node_context(bus: BusDep, node_id: str) -> dict[str, Any]:
    if valid_node(node_id) is None:
        return {"node_id": node_id, "detail": None, "svg": None, "problem": "no such node"}
    reports = await data.node_reports(bus, node_id)
    listed = await data.nodes(bus)
    summary = (
        None
        if isinstance(listed, data.Unavailable)
        else next((n for n in listed.nodes if n.node_id == node_id), None)
    )
    if reports.topology is None and summary is None:
        return {"node_id": node_id, "detail": None, "svg": None, "problem": "no such node"}
    return {
        "node_id": node_id,
        "topic": node_topic(node_id),
        "detail": views.node_detail(node_id, summary, reports.health, reports.metrics, now()),
        "svg": None
        if reports.topology is None
        else topology_svg(reports.topology.node, reports.metrics),
        "problem": None,
    }


@router.get("/nodes/{node_id}", dependencies=[Depends(started)])
async def node_page(request: Request, node_id: str, bus: BusDep, principal: Viewer) -> Response:
    context = await node_context(bus, node_id)
    return page(request, "node.html", principal, follow=context.get("topic"), **context)


@router.get("/panels/nodes/{node_id}")
async def node_panel(
    request: Request,
    node_id: str,
    bus: BusDep,
    principal: Viewer,
    follow: Annotated[str, Query(max_length=100)] = "nodes",
) -> Response:
    """One node's detail; `follow`: the event that refreshes it (`nodes` on the nodes page,
    the node's own on its page)."""
    follow = follow if wanted_topics(follow) == {follow} else "nodes"
    context = await node_context(bus, node_id)
    return page(request, "_node.html", principal, follow=follow, **context)


async def fleets_context(bus: BusDep) -> dict[str, Any]:
    answer = await data.fleets(bus)
    if isinstance(answer, data.Unavailable):
        return {"problem": answer.detail, "view": None}
    return {"problem": None, "view": views.fleets_view(answer, now())}


@router.get("/fleets", dependencies=[Depends(started)])
async def fleets_page(request: Request, bus: BusDep, principal: Viewer) -> Response:
    return page(request, "fleets.html", principal, **await fleets_context(bus))


@router.get("/panels/fleets")
async def fleets_panel(request: Request, bus: BusDep, principal: Viewer) -> Response:
    return page(request, "_fleets.html", principal, **await fleets_context(bus))


# ---- the event stream -------------------------------------------------------------------


@router.get("/events", dependencies=[Depends(started)])
async def events(
    request: Request,
    _: Viewer,
    topics: Annotated[str, Query(max_length=400)] = "",
) -> StreamingResponse:
    """Server-sent events: `event: <topic>` each time a panel the page shows changed, at
    most once per console_refresh_seconds per topic; a comment every 15 s keeps the
    connection open through proxies."""
    wanted = wanted_topics(topics)
    live = hub(request)

    async def stream() -> AsyncIterator[str]:
        with live.listen(wanted) as listener:
            yield "retry: 2000\n\n"
            while True:
                changed = await listener.changed(KEEP_ALIVE_SECONDS)
                if not changed:
                    yield ": keep-alive\n\n"
                for topic in changed:
                    yield f"event: {topic}\ndata: {topic}\n\n"
                await asyncio.sleep(0)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


# ---- who may not ------------------------------------------------------------------------


def login_redirect(request: Request, error: LoginRequired) -> Response:
    """A page goes to the login page (and back after); an htmx panel or the event stream is
    told to go there (HX-Redirect, which htmx follows) with a 401."""
    partial = bool(request.headers.get("hx-request")) or request.url.path.endswith("/events")
    if partial:
        shown = urlsplit(request.headers.get("hx-current-url", ""))
        target = shown.path + (f"?{shown.query}" if shown.query else "")
    else:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    location = f"/console/login?next={quote(safe_next(target))}"
    if error.reason:
        location += f"&why={quote(error.reason)}"
    if partial:
        return Response(status_code=401, headers={"HX-Redirect": location})
    return RedirectResponse(location, status_code=303)


def refused(request: Request, denied: Denied) -> Response:
    """A refusal other than 'sign in' (a key without `read`, a rate limit), as a page."""
    auth: Authenticator = request.app.state.auth
    auth.refused(request, denied.reason, denied.detail)
    return page(
        request,
        "refused.html",
        None,
        detail=denied.detail,
        status_code=denied.status,
        headers=denied.headers,
    )
