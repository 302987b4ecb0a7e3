"""Inference servers' Prometheus expositions -> the load of one replica.

What each server exposes (names checked against the servers' own sources and docs; see
docs/autoscaling.md, Reading real replicas):

- vLLM (`/metrics` on its API port): `vllm:time_to_first_token_seconds` (histogram),
  `vllm:request_queue_time_seconds` (histogram, time in WAITING), `vllm:num_requests_waiting`,
  `vllm:num_requests_running`, the time per output token as
  `vllm:request_time_per_output_token_seconds` (per request), else
  `vllm:time_per_output_token_seconds` or `vllm:inter_token_latency_seconds` (per token), and
  the KV cache in use as `vllm:kv_cache_usage_perc` (V1
  engine) or `vllm:gpu_cache_usage_perc` (V0, deprecated in V1); labels `model_name` and, in
  V1, `engine` (one series per engine: summed).
- TGI (`/metrics`): `tgi_request_queue_duration` (histogram, seconds in the queue; TGI
  exports no time-to-first-token histogram), `tgi_request_mean_time_per_token_duration`
  (histogram, each request's mean time per token), `tgi_queue_size`, `tgi_batch_current_size`.
- crater_client.serving (a home-grown server's `/metrics`, format `asgi`):
  `crater_serving_time_to_first_byte_seconds`, `crater_serving_queue_time_seconds` (with
  `max_concurrent`), `crater_serving_time_per_chunk_seconds` (histograms),
  `crater_serving_requests_waiting` and `crater_serving_requests_running` (gauges).
- Triton (`/metrics` on port 8002): `nv_inference_first_response_histogram_ms` (histogram in
  milliseconds, only for decoupled models with `--metrics-config histogram_latencies=true`),
  else the cumulative counters `nv_inference_request_duration_us`,
  `nv_inference_queue_duration_us` and `nv_inference_request_success` (means per request,
  not a distribution); `nv_inference_pending_request_count` (gauge); labels `model` and
  `version` (summed). With the TensorRT-LLM backend also
  `nv_trt_llm_request_metrics{request_type="waiting"|"scheduled"}` and
  `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}` (the KV cache in use).

Parsing is prometheus_client's (`text_string_to_metric_families`); a text it refuses is
`MalformedExposition`, an exposition without the server's metrics `MissingMetrics`.

Latencies come from the *difference* between two scrapes of a cumulative histogram (what the
replica observed in between), never from its lifetime totals; a counter that went down (the
server restarted) counts from zero, as Prometheus' rate() does.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from crater.contracts import MetricsFormat

# A sample batch holds at most this many latencies (LatencySamplesReported's bound).
MAX_SAMPLES = 10_000


class ExpositionError(ValueError):
    """A scrape's text cannot be read as the load of a replica."""

    reason = "malformed"


class MalformedExposition(ExpositionError):
    """Not Prometheus text (prometheus_client's parser refused it)."""


class MissingMetrics(ExpositionError):
    """Prometheus text, but none of the server's metrics the autoscaler reads."""

    reason = "missing_metrics"


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram: (upper bound, observations at or below it), ascending, the
    last bound +Inf; in milliseconds."""

    buckets: tuple[tuple[float, float], ...]

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def since(self, earlier: Histogram | None) -> Histogram | None:
        """The observations made after `earlier`: None when there is no earlier one (a first
        scrape is only a baseline) or the buckets changed; everything when a count went down
        (the server restarted: its counts start again from zero)."""
        if earlier is None:
            return None
        if [le for le, _ in earlier.buckets] != [le for le, _ in self.buckets]:
            return None
        pairs = zip(self.buckets, earlier.buckets, strict=True)
        if any(now < before for (_, now), (_, before) in pairs):
            return self
        return Histogram(
            tuple(
                (le, now - before)
                for (le, now), (_, before) in zip(self.buckets, earlier.buckets, strict=True)
            )
        )

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket holding rank q x count (the
        first bucket from 0); a rank in the +Inf bucket is the highest finite bound. None when
        empty."""
        total = self.count
        if total <= 0 or not self.buckets:
            return None
        rank = q * total
        counts = [c for _, c in self.buckets]
        i = min(bisect_left(counts, rank), len(counts) - 1)
        upper, cumulative = self.buckets[i]
        if math.isinf(upper):
            finite = [le for le, _ in self.buckets if not math.isinf(le)]
            return finite[-1] if finite else None
        lower, below = (0.0, 0.0) if i == 0 else self.buckets[i - 1]
        inside = cumulative - below
        if inside <= 0:
            return upper
        return lower + (upper - lower) * (rank - below) / inside

    def spread(self, limit: int = MAX_SAMPLES) -> list[float]:
        """The observations as latencies: one value per observation (at most `limit`, evenly
        spaced in rank beyond it), each the quantile of its rank, so the nearest-rank p95 of
        the values is the histogram's interpolated p95."""
        total = round(self.count)
        n = min(total, limit)
        values = []
        for k in range(n):
            value = self.quantile((k + 0.5) / n)
            if value is not None:
                values.append(value)
        return values


@dataclass(frozen=True)
class Exposition:
    """What one scrape of a replica says. Histograms and counters are cumulative."""

    latency: Histogram | None = None  # time to first token (vLLM, Triton); TGI: queue time
    queue: Histogram | None = None  # time waiting to be scheduled (vLLM, TGI)
    tpot: Histogram | None = None  # time per output token after the first (vLLM, TGI)
    waiting: float | None = None  # requests queued now
    running: float | None = None  # requests being served now
    kv_cache: float | None = None  # KV cache in use, 0..1
    # Triton without histograms: cumulative totals, for means between two scrapes.
    totals: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Interval:
    """What a replica did between two scrapes."""

    latencies_ms: list[float]  # one per request that got its first token (see Histogram.spread)
    requests: int
    # Time queued before being scheduled, one per request (vLLM, TGI; Triton: the mean per
    # request); None when the server does not export it.
    queue_ms: list[float] | None
    p95_ms: float | None
    queue_p95_ms: float | None
    queue_mean_ms: float | None
    waiting: float | None
    running: float | None
    kv_cache: float | None
    estimated: bool = False  # latencies are a mean per request (Triton counters), not buckets
    # Time per output token after the first (vLLM, TGI), one value per observation.
    tpot_ms: list[float] | None = None


def parse(server: MetricsFormat, text: str) -> Exposition:
    """One scrape's text, read as the server's exposition."""
    families = _families(text)
    if server is MetricsFormat.VLLM:
        return _vllm(families)
    if server is MetricsFormat.TGI:
        return _tgi(families)
    if server is MetricsFormat.TRITON:
        return _triton(families)
    if server is MetricsFormat.ASGI:
        return _asgi(families)
    raise ValueError(f"format {server.value} is not scraped")


def interval(now: Exposition, before: Exposition | None) -> Interval | None:
    """What happened between two scrapes of one replica; None on its first scrape (nothing to
    compare with: lifetime totals are not a rate)."""
    if before is None:
        return None
    latency = now.latency.since(before.latency) if now.latency else None
    queue = now.queue.since(before.queue) if now.queue else None
    tpot = now.tpot.since(before.tpot) if now.tpot else None
    queue_mean: float | None = None
    queued: list[float] | None = None
    if latency is not None:
        latencies = latency.spread()
        requests = round(latency.count)
        p95 = latency.quantile(0.95)
    else:
        requests, latencies, queue_mean = _means(now.totals, before.totals)
        p95 = latencies[0] if latencies else None  # Triton's counters: the mean
        if queue_mean is not None and latencies:
            queued = [queue_mean] * len(latencies)
    if queue is not None:
        queued = queue.spread()
    return Interval(
        latencies_ms=latencies,
        requests=requests,
        queue_ms=queued,
        p95_ms=p95,
        queue_p95_ms=queue.quantile(0.95) if queue is not None else None,
        queue_mean_ms=queue_mean,
        waiting=now.waiting,
        running=now.running,
        kv_cache=now.kv_cache,
        estimated=latency is None and bool(latencies),
        tpot_ms=(tpot.spread() or None) if tpot is not None else None,
    )


# -- the servers ------------------------------------------------------------------------


class _Families:
    """The parsed families by name: each one's samples, summed over their other labels."""

    def __init__(self, families: dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]):
        self._families = families

    def __contains__(self, name: str) -> bool:
        return name in self._families

    def gauge(
        self, name: str, combine: str = "sum", where: tuple[str, str] | None = None
    ) -> float | None:
        """The family's series (those with label `where`, when given), summed or their max."""
        found = self._families.get(name)
        if found is None:
            return None
        values = [
            v
            for sample, labels, v in found[1]
            if sample == name
            and math.isfinite(v)
            and (where is None or labels.get(where[0]) == where[1])
        ]
        if not values:
            return None
        return max(values) if combine == "max" else sum(values)

    def counter(self, name: str) -> float | None:
        found = self._families.get(name)
        if found is None:
            return None
        values = [v for sample, _, v in found[1] if sample in (name, name + "_total") and v == v]
        return sum(values) if values else None

    def histogram(self, name: str, to_ms: float) -> Histogram | None:
        """The family's buckets summed over its series (engines, models), in ms."""
        found = self._families.get(name)
        if found is None or found[0] != "histogram":
            return None
        by_bound: dict[float, float] = defaultdict(float)
        for sample, labels, value in found[1]:
            if sample != name + "_bucket" or "le" not in labels:
                continue
            try:
                bound = float(labels["le"])
            except ValueError as e:
                raise MalformedExposition(f"{name}: bucket bound {labels['le']!r}") from e
            by_bound[bound] += value
        if not by_bound:
            return None
        if math.inf not in by_bound:
            raise MalformedExposition(f"{name}: no +Inf bucket")
        buckets = tuple(
            (le if math.isinf(le) else le * to_ms, count) for le, count in sorted(by_bound.items())
        )
        counts = [c for _, c in buckets]
        if any(later < earlier for earlier, later in itertools.pairwise(counts)):
            raise MalformedExposition(f"{name}: bucket counts are not cumulative")
        return Histogram(buckets)


def _families(text: str) -> _Families:
    parsed: dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            samples = [(s.name, dict(s.labels), float(s.value)) for s in family.samples]
            kind, earlier = parsed.get(family.name, (family.type, []))
            parsed[family.name] = (kind, earlier + samples)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise MalformedExposition(f"not Prometheus text: {e}") from e
    return _Families(parsed)


def _require(families: _Families, server: str, names: Iterable[str]) -> None:
    wanted = list(names)
    if not any(name in families for name in wanted):
        raise MissingMetrics(f"no {server} metrics: none of {', '.join(wanted)}")


# vLLM's time per output token, newest name first: one value per request (its mean), else
# one per token (the inter-token latency, as V0 and V1 before 0.11 observe it).
_VLLM_TPOT = (
    "vllm:request_time_per_output_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
)


def _first_histogram(f: _Families, names: tuple[str, ...]) -> Histogram | None:
    """The first of `names` the page exports, in milliseconds."""
    for name in names:
        found = f.histogram(name, 1000.0)
        if found is not None:
            return found
    return None


def _vllm(f: _Families) -> Exposition:
    _require(
        f,
        "vLLM",
        (
            "vllm:time_to_first_token_seconds",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
        ),
    )
    kv = f.gauge("vllm:kv_cache_usage_perc", "max")
    if kv is None:
        kv = f.gauge("vllm:gpu_cache_usage_perc", "max")
    return Exposition(
        latency=f.histogram("vllm:time_to_first_token_seconds", 1000.0),
        queue=f.histogram("vllm:request_queue_time_seconds", 1000.0),
        tpot=_first_histogram(f, _VLLM_TPOT),
        waiting=f.gauge("vllm:num_requests_waiting"),
        running=f.gauge("vllm:num_requests_running"),
        kv_cache=None if kv is None else min(max(kv, 0.0), 1.0),
    )


def _asgi(f: _Families) -> Exposition:
    """crater_client.serving's page: time to first byte as the latency; its queue (only with
    max_concurrent: else nothing queues in the middleware) and time per chunk when there."""
    _require(f, "crater_client.serving", ("crater_serving_time_to_first_byte_seconds",))
    return Exposition(
        latency=f.histogram("crater_serving_time_to_first_byte_seconds", 1000.0),
        queue=f.histogram("crater_serving_queue_time_seconds", 1000.0),
        tpot=f.histogram("crater_serving_time_per_chunk_seconds", 1000.0),
        waiting=f.gauge("crater_serving_requests_waiting"),
        running=f.gauge("crater_serving_requests_running"),
    )


def _tgi(f: _Families) -> Exposition:
    _require(f, "TGI", ("tgi_request_queue_duration", "tgi_queue_size", "tgi_batch_current_size"))
    queue = f.histogram("tgi_request_queue_duration", 1000.0)
    return Exposition(
        latency=queue,
        queue=queue,
        tpot=f.histogram("tgi_request_mean_time_per_token_duration", 1000.0),
        waiting=f.gauge("tgi_queue_size"),
        running=f.gauge("tgi_batch_current_size"),
    )


_TRITON_TOTALS = (
    "nv_inference_request_success",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
)


def _triton(f: _Families) -> Exposition:
    _require(
        f,
        "Triton",
        (
            "nv_inference_first_response_histogram_ms",
            "nv_inference_pending_request_count",
            *_TRITON_TOTALS,
        ),
    )
    totals = {name: value for name in _TRITON_TOTALS if (value := f.counter(name)) is not None}
    # The TensorRT-LLM backend's own gauges, when it serves the model: its queue, the
    # requests it schedules, the fraction of KV cache blocks in use.
    trt = "nv_trt_llm_request_metrics"
    waiting = f.gauge(trt, where=("request_type", "waiting"))
    kv = f.gauge("nv_trt_llm_kv_cache_block_metrics", "max", ("kv_cache_block_type", "fraction"))
    return Exposition(
        latency=f.histogram("nv_inference_first_response_histogram_ms", 1.0),
        waiting=waiting if waiting is not None else f.gauge("nv_inference_pending_request_count"),
        running=f.gauge(trt, where=("request_type", "scheduled")),
        kv_cache=None if kv is None else min(max(kv, 0.0), 1.0),
        totals=totals,
    )


def _means(
    now: dict[str, float], before: dict[str, float]
) -> tuple[int, list[float], float | None]:
    """(requests, their latencies, mean queue ms) from Triton's cumulative counters: each
    request gets the mean request time of the interval (a mean: no distribution exists)."""
    success = "nv_inference_request_success"
    if success not in now or success not in before:
        return 0, [], None
    reset = now[success] < before[success]

    def delta(name: str) -> float | None:
        if name not in now or name not in before:
            return None
        return now[name] if reset or now[name] < before[name] else now[name] - before[name]

    requests = round(delta(success) or 0.0)
    if requests <= 0:
        return 0, [], None
    duration = delta("nv_inference_request_duration_us")
    queued = delta("nv_inference_queue_duration_us")
    mean_ms = None if duration is None else duration / requests / 1000.0
    queue_ms = None if queued is None else queued / requests / 1000.0
    latencies = [] if mean_ms is None else [mean_ms] * min(requests, MAX_SAMPLES)
    return requests, latencies, queue_ms
