"""The pure parts of leader election: the epoch header, the consumers' guard, the timing."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from nats.js.errors import KeyWrongLastSequenceError

from crater.runtime import leadership
from crater.runtime.leadership import (
    EPOCH_HEADER,
    Deposed,
    EpochGuard,
    Leadership,
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


def test_a_message_stored_before_the_successors_first_passes_however_late_it_comes() -> None:
    # Consumed late (redelivered after the replica that took it was lost with its host): an
    # older leader's message stored before the newer one's first was published while it led.
    guard = EpochGuard()
    s7, s9 = {EPOCH_HEADER: "scheduler:7"}, {EPOCH_HEADER: "scheduler:9"}
    assert guard.stale(s7, "CRATER_TASKS", 10) is None
    assert guard.stale(s9, "CRATER_TASKS", 20) is None  # the successor's first here
    assert guard.stale(s7, "CRATER_TASKS", 12) is None  # redelivered: stored before 20
    assert guard.stale(s7, "CRATER_TASKS", 19) is None
    refusal = guard.stale(s7, "CRATER_TASKS", 21)  # stored after: the zombie's
    assert refusal == (
        "published by a deposed scheduler leader: epoch 7, stored in CRATER_TASKS at 21, "
        "after epoch 9's message at 20"
    )
    # Each stream has its own order: epoch 9 not yet heard in the allocation stream.
    assert guard.stale(s7, "CRATER_ALLOCATIONS", 500) is None
    # A newer epoch's earlier message moves its first position back.
    assert guard.stale(s9, "CRATER_TASKS", 15) is None
    assert guard.stale(s7, "CRATER_TASKS", 16) is not None
    assert guard.stale(s7, "CRATER_TASKS", 14) is None
    # A core message (no stream order) is judged by the highest epoch heard anywhere.
    assert guard.stale(s7) is not None
    assert guard.stale(s9) is None


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


class ElectingBucket:
    """A key held by another process at `revision`; while `away`, every call fails as it
    does while the bucket's raft group elects a leader or this process's server is lost."""

    def __init__(self) -> None:
        self.revision = 1
        self.away = False

    def _check(self) -> None:
        if self.away:
            raise TimeoutError("nats: timeout")

    async def create(self, key: str, value: bytes) -> int:
        self._check()
        raise KeyWrongLastSequenceError()

    async def get(self, key: str) -> SimpleNamespace:
        self._check()
        return SimpleNamespace(revision=self.revision, value=b"{}")

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        self._check()
        if last != self.revision:
            raise KeyWrongLastSequenceError()
        self.revision += 1
        return self.revision


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _compete(lease: Lease) -> int:
    """As `Leadership` does: a failed look is retried."""
    while True:
        try:
            return await lease.acquire()
        except TimeoutError:
            await asyncio.sleep(0.005)


async def _spin() -> None:
    await asyncio.sleep(0.05)  # the standby looks several times (retry 0.005 s)


async def _standby_through_an_outage() -> tuple[ElectingBucket, Clock, asyncio.Task[int]]:
    """A standby that saw the key at revision 1 at t=0; then the bucket is unwritable from
    t=0.5 until t=3 (longer than the 2 s lease), and back at t=3."""
    bucket, clock = ElectingBucket(), Clock()
    lease = Lease(bucket, "svc", "standby", LeaseTiming(2.0, 0.5, 0.005), clock)  # type: ignore[arg-type]
    standby = asyncio.create_task(_compete(lease))
    await _spin()
    bucket.away, clock.now = True, 0.5
    await _spin()
    clock.now = 3.0
    await _spin()
    bucket.away = False
    await _spin()
    return bucket, clock, standby


async def test_a_lease_that_lapsed_while_the_bucket_was_away_is_taken_a_grace_after() -> None:
    # The leader died at t=0 with its NATS server: no renewal since. Once the bucket takes
    # writes again (t=3) the standby waits the grace (two renewals: 1 s), not a whole lease.
    _, clock, standby = await _standby_through_an_outage()
    assert not standby.done()
    clock.now = 3.9
    await _spin()
    assert not standby.done()
    clock.now = 4.05
    epoch = await asyncio.wait_for(standby, timeout=2)
    assert epoch == 2


async def test_a_leader_only_cut_off_renews_in_the_grace_and_keeps_the_lease() -> None:
    bucket, clock, standby = await _standby_through_an_outage()
    clock.now = 3.5
    bucket.revision += 1  # the leader, alive, renews once the bucket takes writes again
    await _spin()
    clock.now = 4.05
    await _spin()
    assert not standby.done()  # the renewal restarted the standby's watch: 2 s from t=3.5
    clock.now = 5.4
    await _spin()
    assert not standby.done()
    clock.now = 5.55
    assert await asyncio.wait_for(standby, timeout=2) == 3


async def test_the_lease_is_renewed_while_the_takeover_runs() -> None:
    # A takeover that waits (consumers electing a raft leader after a NATS server's loss)
    # for longer than a lease: renewed meanwhile, so a standby sees no lapse.
    bucket = FlakyBucket(failures=0)
    timing = LeaseTiming(0.2, 0.05, 0.05)
    revisions: list[int] = []

    async def lead(epoch: int) -> None:
        await asyncio.sleep(3 * timing.duration_seconds)
        revisions.append(bucket.revision)

    async def step_down() -> None:
        pass

    lease = Lease(bucket, "svc", "me", timing)  # type: ignore[arg-type]
    leadership = Leadership(lease, lead, step_down)
    await leadership.start(wait_seconds=2.0)
    assert leadership.epoch == 1
    assert revisions
    assert revisions[0] >= 5  # about one renewal per 0.05 s of the 0.6 s takeover
    await leadership.stop()


class LostAnswerBucket(ElectingBucket):
    """Its first `get` is never answered: sent on a connection to a server that just died."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 1

    async def get(self, key: str) -> SimpleNamespace:
        if self.lost:
            self.lost -= 1
            await asyncio.sleep(3600)
        return await super().get(key)


async def test_a_standbys_look_whose_answer_is_lost_is_given_up_soon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not nats-py's JetStream timeout (5 s): the standby looks again after LOOK_TIMEOUT.
    monkeypatch.setattr(leadership, "LOOK_TIMEOUT_SECONDS", 0.1)
    lease = Lease(LostAnswerBucket(), "svc", "standby", LeaseTiming(2.0, 0.5, 0.005))  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(lease.acquire(), timeout=3)
    assert time.monotonic() - started < 1.0
