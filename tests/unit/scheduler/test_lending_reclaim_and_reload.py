"""Reclaim without a grace starting over, borrowers packed where the owner is not, and the
pools and quotas files reloaded without a restart (docs/pools.md)."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry

from crater.contracts import (
    NodeCondition,
    NodeHealthReported,
    TaskPreempted,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.adapters.config_watch import ConfigWatch
from crater.scheduler.domain.cluster import Overcommit
from crater.scheduler.domain.core import SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.service_layer.handlers import SchedulerMetrics, SchedulerService
from tests.unit.scheduler.test_lending import GRACE, at, cluster, grants, lending, submit


def tick(when: float) -> NodeHealthReported:
    return NodeHealthReported(
        occurred_at=at(when), node_id="clock", condition=NodeCondition.READY, score=100
    )


def stopped(task_id: str, when: float) -> TaskStatusReported:
    return TaskStatusReported(occurred_at=at(when), task_id=task_id, status=TaskStatus.CANCELLED)


def test_an_owner_that_picks_again_never_starts_a_grace_over() -> None:
    scheduler = cluster(lending(infer_borrows=False), [2, 2, 2], [2])
    assert grants(scheduler.handle(submit("t0", 0, "training", 2)))
    for i in range(3):
        placed = grants(scheduler.handle(submit(f"b{i}", 0.1 * (i + 1), "training", 2)))
        assert placed
        assert placed[0].borrowed_from == "inference"
    first = scheduler.handle(submit("i1", 2, "inference", 2, priority="low"))
    [p1] = [d for d in first if isinstance(d, TaskPreempted)]
    assert p1.must_stop_by == at(2 + GRACE)
    second = scheduler.handle(submit("i2", 3, "inference", 2, priority="high"))
    [p2] = [d for d in second if isinstance(d, TaskPreempted)]
    # i1's victim stops; i2 (first in the queue) takes the room: i1 picks again, and its new
    # victim must go by i1's first deadline, not a whole grace period from now.
    decisions = scheduler.handle(stopped(p1.task_id, 4))
    assert [g.task_id for g in grants(decisions)] == ["i2"]
    [again] = [d for d in decisions if isinstance(d, TaskPreempted)]
    assert again.preempted_by == "i1"
    assert again.task_id not in (p1.task_id, p2.task_id)
    assert again.must_stop_by == at(2 + GRACE)
    assert again.grace_period_seconds == GRACE - 2
    # Neither victim stops by itself: i1 has its card a tick past its first deadline.
    assert not grants(scheduler.handle(tick(2 + GRACE)))
    placed = grants(scheduler.handle(tick(2 + GRACE + 1)))
    assert "i1" in [g.task_id for g in placed]


def test_a_borrower_goes_where_the_owner_holds_the_least() -> None:
    scheduler = cluster(lending(infer_borrows=False), [8, 8], [2])
    [owner] = grants(scheduler.handle(submit("i0", 0, "inference", 2)))
    assert grants(scheduler.handle(submit("t0", 1, "training", 2)))
    [loan] = grants(scheduler.handle(submit("t1", 2, "training", 2)))
    assert loan.borrowed_from == "inference"
    assert loan.node != owner.node  # bin-packing alone would put it beside the owner's task


def test_a_reloaded_configuration_applies_from_the_next_event() -> None:
    scheduler = cluster(SchedulerConfig(grace_period_seconds=GRACE), [8], [2])
    assert grants(scheduler.handle(submit("t0", 0, "training", 2)))
    assert not grants(scheduler.handle(submit("t1", 1, "training", 2)))
    assert scheduler.reconfigure(lending()) is None
    placed = grants(scheduler.handle(tick(2)))
    assert [(g.task_id, g.borrowed_from) for g in placed] == [("t1", "inference")]
    # Lending turned off again: the loan runs on, nobody borrows anew.
    assert scheduler.reconfigure(SchedulerConfig(grace_period_seconds=GRACE)) is None
    assert not grants(scheduler.handle(submit("t2", 3, "training", 2)))
    assert scheduler.allocations["t1"].borrowed_from == "inference"
    # The owner still takes its capacity back.
    decisions = scheduler.handle(submit("i1", 4, "inference", 8))
    assert [d.task_id for d in decisions if isinstance(d, TaskPreempted)] == ["t1"]


def test_a_reload_that_needs_a_restart_is_refused_and_changes_nothing() -> None:
    scheduler = cluster(lending(), [8], [2])
    changed = SchedulerConfig(
        pools={"inference": PoolPolicy(overcommit=Overcommit(cpu=2.0))},
    )
    why = scheduler.reconfigure(changed)
    assert why is not None
    assert why.startswith("pools.inference.overcommit:")
    assert scheduler.config == lending()


POOLS = """pools:
  inference: {cohort: shared, lend: {keep_idle: {gpus: 4}}}
  training: {cohort: shared}
"""


def write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    stamp = 1_700_000_000_000_000_000 + bump * 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


def test_the_watch_rereads_changed_files_and_refuses_invalid_ones(tmp_path: Path) -> None:
    pools, quotas = tmp_path / "pools.yaml", tmp_path / "quotas.yaml"
    write(pools, "pools: {}\n", 0)
    write(quotas, "tenants: {}\n", 0)
    now = [0.0]
    watch = ConfigWatch(pools, quotas, interval=5, clock=lambda: now[0])
    running = SchedulerConfig()
    assert watch.poll(running) is None  # nothing changed
    write(pools, POOLS, 1)
    now[0] = 1.0
    assert watch.poll(running) is None  # looked at just now: not again before the interval
    now[0] = 7.0
    found = watch.poll(running)
    assert found is not None
    assert found.config is not None
    assert found.refused is None
    assert found.config.pools["inference"].keep_idle_gpus == 4
    assert found.config.cohort_of("training") == ("inference",)
    now[0] = 14.0
    assert watch.poll(found.config) is None  # said once
    write(pools, "pools:\n  inference: {lend: {limit: {gpus: 4}}}\n", 2)
    now[0] = 21.0
    refused = watch.poll(found.config)
    assert refused is not None
    assert refused.config is None
    assert refused.refused is not None
    assert "pools.inference" in refused.refused
    assert "cohort" in refused.refused
    write(pools, POOLS, 3)  # fixed, but the quotas file is now wrong: refused all the same
    write(quotas, "tenants: {research: {gpus: many}}\n", 3)
    now[0] = 28.0
    refused = watch.poll(found.config)
    assert refused is not None
    assert refused.refused is not None
    assert "tenants.research.gpus" in refused.refused
    pools.unlink()
    now[0] = 35.0
    gone = watch.poll(found.config)
    assert gone is not None
    assert gone.config is None
    assert "cannot be read" in (gone.refused or "")


def test_the_service_applies_a_valid_reload_and_counts_a_refused_one(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    write(pools, "pools: {}\n", 0)
    now = [0.0]
    registry = CollectorRegistry()
    service = SchedulerService(
        None,  # type: ignore[arg-type]  # reload touches no database
        None,  # type: ignore[arg-type]
        SchedulerConfig(),
        SchedulerMetrics(registry),
        watch=ConfigWatch(pools, None, interval=1, clock=lambda: now[0]),
    )
    write(pools, POOLS, 1)
    now[0] = 2.0
    assert service.reload() is None
    assert service.config.pools["inference"].keep_idle_gpus == 4
    assert service.scheduler.config is service.config
    assert (
        registry.get_sample_value("crater_scheduler_config_reloads_total", {"outcome": "applied"})
        == 1.0
    )
    write(pools, "pools: [not, a, mapping]\n", 2)
    now[0] = 4.0
    why = service.reload()
    assert why is not None
    assert "pools" in why
    assert service.config.pools["inference"].keep_idle_gpus == 4  # the running one kept
    assert (
        registry.get_sample_value("crater_scheduler_config_reloads_total", {"outcome": "refused"})
        == 1.0
    )
