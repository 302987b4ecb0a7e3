"""The GPU utilisation SLA rule: time-weighted windows after a warm-up, one breach an attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crater.predictor.domain.sla import Breach, SlaRule, Window, fold

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RULE = SlaRule(window_seconds=100, warmup_seconds=20)


def run(samples: list[tuple[float, float, float | None]], minimum: float = 50) -> list[Breach]:
    """(end second, interval, utilisation) samples folded in order; the breaches said."""
    window, said = Window(T0), []
    for end, interval, util in samples:
        window, breach = fold(window, T0 + timedelta(seconds=end), interval, util, minimum, RULE)
        if breach:
            said.append(breach)
    return said


def test_the_mean_is_weighted_by_time_and_the_warmup_does_not_count() -> None:
    # 0-20 s warm-up at 0%; then 20 s at 0% and 80 s at 60%: mean 48% < 50%
    [breach] = run([(20, 20, 0.0), (40, 20, 0.0), (120, 80, 60.0)])
    assert breach.measured == pytest.approx(48.0)
    assert (breach.seconds, breach.samples) == (100, 2)
    # the same readings unweighted would average 30%; weighted by time, 80 s at 70% passes
    assert run([(40, 40, 10.0), (120, 80, 70.0)]) == []  # warm-up leaves 20 s at 10%, 80 at 70


def test_a_breach_is_said_once_per_attempt_and_only_for_a_whole_window() -> None:
    assert run([(60, 40, 5.0), (110, 50, 5.0)]) == []  # 90 s so far: not a whole window
    breaches = run([(20 + 50 * n, 50, 5.0) for n in range(1, 9)])
    assert len(breaches) == 1
    assert breaches[0].measured == pytest.approx(5.0)


def test_samples_without_gpu_readings_say_nothing() -> None:
    assert run([(20 + 50 * n, 50, None) for n in range(1, 9)]) == []


def test_a_task_at_or_above_its_minimum_is_never_in_breach() -> None:
    assert run([(20 + 50 * n, 50, 50.0) for n in range(1, 9)]) == []
