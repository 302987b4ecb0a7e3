"""Reading inference servers' /metrics pages (vLLM, TGI, Triton) as the load of a replica:
latencies from the difference between two scrapes of a cumulative histogram, never from its
lifetime totals (issue #25, item 6)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from crater.autoscaler.adapters.exposition import (
    MAX_SAMPLES,
    Histogram,
    MalformedExposition,
    MissingMetrics,
    interval,
    parse,
)
from crater.autoscaler.adapters.scrape import Replica, ReplicaScraper
from crater.autoscaler.domain.window import nearest_rank
from crater.contracts import MetricsFormat
from tests.support.expositions import TgiReplica, TritonReplica, VllmReplica

VLLM, TGI, TRITON = MetricsFormat.VLLM, MetricsFormat.TGI, MetricsFormat.TRITON

# A vLLM V1 page with two engines (data parallel), trimmed to the families read plus one
# that is not, as prometheus_client writes it (the engines' series are summed).
VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 4.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-0.6B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-0.6B"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.61
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.73
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 18231.0
vllm:prompt_tokens_total{engine="1",model_name="Qwen/Qwen3-0.6B"} 17102.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.25
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="Qwen/Qwen3-0.6B"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.06",model_name="Qwen/Qwen3-0.6B"} 18.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.08",model_name="Qwen/Qwen3-0.6B"} 19.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen3-0.6B"} 20.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-0.6B"} 20.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-0.6B"} 20.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.9
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.001",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.005",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.01",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.02",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.04",model_name="Qwen/Qwen3-0.6B"} 8.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.06",model_name="Qwen/Qwen3-0.6B"} 16.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.08",model_name="Qwen/Qwen3-0.6B"} 20.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="Qwen/Qwen3-0.6B"} 20.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="Qwen/Qwen3-0.6B"} 20.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="Qwen/Qwen3-0.6B"} 20.0
"""

# The same server later: engine 0 served 10 more requests, all between 0.5 and 0.75 s.
VLLM_PAGE_LATER = VLLM_PAGE.replace(
    'le="+Inf",model_name="Qwen/Qwen3-0.6B"} 20.0\nvllm:time_to_first_token_seconds_count'
    '{engine="0",model_name="Qwen/Qwen3-0.6B"} 20.0',
    'le="+Inf",model_name="Qwen/Qwen3-0.6B"} 30.0\nvllm:time_to_first_token_seconds_count'
    '{engine="0",model_name="Qwen/Qwen3-0.6B"} 30.0',
    1,
)


def test_a_vllm_page_sums_its_engines_and_reads_the_fullest_kv_cache() -> None:
    page = parse(VLLM, VLLM_PAGE)
    assert (page.waiting, page.running, page.kv_cache) == (3.0, 7.0, 0.73)
    assert page.latency is not None
    assert page.latency.count == 40
    assert page.queue is None  # this page has no queue-time histogram


def test_the_latencies_are_what_happened_between_two_scrapes() -> None:
    # Engine 0's +Inf bucket grew by 10 beyond 0.1 s: ten requests over the highest finite
    # bound seen here (this trimmed page stops at 0.1 s, so they read as 100 ms).
    found = interval(parse(VLLM, VLLM_PAGE_LATER), parse(VLLM, VLLM_PAGE))
    assert found is not None
    assert found.requests == 10
    assert found.latencies_ms == [100.0] * 10
    assert interval(parse(VLLM, VLLM_PAGE), None) is None  # a first scrape is a baseline


def test_vllm_p95_from_the_histogram_delta_not_the_lifetime_totals() -> None:
    replica = VllmReplica()
    for _ in range(1000):
        replica.request(ttft_s=5.0, queue_s=4.0)  # a slow past
    before = parse(VLLM, replica.text())
    for _ in range(95):
        replica.request(ttft_s=0.05, queue_s=0.0)
    for _ in range(5):
        replica.request(ttft_s=3.0, queue_s=2.2)
    replica.set_load(waiting=4, running=12, kv_cache=0.55)
    found = interval(parse(VLLM, replica.text()), before)
    assert found is not None
    assert found.requests == 100
    # rank 95 of 100 is the last of the 95 requests in (40, 60] ms: histogram_quantile's 60 ms
    assert found.p95_ms == pytest.approx(60.0)
    assert len(found.latencies_ms) == 100
    assert nearest_rank(sorted(found.latencies_ms), 0.95) == pytest.approx(60.0, abs=0.5)
    assert max(found.latencies_ms) == pytest.approx(2500 + 2500 * 0.9)  # in (2.5, 5] s
    # the queue: 95 of 100 in the first bucket (0, 0.3 s]
    assert found.queue_p95_ms == pytest.approx(300.0)
    # and one queueing delay per request, what the autoscaler judges, from the difference
    # of the two scrapes (the past's 4 s queueing is not in it)
    assert found.queue_ms is not None
    assert len(found.queue_ms) == 100
    assert nearest_rank(sorted(found.queue_ms), 0.95) == pytest.approx(300.0, abs=3)
    assert max(found.queue_ms) < 4000
    assert (found.waiting, found.running, found.kv_cache) == (4, 12, 0.55)


def test_a_restarted_server_counts_from_zero() -> None:
    old = VllmReplica()
    for _ in range(50):
        old.request(ttft_s=0.5)
    restarted = VllmReplica()
    for _ in range(3):
        restarted.request(ttft_s=0.03)
    found = interval(parse(VLLM, restarted.text()), parse(VLLM, old.text()))
    assert found is not None
    assert found.requests == 3
    assert all(20 < v <= 40 for v in found.latencies_ms)


def test_the_deprecated_gpu_cache_usage_name_is_read_when_it_is_the_only_one() -> None:
    page = VLLM_PAGE.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert parse(VLLM, page).kv_cache == 0.73


def test_tgi_reads_its_queue_duration_histogram() -> None:
    replica = TgiReplica()
    replica.request(0.5)
    before = parse(TGI, replica.text())
    for _ in range(19):
        replica.request(0.001)
    replica.request(0.9)
    replica.queue_size, replica.batch_size = 6, 32
    found = interval(parse(TGI, replica.text()), before)
    assert found is not None
    assert found.requests == 20
    assert (found.waiting, found.running, found.kv_cache) == (6, 32, None)
    # rank 19 of 20: the last of the nineteen 1 ms requests, in TGI's bucket (0.759, 1.139] ms
    assert found.p95_ms == pytest.approx(1.1390625)
    assert found.queue_p95_ms == found.p95_ms
    # the 0.9 s request: rank 19.5 of 20, halfway into its bucket (0.748, 1.122] s
    assert max(found.latencies_ms) == pytest.approx((748.18 + 1122.27) / 2, abs=0.01)


def test_triton_without_histograms_gives_means_per_request() -> None:
    replica = TritonReplica()
    replica.request(duration_ms=100, queue_ms=10, first_response_ms=0)
    before = parse(TRITON, replica.text())
    replica.request(duration_ms=300, queue_ms=50, first_response_ms=0)
    replica.request(duration_ms=500, queue_ms=150, first_response_ms=0)
    replica.pending = 9
    found = interval(parse(TRITON, replica.text()), before)
    assert found is not None
    assert found.requests == 2
    assert found.latencies_ms == [400.0, 400.0]
    assert found.queue_mean_ms == 100.0
    assert found.queue_ms == [100.0, 100.0]  # the mean per request: no distribution exists
    assert found.estimated
    assert found.waiting == 9


def test_triton_with_tensorrt_llm_reads_its_queue_and_kv_cache() -> None:
    replica = TritonReplica(model="tensorrt_llm", trt_llm=True)
    replica.pending, replica.trt_waiting, replica.trt_scheduled, replica.trt_kv = 2, 7, 48, 0.64
    page = parse(TRITON, replica.text())
    assert (page.waiting, page.running, page.kv_cache) == (7, 48, 0.64)


def test_triton_first_response_histogram_is_in_milliseconds() -> None:
    replica = TritonReplica(histogram_buckets_ms=[100, 500, 2000, 5000])
    before = parse(TRITON, replica.text())
    for ms in (50, 60, 70, 80, 700, 800, 900, 1000, 1100, 3000):
        replica.request(duration_ms=ms * 2, queue_ms=ms / 2, first_response_ms=ms)
    found = interval(parse(TRITON, replica.text()), before)
    assert found is not None
    assert not found.estimated
    assert found.requests == 10
    # rank 9.5 of 10: halfway into the (2000, 5000] bucket's only request
    assert found.p95_ms == pytest.approx(3500.0)


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        'vllm:num_requests_waiting{engine="0" 3\n',
        'vllm:num_requests_waiting{engine="0"} three\n',
    ],
)
def test_text_that_is_not_prometheus_is_malformed(text: str) -> None:
    with pytest.raises(MalformedExposition, match="not Prometheus text"):
        parse(VLLM, text)


def test_another_servers_page_is_missing_metrics() -> None:
    with pytest.raises(MissingMetrics, match="no vLLM metrics"):
        parse(VLLM, TgiReplica().text())
    with pytest.raises(MissingMetrics, match="no Triton metrics"):
        parse(TRITON, "")


def test_buckets_that_are_not_cumulative_or_lack_inf_are_malformed() -> None:
    broken = VLLM_PAGE.replace(
        'le="0.1",model_name="Qwen/Qwen3-0.6B"} 20.0', 'le="0.1",model_name="Qwen/Qwen3-0.6B"} 1.0'
    )
    with pytest.raises(MalformedExposition, match="not cumulative"):
        parse(VLLM, broken)
    no_inf = "\n".join(line for line in VLLM_PAGE.splitlines() if '"+Inf"' not in line)
    with pytest.raises(MalformedExposition, match=r"no \+Inf bucket"):
        parse(VLLM, no_inf)


def test_histogram_quantile_is_prometheus() -> None:
    h = Histogram(((10.0, 2.0), (20.0, 6.0), (float("inf"), 8.0)))
    assert h.quantile(0.25) == pytest.approx(10.0)  # rank 2: the top of the first bucket
    assert h.quantile(0.5) == pytest.approx(15.0)  # rank 4: halfway into (10, 20]
    assert h.quantile(0.99) == 20.0  # in +Inf: the highest finite bound
    assert Histogram(((float("inf"), 0.0),)).quantile(0.95) is None


def test_a_sample_is_what_a_replica_publishing_its_own_would_send() -> None:
    replica = Replica("chat-llama3-replica-1", "chat-llama3", VLLM, "http://a100-01:8000/metrics")
    server = VllmReplica()
    before = parse(VLLM, server.text())
    for _ in range(30_000):
        server.request(ttft_s=0.07)
    server.set_load(waiting=0, running=16, kv_cache=0.83)
    found = interval(parse(VLLM, server.text()), before)
    at = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    sample = ReplicaScraper.sample(replica, found, at)
    assert sample is not None
    assert (sample.service, sample.replica_id, sample.task_id) == (
        "chat-llama3",
        "chat-llama3-replica-1",
        "chat-llama3-replica-1",
    )
    assert len(sample.latencies_ms) == MAX_SAMPLES  # 30,000 requests, spread over 10,000
    assert all(60 < v <= 80 for v in sample.latencies_ms)
    assert (sample.kv_cache_usage, sample.gpu_memory_pressure) == (0.83, None)
    assert sample.queue_ms is not None  # vLLM exports its queue time: judged on it
    assert len(sample.queue_ms) == MAX_SAMPLES
    assert sample.occurred_at.timestamp() == at
    # no request since the previous scrape: silent, as an idle replica publishing its own is
    idle = interval(parse(VLLM, server.text()), parse(VLLM, server.text()))
    assert ReplicaScraper.sample(replica, idle, at) is None
