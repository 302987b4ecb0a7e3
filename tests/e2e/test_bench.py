"""`crater bench` at toy size: a real nats-server, the scheduler as its own process, a real
database; the result file must hold figures that add up."""

from __future__ import annotations

import json
import math
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
        f"--database-url={database_url}",
        f"--out-dir={tmp_path}",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    result = json.loads((tmp_path / "bench_scheduler_24.json").read_text())
    assert (tmp_path / "bench_scheduler_24.png").stat().st_size > 10_000
    assert result["nodes"] == 24
    assert result["database"] == database_url.split(":", 1)[0]
    assert result["rejected"] == 0
    assert result["ungranted"] == 0
    assert result["raw_jetstream_per_second"] > 100
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
        assert 0 < stage["decision_p50_ms"] <= stage["decision_p99_ms"] < 100
    assert result["sustained_allocations_per_second"] == max(
        s["allocations_per_second"] for s in stages
    )
    assert math.isclose(
        result["ratio_to_raw"],
        result["sustained_allocations_per_second"] / result["raw_jetstream_per_second"],
        abs_tol=0.001,
    )
    assert result["latency_p50_ms"] <= result["latency_p99_ms"] <= result["latency_p99_9_ms"]
