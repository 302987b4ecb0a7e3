"""The web console the gateway serves at /console (docs/console.md): pools, tasks, nodes and
fleets, server-rendered (Jinja2) and kept live by htmx over server-sent events. Its assets
(htmx and its SSE extension, the stylesheet) are files of this package: nothing is loaded
from elsewhere, so it works where nothing outside is reachable."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from crater.gateway.auth import Authenticator, Denied
from crater.gateway.console.live import LiveHub
from crater.gateway.console.routes import login_redirect, refused, router
from crater.gateway.console.session import LoginRequired, Sessions
from crater.gateway.settings import GatewaySettings
from crater.runtime.service import Service

__all__ = ["STATIC", "mount"]

STATIC = Path(__file__).parent / "static"
PREFIX = "/console"


def mount(app: FastAPI, settings: GatewaySettings, service: Service) -> None:
    """Add the console to the gateway: its routes, its assets under /console/static, the
    shared live hub (subscribed by the first console request, closed with the service)."""
    broker = service.broker

    async def subscribe(subject: str, cb: Callable[[Msg], Awaitable[None]]) -> Subscription:
        return await broker.connection.subscribe(subject, cb=cb)

    hub = LiveHub(subscribe, settings.console_refresh_seconds)
    app.state.console_hub = hub
    app.state.console_sessions = Sessions.of(settings)
    service.on_shutdown.append(hub.close)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="console-static")
    app.include_router(router)
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(Denied, _denied)


async def _denied(request: Request, error: Exception) -> Response:
    """A refusal: on a console path as a page, elsewhere as the REST API answers it."""
    assert isinstance(error, Denied)
    if request.url.path.startswith(f"{PREFIX}/"):
        return refused(request, error)
    authenticator: Authenticator = request.app.state.auth
    return authenticator.answer(request, error)


async def _login_required(request: Request, error: Exception) -> Response:
    assert isinstance(error, LoginRequired)
    return login_redirect(request, error)
