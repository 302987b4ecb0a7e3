"""Pre-warm: a lending pool learns its daily pattern and takes its capacity back ahead of a
recurring peak, so that borrowers spend their grace period before its own tasks arrive."""

from __future__ import annotations

from dataclasses import replace

import pytest

from crater.contracts import TaskPreempted, TaskStatus, TaskStatusReported
from crater.scheduler.adapters.pools_file import PoolsFileError, parse_pools
from crater.scheduler.domain.core import SchedulerConfig
from crater.scheduler.domain.prewarm import DAY_SECONDS, Forecast, Prewarm
from tests.unit.scheduler.test_lending import GRACE, at, cluster, grants, lending, submit
from tests.unit.scheduler.test_lending_reclaim_and_reload import tick

HOUR = 3_600


def test_without_a_past_day_nothing_is_expected() -> None:
    forecast = Forecast(Prewarm(lead_seconds=600))
    forecast.observe(10 * HOUR, 6)
    assert forecast.growth(10 * HOUR, 0) == 0  # today's bucket is not a pattern yet


def test_a_peak_is_expected_again_the_next_day_within_the_lead() -> None:
    forecast = Forecast(Prewarm(lead_seconds=600, bucket_seconds=900))
    forecast.observe(10 * HOUR + 60, 6)
    forecast.observe(11 * HOUR, 0)  # the 10:00 bucket ended: folded into the pattern
    tomorrow = DAY_SECONDS + 10 * HOUR
    assert forecast.growth(tomorrow - 900, 1) == 0  # 09:45 + 10 min: not yet
    assert forecast.growth(tomorrow - 300, 1) == 5  # 09:55 + 10 min reaches 10:00
    assert forecast.growth(tomorrow - 900, 1, ahead=1200) == 5  # a longer look sees it


def test_a_one_off_peak_fades_with_the_half_life() -> None:
    forecast = Forecast(Prewarm(lead_seconds=600, bucket_seconds=900, half_life_days=1))
    forecast.observe(10 * HOUR, 16)
    for day in range(1, 4):
        forecast.observe(day * DAY_SECONDS + 10 * HOUR, 2)  # folds the day before
    forecast.observe(3 * DAY_SECONDS + 11 * HOUR, 0)
    # 16 halved on each of the three days since, then 2 is the larger
    assert forecast.pattern[40] == 2
    assert forecast.growth(4 * DAY_SECONDS + 10 * HOUR, 0) == 2


def prewarming(lead: float = 600) -> SchedulerConfig:
    config = lending(infer_borrows=False)
    pools = dict(config.pools)
    pools["inference"] = replace(pools["inference"], prewarm=Prewarm(lead_seconds=lead))
    # no heartbeats here: nodes stay ready over the two days
    quiet = 10 * DAY_SECONDS
    return replace(config, pools=pools, heartbeat_timeout_seconds=quiet, node_lost_seconds=quiet)


def succeeded(task_id: str, when: float) -> TaskStatusReported:
    return TaskStatusReported(occurred_at=at(when), task_id=task_id, status=TaskStatus.SUCCEEDED)


def preempted(decisions: list) -> list[TaskPreempted]:  # type: ignore[type-arg]
    return [d for d in decisions if isinstance(d, TaskPreempted)]


def test_borrowers_yield_ahead_of_yesterdays_peak_and_no_new_loan_is_made() -> None:
    scheduler = cluster(prewarming(), [4, 4], [2])
    start = 10 * HOUR  # T0 is midnight: the pattern's buckets are hours of the day
    for i in range(3):  # yesterday at 10:00 its own tasks wanted 6 GPUs
        assert grants(scheduler.handle(submit(f"i{i}", start + i, "inference", 2)))
    for i in range(3):
        scheduler.handle(succeeded(f"i{i}", start + 1800 + i))
    scheduler.handle(tick(12 * HOUR))
    day = DAY_SECONDS
    assert grants(scheduler.handle(submit("t0", day + 8 * HOUR, "training", 2)))
    for i in range(3):
        [loan] = grants(scheduler.handle(submit(f"b{i}", day + 8 * HOUR + 1 + i, "training", 2)))
        assert loan.borrowed_from == "inference"
    assert not preempted(scheduler.handle(tick(day + 9 * HOUR + 40 * 60)))  # 09:50: not yet
    decisions = scheduler.handle(tick(day + 9 * HOUR + 52 * 60))  # 10:02 within the lead
    yielded = preempted(decisions)
    # 6 GPUs expected, 2 idle: two borrowers of 2 GPUs yield, the least progressed first
    assert sorted(p.task_id for p in yielded) == ["b1", "b2"]
    for p in yielded:
        assert p.preempted_by is None
        assert p.reclaimed_by_pool == "inference"
        assert p.grace_period_seconds == GRACE
        assert p.cause() == "taken back by pool inference ahead of its expected demand"
    # Told once: the next event asks nothing more of anyone.
    assert not preempted(scheduler.handle(tick(day + 9 * HOUR + 53 * 60)))
    # And nothing new is lent into the headroom it keeps.
    assert not grants(scheduler.handle(submit("b9", day + 9 * HOUR + 54 * 60, "training", 2)))


def test_the_pools_file_takes_prewarm_under_lend_only() -> None:
    policies = parse_pools(
        "pools:\n"
        "  inference: {cohort: day, lend: {prewarm: {lead_seconds: 900}}}\n"
        "  training: {cohort: day}\n"
    )
    assert policies["inference"].prewarm == Prewarm(lead_seconds=900)
    with pytest.raises(PoolsFileError, match="prewarm is a lender's"):
        parse_pools("pools:\n  t: {cohort: day, borrow: {prewarm: {lead_seconds: 900}}}\n")
    with pytest.raises(PoolsFileError, match="lead_seconds"):
        parse_pools("pools:\n  t: {cohort: day, lend: {prewarm: {lead_seconds: 0}}}\n")
