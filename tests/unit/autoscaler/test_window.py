from __future__ import annotations

import random

import pytest

from crater.autoscaler.domain import LatencyWindow, nearest_rank


def test_nearest_rank_is_always_a_sample() -> None:
    values = [float(v) for v in range(1, 101)]
    assert nearest_rank(values, 0.95) == 95.0
    assert nearest_rank([7.0], 0.95) == 7.0
    assert nearest_rank([float(v) for v in range(1, 21)], 0.95) == 19.0
    with pytest.raises(ValueError, match="no samples"):
        nearest_rank([], 0.95)


def test_p95_is_exact_over_batches_in_any_order() -> None:
    rng = random.Random(7)
    values = [rng.uniform(1, 500) for _ in range(1_000)]
    window = LatencyWindow(window_seconds=60)
    for i in range(10):
        window.add(float(i), values[i * 100 : (i + 1) * 100])
    assert window.percentile(0.95) == (sorted(values)[949], 1_000)


def test_samples_leave_the_window_after_window_seconds() -> None:
    window = LatencyWindow(window_seconds=60)
    window.add(0.0, [500.0] * 10)
    window.add(30.0, [10.0] * 10)
    assert window.percentile(0.95) == (500.0, 20)
    window.add(60.0, [20.0])  # the batch at 0 s is exactly 60 s old: out
    assert window.percentile(0.95) == (20.0, 11)
    window.advance(200.0)
    assert window.percentile(0.95) is None
    assert len(window) == 0


def test_late_batches_are_kept_in_time_order_or_dropped_when_too_old() -> None:
    window = LatencyWindow(window_seconds=60)
    window.add(100.0, [1.0])
    window.add(90.0, [2.0])  # late but inside the window
    assert window.add(30.0, [3.0]) == 0  # older than the window
    assert window.samples() == [1.0, 2.0]
    assert window.samples(since=95.0) == [1.0]
    window.advance(150.0 + 0.5)  # 90 s batch falls out first even though it came second
    assert window.samples() == [1.0]


def test_memory_is_bounded_by_dropping_the_oldest_batches() -> None:
    window = LatencyWindow(window_seconds=3_600, max_samples=1_000)
    for i in range(100):
        window.add(float(i), [float(i)] * 100)
    assert len(window) == 1_000
    assert min(window.samples()) == 90.0


def test_time_never_runs_backwards() -> None:
    window = LatencyWindow(window_seconds=60)
    window.add(100.0, [1.0])
    window.advance(50.0)
    assert window.latest == 100.0
