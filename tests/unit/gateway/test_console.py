"""The web console's logic without a browser: view models, the topology drawing, the live
hub's routing and throttle, session cookies, where a sign-in may lead."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest
from itsdangerous import URLSafeTimedSerializer

from crater.contracts import (
    Capacity,
    Confidence,
    FilterReason,
    FleetsAnswer,
    FleetSummary,
    GpuMetrics,
    HealthCheck,
    NodeCondition,
    NodeHealthReported,
    NodeMetricsReported,
    NodeSummary,
    PoolsAnswer,
    PoolSummary,
    PredictedPeaks,
    Priority,
    QuotaUse,
    ScaleDecided,
    ScaleDirection,
    TaskStatus,
    TaskSummary,
    TaskType,
    TenantHolding,
    TenantQuota,
    WebhookDeliveryRecord,
)
from crater.gateway.console import views
from crater.gateway.console.live import (
    Listener,
    LiveHub,
    Telemetry,
    Throttle,
    topics_of,
    wanted_topics,
)
from crater.gateway.console.routes import safe_next
from crater.gateway.console.session import Sessions
from crater.gateway.console.topology import cpulist, nvlink_pairs, topology_svg
from tests.support.topologies import node

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


# ---- figures ----------------------------------------------------------------------------


def test_figures_read_as_people_write_them() -> None:
    assert [views.mib(v) for v in (512, 81920, 1.5 * 1024 * 1024)] == [
        "512 MiB",
        "80 GiB",
        "1.5 TiB",
    ]
    assert [views.gb(v) for v in (960, 7600)] == ["960 GB", "7.6 TB"]
    assert views.number(12.0) == "12"
    assert views.percent(1, 4) == 25.0
    assert views.percent(1, 0) is None
    assert [views.level(p) for p in (None, 10, 80, 99)] == ["ok", "ok", "high", "full"]
    assert views.ago(NOW - timedelta(seconds=5), NOW) == "5 s ago"
    assert views.ago(NOW - timedelta(minutes=30), NOW) == "30 min ago"
    assert views.ago(None, NOW) == "never"


# ---- pools --------------------------------------------------------------------------------


def pools_answer() -> PoolsAnswer:
    return PoolsAnswer(
        pools=[
            PoolSummary(
                pool="training",
                nodes=2,
                nodes_ready=2,
                gpus=Capacity(total=16, allocated=13),
                gpu_memory_mb=Capacity(total=16 * 81920, allocated=13 * 40960),
                cpu_cores=Capacity(total=128, allocated=120),
                memory_mb=Capacity(total=1_048_576, allocated=262_144),
                disk_gb=Capacity(total=7600, allocated=500),
                gpus_free_whole=3,
                fragmented_gpus=1.5,
                fragmentation=0.5,
                tasks_waiting=2,
                tasks_placed=4,
                tenants=[
                    TenantHolding(
                        tenant="search",
                        gpus=8,
                        gpu_memory_mb=8 * 40960,
                        cpu_cores=64,
                        memory_mb=131072,
                        share=0.5,
                    )
                ],
            )
        ],
        quotas=[
            TenantQuota(
                tenant="search",
                resources=[
                    QuotaUse(resource="gpus", used=8, limit=8),
                    QuotaUse(resource="memory_mb", used=131072, limit=None),
                ],
            )
        ],
    )


def test_a_pool_shows_each_resource_with_its_level_and_the_fragmentation_in_words() -> None:
    [pool] = views.pools_view(pools_answer()).pools
    meters = {m.label: m for m in pool.meters}
    assert (meters["GPUs"].used, meters["GPUs"].total, meters["GPUs"].percent) == (
        "13",
        "16",
        81.2,
    )
    assert meters["GPUs"].level == "high"
    assert meters["GPUs"].note == "3 whole free"
    assert meters["CPU cores"].level == "high"  # 93.8 %
    assert (meters["GPU memory"].used, meters["GPU memory"].total) == ("520 GiB", "1.2 TiB")
    assert (meters["SSD"].used, meters["SSD"].total) == ("500 GB", "7.6 TB")
    assert pool.nodes == "2/2 ready"
    assert pool.fragmentation.startswith("50 % of the free GPU capacity (1.5 GPUs)")
    assert pool.tenants[0].share == 50.0


def test_quota_cells_say_the_limit_or_none() -> None:
    [row] = views.pools_view(pools_answer()).quotas
    gpus, memory = row.cells
    assert (gpus.used, gpus.limit, gpus.level) == ("8", "8", "full")
    assert (memory.used, memory.limit, memory.percent) == ("128 GiB", "no limit", None)


def test_an_elastic_tenants_cell_says_its_guarantee_cap_and_borrowing() -> None:
    quota = TenantQuota(
        tenant="acme",
        resources=[QuotaUse(resource="gpus", used=5, limit=6, guarantee=2, borrowed=3)],
    )
    [cell] = views.quota_row(quota).cells
    assert (cell.used, cell.limit) == ("5 (3 borrowed)", "2 guaranteed, up to 6")


def test_an_empty_or_unlearned_pool_says_so() -> None:
    pool = (
        pools_answer().pools[0].model_copy(update={"fragmented_gpus": None, "fragmentation": None})
    )
    assert views.pool_view(pool).fragmentation == "no GPU request seen yet"
    full = pool.model_copy(update={"fragmented_gpus": 0.0})
    assert views.pool_view(full).fragmentation == "no GPU free"


# ---- tasks --------------------------------------------------------------------------------


def summary(**changes: object) -> TaskSummary:
    base = TaskSummary(
        task_id="train-1",
        task_type=TaskType.TRAINING,
        status=TaskStatus.PENDING,
        pool="training",
        tenant="search",
        priority=Priority.HIGH,
        gpus=2,
        reason="0/3 nodes available: 2 fewer than 2 free GPUs, 1 not in pool training",
        reasons=[
            FilterReason(filter="Pool", code="NotInPool", nodes=1, message="not in pool"),
            FilterReason(filter="GpuCount", code="InsufficientGpus", nodes=2, message="few"),
        ],
        predicted=PredictedPeaks(
            gpu_memory_per_gpu_mb=30720, host_memory_mb=16384, confidence=Confidence.MEDIUM
        ),
        submitted_at=NOW - timedelta(minutes=2),
        updated_at=NOW - timedelta(seconds=3),
    )
    return base.model_copy(update=changes)


def test_a_waiting_task_says_why_per_filter_most_nodes_first_with_its_peaks() -> None:
    row = views.task_row(summary(), NOW)
    assert (row.status, row.status_class, row.where) == ("pending", "wait", "")
    assert row.why.startswith("0/3 nodes available")
    assert [(r.nodes, r.filter) for r in row.reasons] == [(2, "GpuCount"), (1, "Pool")]
    assert row.peaks == "30 GiB/GPU, host 16 GiB (medium)"
    assert (row.priority, row.updated) == ("high", "3 s ago")


def test_a_waiting_task_shows_its_place_in_the_queue_and_its_estimated_start() -> None:
    estimated = summary(
        queue_position=2,
        estimated_start_at=NOW + timedelta(minutes=10),
        estimate="estimated to start in 600 s (position 2 in pool training)",
    )
    assert views.task_row(estimated, NOW).estimate == (
        f"#2 in pool training, estimated start {NOW + timedelta(minutes=10):%Y-%m-%d %H:%M:%S}Z"
        ": estimated to start in 600 s (position 2 in pool training)"
    )
    unknown = summary(queue_position=1, estimate="no estimate: a task ahead states no run time")
    assert views.task_row(unknown, NOW).estimate.startswith("#1 in pool training, no estimate:")
    assert views.task_row(summary(), NOW).estimate == ""  # no place: nothing said


def test_a_placed_task_says_where_it_runs() -> None:
    row = views.task_row(
        summary(status=TaskStatus.RUNNING, node="a100-01", gpu_ids=[0, 1], reason=None, reasons=[]),
        NOW,
    )
    assert (row.status_class, row.where, row.why) == ("run", "a100-01 GPUs 0,1", "")
    cpu = views.task_row(summary(gpus=0, node="cpu-01", status=TaskStatus.RUNNING), NOW)
    assert cpu.where == "cpu-01"
    assert (cpu.why, cpu.note[:8]) == ("", "0/3 node")  # placed: its reason is no wait
    assert cpu.peaks == "host 16 GiB (medium)"
    assert views.task_row(summary(priority=700), NOW).priority == "700"


def test_webhook_deliveries_show_their_outcome() -> None:
    record = WebhookDeliveryRecord(
        delivery_id=1,
        webhook_id="w",
        endpoint="alldata",
        task_status="scheduled",
        event_type="allocation.granted",
        state="pending",
        attempts=2,
        round=1,
        last_status_code=None,
        last_error="connection refused",
        created_at=NOW - timedelta(seconds=10),
        updated_at=NOW,
        next_attempt_at=NOW + timedelta(seconds=4),
    )
    row = views.delivery_row(record, NOW)
    assert (row.state_class, row.attempts) == ("wait", 2)
    assert row.outcome == "connection refused; next attempt 12:00:04"
    done = views.delivery_row(
        record.model_copy(update={"state": "delivered", "last_status_code": 200, "endpoint": ""}),
        NOW,
    )
    assert (done.state_class, done.outcome, done.endpoint) == (
        "ok",
        "HTTP 200",
        "(none configured)",
    )


# ---- nodes --------------------------------------------------------------------------------


def metrics(node_id: str = "a100-01") -> NodeMetricsReported:
    return NodeMetricsReported(
        node_id=node_id,
        occurred_at=NOW - timedelta(seconds=2),
        cpu_utilization_percent=37.4,
        memory_used_mb=100_000,
        memory_total_mb=512_000,
        gpus=[
            GpuMetrics(
                index=0, utilization_percent=90, memory_used_mb=40960, memory_total_mb=81920
            ),
            GpuMetrics(index=1, utilization_percent=10, memory_used_mb=0, memory_total_mb=81920),
        ],
        numa_cpu_utilization_percent={0: 50.0, 1: 20.0},
    )


def health(condition: NodeCondition = NodeCondition.READY) -> NodeHealthReported:
    return NodeHealthReported(
        node_id="a100-01",
        occurred_at=NOW - timedelta(seconds=4),
        condition=condition,
        score=80,
        checks=[
            HealthCheck(name="gpu_temperature", passed=True, detail="under 85 C"),
            HealthCheck(name="ecc", passed=False, detail="2 uncorrected errors"),
        ],
    )


NODE = NodeSummary(
    node_id="a100-01",
    pool="training",
    condition=NodeCondition.READY,
    gpu_model="NVIDIA A100-SXM4-80GB",
    gpu_memory_mb=81920,
    gpus_total=2,
    gpus_free=1,
    cpu_cores_total=32,
    cpu_cores_free=20,
    memory_mb_total=512_000,
    memory_mb_free=400_000,
)


def test_a_node_row_joins_what_is_free_with_its_latest_metrics_and_health() -> None:
    row = views.node_row(NODE, metrics(), health(), NOW)
    assert (row.gpus, row.cpu_cores) == ("1/2 free", "20/32 free")
    assert (row.cpu_use, row.gpu_use) == ("37 %", "50 %")
    assert row.gpu_memory_use == "40 GiB of 160 GiB"
    assert row.gpu_memory_percent == 25.0
    assert row.health == "80/100, failing: ecc"
    assert row.reported == "2 s ago"
    silent = views.node_row(NODE, None, None, NOW)
    assert (silent.cpu_use, silent.gpu_use, silent.health, silent.reported) == ("", "", "", "never")


def test_a_node_detail_has_every_check_and_each_gpu() -> None:
    detail = views.node_detail("a100-01", NODE, health(NodeCondition.DEGRADED), metrics(), NOW)
    assert (detail.condition, detail.condition_class, detail.score) == (
        "Degraded",
        "wait",
        "80/100",
    )
    assert [c.name for c in detail.checks] == ["gpu_temperature", "ecc"]
    assert [(f.label, f.value) for f in detail.numa_use] == [("NUMA 0", "50 %"), ("NUMA 1", "20 %")]
    assert [(g.index, g.utilization, g.memory_percent) for g in detail.gpus] == [
        (0, "90 %", 50.0),
        (1, "10 %", 0.0),
    ]
    unknown = views.node_detail("x", None, None, None, NOW)
    assert (unknown.condition, unknown.checks, unknown.gpus) == ("unknown", [], [])


# ---- fleets -------------------------------------------------------------------------------


def test_a_fleet_shows_its_figures_against_the_lines_and_its_decisions() -> None:
    decision = ScaleDecided(
        occurred_at=NOW - timedelta(seconds=20),
        service="chat",
        direction=ScaleDirection.OUT,
        current_replicas=1,
        desired_replicas=2,
        p95_latency_ms=331.2,
        gpu_memory_pressure=0.88,
        samples=50,
        reason="p95 331 ms > 200 ms and pressure 0.88 > 0.8",
    )
    answer = FleetsAnswer(
        strategy="rule",
        scale_out_p95_ms=200,
        scale_out_pressure=0.8,
        scale_in_p95_ms=100,
        scale_in_pressure=0.3,
        min_replicas=1,
        max_replicas=10,
        fleets=[
            FleetSummary(
                service="chat",
                replicas=2,
                p95_latency_ms=60.0,
                samples=300,
                gpu_memory_pressure=0.9,
                mean_gpu_memory_pressure=0.5,
                pressure_source="samples",
                panic=False,
                warm_pool=["w-1"],
                starting=[],
                draining=["r-2"],
                last_sample_at=NOW - timedelta(seconds=1),
                decisions=[decision],
            )
        ],
    )
    view = views.fleets_view(answer, NOW)
    assert view.rule.startswith("rule strategy; scale out above p95 200 ms and pressure 0.8")
    [fleet] = view.fleets
    assert (fleet.p95, fleet.p95_class) == ("60 ms", "cool")
    assert (fleet.pressure, fleet.pressure_class) == ("0.90", "hot")
    assert (fleet.warm_pool, fleet.draining, fleet.heard) == (1, 1, "1 s ago")
    [row] = fleet.decisions
    assert (row.arrow, row.replicas, row.p95, row.pressure) == ("↑", "1 → 2", "331 ms", "0.88")
    assert row.reason.startswith("p95 331 ms")


# ---- topology -----------------------------------------------------------------------------


def test_cpulist_runs() -> None:
    assert cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert cpulist([]) == "none"


def test_an_all_to_all_nvlink_node_is_drawn_with_one_switch() -> None:
    topology = node("dgx-01", gpus=8)
    svg = str(topology_svg(topology, metrics("dgx-01")))
    assert svg.startswith("<svg")
    assert svg.count('class="t-gpu"') == 8
    assert "NVSwitch" in svg
    assert svg.count('class="t-nvlink"') == 8  # one link per GPU to the fabric
    assert "NUMA node 0" in svg
    assert "NUMA node 1" in svg
    assert "inter-socket" in svg
    assert "90 % busy" in svg  # GPU 0's live figures


def test_nvlink_pairs_are_drawn_as_arcs_and_text_is_escaped() -> None:
    topology = node("n1", gpus=2)
    gpus = [g.model_copy(update={"model": "A100 <b>"}) for g in topology.gpus]
    topology = topology.model_copy(update={"gpus": gpus})
    assert nvlink_pairs(topology) == [(0, 1)]
    svg = str(topology_svg(topology))
    assert "NVSwitch" not in svg
    assert svg.count("<path") == 1
    assert "<b>" not in svg
    assert "A100 &lt;b&gt;" in svg
    no_links = node("pcie-01", gpus=4, nvlink=False)
    assert "<path" not in str(topology_svg(no_links))


# ---- live ---------------------------------------------------------------------------------


def test_each_subject_names_the_panels_it_changes() -> None:
    assert topics_of("crater.v1.task.pending") == ("tasks", "pools")
    assert topics_of("crater.v1.allocation.granted") == ("tasks", "pools", "nodes", "fleets")
    assert topics_of("crater.v1.node.metrics.a100-01") == ("nodes", "node-a100-01")
    assert topics_of("crater.v1.node.topology.a100-01")[-1] == "pools"
    assert topics_of("crater.v1.scale.decided") == ("fleets",)
    assert topics_of("crater.v1.webhook.delivered") == ("tasks",)
    assert topics_of("crater.v1.usage.task") == ()
    assert wanted_topics("tasks, pools,evil,node-a1") == {"tasks", "pools", "node-a1"}


async def test_a_burst_of_events_is_one_notice_per_interval() -> None:
    fired: list[tuple[str, float]] = []
    throttle = Throttle(0.2, lambda topic: fired.append((topic, time.monotonic())))
    started = time.monotonic()
    for _ in range(50):
        throttle.touch("tasks")
    throttle.touch("nodes")
    await asyncio.sleep(0.05)
    assert sorted(t for t, _ in fired) == ["nodes", "tasks"]  # the first at once
    for _ in range(50):  # a steady stream for a while
        throttle.touch("tasks")
        await asyncio.sleep(0.005)
    burst = time.monotonic() - started
    await asyncio.sleep(0.3)
    tasks = [at for topic, at in fired if topic == "tasks"]
    assert 2 <= len(tasks) <= 2 + burst / 0.2  # the stream's events folded, one per interval
    assert all(b - a >= 0.19 for a, b in itertools.pairwise(tasks))


async def test_the_hub_tells_only_the_listeners_that_show_a_panel() -> None:
    hub = LiveHub(subscribe=None, interval=0.05)  # type: ignore[arg-type]
    with hub.listen(frozenset({"tasks"})) as tasks, hub.listen(frozenset({"fleets"})) as fleets:
        hub.received("crater.v1.task.pending", b"{}")
        assert await tasks.changed(1.0) == ["tasks"]
        assert await fleets.changed(0.1) == []
    assert not hub.listeners


async def test_a_listener_with_nothing_new_waits_out_its_timeout() -> None:
    listener = Listener(frozenset({"pools"}))
    listener.offer("tasks")  # not one it shows
    assert await listener.changed(0.01) == []
    listener.offer("pools")
    listener.offer("pools")
    assert await listener.changed(0.01) == ["pools"]


def test_telemetry_keeps_the_latest_and_sees_a_condition_change() -> None:
    telemetry = Telemetry()
    ready = health().model_dump_json().encode()
    degraded = health(NodeCondition.DEGRADED).model_dump_json().encode()
    assert not telemetry.keep("health", "a100-01", ready, 0.0)
    assert not telemetry.keep("health", "a100-01", ready, 1.0)
    assert telemetry.keep("health", "a100-01", degraded, 2.0)
    telemetry.keep("metrics", "a100-01", metrics().model_dump_json().encode(), 2.0)
    assert telemetry.latest_metrics(now=3.0)["a100-01"].cpu_utilization_percent == 37.4
    assert telemetry.latest_health(now=3.0)["a100-01"].condition is NodeCondition.DEGRADED
    assert telemetry.latest_metrics(now=10_000.0) == {}  # gone silent for an hour: forgotten


# ---- sessions and sign-in -----------------------------------------------------------------


def test_a_session_cookie_holds_the_key_hash_signed_and_expires() -> None:
    sessions = Sessions(URLSafeTimedSerializer("secret", salt="s"), max_age=60)
    cookie = sessions.sign("ab" * 32)
    assert "ab" * 32 in URLSafeTimedSerializer("secret", salt="s").loads(cookie)["key"]
    assert sessions.read(cookie) == "ab" * 32
    assert sessions.read(cookie[:-2] + "xx") is None  # altered
    other = Sessions(URLSafeTimedSerializer("other", salt="s"), max_age=60)
    assert other.read(cookie) is None  # signed by another secret
    expired = Sessions(URLSafeTimedSerializer("secret", salt="s"), max_age=-1)
    assert expired.read(cookie) is None


@pytest.mark.parametrize(
    ("asked", "goes"),
    [
        ("/console/tasks?status=pending", "/console/tasks?status=pending"),
        ("/console/nodes/a100-01", "/console/nodes/a100-01"),
        ("https://evil.example/console", "/console/pools"),
        ("//evil.example/console", "/console/pools"),
        ("/console//evil.example", "/console/pools"),
        ("/api/v1/tasks", "/console/pools"),
        (None, "/console/pools"),
    ],
)
def test_after_signing_in_only_a_console_page(asked: str | None, goes: str) -> None:
    assert safe_next(asked) == goes
