from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from crater.callback.domain.retry import (
    DeliveryState,
    Outcome,
    RetryPolicy,
    Verdict,
    backoff,
    classify,
    delay_before_retry,
    parse_retry_after,
    schedule,
    state_after,
)

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("code", [200, 201, 202, 204, 299])
def test_2xx_is_delivered(code: int) -> None:
    assert classify(code).outcome is Outcome.DELIVERED


@pytest.mark.parametrize("code", [500, 502, 503, 504, 599, 408, 429])
def test_server_errors_timeouts_and_rate_limits_are_retried(code: int) -> None:
    assert classify(code).outcome is Outcome.RETRY


def test_no_response_is_retried() -> None:
    assert classify(None) == Verdict(Outcome.RETRY)


@pytest.mark.parametrize("code", [400, 401, 403, 404, 409, 410, 413, 422, 301, 302, 100])
def test_other_statuses_give_up_at_once(code: int) -> None:
    assert classify(code, retry_after="5").outcome is Outcome.GIVE_UP


def test_retry_after_is_read_from_seconds_and_http_dates() -> None:
    assert classify(429, "7", NOW).retry_after_seconds == 7.0
    assert classify(503, "Thu, 01 May 2025 12:00:03 GMT", NOW).retry_after_seconds == 3.0
    assert parse_retry_after("Thu, 01 May 2025 11:59:00 GMT", NOW) == 0.0  # in the past
    assert parse_retry_after("Thu, 01 May 2025 12:00:03 GMT", None) is None  # no clock
    assert parse_retry_after("soon", NOW) is None
    assert parse_retry_after("-1", NOW) is None
    assert parse_retry_after(None, NOW) is None


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    policy = RetryPolicy(initial_backoff_seconds=0.5, max_backoff_seconds=5.0, jitter=0.5)
    rng = random.Random(1)
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (60, 5.0)]:
        for _ in range(50):
            delay = backoff(policy, attempt, rng)
            assert ceiling / 2 <= delay <= ceiling
    assert backoff(policy, 10_000, rng) <= 5.0  # no overflow far out


def test_backoff_without_jitter_is_exact_and_with_a_seed_is_reproducible() -> None:
    exact = RetryPolicy(initial_backoff_seconds=1.0, max_backoff_seconds=8.0, jitter=0.0)
    assert [backoff(exact, n, random.Random()) for n in range(1, 6)] == [1, 2, 4, 8, 8]
    policy = RetryPolicy()
    first = [backoff(policy, n, random.Random(42)) for n in range(1, 6)]
    again = [backoff(policy, n, random.Random(42)) for n in range(1, 6)]
    assert first == again


def test_retry_after_lengthens_the_wait_even_past_the_cap_up_to_a_day() -> None:
    policy = RetryPolicy(initial_backoff_seconds=0.1, max_backoff_seconds=5.0, jitter=0.0)
    rng = random.Random(0)
    assert delay_before_retry(policy, 1, Verdict(Outcome.RETRY, 2.0), rng) == 2.0
    assert delay_before_retry(policy, 1, Verdict(Outcome.RETRY, 0.0), rng) == 0.1
    assert delay_before_retry(policy, 1, Verdict(Outcome.RETRY, 3600.0), rng) == 3600.0
    assert delay_before_retry(policy, 1, Verdict(Outcome.RETRY, 1e9), rng) == 86400.0


def test_the_default_schedule_reaches_hours() -> None:
    policy = RetryPolicy(max_attempts=20, initial_backoff_seconds=1.0, max_backoff_seconds=3600)
    waits = schedule(policy)
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(waits) == 3600.0
    assert sum(waits) > 8 * 3600  # retried for more than eight hours before a dead letter


def test_an_operator_limit_overrides_max_attempts() -> None:
    policy = RetryPolicy(max_attempts=3)
    retry = Verdict(Outcome.RETRY)
    assert state_after(policy, retry, 3) is DeliveryState.DEAD
    assert state_after(policy, retry, 3, limit=6) is DeliveryState.PENDING
    assert state_after(policy, retry, 6, limit=6) is DeliveryState.DEAD


def test_state_after_each_attempt() -> None:
    policy = RetryPolicy(max_attempts=3)
    retry, give_up = Verdict(Outcome.RETRY), Verdict(Outcome.GIVE_UP)
    assert state_after(policy, Verdict(Outcome.DELIVERED), 3) is DeliveryState.DELIVERED
    assert state_after(policy, retry, 1) is DeliveryState.PENDING
    assert state_after(policy, retry, 2) is DeliveryState.PENDING
    assert state_after(policy, retry, 3) is DeliveryState.DEAD
    assert state_after(policy, give_up, 1) is DeliveryState.DEAD


def test_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=1.5)
