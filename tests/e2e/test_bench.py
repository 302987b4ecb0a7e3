"""`crater bench` at toy size: a real nats-server, the scheduler as its own process, a real
database; the result file must hold figures that add up."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_bench_writes_sane_figures(tmp_path: Path, database_url: str) -> None:
    command = [
        sys.executable,
        "-m",
        "crater.cli",
        "bench",
        "--nodes=24",
        "--rates=5,10",
        "--keep-going",
        "--stage-seconds=2",
        "--raw-messages=500",
        "--idle-seconds=2",
        f"--database-url={database_url}",
        f"--out-dir={tmp_path}",
    ]
    # As shipped (production mode): the suite's development mode would hide a service the
    # bench starts with a setting production refuses.
    env = {**os.environ, "CRATER_ENVIRONMENT": "production"}
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    result = json.loads((tmp_path / "bench_scheduler_24.json").read_text())
    assert (tmp_path / "bench_scheduler_24.png").stat().st_size > 10_000
    assert result["nodes"] == 24
    assert result["database"] == database_url.split(":", 1)[0]
    assert result["rejected"] == 0
    assert result["ungranted"] == 0
    assert result["raw_jetstream_per_second"] > 100
    # Every node heartbeats as its probe would (the shipped interval, 5 s), under the
    # scheduler's shipped heartbeat timeout: 24 nodes spread over 5 s, for a run of 5 s or
    # more (the stages' 4 s after the topologies): about a round at least.
    assert result["heartbeat_seconds"] == 5.0
    assert result["heartbeats"] >= 12
    stages = result["stages"]
    assert [s["offered_per_second"] for s in stages] == [5, 10]
    for stage in stages:
        assert stage["granted"] == stage["submitted"] == int(stage["offered_per_second"] * 2)
        # The rate is the tasks placed over the time from the first submission to the last
        # placement, which is at least the time the tasks took to be offered.
        assert stage["seconds"] >= 2 * (stage["submitted"] - 1) / stage["submitted"] - 0.1
        assert math.isclose(
            stage["allocations_per_second"], stage["granted"] / stage["seconds"], rel_tol=0.01
        )
        assert 0 < stage["latency_p50_ms"] <= stage["latency_p99_ms"] <= stage["latency_max_ms"]
        assert stage["latency_max_ms"] < 60_000
        assert stage["scheduler_cpu_ms_per_allocation"] > 0
        # Every task placed and completed is at least two decisions of the core.
        assert stage["decisions"] >= 2 * stage["granted"]
        # A bucket's bound: a loaded CI machine (load average 12) reached the 100 ms bucket.
        assert 0 < stage["decision_p50_ms"] <= stage["decision_p99_ms"] <= 1000
    assert result["sustained_allocations_per_second"] == max(
        s["allocations_per_second"] for s in stages
    )
    assert math.isclose(
        result["ratio_to_raw"],
        result["sustained_allocations_per_second"] / result["raw_jetstream_per_second"],
        abs_tol=0.001,
    )
    assert result["latency_p50_ms"] <= result["latency_p99_ms"] <= result["latency_p99_9_ms"]
    # The idle baseline (the fleet's heartbeats, no task): measured, and taken off each
    # stage's CPU per task above idle.
    assert result["idle_seconds"] == 2
    assert set(result["idle_cpu_percent"]) == {"scheduler"}
    for stage in stages:
        above, gross = (
            stage[k]["scheduler"] for k in ("cpu_ms_per_task_above_idle", "cpu_ms_per_task")
        )
        assert 0 < above < gross


def test_bench_http_path_writes_sane_figures(tmp_path: Path) -> None:
    """The http path: the services as `crater up` runs them (production mode, the gateway
    requiring the stack's token), tasks POSTed as arrays, each timed to its `scheduled`
    webhook at the reference receiver; and a deep-queue stage whose tasks wait."""
    command = [
        sys.executable,
        "-m",
        "crater.cli",
        "bench",
        "--path=http",
        "--nodes=24",
        "--rates=5,10",
        "--keep-going",
        "--stage-seconds=2",
        "--raw-messages=500",
        "--deep-queue",
        "--deep-queue-hold=0.5",
        f"--out-dir={tmp_path}",
    ]
    env = {**os.environ, "CRATER_ENVIRONMENT": "production"}
    # Five processes and a nats-server: minutes on a loaded machine.
    run = subprocess.run(command, capture_output=True, text=True, timeout=480, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    result = json.loads((tmp_path / "bench_http_24.json").read_text())
    assert (tmp_path / "bench_http_24.png").stat().st_size > 10_000
    assert result["path"] == "http"
    assert result["nodes"] == 24
    assert result["rejected"] == result["ungranted"] == result["undelivered"] == 0
    assert result["raw_jetstream_per_second"] > 100
    services = {"gateway", "predictor", "scheduler", "callback", "receiver"}
    stages = result["stages"]
    assert [s["offered_per_second"] for s in stages] == [5, 10]
    for stage in stages:
        count = int(stage["offered_per_second"] * 2)
        assert stage["kind"] == "rate"
        assert stage["submitted"] == stage["granted"] == stage["delivered"] == count
        # Every task answered 202 inside a 207, none refused, and its `scheduled` webhook
        # recorded once.
        assert stage["http_accepted"] == count
        assert stage["http_refused"] == {}
        assert stage["http_errors"] == 0
        assert stage["webhooks"]["scheduled"] == count
        # The delivered rate is the webhooks over the time from the first submit to the last
        # of them, at least the time the tasks took to be offered.
        assert stage["delivered_seconds"] >= 2 * (count - 1) / count - 0.1
        assert math.isclose(
            stage["delivered_per_second"],
            stage["delivered"] / stage["delivered_seconds"],
            rel_tol=0.01,
        )
        # A webhook follows its grant: from the same submit, it cannot come sooner.
        assert (
            0
            < stage["webhook_latency_p50_ms"]
            <= stage["webhook_latency_p99_ms"]
            <= stage["webhook_latency_max_ms"]
            < 60_000
        )
        assert stage["webhook_latency_max_ms"] >= stage["latency_p50_ms"]
        assert set(stage["cpu_ms_per_task"]) == services
        assert all(v > 0 for k, v in stage["cpu_ms_per_task"].items() if k != "receiver")
    best = max(stages, key=lambda s: s["delivered_per_second"])
    assert result["sustained_delivered_per_second"] == best["delivered_per_second"]
    assert result["cpu_ms_per_task"] == best["cpu_ms_per_task"]
    assert 0 < result["webhook_latency_p50_ms"] <= result["webhook_latency_p99_ms"]

    deep = result["deep_queue"]
    assert deep["kind"] == "deep-queue"
    assert deep["submitted"] == deep["granted"] == deep["delivered"] == deep["http_accepted"]
    # Twice the fleet's cards asked at once: tasks waited (told `pending`) and were placed
    # as others finished, after at least one hold.
    assert deep["webhooks"].get("pending", 0) > 0
    assert deep["latency_max_ms"] > 500
    assert deep["webhook_latency_max_ms"] > 500
    assert set(deep["cpu_ms_per_task"]) == services
    assert len(result["load_average"]) == 2
    assert result["topology_seconds"] > 0
    assert set(result["topology_cpu_ms_per_node"]) == services
    assert result["topology_cpu_ms_per_node"]["scheduler"] > 0
