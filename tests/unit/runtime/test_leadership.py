"""The pure parts of leader election: the epoch header, the consumers' guard, the timing."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.errors import KeyWrongLastSequenceError

from crater.runtime.leadership import (
    EPOCH_HEADER,
    Deposed,
    EpochGuard,
    Lease,
    LeaseSettings,
    LeaseTiming,
    epoch_header,
    parse_epoch_header,
)


def test_the_header_names_service_and_epoch() -> None:
    assert epoch_header("scheduler", 17) == {EPOCH_HEADER: "scheduler:17"}
    assert parse_epoch_header("scheduler:17") == ("scheduler", 17)
    for malformed in ("", "scheduler", ":17", "scheduler:-1", "scheduler:x", "s:" + "9" * 19):
        assert parse_epoch_header(malformed) is None, malformed


def test_the_guard_refuses_lower_epochs_per_service_and_passes_unstamped() -> None:
    guard = EpochGuard()
    assert guard.stale({EPOCH_HEADER: "scheduler:3"}) is None
    assert guard.stale({EPOCH_HEADER: "scheduler:5"}) is None
    assert guard.stale({EPOCH_HEADER: "scheduler:5"}) is None  # the same leader again
    assert guard.stale({EPOCH_HEADER: "autoscaler:1"}) is None  # its own line of epochs
    refusal = guard.stale({EPOCH_HEADER: "scheduler:4"})
    assert refusal == "published by a deposed scheduler leader: epoch 4, while epoch 5 leads"
    assert guard.stale({}) is None
    assert guard.stale(None) is None
    malformed = guard.stale({EPOCH_HEADER: "nonsense"})
    assert malformed is not None
    assert "malformed" in malformed


def test_renewal_and_retry_must_fit_in_the_lease() -> None:
    with pytest.raises(ValueError, match="renew_seconds"):
        LeaseTiming(duration_seconds=1.0, renew_seconds=1.0)
    with pytest.raises(ValueError, match="retry_seconds"):
        LeaseTiming(duration_seconds=1.0, renew_seconds=0.5, retry_seconds=2.0)
    with pytest.raises(ValueError, match="renew_seconds"):
        LeaseSettings(lease_seconds=1.0, lease_renew_seconds=3.0)
    assert LeaseSettings().lease_timing == LeaseTiming(2.0, 0.5, 0.25)


class FlakyBucket:
    """A key-value bucket whose writes time out `failures` times (NATS away), then work."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.revision = 1

    async def create(self, key: str, value: bytes) -> int:
        return self.revision

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if self.failures > 0:
            self.failures -= 1
            raise TimeoutError("nats: timeout")
        if last != self.revision:
            raise KeyWrongLastSequenceError()
        self.revision += 1
        return self.revision


async def test_a_leader_keeps_leading_through_failing_renewals_and_is_deposed_only_by_a_rival() -> (
    None
):
    bucket = FlakyBucket(failures=12)  # three leases' worth of renewals lost
    lease = Lease(bucket, "svc", "me", LeaseTiming(0.2, 0.05, 0.05))  # type: ignore[arg-type]
    await lease.acquire()
    keeping = asyncio.create_task(lease.keep())
    await asyncio.sleep(0.9)
    assert not keeping.done()
    assert lease.epoch == 1
    assert bucket.revision > 1  # renewing again
    bucket.revision += 5  # a rival wrote the key
    with pytest.raises(Deposed, match="lost the lease"):
        await asyncio.wait_for(keeping, timeout=2)
