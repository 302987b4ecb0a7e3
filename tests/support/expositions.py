"""Inference servers' /metrics pages, as each server writes them, for the autoscaler's scraping
tests: a replica object observes requests, `text()` is its page at that moment.

- vLLM writes its page with prometheus_client (vllm/v1/metrics/loggers.py), so it is rendered
  here by prometheus_client too, with vLLM's V1 names, help texts, labels (`model_name`,
  `engine`) and bucket bounds.
- TGI writes its page with the Rust `metrics-exporter-prometheus` (router/src/server.rs):
  `# TYPE` lines without `# HELP`, integer counts, and for every name ending in `duration` 35
  buckets 0.0001 x 1.5^k seconds (k = 1..35).
- Triton writes its page with prometheus-cpp: `# HELP`/`# TYPE`, labels `model` and `version`,
  a histogram's `_count` and `_sum` before its buckets; the first-response histogram exists
  only for decoupled models with `--metrics-config histogram_latencies=true`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as PromCounter

VLLM_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# vLLM's buckets for time per output token (vllm/v1/metrics/loggers.py).
VLLM_TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
VLLM_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


def _tgi_duration_buckets() -> list[float]:
    value, buckets = 0.0001, []
    for _ in range(35):
        value *= 1.5
        buckets.append(value)
    return buckets


TGI_DURATION_BUCKETS = tuple(_tgi_duration_buckets())


class VllmReplica:
    """A vLLM V1 server's metrics, one engine."""

    def __init__(self, model: str = "meta-llama/Llama-3.1-8B-Instruct", engines: int = 1) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.model = model
        self.engines = [str(i) for i in range(engines)]
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=self.registry,
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            registry=self.registry,
        )
        self.kv_cache = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            labels,
            registry=self.registry,
        )
        self.success = PromCounter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=VLLM_TTFT_BUCKETS,
            registry=self.registry,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels,
            buckets=VLLM_REQUEST_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            labels,
            buckets=VLLM_TPOT_BUCKETS,
            registry=self.registry,
        )
        for engine in self.engines:
            for metric in (
                self.running,
                self.waiting,
                self.kv_cache,
                self.ttft,
                self.queue,
                self.tpot,
            ):
                metric.labels(model, engine)
        self.set_load(waiting=0, running=0, kv_cache=0.0)

    def request(
        self, ttft_s: float, queue_s: float = 0.0, engine: int = 0, tpot_s: float | None = None
    ) -> None:
        """One request got its first token `ttft_s` after arriving, having waited `queue_s`;
        with `tpot_s`, it finished, its output tokens after the first `tpot_s` apart."""
        labels = (self.model, self.engines[engine])
        self.ttft.labels(*labels).observe(ttft_s)
        self.queue.labels(*labels).observe(queue_s)
        if tpot_s is not None:
            self.tpot.labels(*labels).observe(tpot_s)
        self.success.labels(*labels, "stop").inc()

    def set_load(self, waiting: int, running: int, kv_cache: float, engine: int = 0) -> None:
        labels = (self.model, self.engines[engine])
        self.waiting.labels(*labels).set(waiting)
        self.running.labels(*labels).set(running)
        self.kv_cache.labels(*labels).set(kv_cache)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def _cumulative(observed: Sequence[float], bounds: Sequence[float]) -> list[int]:
    """Each bucket's count: the values at or below its bound (`le`)."""
    ordered = sorted(observed)
    return [bisect_right(ordered, b) for b in bounds]


class TgiReplica:
    """A text-generation-inference router's metrics."""

    def __init__(self) -> None:
        self.queued: list[float] = []  # seconds each request spent in the queue
        self.queue_size = 0
        self.batch_size = 0

    def request(self, queue_s: float) -> None:
        self.queued.append(queue_s)

    def text(self) -> str:
        lines = [
            "# TYPE tgi_request_count counter",
            f"tgi_request_count {len(self.queued)}",
            "",
            "# TYPE tgi_request_success counter",
            f"tgi_request_success {len(self.queued)}",
            "",
            "# TYPE tgi_queue_size gauge",
            f"tgi_queue_size {self.queue_size}",
            "",
            "# TYPE tgi_batch_current_size gauge",
            f"tgi_batch_current_size {self.batch_size}",
            "",
            "# TYPE tgi_batch_current_max_tokens gauge",
            f"tgi_batch_current_max_tokens {self.batch_size * 512}",
            "",
            "# TYPE tgi_request_queue_duration histogram",
        ]
        counts = _cumulative(self.queued, TGI_DURATION_BUCKETS)
        for bound, count in zip(TGI_DURATION_BUCKETS, counts, strict=True):
            lines.append(f'tgi_request_queue_duration_bucket{{le="{bound!r}"}} {count}')
        lines += [
            f'tgi_request_queue_duration_bucket{{le="+Inf"}} {len(self.queued)}',
            f"tgi_request_queue_duration_sum {sum(self.queued)!r}",
            f"tgi_request_queue_duration_count {len(self.queued)}",
            "",
        ]
        return "\n".join(lines) + "\n"


class TritonReplica:
    """A Triton Inference Server's metrics for one model (counters always; the first-response
    histogram when `histogram_buckets_ms` is given, as for a decoupled model with
    histogram_latencies=true)."""

    def __init__(
        self,
        model: str = "ensemble_llm",
        histogram_buckets_ms: Sequence[float] | None = None,
        trt_llm: bool = False,
    ) -> None:
        self.model = model
        # The TensorRT-LLM backend's gauges (its queue, what it schedules, KV blocks in use).
        self.trt_llm = trt_llm
        self.trt_waiting, self.trt_scheduled, self.trt_kv = 0, 0, 0.0
        self.buckets = tuple(histogram_buckets_ms) if histogram_buckets_ms else None
        self.first_response_ms: list[float] = []
        self.request_us = 0
        self.queue_us = 0
        self.success = 0
        self.pending = 0

    def request(self, duration_ms: float, queue_ms: float, first_response_ms: float) -> None:
        self.success += 1
        self.request_us += round(duration_ms * 1000)
        self.queue_us += round(queue_ms * 1000)
        self.first_response_ms.append(first_response_ms)

    def text(self) -> str:
        labels = f'model="{self.model}",version="1"'
        lines = [
            "# HELP nv_inference_request_success Number of successful inference requests, "
            "all batch sizes",
            "# TYPE nv_inference_request_success counter",
            f"nv_inference_request_success{{{labels}}} {self.success}",
            "# HELP nv_inference_request_failure Number of failed inference requests, "
            "all batch sizes",
            "# TYPE nv_inference_request_failure counter",
            f'nv_inference_request_failure{{{labels},reason="BACKEND"}} 0',
            "# HELP nv_inference_count Number of inferences performed (does not include cached "
            "requests)",
            "# TYPE nv_inference_count counter",
            f"nv_inference_count{{{labels}}} {self.success}",
            "# HELP nv_inference_request_duration_us Cumulative inference request duration in "
            "microseconds (includes cached requests)",
            "# TYPE nv_inference_request_duration_us counter",
            f"nv_inference_request_duration_us{{{labels}}} {self.request_us}",
            "# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in "
            "microseconds (includes cached requests)",
            "# TYPE nv_inference_queue_duration_us counter",
            f"nv_inference_queue_duration_us{{{labels}}} {self.queue_us}",
            "# HELP nv_inference_pending_request_count Instantaneous number of pending requests "
            "awaiting execution per-model.",
            "# TYPE nv_inference_pending_request_count gauge",
            f"nv_inference_pending_request_count{{{labels}}} {self.pending}",
        ]
        if self.buckets is not None:
            counts = _cumulative(self.first_response_ms, self.buckets)
            total = sum(self.first_response_ms)
            lines += [
                "# HELP nv_inference_first_response_histogram_ms Duration from request to "
                "first response in milliseconds",
                "# TYPE nv_inference_first_response_histogram_ms histogram",
                f"nv_inference_first_response_histogram_ms_count{{{labels}}} "
                f"{len(self.first_response_ms)}",
                f"nv_inference_first_response_histogram_ms_sum{{{labels}}} {_num(total)}",
            ]
            for bound, count in zip(self.buckets, counts, strict=True):
                lines.append(
                    f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="{_num(bound)}"}}'
                    f" {count}"
                )
            lines.append(
                f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="+Inf"}} '
                f"{len(self.first_response_ms)}"
            )
        if self.trt_llm:
            used = round(self.trt_kv * 6240)
            lines += [
                "# HELP nv_trt_llm_request_metrics TRT LLM request metrics",
                "# TYPE nv_trt_llm_request_metrics gauge",
                f'nv_trt_llm_request_metrics{{{labels},request_type="waiting"}} {self.trt_waiting}',
                f'nv_trt_llm_request_metrics{{{labels},request_type="scheduled"}} '
                f"{self.trt_scheduled}",
                f'nv_trt_llm_request_metrics{{{labels},request_type="max"}} 512',
                f'nv_trt_llm_request_metrics{{{labels},request_type="active"}} '
                f"{self.trt_scheduled + self.trt_waiting}",
                "# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics",
                "# TYPE nv_trt_llm_kv_cache_block_metrics gauge",
                f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="tokens_per",{labels}}} '
                "64",
                f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",{labels}}} {used}',
                f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="free",{labels}}} '
                f"{6240 - used}",
                f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",{labels}}} 6240',
                f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction",{labels}}} '
                f"{self.trt_kv!r}",
            ]
        lines += [
            "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes",
            "# TYPE nv_gpu_memory_used_bytes gauge",
            'nv_gpu_memory_used_bytes{gpu_uuid="GPU-5d6c1b2e-0000-0000-0000-000000000000"} '
            "71303168000",
        ]
        return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    """A number as prometheus-cpp writes it: integers without a decimal point."""
    return str(int(value)) if math.isfinite(value) and value == int(value) else repr(value)
