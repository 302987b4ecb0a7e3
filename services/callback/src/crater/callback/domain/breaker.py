"""A circuit breaker per endpoint: pure, the time is passed in.

Closed: every due delivery may go. After `failure_threshold` consecutive failures it opens:
nothing goes to the endpoint for `cooldown_seconds`. Then it is half-open: one probe goes;
its success closes the breaker, its failure opens it again for a longer cool-down (doubling,
up to `max_cooldown_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class CircuitBreaker:
    failure_threshold: int = 5
    cooldown_seconds: float = 30.0
    max_cooldown_seconds: float = 600.0
    failures: int = 0
    opened_at: float | None = None
    current_cooldown: float = field(default=0.0)
    probing: bool = False  # a half-open probe is in flight

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self.current_cooldown = self.cooldown_seconds

    def state(self, now: float) -> BreakerState:
        if self.opened_at is None:
            return BreakerState.CLOSED
        if now - self.opened_at >= self.current_cooldown:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allowance(self, now: float) -> int | None:
        """How many deliveries may start now: None for no limit, 0 or 1 otherwise."""
        match self.state(now):
            case BreakerState.CLOSED:
                return None
            case BreakerState.OPEN:
                return 0
            case BreakerState.HALF_OPEN:
                return 0 if self.probing else 1

    def started(self, now: float) -> None:
        if self.state(now) is BreakerState.HALF_OPEN:
            self.probing = True

    def succeeded(self) -> bool:
        """Record a success; True if it closed an open breaker (the endpoint is back)."""
        was_open = self.opened_at is not None
        self.failures, self.opened_at, self.probing = 0, None, False
        self.current_cooldown = self.cooldown_seconds
        return was_open

    def failed(self, now: float) -> bool:
        """Record a failure; True if it opened the breaker."""
        self.failures += 1
        if self.opened_at is not None:
            if self.probing:  # the probe failed: wait longer
                self.probing = False
                self.current_cooldown = min(self.current_cooldown * 2, self.max_cooldown_seconds)
                self.opened_at = now
            return False
        if self.failures >= self.failure_threshold:
            self.opened_at = now
            return True
        return False

    def seconds_until_probe(self, now: float) -> float:
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.opened_at + self.current_cooldown - now)
