"""A tenant's hard budget in the core: its work not yet placed waits, with a reason naming
the budget, until the budget is raised or its period ends; a soft limit changes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from crater.contracts import (
    AllocationGranted,
    NodeCondition,
    NodeHealthReported,
    TaskPending,
    TenantBudgetExceeded,
    TenantBudgetRestored,
)
from crater.scheduler.domain.core import Scheduler
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, cluster, profiled

PERIOD = (at(0) - timedelta(days=1), at(0) + timedelta(hours=1))


def exceeded(
    when: float, limit: str = "hard", period: tuple[datetime, datetime] = PERIOD
) -> TenantBudgetExceeded:
    return TenantBudgetExceeded(
        occurred_at=at(when),
        tenant="vision",
        limit=limit,  # type: ignore[arg-type]
        period="monthly",
        period_start=period[0],
        period_end=period[1],
        budget=Decimal(1000),
        cost=Decimal("1250.5"),
        currency="EUR",
    )


def restored(when: float, period: tuple[datetime, datetime] = PERIOD) -> TenantBudgetRestored:
    return TenantBudgetRestored(
        occurred_at=at(when),
        tenant="vision",
        limit="hard",
        period="monthly",
        period_start=period[0],
        period_end=period[1],
        budget=Decimal(2000),
        cost=Decimal("1250.5"),
        currency="EUR",
        why="its hard budget was raised from 1000 to 2000",
    )


def held_cluster() -> Scheduler:
    scheduler, _ = cluster(node("a100-01", gpus=8))
    assert scheduler.handle(exceeded(1)) == []
    return scheduler


def test_new_work_of_a_tenant_over_its_hard_budget_waits_naming_the_budget() -> None:
    scheduler = held_cluster()
    [pending] = scheduler.handle(profiled("t1", when=2, tenant="vision"))
    assert isinstance(pending, TaskPending)
    [reason] = pending.reasons
    assert (reason.filter, reason.code) == ("TenantBudget", "BudgetExceeded")
    assert pending.summary == (
        "0/1 nodes available: tenant 'vision' spent 1250.5 EUR this month (UTC), against its "
        "hard budget of 1000 EUR: its work not yet placed waits until the period ends at "
        "2026-01-01T01:00:00Z or the budget is raised"
    )
    # Other tenants are placed as ever.
    [granted] = scheduler.handle(profiled("t2", when=3, tenant="physics"))
    assert isinstance(granted, AllocationGranted)


def test_raising_the_budget_places_the_waiting_work() -> None:
    scheduler = held_cluster()
    scheduler.handle(profiled("t1", when=2, tenant="vision"))
    [granted] = scheduler.handle(restored(3))
    assert isinstance(granted, AllocationGranted)
    assert granted.task_id == "t1"
    assert scheduler.quotas.holds == {}


def test_the_period_ending_lets_the_work_go_without_a_word_from_the_predictor() -> None:
    scheduler = held_cluster()
    scheduler.handle(profiled("t1", when=2, tenant="vision"))
    heartbeat = NodeHealthReported(
        occurred_at=at(3599), node_id="a100-01", condition=NodeCondition.READY, score=100
    )
    assert scheduler.handle(heartbeat) == []  # still in the period
    # Past the period's end, any event's time (a heartbeat) lifts the hold.
    [granted] = scheduler.handle(heartbeat.model_copy(update={"occurred_at": at(3601)}))
    assert isinstance(granted, AllocationGranted)
    assert granted.task_id == "t1"


def test_a_soft_limit_and_stale_or_unrelated_events_change_nothing() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8))
    assert scheduler.handle(exceeded(1, limit="soft")) == []
    assert scheduler.quotas.holds == {}
    [granted] = scheduler.handle(profiled("t1", when=2, tenant="vision"))
    assert isinstance(granted, AllocationGranted)
    # A restore with nothing held, and an exceeded whose period is over: nothing held.
    assert scheduler.handle(restored(3)) == []
    old = (at(0) - timedelta(days=40), at(0) - timedelta(days=9))
    assert scheduler.handle(exceeded(4, period=old)) == []
    assert scheduler.quotas.holds == {}
    # A restore about an earlier period than the hold in force lifts nothing.
    scheduler.handle(exceeded(5))
    assert scheduler.handle(restored(6, period=old)) == []
    assert "vision" in scheduler.quotas.holds


def test_a_held_tenant_preempts_nobody_and_a_dry_run_says_it_would_wait() -> None:
    scheduler = held_cluster()
    answer = scheduler.dry_run_task(profiled("t9", tenant="vision").task, None)
    assert answer.outcome == "waiting"
    assert answer.reasons[0].filter == "TenantBudget"
    assert "hard budget of 1000 EUR" in answer.summary


def test_a_hold_survives_a_restore() -> None:
    scheduler = held_cluster()
    scheduler.handle(profiled("t1", when=2, tenant="vision"))
    again = Scheduler(config=scheduler.config)
    again.restore(
        nodes=[(n.topology, n.condition, n.last_heartbeat_at) for n in scheduler.cluster.nodes],
        allocations=[],
        pending=list(scheduler.pending.values()),
        next_seq=scheduler.next_seq,
        budget_holds=list(scheduler.quotas.holds.values()),
    )
    assert again.quotas.blocking("vision", scheduler.pending["t1"].demand)[0][0] == "budget"
    [granted] = again.handle(restored(3))
    assert isinstance(granted, AllocationGranted)
