"""The pure parts of leader election: the epoch header, the consumers' guard, the timing."""

from __future__ import annotations

import pytest

from crater.runtime.leadership import (
    EPOCH_HEADER,
    EpochGuard,
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
