"""The autoscaler reading real HTTP endpoints that serve vLLM's, TGI's and Triton's /metrics
pages as the load changes, one that garbles, one that hangs and one nobody listens on; and,
over a real nats-server, a scraped vLLM replica whose first tokens slow down scaled out
(issue #25, item 6)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from faststream import TestApp
from prometheus_client import CollectorRegistry, generate_latest

from crater.autoscaler.adapters import scrape
from crater.autoscaler.adapters.scrape import Replica, ReplicaScraper, ScrapeMetrics
from crater.autoscaler.app import AutoscalerSettings, build
from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    LatencySamplesReported,
    MetricsFormat,
    ReleaseReason,
    ScaleDecided,
    ScaleDirection,
    ScrapeTarget,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer, free_port
from tests.support.events import EventTap
from tests.support.expositions import TgiReplica, TritonReplica, VllmReplica

Page = Callable[[], tuple[int, bytes]]


@contextmanager
def serving(page: Page, port: int | None = None, delay: float = 0.0) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every GET with `page()` (status, body) after
    `delay` seconds, in a thread, until the block ends; yields its /metrics URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(delay)
            status, body = page()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    port = port or free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def ok(text: Callable[[], str]) -> Page:
    return lambda: (200, text().encode())


def value(registry: CollectorRegistry, line: str) -> bool:
    return line in generate_latest(registry).decode()


async def test_replicas_of_each_server_read_over_http_as_their_load_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vllm, tgi = VllmReplica(), TgiReplica()
    triton = TritonReplica(histogram_buckets_ms=[100, 500, 2000, 5000])
    garbled: Page = lambda: (200, b"<html><body>upstream connect error</body></html>")  # noqa: E731
    registry = CollectorRegistry()
    caplog.set_level(logging.INFO, logger="crater.autoscaler.scrape")
    client = httpx.AsyncClient()
    with (
        serving(ok(vllm.text)) as vllm_url,
        serving(ok(tgi.text)) as tgi_url,
        serving(ok(triton.text)) as triton_url,
        serving(garbled) as garbled_url,
        serving(ok(vllm.text), delay=3.0) as hanging_url,
        serving(lambda: (503, b"loading")) as loading_url,
    ):
        dead_url = f"http://127.0.0.1:{free_port()}/metrics"  # nobody listens there
        scraper = ReplicaScraper(client, ScrapeMetrics(registry), timeout_seconds=0.5)
        targets = {
            "llama-0": (MetricsFormat.VLLM, vllm_url),
            "tgi-0": (MetricsFormat.TGI, tgi_url),
            "triton-0": (MetricsFormat.TRITON, triton_url),
            "garbled-0": (MetricsFormat.VLLM, garbled_url),
            "hanging-0": (MetricsFormat.VLLM, hanging_url),
            "loading-0": (MetricsFormat.TGI, loading_url),
            "dead-0": (MetricsFormat.TRITON, dead_url),
            "wrong-0": (MetricsFormat.TRITON, tgi_url),  # a TGI page read as Triton's
        }
        for task, (server, url) in targets.items():
            scraper.add(Replica(task, "chat", server, url))

        # A first round is a baseline: lifetime totals are no sample.
        for _ in range(200):
            vllm.request(ttft_s=4.0)  # before the autoscaler looked
        started = time.monotonic()
        assert await scraper.scrape_all() == []
        assert time.monotonic() - started < 2.5  # the hanging one cut at its timeout
        down = {t for t, h in scraper.health.items() if h.up is False}
        assert down == {"garbled-0", "hanging-0", "loading-0", "dead-0", "wrong-0"}
        for task, reason in [
            ("garbled-0", "malformed"),
            ("hanging-0", "timeout"),
            ("loading-0", "http_status"),
            ("dead-0", "unreachable"),
            ("wrong-0", "missing_metrics"),
        ]:
            assert value(
                registry,
                f'crater_autoscaler_scrape_failures_total{{reason="{reason}",replica="{task}",'
                'service="chat"} 1.0',
            ), task
            assert value(
                registry, f'crater_autoscaler_replica_up{{replica="{task}",service="chat"}} 0.0'
            )
            [line] = [
                r.getMessage()
                for r in caplog.records
                if task in r.getMessage() and "does not answer" in r.getMessage()
            ]
            assert reason in line
            assert "never answered" in line
        assert value(registry, 'crater_autoscaler_replica_up{replica="llama-0",service="chat"} 1.0')

        # Then the servers serve requests: each one's sample is what it served since.
        for _ in range(19):
            vllm.request(ttft_s=0.03, queue_s=0.0, tpot_s=0.02)
        vllm.request(ttft_s=0.9, queue_s=0.6, tpot_s=0.12)
        vllm.set_load(waiting=5, running=14, kv_cache=0.9)
        for _ in range(9):
            tgi.request(0.004)
        tgi.request(2.0)
        for ms in (80, 90, 400, 450):
            triton.request(duration_ms=ms * 3, queue_ms=ms / 4, first_response_ms=ms)
        samples = {s.replica_id: s for s in await scraper.scrape_all()}
        assert set(samples) == {"llama-0", "tgi-0", "triton-0"}
        llama = samples["llama-0"]
        assert len(llama.latencies_ms) == 20
        assert all(20 < v <= 40 for v in sorted(llama.latencies_ms)[:19])
        assert 750 < max(llama.latencies_ms) <= 1000
        assert (llama.kv_cache_usage, llama.gpu_memory_pressure) == (0.9, None)
        assert llama.requests_waiting == 5  # vllm:num_requests_waiting, the backlog
        # Time per output token (vllm:request_time_per_output_token_seconds), one per request.
        assert llama.tpot_ms is not None
        assert len(llama.tpot_ms) == 20
        assert all(10 < v <= 25 for v in sorted(llama.tpot_ms)[:19])
        assert 100 < max(llama.tpot_ms) <= 150
        assert (llama.service, llama.task_id) == ("chat", "llama-0")
        assert len(samples["tgi-0"].latencies_ms) == 10
        assert max(samples["tgi-0"].latencies_ms) > 1000
        assert sorted(samples["triton-0"].latencies_ms)[0] < 100
        assert len(samples["triton-0"].latencies_ms) == 4
        assert value(
            registry,
            'crater_autoscaler_replica_requests_waiting{replica="llama-0",service="chat"} 5.0',
        )
        assert value(
            registry,
            'crater_autoscaler_replica_kv_cache_usage_ratio{replica="llama-0",service="chat"} 0.9',
        )

        # Nothing served since: nothing sent (an idle replica is silent).
        assert await scraper.scrape_all() == []

        # The dead one stays a target, reported again each round it is down...
        assert scraper.health["dead-0"].failures == 3
        assert "dead-0" in {r.task_id for r in scraper.replicas()}
        # ...until its allocation is released.
        scraper.remove("dead-0")
        assert "dead-0" not in {r.task_id for r in scraper.replicas()}
        assert not value(registry, 'crater_autoscaler_replica_up{replica="dead-0"')

    # Every server gone: the live ones are reported as stopping to answer, once each. Nothing
    # hangs now, so a longer timeout lets a loaded machine see the refusal, not the 0.5 s cut.
    scraper.timeout = 5.0
    caplog.clear()
    try:
        assert await scraper.scrape_all() == []
    finally:
        await client.aclose()
    assert scraper.health["llama-0"].up is False
    lines = [r.getMessage() for r in caplog.records if "llama-0" in r.getMessage()]
    assert len(lines) == 1
    assert "unreachable" in lines[0]
    assert "last answered" in lines[0]


async def test_a_replica_that_answers_again_is_logged_and_sampled_from_its_baseline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vllm = VllmReplica()
    port = free_port()
    caplog.set_level(logging.INFO, logger="crater.autoscaler.scrape")
    async with httpx.AsyncClient() as client:
        scraper = ReplicaScraper(client, timeout_seconds=0.5)
        scraper.add(
            Replica("llama-0", "chat", MetricsFormat.VLLM, f"http://127.0.0.1:{port}/metrics")
        )
        with serving(ok(vllm.text), port=port):
            assert await scraper.scrape_all() == []
        assert await scraper.scrape_all() == []  # down
        assert scraper.health["llama-0"].up is False
        vllm.request(ttft_s=0.05)
        with serving(ok(vllm.text), port=port):
            [sample] = await scraper.scrape_all()
        assert len(sample.latencies_ms) == 1
        assert scraper.health["llama-0"].up is True
        assert any("answers again" in r.getMessage() for r in caplog.records)


async def test_a_page_too_large_is_cut_and_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrape, "MAX_BODY", 4096)
    vllm = VllmReplica()  # its page is larger than 4 KiB
    with serving(ok(vllm.text)) as url:
        async with httpx.AsyncClient() as client:
            scraper = ReplicaScraper(client, timeout_seconds=0.5)
            scraper.add(Replica("llama-0", "chat", MetricsFormat.VLLM, url))
            assert await scraper.scrape_all() == []
    assert scraper.health["llama-0"].last_error == "a page over 4096 bytes"


async def test_the_loop_survives_a_sink_that_fails() -> None:
    vllm = VllmReplica()
    taken: list[LatencySamplesReported] = []
    calls = 0

    async def sink(sample: LatencySamplesReported) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the first one is refused")
        taken.append(sample)

    with serving(ok(vllm.text)) as url:
        async with httpx.AsyncClient() as client:
            scraper = ReplicaScraper(client, timeout_seconds=0.5)
            scraper.add(Replica("llama-0", "chat", MetricsFormat.VLLM, url))
            loop = asyncio.create_task(scraper.run(0.05, sink))
            try:
                deadline = time.monotonic() + 10
                while len(taken) < 2:
                    assert time.monotonic() < deadline, "the loop stopped sampling"
                    vllm.request(ttft_s=0.05)
                    await asyncio.sleep(0.05)
            finally:
                loop.cancel()
    assert calls >= 3


def granted(task_id: str, url: str) -> AllocationGranted:
    return AllocationGranted(
        allocation_id=f"alloc-{task_id}",
        task_id=task_id,
        node="a100-01",
        pool="inference",
        tenant="default",
        gpu_ids=[0],
        gpu_memory_mb=20_000,
        cpu_cores=[0, 1],
        numa_node=0,
        memory_mb=8_192,
        checkpoint_path=None,
        reservation_token="token",
        reservation_expires_at=datetime.now(UTC) + timedelta(seconds=30),
        score=1.0,
        explanation="test",
        environment={},
        scrape=ScrapeTarget(service="chat-llama3", format=MetricsFormat.VLLM, url=url),
    )


async def test_a_scraped_vllm_replica_that_slows_down_is_scaled_out(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    vllm = VllmReplica()
    with serving(ok(vllm.text)) as url:
        settings = AutoscalerSettings(
            nats_url=fresh_nats.url, scrape_interval_seconds=0.2, scrape_timeout_seconds=1.0
        )
        service, app = build(settings)
        async with TestApp(app):
            await publish(service.broker, granted("chat-llama3-0", url))
            up = 'crater_autoscaler_replica_up{replica="chat-llama3-0",service="chat-llama3"} 1.0'
            deadline = time.monotonic() + 20
            while not value(service.registry, up):
                assert time.monotonic() < deadline, "the replica was never scraped"
                await asyncio.sleep(0.05)
            # Its first tokens now come after 450-700 ms, its KV cache nearly full.
            vllm.set_load(waiting=12, running=16, kv_cache=0.95)
            for _ in range(40):
                vllm.request(ttft_s=0.6, queue_s=0.5)
            [decision] = await tap.wait_for(ScaleDecided, timeout=20)
            assert decision.service == "chat-llama3"
            assert decision.direction is ScaleDirection.OUT
            assert decision.p95_latency_ms > 400
            assert decision.gpu_memory_pressure == 0.95  # its KV cache
            assert decision.pressure_source == "kv-cache"

            # Its release ends the scraping.
            await publish(
                service.broker,
                AllocationReleased(
                    allocation_id="alloc-chat-llama3-0",
                    task_id="chat-llama3-0",
                    node="a100-01",
                    gpu_ids=[0],
                    cpu_cores=[0, 1],
                    reason=ReleaseReason.SCALED_IN,
                ),
            )
            deadline = time.monotonic() + 20
            while value(service.registry, 'replica="chat-llama3-0"'):
                assert time.monotonic() < deadline, "the released replica is still scraped"
                await asyncio.sleep(0.05)
