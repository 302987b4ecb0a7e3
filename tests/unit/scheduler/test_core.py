"""The scheduling core alone: pure, deterministic, explained."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from crater.contracts import (
    Affinity,
    AllocationGranted,
    AllocationReleased,
    Confidence,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    ResourcePrediction,
    ResourceRequirements,
    TaskEnded,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.quotas import Quota
from tests.support.topologies import node

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def profiled(task_id: str, when: float = 1, **needs: Any) -> TaskProfiled:
    body: dict[str, Any] = {
        "task_id": task_id,
        "task_type": "training",
        "model_config": {"name": "m"},
        "resource_requirements": {
            "gpu": {
                "count": needs.get("gpus", 1),
                "memory_mb": needs.get("gpu_mb", 40000),
                "milli": needs.get("milli", 1000),
            },
            "cpu": {"cores": needs.get("cores", 4)},
            "memory": {"capacity_mb": needs.get("mem", 16000)},
        },
    }
    keys = (
        "pool",
        "affinity",
        "priority",
        "gang_size",
        "tenant",
        "preemptible",
        "anti_affinity",
        "reservation_timeout_ms",
        "max_run_seconds",
        "expected_run_seconds",
        "restart_policy",
        "network_topology",
    )
    for key in keys:
        if key in needs:
            body[key] = needs[key]
    if "type" in needs:
        body["resource_requirements"]["gpu"]["type"] = needs["type"]
    prediction = ResourcePrediction(
        gpu_memory_per_gpu_mb=needs.get("predicted_mb", 30000),
        host_memory_mb=16000,
        confidence=needs.get("confidence", Confidence.LOW),
        method="test",
        dataloader_num_workers=3,
        dataloader_prefetch_factor=2,
    )
    return TaskProfiled(
        occurred_at=at(when), task=TaskRequest.model_validate(body), prediction=prediction
    )


def cluster(*topologies: Any) -> tuple[Scheduler, list[Event]]:
    scheduler = Scheduler()
    log: list[Event] = []
    for t in topologies:
        event = NodeTopologyReported(occurred_at=at(0), node=t)
        log.append(event)
        scheduler.handle(event)
    return scheduler, log


def test_places_on_fitting_node_with_gpus_and_cores_on_one_numa_node() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8), node("cpu-01"))
    [granted] = scheduler.handle(profiled("t1", gpus=2, cores=8))
    assert isinstance(granted, AllocationGranted)
    assert granted.node == "a100-01"
    assert granted.gpu_ids == [0, 1]
    assert granted.numa_node == 0
    assert granted.explanation.endswith("; NUMA 0"), granted.explanation
    assert set(granted.cpu_cores) <= set(range(16))  # NUMA node 0's CPUs
    assert granted.environment["CRATER_GPU_IDS"] == "0,1"
    assert granted.environment["CRATER_CHECKPOINT_PATH"] == "/mnt/nvme0/crater/checkpoints/t1"
    assert granted.reservation_token.startswith(f"v1.{granted.allocation_id}.")


def test_cpu_only_task_prefers_a_node_without_gpus() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8), node("cpu-01"))
    [granted] = scheduler.handle(profiled("cpu", gpus=0, gpu_mb=0))
    assert isinstance(granted, AllocationGranted)
    assert granted.node == "cpu-01"


def test_ties_go_to_the_smallest_node_name() -> None:
    scheduler, _ = cluster(node("b-node", gpus=4), node("a-node", gpus=4))
    [granted] = scheduler.handle(profiled("t"))
    assert isinstance(granted, AllocationGranted)
    assert granted.node == "a-node"


def test_pending_task_says_why_per_filter_and_is_placed_when_resources_free() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=2), node("v100-01", gpus=4, gpu_memory_mb=16384))
    [first] = scheduler.handle(profiled("big-1", gpus=2, gpu_mb=40000))
    assert isinstance(first, AllocationGranted)
    [pending] = scheduler.handle(profiled("big-2", when=2, gpus=2, gpu_mb=40000))
    assert isinstance(pending, TaskPending)
    assert pending.summary == (
        "0/2 nodes available: 1 node has fewer than 2 free GPUs; "
        "1 node has less than 40000 MiB of GPU memory per card"
    )
    assert {r.code: r.nodes for r in pending.reasons} == {
        "InsufficientGpus": 1,
        "InsufficientGpuMemory": 1,
    }
    done = TaskStatusReported(occurred_at=at(3), task_id="big-1", status=TaskStatus.SUCCEEDED)
    released, ended, granted = scheduler.handle(done)
    assert isinstance(released, AllocationReleased)
    assert isinstance(ended, TaskEnded)
    assert (ended.task_id, ended.status, ended.release_reason) == (
        "big-1",
        "succeeded",
        "succeeded",
    )
    assert isinstance(granted, AllocationGranted)
    assert granted.task_id == "big-2"
    assert granted.node == "a100-01"


def test_a_task_that_can_never_fit_is_rejected_naming_the_field() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8))
    [rejected] = scheduler.handle(profiled("huge", gpus=16))
    assert isinstance(rejected, TaskRejected)
    assert rejected.errors[0].field == "resource_requirements.gpu.count"
    [unknown_pool] = scheduler.handle(profiled("elsewhere", pool="nowhere"))
    assert isinstance(unknown_pool, TaskRejected)
    assert unknown_pool.errors[0].field == "pool"
    [model] = scheduler.handle(profiled("h100", type="H100"))
    assert isinstance(model, TaskRejected)
    assert model.errors[0].field == "resource_requirements.gpu.type"


def test_gpu_model_filter_matches_loosely() -> None:
    scheduler, _ = cluster(node("rtx-01", gpus=4, gpu_model="NVIDIA GeForce RTX 4090"))
    [granted] = scheduler.handle(profiled("t", type="rtx4090", gpu_mb=20000))
    assert isinstance(granted, AllocationGranted)


def test_strict_numa_refuses_a_split_placement() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=4, cores=8))  # 2 GPUs and 4 cores per NUMA
    [pending] = scheduler.handle(profiled("t", gpus=3, cores=2, affinity={"numa": "strict"}))
    assert isinstance(pending, TaskPending)
    [granted] = scheduler.handle(profiled("t2", gpus=3, cores=2))
    assert isinstance(granted, AllocationGranted)
    assert granted.numa_node is None
    # said in words, never as `NUMA None`
    assert granted.explanation.endswith("across NUMA 0 and 1"), granted.explanation
    assert "None" not in granted.explanation


def test_node_that_stops_reporting_becomes_not_ready() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8))
    health = NodeHealthReported(
        occurred_at=at(1), node_id="a100-01", condition=NodeCondition.READY, score=100
    )
    scheduler.handle(health)
    [pending] = scheduler.handle(profiled("late", when=100))
    assert isinstance(pending, TaskPending)
    assert pending.reasons[0].code == "NodeNotReady"
    back = health.model_copy(update={"occurred_at": at(101), "event_id": health.event_id})
    [granted] = scheduler.handle(back)
    assert isinstance(granted, AllocationGranted)


def test_duplicate_profiled_event_decides_nothing() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8))
    event = profiled("t")
    assert len(scheduler.handle(event)) == 1
    assert scheduler.handle(event) == []


def test_replaying_the_same_events_gives_identical_decisions() -> None:
    _, log = cluster(
        node("a100-01", gpus=8), node("a100-02", gpus=8), node("v100-01", gpus=2, nvlink=False)
    )
    log += [profiled(f"t{i}", when=i, gpus=1 + i % 4, cores=2 + i % 8) for i in range(30)]
    log += [
        TaskStatusReported(occurred_at=at(40 + i), task_id=f"t{i}", status=TaskStatus.SUCCEEDED)
        for i in range(0, 30, 3)
    ]

    def replay() -> list[str]:
        scheduler = Scheduler()
        return [d.model_dump_json() for e in log for d in scheduler.handle(e)]

    first, second = replay(), replay()
    assert first == second
    assert len(first) > 30


def test_a_reservation_not_confirmed_in_time_is_released() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=1))
    [granted] = scheduler.handle(profiled("silent", gpus=1, when=1))
    [pending] = scheduler.handle(profiled("next", gpus=1, when=2))
    assert isinstance(granted, AllocationGranted)
    assert granted.reservation_expires_at == at(31)
    assert isinstance(pending, TaskPending)
    # the grant left the outbox at 3: its reservation runs to 33
    assert scheduler.handle(ReservationArmed.of(granted, at(3))) == []
    heartbeat = NodeHealthReported(
        occurred_at=at(32), node_id="a100-01", condition=NodeCondition.READY, score=100
    )
    assert scheduler.handle(heartbeat) == []
    # a report of another task dated after the expiry: the reports of that time are in
    other = TaskStatusReported(occurred_at=at(34), task_id="elsewhere", status=TaskStatus.RUNNING)
    released, ended, placed = scheduler.handle(other)
    assert isinstance(released, AllocationReleased)
    assert (released.task_id, released.reason) == ("silent", "expired")
    assert isinstance(ended, TaskEnded)
    assert (ended.status, ended.release_reason) == ("failed", "expired")
    assert isinstance(placed, AllocationGranted)
    assert placed.task_id == "next"


def test_a_confirmed_reservation_is_kept() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=1))
    scheduler.handle(profiled("busy", gpus=1, when=1))
    running = TaskStatusReported(occurred_at=at(5), task_id="busy", status=TaskStatus.RUNNING)
    assert scheduler.handle(running) == []
    later = NodeHealthReported(
        occurred_at=at(20), node_id="a100-01", condition=NodeCondition.READY, score=100
    )
    assert scheduler.handle(later) == []
    much_later = NodeHealthReported(
        occurred_at=at(45), node_id="a100-01", condition=NodeCondition.READY, score=100
    )
    assert scheduler.handle(much_later) == []


def test_dry_run_lists_every_fit_best_first_and_every_misfit_with_its_reason() -> None:
    scheduler, _ = cluster(
        node("a100-01", gpus=8),
        node("a100-02", gpus=2),
        node("v100-01", gpus=4, gpu_memory_mb=16384),
        node("cpu-01"),
    )
    needs = ResourceRequirements.model_validate(
        {"gpu": {"count": 2, "memory_mb": 40000}, "cpu": {"cores": 4}}
    )
    answer = scheduler.dry_run(Demand.of_resources(needs, "default", Affinity()))
    assert [f.node_id for f in answer.fits] == ["a100-02", "a100-01"]  # the fuller node first
    assert answer.fits[0].gpu_ids == [0, 1]
    assert {(m.node_id, m.code) for m in answer.misfits} == {
        ("cpu-01", "InsufficientGpus"),
        ("v100-01", "InsufficientGpuMemory"),
    }
    assert answer.summary.startswith("2/4 nodes fit")
    assert scheduler.allocations == {}  # nothing reserved


def test_tenant_quota_holds_tasks_back_and_refuses_what_could_never_fit() -> None:
    scheduler = Scheduler(config=SchedulerConfig(quotas={"search": Quota(gpus=3)}))
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("a100-01", gpus=8)))
    [first] = scheduler.handle(profiled("s1", gpus=2, tenant="search"))
    assert isinstance(first, AllocationGranted)
    [waits] = scheduler.handle(profiled("s2", gpus=2, when=2, tenant="search"))
    assert isinstance(waits, TaskPending)
    assert waits.reasons[0].code == "QuotaExceeded"
    assert "tenant 'search' is over its quota: gpus would reach 4, over its limit of 3" in (
        waits.summary
    )
    [other] = scheduler.handle(profiled("r1", gpus=2, when=3, tenant="research"))
    assert isinstance(other, AllocationGranted)  # another tenant is not held back
    [never] = scheduler.handle(profiled("s3", gpus=4, when=4, tenant="search"))
    assert isinstance(never, TaskRejected)
    assert never.errors[0].field == "resource_requirements.gpu.count"
    done = TaskStatusReported(occurred_at=at(5), task_id="s1", status=TaskStatus.SUCCEEDED)
    released, ended, granted = scheduler.handle(done)
    assert isinstance(released, AllocationReleased)
    assert isinstance(ended, TaskEnded)
    assert isinstance(granted, AllocationGranted)
    assert granted.task_id == "s2"


def running(task_id: str, when: float) -> TaskStatusReported:
    return TaskStatusReported(occurred_at=at(when), task_id=task_id, status=TaskStatus.RUNNING)


def test_a_high_priority_task_preempts_the_fewest_least_progressed_preemptible_tasks() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=4), node("a100-02", gpus=4))
    low = {"priority": "low", "preemptible": True}
    for i, (gpus, when) in enumerate([(2, 1), (2, 2), (4, 3)]):
        [granted] = scheduler.handle(profiled(f"low-{i}", gpus=gpus, when=when, **low))
        assert isinstance(granted, AllocationGranted)
        scheduler.handle(running(f"low-{i}", when + 0.5))
    [kept] = scheduler.handle(profiled("mine", gpus=2, when=4, priority="low"))
    assert isinstance(kept, TaskPending)  # the same priority never preempts

    decisions = scheduler.handle(profiled("urgent", gpus=4, when=5, priority="high"))
    pending, preempted = decisions
    assert isinstance(pending, TaskPending)
    # one victim (low-2, all of a100-02) rather than two on a100-01
    assert isinstance(preempted, TaskPreempted)
    assert (preempted.task_id, preempted.preempted_by) == ("low-2", "urgent")
    assert preempted.grace_period_seconds == 30

    # the victim stops within its grace period: its GPUs go to the urgent task
    stopped = TaskStatusReported(occurred_at=at(10), task_id="low-2", status=TaskStatus.CANCELLED)
    released, ended, granted = scheduler.handle(stopped)[:3]
    assert isinstance(released, AllocationReleased)
    assert released.reason == "preempted"
    assert isinstance(ended, TaskEnded)
    assert (ended.task_id, ended.status, ended.release_reason) == ("low-2", "failed", "preempted")
    assert isinstance(granted, AllocationGranted)
    assert (granted.task_id, granted.node) == ("urgent", "a100-02")


def test_a_victim_that_ignores_preemption_is_released_after_its_grace_period() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=2))
    scheduler.handle(profiled("low", gpus=2, when=1, priority="low", preemptible=True))
    scheduler.handle(running("low", 2))
    scheduler.handle(profiled("urgent", gpus=2, when=3, priority="high"))
    late = NodeHealthReported(
        occurred_at=at(40), node_id="a100-01", condition=NodeCondition.READY, score=100
    )
    released, ended, granted = scheduler.handle(late)
    assert isinstance(released, AllocationReleased)
    assert (released.task_id, released.reason) == ("low", "preempted")
    assert isinstance(ended, TaskEnded)
    assert isinstance(granted, AllocationGranted)
    assert granted.task_id == "urgent"


def test_replicas_of_one_group_spread_across_nodes() -> None:
    scheduler, _ = cluster(node("rtx-01", gpus=4), node("rtx-02", gpus=4))
    group = {"anti_affinity": {"group": "chat"}}
    placed = [scheduler.handle(profiled(f"r{i}", gpus=1, when=i, **group))[0] for i in range(3)]
    assert [type(p).__name__ for p in placed] == ["AllocationGranted"] * 2 + ["TaskPending"]
    assert {p.node for p in placed[:2] if isinstance(p, AllocationGranted)} == {
        "rtx-01",
        "rtx-02",
    }
    assert isinstance(placed[2], TaskPending)
    assert "2 nodes already run a replica of chat" in placed[2].summary
    [other] = scheduler.handle(profiled("solo", gpus=1, when=5))
    assert isinstance(other, AllocationGranted)  # no group: bin-packs as usual


def test_gpu_sharing_packs_shares_onto_the_fullest_card_and_keeps_whole_cards_whole() -> None:
    scheduler, _ = cluster(node("t4-01", gpus=2, gpu_memory_mb=16384))
    shares = [
        scheduler.handle(profiled(f"s{i}", gpus=1, gpu_mb=4000, when=i, milli=milli))[0]
        for i, milli in enumerate([500, 300, 200])
    ]
    assert all(isinstance(s, AllocationGranted) for s in shares)
    assert [s.gpu_ids for s in shares if isinstance(s, AllocationGranted)] == [[0], [0], [0]]
    assert [s.gpu_milli for s in shares if isinstance(s, AllocationGranted)] == [500, 300, 200]
    [whole] = scheduler.handle(profiled("whole", gpus=1, gpu_mb=4000, when=5))
    assert isinstance(whole, AllocationGranted)
    assert whole.gpu_ids == [1]
    [waits] = scheduler.handle(profiled("more", gpus=1, gpu_mb=4000, when=6, milli=100))
    assert isinstance(waits, TaskPending)
    done = TaskStatusReported(occurred_at=at(7), task_id="s1", status=TaskStatus.SUCCEEDED)
    _, _, placed = scheduler.handle(done)
    assert isinstance(placed, AllocationGranted)
    assert (placed.task_id, placed.gpu_ids, placed.gpu_milli) == ("more", [0], 100)


def test_a_trusted_prediction_above_the_request_is_placed_on_with_a_margin() -> None:
    scheduler, _ = cluster(node("a100-40g", gpus=4, gpu_memory_mb=40960), node("h100", gpus=4))
    trusted = {"predicted_mb": 60000, "confidence": Confidence.MEDIUM}
    [granted] = scheduler.handle(profiled("big", gpus=1, gpu_mb=40000, **trusted))
    assert isinstance(granted, AllocationGranted)
    assert granted.node == "h100"  # 60000 MiB + 10% does not fit a 40 GiB card
    assert granted.gpu_memory_mb == 66000
    assert "predicted peak 60000 MiB + 10%" in granted.explanation
    guess = {"predicted_mb": 60000, "confidence": Confidence.LOW}
    [placed] = scheduler.handle(profiled("guess", gpus=1, gpu_mb=40000, when=2, **guess))
    assert isinstance(placed, AllocationGranted)
    assert placed.node == "a100-40g"  # a low-confidence guess does not override the request
