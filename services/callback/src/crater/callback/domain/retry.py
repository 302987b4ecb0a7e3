"""When a webhook attempt counts as delivered, when to try again, and how long to wait.

Pure: the random source is passed in (seeded in tests and replays) and so is "now".
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

# Statuses that say "not now" rather than "never": request timeout and rate limiting.
RETRYABLE_4XX = frozenset({408, 429})
# The longest wait a Retry-After may ask for; beyond it the header is taken as this.
MAX_RETRY_AFTER_SECONDS = 24 * 3600.0


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    GIVE_UP = "give_up"


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"
    SKIPPED = "skipped"  # no endpoint configured
    SUPERSEDED = "superseded"  # never sent: AllData must not hear it (domain/lifecycle.py)

    @property
    def is_final(self) -> bool:
        return self is not DeliveryState.PENDING


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    retry_after_seconds: float | None = None


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date (needs `now`)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    if now is None:
        return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def classify(
    status_code: int | None, retry_after: str | None = None, now: datetime | None = None
) -> Verdict:
    """One attempt's verdict. `status_code` None means no response: timeout or connection error.

    2xx is delivered; 5xx, 408, 429 and no response are worth retrying; any other status
    (401, 404, 422, a redirect) will not change by asking again.
    """
    if status_code is None:
        return Verdict(Outcome.RETRY)
    if 200 <= status_code < 300:
        return Verdict(Outcome.DELIVERED)
    if status_code >= 500 or status_code in RETRYABLE_4XX:
        return Verdict(Outcome.RETRY, parse_retry_after(retry_after, now))
    return Verdict(Outcome.GIVE_UP)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    initial_backoff_seconds: float = 0.5
    max_backoff_seconds: float = 5.0
    jitter: float = 0.5  # the random share of each delay, 0 (none) to 1 ("full jitter")

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must lie in [0, 1]")


def backoff(policy: RetryPolicy, failed_attempts: int, rng: random.Random) -> float:
    """Delay after the n-th failed attempt: doubling from the initial delay, capped, with the
    jittered share drawn from `rng` so that many senders do not retry in lock step."""
    exponent = min(max(failed_attempts, 1) - 1, 62)  # 2**62 already exceeds any cap
    ceiling = min(policy.max_backoff_seconds, policy.initial_backoff_seconds * 2.0**exponent)
    return ceiling * (1.0 - policy.jitter) + ceiling * policy.jitter * rng.random()


def delay_before_retry(
    policy: RetryPolicy, failed_attempts: int, verdict: Verdict, rng: random.Random
) -> float:
    """The wait before the next attempt: the backoff, or longer if the endpoint asked for it.

    Retries are scheduled in the delivery log, not slept on inside a consumer, so a
    Retry-After longer than the backoff cap is honoured (up to a day).
    """
    delay = backoff(policy, failed_attempts, rng)
    if verdict.retry_after_seconds is not None:
        delay = max(delay, min(verdict.retry_after_seconds, MAX_RETRY_AFTER_SECONDS))
    return delay


def schedule(policy: RetryPolicy) -> list[float]:
    """The un-jittered ceilings of the waits between attempts: what the policy adds up to."""
    return [
        min(policy.max_backoff_seconds, policy.initial_backoff_seconds * 2.0 ** min(n, 62))
        for n in range(policy.max_attempts - 1)
    ]


def state_after(
    policy: RetryPolicy, verdict: Verdict, attempts: int, limit: int | None = None
) -> DeliveryState:
    """Where a delivery stands after `attempts` attempts, the last of which got `verdict`;
    `limit` overrides the policy's attempt count (a delivery retried by an operator)."""
    if verdict.outcome is Outcome.DELIVERED:
        return DeliveryState.DELIVERED
    if verdict.outcome is Outcome.RETRY and attempts < (limit or policy.max_attempts):
        return DeliveryState.PENDING
    return DeliveryState.DEAD
