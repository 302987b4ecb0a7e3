"""A node's health score takes part in placement (docs/architecture.md): below 90 it takes no
high-priority work, which goes elsewhere or waits, told why; other work may still use it, and
the node takes high-priority work again once its score comes back. A pool may also rank the
healthier node first (the `Healthier` score)."""

from __future__ import annotations

from crater.contracts import (
    AllocationGranted,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskPending,
)
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.plugins import DEFAULT_PIPELINE, FILTERS, Pipeline
from crater.scheduler.domain.plugins.registry import SCORES
from crater.scheduler.domain.pools import PoolPolicy
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, cluster, profiled


def health(scheduler: Scheduler, name: str, when: float, score: int) -> list[object]:
    condition = NodeCondition.READY if score >= 95 else NodeCondition.DEGRADED
    report = NodeHealthReported(
        occurred_at=at(when), node_id=name, condition=condition, score=score
    )
    return list(scheduler.handle(report))


def test_high_priority_work_goes_to_a_healthy_node_and_other_work_may_use_a_restricted_one() -> (
    None
):
    scheduler, _ = cluster(node("sick", gpus=8), node("well", gpus=8))
    health(scheduler, "sick", 1, 85)
    health(scheduler, "well", 1, 100)
    for i in range(3):
        [grant] = scheduler.handle(profiled(f"h{i}", when=2, gpus=2, priority="high"))
        assert isinstance(grant, AllocationGranted)
        assert grant.node == "well"
    # low-priority work packs where it fits best, the restricted node included
    nodes = set()
    for i in range(4):
        [grant] = scheduler.handle(profiled(f"l{i}", when=3, gpus=2, priority="low"))
        assert isinstance(grant, AllocationGranted)
        nodes.add(grant.node)
    assert "sick" in nodes


def test_high_priority_work_waits_off_a_restricted_node_and_takes_it_once_it_recovers() -> None:
    scheduler, _ = cluster(node("only", gpus=8))
    health(scheduler, "only", 1, 89)
    decisions = scheduler.handle(profiled("h", when=2, gpus=1, priority="high"))
    [pending] = [d for d in decisions if isinstance(d, TaskPending)]
    assert "has a health score below 90, restricted from high-priority work" in pending.summary
    assert "NodeHealthRestricted" in {r.code for r in pending.reasons}
    # medium priority is not high-SLA work: it may run there
    [grant] = scheduler.handle(profiled("m", when=3, gpus=1, priority="medium"))
    assert isinstance(grant, AllocationGranted)
    # a score of 90 is no longer restricted
    placed = [d for d in health(scheduler, "only", 4, 90) if isinstance(d, AllocationGranted)]
    assert [g.task_id for g in placed] == ["h"]


def test_a_pool_that_names_the_healthier_score_prefers_the_healthier_node() -> None:
    pipeline = Pipeline.from_names(list(FILTERS), {"Healthier": 1.0})
    config = SchedulerConfig(pools={"default": PoolPolicy(pipeline=pipeline)})
    scheduler = Scheduler(config=config)
    for name in ("a-warm", "b-cool"):
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(name, gpus=8)))
    health(scheduler, "a-warm", 1, 85)  # a warning: a hot card, say
    health(scheduler, "b-cool", 1, 100)
    [grant] = scheduler.handle(profiled("t", when=2, gpus=1, priority="low"))
    assert isinstance(grant, AllocationGranted)
    assert grant.node == "b-cool"
    assert "Healthier" in SCORES
    assert "Healthier" not in {s.name for s in DEFAULT_PIPELINE.scores}
