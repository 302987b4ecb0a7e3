"""Scraping inference replicas: each replica's Prometheus endpoint, read every interval, turned
into the `LatencySamplesReported` a replica publishing its own samples would send.

The targets come from the replicas' allocations (`AllocationGranted.scrape`, formed by the
scheduler from the request's `inference_config.metrics` and the node's hostname) and go with
their release. Every target is scraped concurrently, each within the timeout; a scrape that
fails (unreachable, timed out, an HTTP error, text that is not Prometheus, an exposition
without the server's metrics) is counted (`crater_autoscaler_scrape_failures_total{service,
replica,reason}`) and logged naming the replica and the reason, and the loop goes on. A replica
that stops answering stays a target, shown down (`crater_autoscaler_replica_up` 0) and logged
when it goes down, every `remind_every` failures after, and when it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from crater.autoscaler.adapters.exposition import (
    Exposition,
    ExpositionError,
    Interval,
    interval,
    parse,
)
from crater.contracts import LatencySamplesReported, MetricsFormat, ScrapeTarget
from crater.contracts.autoscaling import MAX_REQUESTS_WAITING

log = logging.getLogger("crater.autoscaler.scrape")

Sink = Callable[[LatencySamplesReported], Awaitable[None]]

# Bytes of a metrics page read at most (a vLLM page is tens of KiB): a larger one is cut.
MAX_BODY = 8 << 20


@dataclass(frozen=True)
class Replica:
    """One scrape target: a replica (its task) of a service."""

    task_id: str
    service: str
    server: MetricsFormat
    url: str

    @classmethod
    def of(cls, task_id: str, target: ScrapeTarget) -> Replica:
        return cls(task_id, target.service, target.format, target.url)


@dataclass
class Health:
    """What the scraper knows of a replica's endpoint."""

    up: bool | None = None  # None: not scraped yet
    failures: int = 0  # in a row
    last_error: str | None = None
    last_success: float | None = None


class ScrapeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.scrapes = Counter(
            "crater_autoscaler_scrapes",
            "Scrapes of inference replicas' metrics endpoints, by result (ok or failed).",
            ["service", "result"],
            registry=registry,
        )
        self.failures = Counter(
            "crater_autoscaler_scrape_failures",
            "Failed scrapes of a replica's metrics endpoint, by reason: unreachable, timeout, "
            "http_status, malformed (not Prometheus text), missing_metrics (not the server's).",
            ["service", "replica", "reason"],
            registry=registry,
        )
        self.up = Gauge(
            "crater_autoscaler_replica_up",
            "1 when a scraped replica's latest scrape succeeded, 0 when it failed.",
            ["service", "replica"],
            registry=registry,
        )
        self.waiting = Gauge(
            "crater_autoscaler_replica_requests_waiting",
            "Requests queued on a scraped replica at its latest scrape.",
            ["service", "replica"],
            registry=registry,
        )
        self.kv_cache = Gauge(
            "crater_autoscaler_replica_kv_cache_usage_ratio",
            "KV cache in use (0..1) on a scraped replica at its latest scrape (vLLM).",
            ["service", "replica"],
            registry=registry,
        )

    def forget(self, replica: Replica) -> None:
        for gauge in (self.up, self.waiting, self.kv_cache):
            with contextlib.suppress(KeyError):
                gauge.remove(replica.service, replica.task_id)


class ReplicaScraper:
    """The replicas to scrape and what their last scrape said. `scrape_all` is one round;
    `run` rounds forever, handing each sample to the sink."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        metrics: ScrapeMetrics | None = None,
        *,
        timeout_seconds: float = 2.0,
        remind_every: int = 10,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.timeout = timeout_seconds
        self.remind_every = remind_every
        self.clock = clock
        self._replicas: dict[str, Replica] = {}
        self._last: dict[str, Exposition] = {}
        self.health: dict[str, Health] = {}

    def add(self, replica: Replica) -> None:
        """Scrape this replica from the next round (a changed endpoint starts afresh)."""
        if self._replicas.get(replica.task_id) != replica:
            self._last.pop(replica.task_id, None)
            self.health[replica.task_id] = Health()
            log.info(
                "scraping %s replica %s of %s at %s",
                replica.server.value,
                replica.task_id,
                replica.service,
                replica.url,
            )
        self._replicas[replica.task_id] = replica

    def remove(self, task_id: str) -> None:
        """The replica's allocation was released: no more scrapes."""
        replica = self._replicas.pop(task_id, None)
        self._last.pop(task_id, None)
        self.health.pop(task_id, None)
        if replica is not None:
            log.info("no longer scraping replica %s of %s (released)", task_id, replica.service)
            if self.metrics is not None:
                self.metrics.forget(replica)

    def replicas(self) -> list[Replica]:
        return sorted(self._replicas.values(), key=lambda r: (r.service, r.task_id))

    async def scrape_all(self) -> list[LatencySamplesReported]:
        """One round: every replica scraped at once; the samples of those that served
        requests since their previous scrape."""
        replicas = self.replicas()
        results = await asyncio.gather(*(self._scrape(r) for r in replicas))
        return [sample for sample in results if sample is not None]

    async def run(self, every_seconds: float, sink: Sink) -> None:
        """Forever: a round every `every_seconds` (from the start of the previous one); a
        sample the sink refuses is logged, the loop goes on."""
        while True:
            started = time.monotonic()
            try:
                for sample in await self.scrape_all():
                    try:
                        await sink(sample)
                    except Exception:
                        log.exception(
                            "the sample scraped from replica %s of %s was not taken",
                            sample.replica_id,
                            sample.service,
                        )
            except Exception:
                log.exception("scrape round failed")
            await asyncio.sleep(max(0.0, every_seconds - (time.monotonic() - started)))

    # -- one replica -----------------------------------------------------------------------

    async def _scrape(self, replica: Replica) -> LatencySamplesReported | None:
        at = self.clock()
        try:
            text = await self._get(replica.url)
            exposition = parse(replica.server, text)
        except Failure as failure:
            self._failed(replica, failure.reason, failure.detail)
            return None
        except ExpositionError as e:
            self._failed(replica, e.reason, str(e))
            return None
        if self._replicas.get(replica.task_id) != replica:
            return None  # released while it was scraped
        self._succeeded(replica, exposition, at)
        before = self._last.get(replica.task_id)
        self._last[replica.task_id] = exposition
        return self.sample(replica, interval(exposition, before), at)

    async def _get(self, url: str) -> str:
        """The page's text; read as it streams, cut at MAX_BODY bytes, all within the
        timeout."""
        try:
            async with (
                asyncio.timeout(self.timeout),
                self.client.stream("GET", url, timeout=self.timeout) as response,
            ):
                if response.status_code != 200:
                    raise Failure("http_status", f"HTTP {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_BODY:
                        raise Failure("malformed", f"a page over {MAX_BODY} bytes")
        except (TimeoutError, httpx.TimeoutException) as e:
            raise Failure("timeout", f"no answer within {self.timeout:g} s") from e
        except httpx.HTTPError as e:
            raise Failure("unreachable", f"{type(e).__name__}: {e}" if str(e) else repr(e)) from e
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Failure("malformed", f"not UTF-8 text: {e}") from e

    @staticmethod
    def sample(
        replica: Replica, found: Interval | None, at: float
    ) -> LatencySamplesReported | None:
        """The sample of an interval, as a replica publishing its own would send it: the
        latencies of the requests that got their first token since the previous scrape, the
        requests waiting for admission now (its backlog), and the KV cache its engine says is
        in use (vLLM), which the autoscaler reads as the replica's pressure ahead of its
        cards' memory. None when it served none (an idle replica is silent, as one publishing
        its samples is)."""
        if found is None or not found.latencies_ms:
            return None
        return LatencySamplesReported(
            occurred_at=datetime.fromtimestamp(at, UTC),
            service=replica.service,
            replica_id=replica.task_id,
            task_id=replica.task_id,
            latencies_ms=found.latencies_ms,
            queue_ms=found.queue_ms or None,
            tpot_ms=found.tpot_ms[:10_000] if found.tpot_ms else None,
            requests_waiting=_count(found.waiting),
            kv_cache_usage=found.kv_cache,
        )

    def _succeeded(self, replica: Replica, exposition: Exposition, at: float) -> None:
        health = self.health.setdefault(replica.task_id, Health())
        if health.up is False:
            log.warning(
                "replica %s of %s answers again at %s after %d failed scrapes (last: %s)",
                replica.task_id,
                replica.service,
                replica.url,
                health.failures,
                health.last_error,
            )
        health.up, health.failures, health.last_success = True, 0, at
        m = self.metrics
        if m is None:
            return
        m.scrapes.labels(service=replica.service, result="ok").inc()
        m.up.labels(service=replica.service, replica=replica.task_id).set(1)
        if exposition.waiting is not None:
            m.waiting.labels(service=replica.service, replica=replica.task_id).set(
                exposition.waiting
            )
        if exposition.kv_cache is not None:
            m.kv_cache.labels(service=replica.service, replica=replica.task_id).set(
                exposition.kv_cache
            )

    def _failed(self, replica: Replica, reason: str, detail: str) -> None:
        if replica.task_id not in self._replicas:
            return  # released while it was scraped
        health = self.health.setdefault(replica.task_id, Health())
        was_up = health.up
        health.up, health.failures, health.last_error = False, health.failures + 1, detail
        m = self.metrics
        if m is not None:
            m.scrapes.labels(service=replica.service, result="failed").inc()
            m.failures.labels(service=replica.service, replica=replica.task_id, reason=reason).inc()
            m.up.labels(service=replica.service, replica=replica.task_id).set(0)
        if was_up is not False or health.failures % self.remind_every == 0:
            silent = (
                "never answered"
                if health.last_success is None
                else f"last answered {self.clock() - health.last_success:.0f} s ago"
            )
            log.warning(
                "replica %s of %s does not answer its scrape at %s: %s (%s; %d in a row, %s)",
                replica.task_id,
                replica.service,
                replica.url,
                reason,
                detail,
                health.failures,
                silent,
            )


class Failure(Exception):
    """A scrape that got no metrics page: its reason (a metric label) and what happened."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _count(gauge: float | None) -> int | None:
    """A gauge of requests as the whole number the contract takes (None when not exported);
    one out of bounds (a counter gone wrong) is not sent rather than failing the sample."""
    if gauge is None or not 0 <= gauge <= MAX_REQUESTS_WAITING:
        return None
    return round(gauge)
