"""Lending by phase (docs/pools.md): a running training task in a CPU phase lends its whole
cards to inference replicas, memory-capped; when it asks them back (or its phase passes the
maximum, or it goes) the replicas are gone within the reclaim grace.

Directed tests of each outcome and fault, then a property test over random scripts: nothing
is held past a card or a core, a lent card carries one replica and stays held by its lender
or by that replica, and every owner has its cards back (`returned`) within the grace plus
a tick of asking."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from hypothesis import event as note_case
from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    GpuPhase,
    GpuUsage,
    LendingState,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskGpusLending,
    TaskPhaseReported,
    TaskPreempted,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.audit import decisions_json
from crater.scheduler.domain.cluster import WHOLE
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.phases import LEND_HEADROOM_MB
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.quotas import Quota
from tests.support.topologies import node
from tests.unit.scheduler.test_lending import PREDICTION, T0, at

GRACE = 10.0
CARD_MB = 81920


def submit(task_id: str, when: float, pool: str, gpus: int, **body: Any) -> TaskProfiled:
    kind = body.pop("task_type", "training" if pool == "training" else "inference")
    request = TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": kind,
            "model_config": {"name": "m"},
            "pool": pool,
            "resource_requirements": {
                "gpu": {"count": gpus, "memory_mb": body.pop("gpu_memory_mb", 20000)},
                "cpu": {"cores": 2},
                "memory": {"capacity_mb": 1000},
            },
            **body,
        }
    )
    return TaskProfiled(occurred_at=at(when), task=request, prediction=PREDICTION)


def config(**changes: Any) -> SchedulerConfig:
    """Two pools of one cohort; inference borrows no whole idle card (so a replica that does
    not fit its pool has only lent cards)."""
    return SchedulerConfig(
        grace_period_seconds=30,
        phase_reclaim_grace_seconds=GRACE,
        reservation_timeout_ms=3_600_000,  # replicas here never confirm: none expires
        pools={
            "inference": PoolPolicy(cohort="shared", borrow_limit=Quota(gpus=0)),
            "training": PoolPolicy(cohort="shared", borrow_limit=Quota(gpus=0)),
        },
        **changes,
    )


def cluster(train_gpus: int = 2, infer_gpus: int = 1, **changes: Any) -> Scheduler:
    scheduler = Scheduler(config=config(**changes))
    for topology in (
        node("trn-0", gpus=train_gpus, pool="training", gpu_memory_mb=CARD_MB),
        node("inf-0", gpus=infer_gpus, pool="inference"),
    ):
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    return scheduler


def running(scheduler: Scheduler, task_id: str, when: float) -> str:
    """The task's allocation, confirmed running by its node."""
    allocation_id = scheduler.allocations[task_id].allocation_id
    report = TaskStatusReported(
        occurred_at=at(when),
        task_id=task_id,
        allocation_id=allocation_id,
        status=TaskStatus.RUNNING,
    )
    scheduler.handle(report)
    return allocation_id


def phase(
    task_id: str, allocation_id: str, when: float, which: GpuPhase, **fields: Any
) -> TaskPhaseReported:
    return TaskPhaseReported(
        occurred_at=at(when), task_id=task_id, allocation_id=allocation_id, phase=which, **fields
    )


def tick(when: float, node_id: str = "inf-0") -> NodeHealthReported:
    return NodeHealthReported(
        occurred_at=at(when), node_id=node_id, condition=NodeCondition.READY, score=100
    )


E = TypeVar("E", bound=Event)


def of(kind: type[E], decisions: list[Event]) -> list[E]:
    return [d for d in decisions if isinstance(d, kind)]


def lending_training() -> tuple[Scheduler, str]:
    """t1 runs on both cards of trn-0; replica r0 fills inf-0; r1 waits."""
    scheduler = cluster()
    assert of(AllocationGranted, scheduler.handle(submit("t1", 0, "training", 2)))
    allocation_id = running(scheduler, "t1", 1)
    assert of(AllocationGranted, scheduler.handle(submit("r0", 2, "inference", 1)))
    assert not of(AllocationGranted, scheduler.handle(submit("r1", 3, "inference", 1)))
    return scheduler, allocation_id


def test_a_replica_takes_a_lent_card_memory_capped_and_leaves_when_asked() -> None:
    scheduler, alloc = lending_training()
    resident = [GpuUsage(gpu_id=0, utilization_percent=0, memory_used_mb=30000)]
    decisions = scheduler.handle(
        phase("t1", alloc, 4, GpuPhase.CPU, expected_seconds=600, gpus=resident)
    )
    said = of(TaskGpusLending, decisions)
    assert [(s.state, s.gpu_ids, s.lent_until) for s in said] == [
        (LendingState.LENT, [0, 1], at(4 + 600))
    ]
    [grant] = of(AllocationGranted, decisions)
    assert (grant.task_id, grant.node, grant.gpu_ids) == ("r1", "trn-0", [0])
    cap = CARD_MB - 30000 - LEND_HEADROOM_MB
    assert grant.explanation.startswith(
        f"on GPU 0 of trn-0, lent by task t1 during its CPU phase, isolated by "
        f"memory-limited sharing ({cap} MiB); the card has no MIG"
    )
    assert grant.environment["CRATER_LENT_BY"] == "t1"
    assert grant.environment["CRATER_GPU_MEMORY_LIMIT_MB"] == str(cap)
    trn = scheduler.cluster.get("trn-0")
    assert trn is not None
    assert trn.gpu_milli_free == [0, 0]
    # A second replica goes on the other card, capped to what t1 asked per card (20000).
    [second] = of(AllocationGranted, scheduler.handle(submit("r2", 5, "inference", 1)))
    assert second.gpu_ids == [1]
    assert second.environment["CRATER_GPU_MEMORY_LIMIT_MB"] == str(
        CARD_MB - 20000 - LEND_HEADROOM_MB
    )
    # A third finds no lent card free: one replica per card.
    assert not of(AllocationGranted, scheduler.handle(submit("r3", 6, "inference", 1)))
    # Asked back: both replicas yield within the grace; t1 hears it is reclaiming.
    decisions = scheduler.handle(phase("t1", alloc, 10, GpuPhase.GPU))
    preempted = of(TaskPreempted, decisions)
    assert sorted((p.task_id, p.lent_by, p.must_stop_by) for p in preempted) == [
        ("r1", "t1", at(10 + GRACE)),
        ("r2", "t1", at(10 + GRACE)),
    ]
    assert preempted[0].cause() == "the GPUs lent by t1 taken back"
    [said_back] = of(TaskGpusLending, decisions)
    assert (said_back.state, said_back.must_be_free_by) == (LendingState.RECLAIMING, at(20))
    # r1 stops; r2 never does: released at the deadline, and t1 is told its cards are back.
    stop = TaskStatusReported(occurred_at=at(12), task_id="r1", status=TaskStatus.CANCELLED)
    decisions = scheduler.handle(stop)
    assert not of(TaskGpusLending, decisions)
    assert not of(AllocationGranted, decisions), "nothing new on a card being taken back"
    decisions = scheduler.handle(tick(20.5))
    assert [r.task_id for r in of(AllocationReleased, decisions)] == ["r2"]
    [back] = of(TaskGpusLending, decisions)
    assert back.state is LendingState.RETURNED
    assert back.occurred_at <= at(10 + GRACE + 1)
    assert not scheduler.phases
    assert not scheduler.lent_cards
    assert trn.gpu_milli_free == [0, 0]


def mig_lender() -> Scheduler:
    """t1 runs on one MIG-capable A100 (1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb) of the training
    pool; the inference pool's one card is taken by r0."""
    scheduler = Scheduler(config=config())
    topology = node("a100-01", gpus=1, pool="training", gpu_memory_mb=CARD_MB)
    profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]
    topology = topology.model_copy(
        update={
            "gpus": [
                g.model_copy(update={"mig_capable": True, "mig_profiles": profiles})
                for g in topology.gpus
            ]
        }
    )
    scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    serving = node("inf-0", gpus=1, pool="inference")  # the replicas' own pool, full
    scheduler.handle(NodeTopologyReported(occurred_at=T0, node=serving))
    scheduler.handle(submit("r0", 0, "inference", 1))
    scheduler.handle(submit("t1", 0, "training", 1))
    return scheduler


def test_a_mig_capable_card_is_shared_by_memory_and_the_grant_says_why() -> None:
    scheduler = mig_lender()
    alloc = running(scheduler, "t1", 1)
    scheduler.handle(phase("t1", alloc, 2, GpuPhase.CPU))  # resident memory not reported
    [grant] = of(AllocationGranted, scheduler.handle(submit("r1", 3, "inference", 1)))
    assert "lent by task t1" in grant.explanation
    assert "not MIG: a card is cut only while empty" in grant.explanation
    assert grant.mig_profile is None


def lent_with_resident(resident_mb: int) -> tuple[Scheduler, str, AllocationGranted]:
    """t1 on the MIG card enters a CPU phase keeping `resident_mb` on it; replica r1 (15 GB)
    asks: the scheduler, t1's allocation, r1's grant."""
    scheduler = mig_lender()
    alloc = running(scheduler, "t1", 1)
    kept = [GpuUsage(gpu_id=0, memory_used_mb=resident_mb, utilization_percent=0)]
    scheduler.handle(phase("t1", alloc, 2, GpuPhase.CPU, gpus=kept))
    decisions = scheduler.handle(submit("r1", 3, "inference", 1, gpu_memory_mb=15000))
    [grant] = of(AllocationGranted, decisions)
    return scheduler, alloc, grant


def test_an_empty_mig_card_is_lent_as_the_smallest_slice_that_holds_the_replica() -> None:
    # its GPU processes gone for the phase: nothing resident on card 0
    scheduler, alloc, grant = lent_with_resident(0)
    assert (grant.mig_profile, grant.gpu_ids) == ("2g.20gb", [0])
    assert "isolated by a MIG slice 2g.20gb (the lender keeps nothing resident" in (
        grant.explanation
    )
    assert grant.environment["CRATER_MIG_PROFILE"] == "2g.20gb"
    assert grant.environment["CRATER_GPU_MEMORY_LIMIT_MB"] == str(20 * 1024)
    card = scheduler.cluster.get("a100-01")
    assert card is not None
    assert card.gpu_milli_free == [0]
    assert not card.mig_used
    # Back to the GPU: the replica goes, the card is the lender's again, nothing carved left.
    scheduler.handle(phase("t1", alloc, 10, GpuPhase.GPU))
    scheduler.handle(tick(10 + GRACE + 1))
    assert "r1" not in scheduler.allocations
    assert card.gpu_milli_free == [0]
    assert not card.mig_used
    scheduler.handle(
        TaskStatusReported(occurred_at=at(40), task_id="t1", status=TaskStatus.SUCCEEDED)
    )
    assert card.gpu_milli_free == [WHOLE]
    assert not card.mig_used


def test_a_mig_card_with_the_lenders_memory_resident_is_shared_by_memory() -> None:
    _, _, grant = lent_with_resident(30000)
    assert grant.mig_profile is None
    assert "memory-limited sharing" in grant.explanation


def test_refusals_name_why_and_change_nothing() -> None:
    scheduler = cluster()
    said = of(TaskGpusLending, scheduler.handle(phase("ghost", "alloc-x", 1, GpuPhase.CPU)))
    assert [(s.state, s.reason) for s in said] == [
        (LendingState.REFUSED, "task ghost is not running (it holds no allocation)")
    ]
    scheduler.handle(submit("t1", 2, "training", 2))
    alloc = scheduler.allocations["t1"].allocation_id
    [early] = of(TaskGpusLending, scheduler.handle(phase("t1", alloc, 3, GpuPhase.CPU)))
    assert early.state is LendingState.REFUSED
    assert "not confirmed running" in early.reason
    running(scheduler, "t1", 4)
    [other] = of(TaskGpusLending, scheduler.handle(phase("t1", "alloc-old", 5, GpuPhase.CPU)))
    assert other.state is LendingState.REFUSED
    assert "alloc-old" in other.reason
    assert not scheduler.phases
    # An end before any begin: nothing was lent, the cards are the task's.
    [end] = of(TaskGpusLending, scheduler.handle(phase("t1", alloc, 6, GpuPhase.GPU)))
    assert (end.state, end.reason) == (LendingState.RETURNED, "nothing was lent")


def test_a_share_or_a_gang_is_not_lent() -> None:
    scheduler = cluster()
    body = {"resource_requirements": {"gpu": {"count": 1, "milli": 500}, "cpu": {"cores": 2}}}
    request = TaskRequest.model_validate(
        {"task_id": "s1", "task_type": "training", "model_config": {"name": "m"}}
        | {"pool": "training"}
        | body
    )
    scheduler.handle(TaskProfiled(occurred_at=at(0), task=request, prediction=PREDICTION))
    alloc = running(scheduler, "s1", 1)
    [said] = of(TaskGpusLending, scheduler.handle(phase("s1", alloc, 2, GpuPhase.CPU)))
    assert said.state is LendingState.REFUSED
    assert "share" in said.reason


def test_duplicates_keep_the_phase_and_the_deadline() -> None:
    scheduler, alloc = lending_training()
    scheduler.handle(phase("t1", alloc, 4, GpuPhase.CPU))
    [again] = of(TaskGpusLending, scheduler.handle(phase("t1", alloc, 5, GpuPhase.CPU)))
    assert (again.state, again.lent_until) == (LendingState.LENT, at(4 + 3600))
    first = scheduler.handle(phase("t1", alloc, 6, GpuPhase.GPU))
    assert [p.task_id for p in of(TaskPreempted, first)] == ["r1"]
    second = scheduler.handle(phase("t1", alloc, 8, GpuPhase.GPU))
    assert not of(TaskPreempted, second)
    [said] = of(TaskGpusLending, second)
    assert (said.state, said.must_be_free_by) == (LendingState.RECLAIMING, at(6 + GRACE))
    # A begin while the cards are being taken back is refused.
    [refused] = of(TaskGpusLending, scheduler.handle(phase("t1", alloc, 9, GpuPhase.CPU)))
    assert refused.state is LendingState.REFUSED
    scheduler.handle(tick(6 + GRACE + 1))
    [after] = of(TaskGpusLending, scheduler.handle(phase("t1", alloc, 30, GpuPhase.GPU)))
    assert after.state is LendingState.RETURNED


def test_a_phase_past_its_maximum_ends_by_itself() -> None:
    scheduler, alloc = lending_training()
    scheduler.handle(phase("t1", alloc, 4, GpuPhase.CPU, expected_seconds=60))
    assert "r1" in scheduler.allocations
    assert not of(TaskPreempted, scheduler.handle(tick(63)))
    decisions = scheduler.handle(tick(64))
    assert [(p.task_id, p.must_stop_by) for p in of(TaskPreempted, decisions)] == [
        ("r1", at(64 + GRACE))
    ]
    [said] = of(TaskGpusLending, decisions)
    assert said.state is LendingState.RECLAIMING
    assert "maximum" in said.reason


def test_the_lender_ending_hands_its_card_to_the_replica_until_it_leaves() -> None:
    scheduler, alloc = lending_training()
    scheduler.handle(phase("t1", alloc, 4, GpuPhase.CPU))
    done = TaskStatusReported(
        occurred_at=at(5), task_id="t1", allocation_id=alloc, status=TaskStatus.SUCCEEDED
    )
    decisions = scheduler.handle(done)
    assert [(p.task_id, p.lent_by) for p in of(TaskPreempted, decisions)] == [("r1", "t1")]
    trn = scheduler.cluster.get("trn-0")
    assert trn is not None
    assert trn.gpu_milli_free == [0, WHOLE]
    assert scheduler.allocations["r1"].gpu_milli == WHOLE
    assert not scheduler.phases
    # Nothing else goes on card 0 before r1 leaves.
    [other] = of(AllocationGranted, scheduler.handle(submit("t2", 6, "training", 1)))
    assert other.gpu_ids == [1]
    released = of(AllocationReleased, scheduler.handle(tick(5 + GRACE + 1)))
    assert [r.task_id for r in released] == ["r1"]
    assert trn.gpu_milli_free == [WHOLE, 0]


def test_a_preempted_lender_takes_its_cards_back_by_its_own_deadline() -> None:
    scheduler = cluster(train_gpus=1, infer_gpus=1)
    scheduler.handle(submit("r0", 0, "inference", 1))
    scheduler.handle(submit("t1", 0, "training", 1, preemptible=True, priority="low"))
    alloc = running(scheduler, "t1", 1)
    scheduler.handle(phase("t1", alloc, 2, GpuPhase.CPU))
    assert of(AllocationGranted, scheduler.handle(submit("r1", 3, "inference", 1)))
    decisions = scheduler.handle(submit("t2", 4, "training", 1, priority="high"))
    by = {p.task_id: p.must_stop_by for p in of(TaskPreempted, decisions)}
    assert by["t1"] == at(4 + 30)
    assert by["r1"] == at(4 + GRACE)  # the shorter of the two
    [said] = of(TaskGpusLending, decisions)
    assert said.state is LendingState.RECLAIMING
    assert said.reason == "it is preempted"


def test_a_lost_node_releases_lender_and_replica() -> None:
    scheduler, alloc = lending_training()
    scheduler.handle(phase("t1", alloc, 4, GpuPhase.CPU))
    down = NodeHealthReported(
        occurred_at=at(5), node_id="trn-0", condition=NodeCondition.NOT_READY, score=0
    )
    scheduler.handle(down)
    released: list[AllocationReleased] = []
    for second in range(6, 130):
        released += of(AllocationReleased, scheduler.handle(tick(second)))
    assert sorted(r.task_id for r in released) == ["r1", "t1"]
    assert not scheduler.phases
    assert not scheduler.lent_cards


def restarted(scheduler: Scheduler, when: float) -> Scheduler:
    """A new core restored as the repository loads it: nodes, live allocations as granted
    (each replica's share from its request, `lent_by` from its grant's environment)."""
    again = Scheduler(config=scheduler.config)
    members = [
        replace(m, gpu_milli=WHOLE, peers=[], heard_at=None)
        for head in scheduler.allocations.values()
        for m in head.members()
    ]
    again.restore(
        nodes=[(n.topology, n.condition, n.last_heartbeat_at) for n in scheduler.cluster.nodes],
        allocations=members,
        pending=list(scheduler.pending.values()),
        next_seq=scheduler.next_seq,
    )
    again.handle(tick(when))
    return again


def test_a_restart_keeps_the_lent_cards_and_takes_them_back() -> None:
    scheduler, alloc = lending_training()
    scheduler.handle(phase("t1", alloc, 4, GpuPhase.CPU))
    again = restarted(scheduler, 5)
    assert set(again.phases) == {"t1"}
    trn = again.cluster.get("trn-0")
    assert trn is not None
    assert trn.gpu_milli_free == [0, 0]
    assert again.lent_cards == {("trn-0", 0): "r1"}
    decisions = again.handle(phase("t1", alloc, 6, GpuPhase.GPU))
    assert [(p.task_id, p.must_stop_by) for p in of(TaskPreempted, decisions)] == [
        ("r1", at(6 + GRACE))
    ]
    # A restart in the middle of the taking back keeps the deadline.
    third = restarted(again, 7)
    assert third.phases["t1"].must_be_free_by == at(6 + GRACE)
    decisions = third.handle(tick(6 + GRACE + 0.5))
    assert [r.task_id for r in of(AllocationReleased, decisions)] == ["r1"]
    assert [s.state for s in of(TaskGpusLending, decisions)] == [LendingState.RETURNED]


def test_a_restart_with_a_mig_slice_lent_cuts_nothing_and_gives_the_card_back_whole() -> None:
    scheduler, alloc, grant = lent_with_resident(0)
    assert grant.mig_profile == "2g.20gb"
    again = restarted(scheduler, 5)
    card = again.cluster.get("a100-01")
    assert card is not None
    assert again.lent_cards == {("a100-01", 0): "r1"}
    assert card.gpu_milli_free == [0]
    assert not card.mig_used  # the lender's hold, whole: the slice is not the core's to cut
    again.handle(phase("t1", alloc, 6, GpuPhase.GPU))
    decisions = again.handle(tick(6 + GRACE + 0.5))
    assert [r.task_id for r in of(AllocationReleased, decisions)] == ["r1"]
    assert card.gpu_milli_free == [0]
    assert not card.mig_used


def test_a_restart_after_the_lender_left_keeps_the_card_with_the_replica() -> None:
    scheduler, alloc = lending_training()
    scheduler.handle(phase("t1", alloc, 4, GpuPhase.CPU))
    done = TaskStatusReported(
        occurred_at=at(5), task_id="t1", allocation_id=alloc, status=TaskStatus.SUCCEEDED
    )
    scheduler.handle(done)
    again = restarted(scheduler, 6)
    trn = again.cluster.get("trn-0")
    assert trn is not None
    assert trn.gpu_milli_free == [0, WHOLE]
    assert again.allocations["r1"].gpu_milli == WHOLE
    assert not again.phases


def test_decisions_replay_the_same() -> None:
    """Deterministic: the same events decide the same, bit for bit (the audit's replay)."""
    events: list[Event] = [
        submit("t1", 0, "training", 2),
        submit("r0", 2, "inference", 1),
        submit("r1", 3, "inference", 1),
    ]
    first = cluster()
    decided = [first.handle(e) for e in events]
    alloc = first.allocations["t1"].allocation_id
    more: list[Event] = [
        TaskStatusReported(
            occurred_at=at(1), task_id="t1", allocation_id=alloc, status=TaskStatus.RUNNING
        ),
        phase("t1", alloc, 4, GpuPhase.CPU),
        phase("t1", alloc, 8, GpuPhase.GPU),
        tick(30),
    ]
    decided += [first.handle(e) for e in more]
    second = cluster()
    again = [second.handle(e) for e in [*events, *more]]
    assert [decisions_json(d) for d in again] == [decisions_json(d) for d in decided]
    assert any(of(TaskGpusLending, d) for d in decided)


# -- property: capacity and the owner's bound over random scripts ------------------------------

# Replicas and begins weighted up: lending needs a running task in its phase and a replica
# its own pool cannot hold.
steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["train", "infer", "infer", "infer", "begin", "begin", "end", "stop", "wait"]
        ),
        st.integers(0, 7),
        st.booleans(),
    ),
    min_size=6,
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(
    train_cards=st.sampled_from([1, 2, 4]),
    infer_cards=st.sampled_from([1, 2]),
    max_phase=st.sampled_from([15.0, 3600.0]),
    replicas_stop=st.booleans(),
    script=steps,
)
def test_nothing_over_capacity_and_owners_get_their_cards_back_in_time(
    train_cards: int,
    infer_cards: int,
    max_phase: float,
    replicas_stop: bool,
    script: list[tuple[str, int, bool]],
) -> None:
    scheduler = cluster(train_cards, infer_cards, phase_max_seconds=max_phase)
    clock = 0
    asked_back: dict[str, int] = {}  # owners whose cards are being taken back, since when
    stop_at: dict[str, int] = {}

    def feed(event: Event) -> None:
        decisions = scheduler.handle(event)
        for d in decisions:
            if isinstance(d, TaskGpusLending) and d.state is LendingState.RECLAIMING:
                asked_back.setdefault(d.task_id, clock)
            if (
                isinstance(d, TaskGpusLending)
                and d.state is LendingState.RETURNED
                and asked_back.pop(d.task_id, None) is not None
            ):
                note_case("an owner got its cards back from replicas")
            if isinstance(d, AllocationGranted) and "CRATER_LENT_BY" in d.environment:
                note_case("a replica on a lent card")
            if isinstance(d, TaskPreempted) and replicas_stop:
                stop_at.setdefault(d.task_id, clock + 3)
        for owner in [o for o in asked_back if o not in scheduler.allocations]:
            del asked_back[owner]  # it ended: it is owed nothing
        check()

    def check() -> None:
        for n in scheduler.cluster.nodes:
            held = [0] * len(n.topology.gpus)
            cores: list[int] = []
            for head in scheduler.allocations.values():
                for m in head.members():
                    if m.node == n.name:
                        cores += m.cpu_cores
                        for card in m.gpu_ids:
                            held[card] += m.gpu_milli
            assert all(h <= WHOLE for h in held), "a card held past whole"
            assert [WHOLE - h for h in held] == n.gpu_milli_free, "the node's books drift"
            assert len(cores) == len(set(cores)), "a core held twice"
        for (name, card), replica_id in scheduler.lent_cards.items():
            replica = scheduler.allocations[replica_id]
            lender = scheduler.allocations.get(replica.lent_by or "")
            holds = lender is not None and lender.node == name and card in lender.gpu_ids
            # the lender holds the card and the replica none of it, or the replica holds it all
            assert replica.gpu_milli == (0 if holds else WHOLE)
        for owner, since in asked_back.items():
            assert clock - since <= GRACE + 1, f"{owner} waited {clock - since} s"

    def advance(seconds: int) -> None:
        nonlocal clock
        for _ in range(seconds):
            clock += 1
            for task_id in sorted(t for t, when in stop_at.items() if when <= clock):
                del stop_at[task_id]
                feed(
                    TaskStatusReported(
                        occurred_at=at(clock), task_id=task_id, status=TaskStatus.CANCELLED
                    )
                )
            feed(tick(clock, "trn-0"))

    for i, (kind, size, flag) in enumerate(script):
        advance(1)
        training = sorted(t for t, a in scheduler.allocations.items() if a.pool == "training")
        if kind == "wait":
            advance(size)
        elif kind == "train":
            feed(submit(f"t{i}", clock, "training", 1 + size % train_cards))
            if f"t{i}" in scheduler.allocations:
                feed(
                    TaskStatusReported(
                        occurred_at=at(clock),
                        task_id=f"t{i}",
                        allocation_id=scheduler.allocations[f"t{i}"].allocation_id,
                        status=TaskStatus.RUNNING,
                    )
                )
        elif kind == "infer":
            feed(submit(f"r{i}", clock, "inference", 1, gpu_memory_mb=1000 * (1 + size * 9)))
        elif training and kind in ("begin", "end"):
            owner = training[size % len(training)]
            which = GpuPhase.CPU if kind == "begin" else GpuPhase.GPU
            feed(phase(owner, scheduler.allocations[owner].allocation_id, clock, which))
        elif kind == "stop":
            live = sorted(scheduler.allocations)
            if live:
                task_id = live[size % len(live)]
                status = TaskStatus.SUCCEEDED if flag else TaskStatus.CANCELLED
                feed(TaskStatusReported(occurred_at=at(clock), task_id=task_id, status=status))
    for owner in sorted(scheduler.phases):  # every owner asks its cards back at the end
        feed(phase(owner, scheduler.allocations[owner].allocation_id, clock, GpuPhase.GPU))
    advance(int(GRACE) + 2)
    assert not asked_back, "an owner still waits for its cards past the grace"
    assert not scheduler.phases
