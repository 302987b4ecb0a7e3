"""A service served as `main()` serves it (uvicorn on a free port, the app's lifespan), and
its /metrics read over HTTP and parsed as Prometheus parses it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from crater.runtime.nats_server import free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@asynccontextmanager
async def served(app: Any, port: int | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """`app` under uvicorn until the block ends; yields a client for its base URL."""
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on", log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or serving.done():
                break
            await asyncio.sleep(0.02)
        assert server.started, "the service did not start"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            await healthy(http)
            yield http
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


async def healthy(http: httpx.AsyncClient, timeout: float = 30.0) -> None:
    """Until /healthz answers 2xx (its broker connected): uvicorn's `started` can come first
    on a loaded machine, and a test publishing on the service's broker then finds none."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (await http.get("/healthz")).is_success:
        assert asyncio.get_running_loop().time() < deadline, "the service never got healthy"
        await asyncio.sleep(0.05)


async def scrape(http: httpx.AsyncClient) -> Samples:
    """GET /metrics, parsed: (series name, labels) -> value."""
    response = await http.get("/metrics")
    assert response.status_code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every series of `name`, by its labels."""
    return {labels: v for (n, labels), v in samples.items() if n == name}
