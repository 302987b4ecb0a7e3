"""A dry run of a whole task decides as a real submission would (gang, prediction, quota,
refusals) and leaves the scheduler exactly as it was."""

from __future__ import annotations

import copy

from crater.contracts import AllocationGranted, Confidence, TaskPending
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.quotas import Quota
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, cluster, profiled
from tests.unit.scheduler.test_lending import cluster as lending_cluster
from tests.unit.scheduler.test_lending import lending, submit


def state(scheduler: Scheduler) -> object:
    """What a dry run must not change: queue, allocations, sequence, free devices."""
    free = [(n.name, n.topology, copy.deepcopy(vars(n))) for n in scheduler.cluster.nodes]
    return (dict(scheduler.pending), dict(scheduler.allocations), scheduler.next_seq, free)


def test_answers_the_node_a_real_submission_gets_and_changes_nothing() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8), node("a100-02", gpus=2), node("cpu-01"))
    event = profiled("t1", gpus=2, cores=8)
    before = state(scheduler)
    answer = scheduler.dry_run_task(event.task, event.prediction)
    assert state(scheduler) == before
    assert (answer.outcome, answer.would_wait) == ("placed", False)
    [member] = answer.members
    assert {m.node_id for m in answer.misfits} == {"cpu-01"}
    [granted] = scheduler.handle(event)
    assert isinstance(granted, AllocationGranted)
    assert (member.node_id, member.gpu_ids, member.cpu_cores) == (
        granted.node,
        granted.gpu_ids,
        granted.cpu_cores,
    )


def test_a_prediction_above_the_request_is_what_is_placed_on() -> None:
    scheduler, _ = cluster(node("small-01", gpus=2, gpu_memory_mb=24576))
    event = profiled("t1", gpus=1, gpu_mb=8000, predicted_mb=30000, confidence=Confidence.MEDIUM)
    answer = scheduler.dry_run_task(event.task, event.prediction)
    assert answer.gpu_memory_per_gpu_mb == 33000  # 30000 + 10% margin
    assert answer.gpu_memory_source.startswith("predicted peak 30000")
    assert answer.outcome == "rejected"  # no card of the pool is large enough, ever
    assert answer.errors[0].field == "resource_requirements.gpu.memory_mb"
    without = scheduler.dry_run_task(event.task, None)
    assert without.outcome == "placed"


def test_a_gang_gets_every_member_a_node_or_waits_with_the_reason() -> None:
    scheduler, _ = cluster(node("a-01", gpus=2), node("a-02", gpus=2), node("a-03", gpus=2))
    gang = profiled("g1", gpus=2, gang_size=3)
    answer = scheduler.dry_run_task(gang.task, gang.prediction)
    assert answer.outcome == "placed"
    assert sorted(m.node_id for m in answer.members) == ["a-01", "a-02", "a-03"]
    assert [m.member for m in answer.members] == [0, 1, 2]
    scheduler.handle(profiled("busy", gpus=2, when=2))  # one node taken
    before = state(scheduler)
    waits = scheduler.dry_run_task(gang.task, gang.prediction)
    assert state(scheduler) == before
    assert (waits.outcome, waits.would_wait, waits.members) == ("waiting", True, [])
    assert "3 needed at once" in waits.summary
    [pending] = scheduler.handle(gang.model_copy(update={"occurred_at": at(3)}))
    assert isinstance(pending, TaskPending)
    assert pending.summary == waits.summary  # the same words a real submission hears
    same_node = profiled("g2", gpus=2, gang_size=2, affinity={"gpu": "same-node"})
    answer = scheduler.dry_run_task(same_node.task, same_node.prediction)
    assert answer.outcome == "rejected"  # no node holds 4 GPUs
    assert answer.errors


def test_the_tenant_quota_counts() -> None:
    scheduler = Scheduler(config=SchedulerConfig(quotas={"search": Quota(gpus=3)}))
    for event in cluster(node("a100-01", gpus=8))[1]:
        scheduler.handle(event)
    scheduler.handle(profiled("s1", gpus=2, tenant="search"))
    over = profiled("s2", gpus=2, tenant="search", when=2)
    answer = scheduler.dry_run_task(over.task, over.prediction)
    assert answer.outcome == "waiting"
    assert answer.reasons[0].code == "QuotaExceeded"
    never = profiled("s3", gpus=4, tenant="search", when=2)
    assert scheduler.dry_run_task(never.task, never.prediction).outcome == "rejected"


def test_a_task_that_would_borrow_is_answered_where_it_would_borrow() -> None:
    """In a cohort the dry run looks where the submission would borrow (a cohort mate's idle
    nodes), and a real submission then borrows exactly there."""
    scheduler = lending_cluster(lending(), [8], [4])
    scheduler.handle(submit("t0", 0, "training", 4))
    event = submit("t1", 1, "training", 4)
    before = state(scheduler)
    answer = scheduler.dry_run_task(event.task, event.prediction)
    assert state(scheduler) == before
    assert answer.outcome == "placed"
    assert [m.node_id for m in answer.members] == ["inf-0"]
    assert "would borrow from pool inference" in answer.summary
    [granted] = [d for d in scheduler.handle(event) if isinstance(d, AllocationGranted)]
    assert (granted.node, granted.borrowed_from) == ("inf-0", "inference")
    # A lender that lends nothing now: waiting, and why (the borrow reason).
    config = SchedulerConfig(
        pools={
            "inference": PoolPolicy(cohort="shared", lend_limit=Quota(gpus=0)),
            "training": PoolPolicy(cohort="shared"),
        }
    )
    scheduler = lending_cluster(config, [8], [4])
    scheduler.handle(submit("t0", 0, "training", 4))
    answer = scheduler.dry_run_task(event.task, event.prediction)
    assert answer.outcome == "waiting"
    assert "pool inference lends no more" in answer.summary
