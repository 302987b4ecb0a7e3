"""The reference receiver served over real HTTP by uvicorn, on a free port, per test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import uvicorn

from crater.callback.receiver import Receiver
from crater.runtime.nats_server import free_port

USERNAME, PASSWORD = "alldata", "s3cret"


@dataclass
class ServedReceiver:
    state: Receiver
    url: str


@pytest.fixture
async def receiver() -> AsyncIterator[ServedReceiver]:
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
        yield ServedReceiver(state, f"http://127.0.0.1:{port}/hooks/crater")
    finally:
        server.should_exit = True
        await serving
