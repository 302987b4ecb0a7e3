"""`crater up --scenario shared-day`: the demo's day (its load, what replicas report under
it, its clock) and what the watcher counts of the fleet (issue #18, item 5)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from crater.cli import demo, demo_day
from crater.contracts import AllocationReleased, ReleaseReason, utc_now
from tests.unit.cli.test_demo_lines import placed


def test_the_day_is_quiet_at_night_and_peaks_in_the_afternoon() -> None:
    loads = {hour: demo_day.load_at(hour) for hour in range(24)}
    assert min(loads, key=loads.__getitem__) == demo_day.QUIET_HOUR
    assert max(loads, key=loads.__getitem__) == demo_day.PEAK_HOUR
    assert loads[4] == pytest.approx(demo_day.NIGHT_LOAD)
    assert loads[15] == pytest.approx(demo_day.PEAK_LOAD)
    # continuous across midnight and at the turning points: no jump between two hours
    steps = [abs(demo_day.load_at(h / 10) - demo_day.load_at((h + 1) / 10)) for h in range(240)]
    assert max(steps) < 0.2


def test_the_clock_starts_in_the_evening_and_runs_a_day_per_day_seconds() -> None:
    assert demo_day.clock(demo_day.hour_of_day(0, 480)) == "20:00"
    assert demo_day.clock(demo_day.hour_of_day(80, 480)) == "00:00"
    assert demo_day.clock(demo_day.hour_of_day(480, 480)) == "20:00"
    assert demo_day.part_of_day(demo_day.hour_of_day(200, 480)) == "morning"  # 06:00
    assert demo_day.part_of_day(3.5) == "night"


def p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * len(values)) - 1]


def test_a_replica_reports_its_share_of_the_load() -> None:
    rng = random.Random(3)
    calm = demo_day.replica_report(0.5, 1, rng)
    shared = demo_day.replica_report(5.6, 7, rng)
    overloaded = demo_day.replica_report(5.6, 3, rng)
    assert calm.pressure == 0.5
    assert shared.pressure == 0.8
    assert overloaded.pressure == 1.0  # a full cache: the rest queues
    # calm: under the shipped scale-in line; overloaded: far past panic (400 ms)
    assert p95(calm.latencies_ms) < 200
    assert p95(overloaded.latencies_ms) > 400
    assert len(overloaded.latencies_ms) > len(calm.latencies_ms)  # more requests served


def test_the_watcher_counts_serving_replicas_and_borrowed_training_gpus() -> None:
    watcher = demo.Watcher()
    watcher.track(placed(task_id=f"{demo.SERVICE}-replica-00", pool="inference", gpu_ids=[0]))
    watcher.track(placed(task_id="tune-0001", gpu_ids=[0, 1]))
    watcher.track(placed(task_id="tune-0002", gpu_ids=[3], borrowed_from="inference"))
    assert watcher.serving == {f"{demo.SERVICE}-replica-00"}
    assert watcher.training_gpus() == (2, 1)
    watcher.track(
        AllocationReleased(
            allocation_id="a1",
            task_id="tune-0002",
            node="rtx-01",
            gpu_ids=[3],
            cpu_cores=[],
            reason=ReleaseReason.PREEMPTED,
            occurred_at=utc_now(),
        )
    )
    assert watcher.training_gpus() == (2, 0)


def test_an_unknown_scenario_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(demo.CliError, match="--scenario: 'nightly' is not one of mixed"):
        demo.run_demo(data_dir=tmp_path / "demo", duration=1, rate=1, seed=1, scenario="nightly")
    assert not (tmp_path / "demo").exists()
