"""The pure parts of `crater bench` (benchmarks/scheduler/throughput.py, and the options it
reads): its workload fits its fleet, its statistics, its rates."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from benchmarks.scheduler.throughput import (
    PREDICTION,
    Heartbeats,
    WebhookTail,
    bucket_delta,
    deep_queue_requests,
    histogram_quantile,
    percentile,
    scaled_fleet,
    task_request,
)
from crater.cli.bench import parse_rates
from crater.contracts import (
    AllocationGranted,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskProfiled,
    TaskRejected,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler


@pytest.mark.parametrize("nodes", [6, 24, 120])
def test_scaled_fleet_has_the_nodes_asked_for_of_every_kind(nodes: int) -> None:
    fleet = scaled_fleet(nodes, seed=1)
    assert len(fleet) == nodes
    assert len({t.node_id for t in fleet}) == nodes
    assert {t.node_id.split("-")[0] for t in fleet} == {
        "a100",
        "h100",
        "v100",
        "rtx4090",
        "t4",
        "cpu",
    }
    assert fleet == scaled_fleet(nodes, seed=1)


def test_every_bench_task_is_placed_on_the_bench_fleet() -> None:
    """No task of the workload is rejected or left waiting when each is completed at once."""
    fleet = scaled_fleet(24, seed=3)
    scheduler = Scheduler()
    for topology in fleet:
        scheduler.handle(NodeTopologyReported(node=topology))
    rng = random.Random(3)
    pools = sorted({t.pool for t in fleet})
    for n in range(300):
        request = task_request(f"t{n}", rng, pools)
        decisions = scheduler.handle(TaskProfiled(task=request, prediction=PREDICTION))
        assert not [d for d in decisions if isinstance(d, TaskRejected)], request
        granted = [d for d in decisions if isinstance(d, AllocationGranted)]
        assert len(granted) == 1, (request, decisions)
        scheduler.handle(
            TaskStatusReported(
                task_id=request.task_id,
                status=TaskStatus.SUCCEEDED,
                allocation_id=granted[0].allocation_id,
            )
        )
    assert not scheduler.pending
    assert not scheduler.allocations


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert percentile(values, 50) == 500
    assert percentile(values, 99) == 990
    assert percentile(values, 99.9) == 999
    assert percentile([7.0], 99.9) == 7
    assert math.isnan(percentile([], 50))


def test_histogram_quantile_is_the_bound_of_the_bucket_holding_it() -> None:
    before = {0.001: 10.0, 0.002: 10.0, 0.005: 10.0, math.inf: 10.0}
    after = {0.001: 60.0, 0.002: 108.0, 0.005: 109.0, math.inf: 110.0}
    delta = bucket_delta(after, before)
    assert delta == {0.001: 50.0, 0.002: 98.0, 0.005: 99.0, math.inf: 100.0}
    assert histogram_quantile(delta, 0.5) == 0.001
    assert histogram_quantile(delta, 0.9) == 0.002
    assert histogram_quantile(delta, 0.99) == 0.005
    assert histogram_quantile(delta, 0.999) == math.inf
    assert math.isnan(histogram_quantile({math.inf: 0.0}, 0.5))


def test_rates_are_positive_numbers() -> None:
    assert parse_rates("100, 200,400") == [100, 200, 400]
    for bad in ("", "100,x", "0", "-5"):
        with pytest.raises(Exception, match="rates"):
            parse_rates(bad)


def test_deep_queue_asks_twice_each_pools_cards_and_cannot_all_fit() -> None:
    """Each task fits its pool alone; offered together, some wait; placed as others finish."""
    fleet = scaled_fleet(24, seed=3)
    requests = deep_queue_requests("run-deep", fleet, random.Random(3), factor=2.0)
    assert len({r.task_id for r in requests}) == len(requests)
    for pool in {t.pool for t in fleet}:
        cards = sum(len(t.gpus) for t in fleet if t.pool == pool)
        asked = sum(
            r.resource_requirements.gpu.count * r.resource_requirements.gpu.milli / 1000
            for r in requests
            if r.pool == pool
        )
        assert 2 * cards <= asked < 2 * cards + 8
    scheduler = Scheduler()
    for topology in fleet:
        scheduler.handle(NodeTopologyReported(node=topology))
    granted: list[AllocationGranted] = []
    for request in requests:
        decisions = scheduler.handle(TaskProfiled(task=request, prediction=PREDICTION))
        assert not [d for d in decisions if isinstance(d, TaskRejected)], request
        granted += [d for d in decisions if isinstance(d, AllocationGranted)]
    assert 0 < len(granted) < len(requests) / 2 + 1  # at most about half fit at once
    assert scheduler.pending
    placed = len(granted)
    while granted:  # each end frees room for the waiting
        done = granted.pop(0)
        decisions = scheduler.handle(
            TaskStatusReported(
                task_id=done.task_id, status=TaskStatus.SUCCEEDED, allocation_id=done.allocation_id
            )
        )
        more = [d for d in decisions if isinstance(d, AllocationGranted)]
        placed += len(more)
        granted += more
    assert placed == len(requests)
    assert not scheduler.pending


def test_webhook_tail_reads_each_scheduled_webhook_once_as_the_file_grows(tmp_path: Path) -> None:
    path = tmp_path / "webhooks.jsonl"
    tail = WebhookTail(path)
    tail.poll()  # no file yet
    assert tail.scheduled == {}

    def line(task_id: str, status: str, at: datetime) -> str:
        record = {"received_at": at.isoformat(), "body": {"task_id": task_id, "status": status}}
        return json.dumps(record) + "\n"

    first = datetime(2026, 1, 2, 3, 4, 5, 250_000, tzinfo=UTC)
    later = datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC)
    whole = line("t1", "scheduled", first) + line("t2", "pending", first)
    half = line("t2", "scheduled", later)
    path.write_text(whole + half[:20])
    tail.poll()
    assert tail.scheduled == {"t1": first.timestamp()}
    assert tail.statuses == {"scheduled": 1, "pending": 1}
    with path.open("a") as out:  # the rest of the half-written line, then a later duplicate
        out.write(half[20:] + line("t1", "scheduled", later) + line("t1", "succeeded", later))
    tail.poll()
    assert tail.scheduled == {"t1": first.timestamp(), "t2": later.timestamp()}
    assert tail.statuses == {"scheduled": 3, "pending": 1, "succeeded": 1}


class Recorded:
    """Stands for the bench's JetStream publisher: what was sent, when."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, bytes, str]] = []

    async def send(self, subject: str, body: bytes, event_id: str) -> None:
        self.sent.append((time.monotonic(), subject, body, event_id))


def test_heartbeats_come_from_every_node_spread_over_the_interval() -> None:
    fleet = scaled_fleet(10, seed=1)
    sink = Recorded()
    beats = Heartbeats(sink, fleet, interval=0.4)  # type: ignore[arg-type]

    async def run() -> None:
        for index in range(len(fleet)):
            beats.start(index)
        beating = asyncio.create_task(beats.run())
        await asyncio.sleep(1.0)
        beating.cancel()

    asyncio.run(run())
    reports = [NodeHealthReported.model_validate_json(body) for _, _, body, _ in sink.sent]
    assert beats.sent == len(reports)
    assert {r.node_id for r in reports} == {t.node_id for t in fleet}
    assert all(r.condition is NodeCondition.READY and r.running is None for r in reports)
    assert len({event_id for *_, event_id in sink.sent}) == len(reports)  # each its own
    assert all(
        subject == f"crater.v1.node.health.{r.node_id}"
        for (_, subject, _, _), r in zip(sink.sent, reports, strict=True)
    )
    # each node every 0.4 s (2-3 in 1 s), not the whole fleet at once
    by_node = {
        t.node_id: [
            at for (at, *_), r in zip(sink.sent, reports, strict=True) if r.node_id == t.node_id
        ]
        for t in fleet
    }
    assert all(2 <= len(times) <= 3 for times in by_node.values())
    for times in by_node.values():
        assert all(0.3 < b - a < 0.5 for a, b in itertools.pairwise(times))
    firsts = sorted(times[0] for times in by_node.values())
    assert firsts[-1] - firsts[0] > 0.25  # spread over the interval
