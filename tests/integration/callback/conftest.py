"""The reference receiver served over real HTTP by uvicorn, on a free port, per test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import uvicorn

from crater.callback.sim.receiver import Receiver
from crater.runtime.nats_server import free_port

USERNAME, PASSWORD = "alldata", "s3cret"


@dataclass
class ServedReceiver:
    state: Receiver
    url: str


@asynccontextmanager
async def serve_receiver(path: str = "/hooks/crater") -> AsyncIterator[ServedReceiver]:
    """A receiver served on a free port until the block ends (each keeps its own record)."""
    state = Receiver(USERNAME, PASSWORD, echo=False)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            state.app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
    )
    serving = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started or serving.done():
            break
        await asyncio.sleep(0.02)
    assert server.started, "receiver did not start"
    try:
        yield ServedReceiver(state, f"http://127.0.0.1:{port}{path}")
    finally:
        server.should_exit = True
        await serving


@pytest.fixture
async def receiver() -> AsyncIterator[ServedReceiver]:
    async with serve_receiver() as served:
        yield served
