"""Issue #25, item 6: a home-grown inference server, wrapped in crater_client's ASGI
middleware and served by uvicorn, read by the autoscaler's scraper as it reads vLLM: its time
to first byte, the wait for one of its `max_concurrent` slots, the time between streamed
chunks and the requests waiting, between two scrapes over real HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from crater.autoscaler.adapters.scrape import Replica, ReplicaScraper
from crater.contracts import MetricsFormat
from crater_client.serving import ServingMetrics
from tests.support.scrape import served

CHUNKS = 4
FIRST_S, BETWEEN_S = 0.02, 0.05


async def generator(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A streaming 'model': the first token after 20 ms, three more 50 ms apart; /healthz."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    if scope["path"] == "/healthz":
        await send({"type": "http.response.body", "body": b"ok"})
        return
    await asyncio.sleep(FIRST_S)
    for i in range(CHUNKS):
        if i:
            await asyncio.sleep(BETWEEN_S)
        await send({"type": "http.response.body", "body": b"tok ", "more_body": i < CHUNKS - 1})


async def test_a_home_grown_server_is_read_like_an_engine() -> None:
    app = ServingMetrics(generator, max_concurrent=1)
    async with served(app) as http:
        url = str(http.base_url.join("/metrics"))
        async with httpx.AsyncClient() as client:
            scraper = ReplicaScraper(client, timeout_seconds=5.0)
            scraper.add(Replica("home-0", "chat", MetricsFormat.ASGI, url))
            assert await scraper.scrape_all() == []  # a baseline, and nothing served yet
            # Three at once through one slot: the second waits for the first, the third for
            # both (about 170 and 340 ms).
            await asyncio.gather(*(http.get("/generate") for _ in range(3)))
            [sample] = await scraper.scrape_all()
    assert (sample.service, sample.task_id) == ("chat", "home-0")
    assert len(sample.latencies_ms) == 3
    assert sample.queue_ms is not None
    queued = sorted(sample.queue_ms)
    assert queued[0] < 60  # the first had the slot at once
    assert queued[1] > 100
    assert queued[2] > 250
    first_bytes = sorted(sample.latencies_ms)
    assert first_bytes[0] >= FIRST_S * 1000 * 0.5
    assert first_bytes[2] >= queued[2]  # its first byte came after its wait (same bucket)
    assert sample.tpot_ms is not None
    assert len(sample.tpot_ms) == 3
    assert all(BETWEEN_S * 1000 * 0.8 <= v <= 400 for v in sample.tpot_ms)  # 50 ms apart
    assert sample.requests_waiting == 0


async def test_without_a_slot_limit_nothing_is_said_to_queue_and_probes_are_not_load() -> None:
    app = ServingMetrics(generator)
    async with served(app) as http:
        for _ in range(5):
            assert (await http.get("/healthz")).status_code == 200
        page = (await http.get("/metrics")).text
    assert "crater_serving_queue_time_seconds" not in page  # judged on time to first byte
    assert "crater_serving_time_to_first_byte_seconds_count 0.0" in page  # probes unmeasured


def test_a_slot_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_concurrent must be at least 1"):
        ServingMetrics(generator, max_concurrent=0)
