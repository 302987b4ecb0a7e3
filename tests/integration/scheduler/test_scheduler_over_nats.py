"""The scheduler as it runs: real nats-server, real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    AntiAffinity,
    Confidence,
    MessageRejected,
    NodesAnswer,
    NodesQuery,
    NodeTopologyReported,
    PlacementAnswer,
    PlacementQuery,
    Priority,
    QuerySubjects,
    ReplicaReleaseRequested,
    ReplicasRequested,
    ResourcePrediction,
    RestartOn,
    RestartPolicy,
    Subjects,
    TaskEnded,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TasksAnswer,
    TasksQuery,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.support.events import EventTap, publish_raw
from tests.support.scheduler import leading
from tests.support.topologies import node

PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=20000,
    host_memory_mb=8000,
    confidence=Confidence.MEDIUM,
    method="test",
    dataloader_num_workers=2,
    dataloader_prefetch_factor=2,
)


def profiled(task_id: str, gpus: int, gpu_mb: int = 40000) -> TaskProfiled:
    request = TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training",
            "model_config": {"name": "m"},
            "resource_requirements": {
                "gpu": {"count": gpus, "memory_mb": gpu_mb},
                "cpu": {"cores": 4},
                "memory": {"capacity_mb": 8000},
            },
        }
    )
    return TaskProfiled(task=request, prediction=PREDICTION)


async def query(nats_url: str, subject: str, body: bytes) -> bytes:
    connection = await nats.connect(nats_url)
    try:
        return (await connection.request(subject, body, timeout=5)).data
    finally:
        await connection.close()


async def test_places_persists_releases_and_survives_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        for topology in (node("a100-01", gpus=4), node("v100-01", gpus=2, gpu_memory_mb=16384)):
            await publish(service.broker, NodeTopologyReported(node=topology))
        await publish(service.broker, profiled("train-1", gpus=4))
        [granted] = await tap.wait_for(AllocationGranted)
        assert (granted.task_id, granted.node, granted.gpu_ids) == (
            "train-1",
            "a100-01",
            [0, 1, 2, 3],
        )

        await publish(service.broker, profiled("train-2", gpus=2))
        [pending] = await tap.wait_for(TaskPending)
        assert "0/2 nodes available" in pending.summary

        await publish(service.broker, profiled("never", gpus=64))
        [rejected] = await tap.wait_for(TaskRejected)
        assert rejected.errors[0].field == "resource_requirements.gpu.count"

        answer = NodesAnswer.model_validate_json(
            await query(
                fresh_nats.url, QuerySubjects.NODES, NodesQuery().model_dump_json().encode()
            )
        )
        assert [(n.node_id, n.gpus_free) for n in answer.nodes] == [("a100-01", 0), ("v100-01", 2)]

        dry_run = PlacementQuery.model_validate(
            {"resource_requirements": {"gpu": {"count": 1, "memory_mb": 8000}}}
        )
        placement = PlacementAnswer.model_validate_json(
            await query(fresh_nats.url, QuerySubjects.PLACEMENT, dry_run.model_dump_json().encode())
        )
        assert [f.node_id for f in placement.fits] == ["v100-01"]
        assert [(m.node_id, m.code) for m in placement.misfits] == [("a100-01", "InsufficientGpus")]

    # a new process: state comes back from the database, the queue goes on
    service, app = build(settings)
    async with TestApp(app):
        await leading(service)
        assert "train-2" in service.state.scheduler.pending
        done = TaskStatusReported(task_id="train-1", status=TaskStatus.SUCCEEDED)
        await publish(service.broker, done)
        await tap.wait_for(AllocationReleased)
        [_, second] = await tap.wait_for(AllocationGranted, count=2)
        assert (second.task_id, second.node) == ("train-2", "a100-01")

        tasks = TasksAnswer.model_validate_json(
            await query(
                fresh_nats.url, QuerySubjects.TASKS, TasksQuery().model_dump_json().encode()
            )
        )
        statuses = {t.task_id: t.status for t in tasks.tasks}
        assert statuses == {
            "train-1": TaskStatus.SUCCEEDED,
            "train-2": TaskStatus.SCHEDULED,
            "never": TaskStatus.REJECTED,
        }


async def test_redelivered_and_malformed_input_changes_nothing(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=8)))
        event = profiled("once", gpus=1)
        # the same event under another Nats-Msg-Id: past JetStream's de-duplication
        await publish_raw(
            fresh_nats.url, "crater.v1.task.profiled", event.model_dump_json().encode()
        )
        await publish_raw(
            fresh_nats.url, "crater.v1.task.profiled", event.model_dump_json().encode()
        )
        await publish_raw(fresh_nats.url, "crater.v1.task.profiled", b'{"task": 42}')
        await publish_raw(fresh_nats.url, "crater.v1.node.topology.x", b"\xff\xfe")
        await publish(service.broker, profiled("after", gpus=1))
        await tap.wait_for(MessageRejected, count=2)
        granted = await tap.wait_for(AllocationGranted, count=2)
        assert sorted(g.task_id for g in granted) == ["after", "once"]
        assert len(tap.of(AllocationGranted)) == 2
        # a second placement would carry the same event id (derived from its input's)
        assert not [m.subject for m in tap.repeats if m.subject == "crater.v1.allocation.granted"]


async def test_quota_usage_is_restored_after_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("tenants:\n  default: {gpus: 4}\n")
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, quotas_file=quotas
    )
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=8)))
        await publish(service.broker, profiled("first", gpus=4))
        [grant] = await tap.wait_for(AllocationGranted)
        assert grant.gpu_model  # the node's cards, for usage by model
        gpus = {"tenant": "default", "resource": "gpus"}
        for _ in range(100):  # the gauges follow the commit
            if service.registry.get_sample_value("crater_tenant_quota_used", gpus) == 4:
                break
            await asyncio.sleep(0.05)
        assert service.registry.get_sample_value("crater_tenant_quota_used", gpus) == 4
        assert service.registry.get_sample_value("crater_tenant_quota", gpus) == 4
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, profiled("second", gpus=1))
        [pending] = await tap.wait_for(TaskPending)
        assert pending.reasons[0].code == "QuotaExceeded"


async def test_preemption_over_nats_with_the_victim_recorded_as_preempted(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=2)))
        low = profiled("low", gpus=2)
        low = low.model_copy(
            update={
                "task": low.task.model_copy(update={"priority": Priority.LOW, "preemptible": True})
            }
        )
        await publish(service.broker, low)
        await tap.wait_for(AllocationGranted)
        await publish(service.broker, TaskStatusReported(task_id="low", status=TaskStatus.RUNNING))
        urgent = profiled("urgent", gpus=2)
        urgent = urgent.model_copy(
            update={"task": urgent.task.model_copy(update={"priority": Priority.HIGH})}
        )
        await publish(service.broker, urgent)
        [preempted] = await tap.wait_for(TaskPreempted)
        assert (preempted.task_id, preempted.preempted_by) == ("low", "urgent")
        await publish(
            service.broker, TaskStatusReported(task_id="low", status=TaskStatus.CANCELLED)
        )
        [_, granted] = await tap.wait_for(AllocationGranted, count=2)
        assert granted.task_id == "urgent"
        answer = TasksAnswer.model_validate_json(
            await query(
                fresh_nats.url, QuerySubjects.TASKS, TasksQuery().model_dump_json().encode()
            )
        )
        # no restart policy: the victim's preemption was its end
        assert {t.task_id: t.status for t in answer.tasks} == {
            "low": TaskStatus.FAILED,
            "urgent": TaskStatus.SCHEDULED,
        }
        [ended] = tap.of(TaskEnded, lambda e: e.task_id == "low")
        assert (ended.status, ended.release_reason) == (TaskStatus.FAILED, "preempted")


async def test_replicas_the_autoscaler_asks_for_are_placed_and_released(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        for name in ("rtx-01", "rtx-02", "rtx-03"):
            await publish(service.broker, NodeTopologyReported(node=node(name, gpus=4)))
        first = profiled("chat-0", gpus=1, gpu_mb=20000)
        first = first.model_copy(
            update={
                "task": first.task.model_copy(update={"anti_affinity": AntiAffinity(group="chat")})
            }
        )
        await publish(service.broker, first)
        await tap.wait_for(AllocationGranted)
        ask = ReplicasRequested(
            service="chat", task_ids=["chat-1", "chat-2"], template_task_id="chat-0", reason="p95"
        )
        await publish(service.broker, ask)
        await publish(service.broker, ask)  # a redelivery places nothing twice
        granted = await tap.wait_for(AllocationGranted, count=3)
        assert sorted(g.task_id for g in granted) == ["chat-0", "chat-1", "chat-2"]
        assert len({g.node for g in granted}) == 3  # the template's anti-affinity holds
        orphan = ReplicasRequested(
            service="embed", task_ids=["embed-9"], template_task_id="gone", reason="p95"
        )
        await publish(service.broker, orphan)
        [rejected] = await tap.wait_for(TaskRejected)
        assert rejected.errors[0].field == "template_task_id"
        assert "'embed'" in rejected.errors[0].reason
        release = ReplicaReleaseRequested(
            service="chat",
            replica_id="chat-2",
            task_id="chat-2",
            drained=True,
            decision_id=ask.event_id,
            reason="scale in",
        )
        await publish(service.broker, release)
        [released] = await tap.wait_for(AllocationReleased)
        assert (released.task_id, released.reason) == ("chat-2", "scaled-in")
        await asyncio.sleep(0.5)
        assert len(tap.of(AllocationGranted)) == 3


async def test_each_decision_carries_the_trace_of_the_task_it_decides(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    """The scheduler takes a pull batch in one span; what it publishes for each task goes on
    in that task's own trace (body and traceparent header), so the trace stays whole."""
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    traces = {
        "traced-a": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "traced-b": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=8)))
        for task_id, traceparent in traces.items():
            event = profiled(task_id, gpus=1)
            await publish_raw(
                fresh_nats.url,
                "crater.v1.task.profiled",
                event.model_dump_json().encode(),
                traceparent=traceparent,
            )
        granted = await tap.wait_for(AllocationGranted, count=2)
        by_task = {g.task_id: g for g in granted}
        for task_id, traceparent in traces.items():
            trace = by_task[task_id].trace
            assert trace is not None
            assert trace.traceparent.split("-")[1] == traceparent.split("-")[1]
            [message] = [
                m
                for m in tap.raw
                if m.subject == Subjects.ALLOCATION_GRANTED.subject
                and f'"task_id":"{task_id}"' in m.data.decode()
            ]
            assert (message.headers or {})["traceparent"].split("-")[1] == traceparent.split("-")[1]


async def test_a_task_under_its_minimum_run_time_is_not_preempted_across_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    """No preemption thrashing over NATS: the waiting task says which tasks it may not take
    yet, the refusal is counted, and a restarted scheduler still counts the run time from the
    stored grant."""
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, preemption_min_run_seconds=600
    )

    def urgent(task_id: str) -> TaskProfiled:
        event = profiled(task_id, gpus=2)
        return event.model_copy(
            update={"task": event.task.model_copy(update={"priority": Priority.HIGH})}
        )

    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=2)))
        low = profiled("low", gpus=2)
        low = low.model_copy(
            update={
                "task": low.task.model_copy(update={"priority": Priority.LOW, "preemptible": True})
            }
        )
        await publish(service.broker, low)
        await tap.wait_for(AllocationGranted)
        await publish(service.broker, urgent("urgent"))
        # its own: "low" may have waited for the node first (streams are consumed apart)
        [pending] = await tap.wait_for(TaskPending, lambda p: p.task_id == "urgent")
        assert "1 task could make room but has run under pool default's minimum of 600 s" in (
            pending.summary
        )
        assert [r.code for r in pending.reasons if r.filter == "Preemption"] == ["MinRunTime"]
        held = {"rule": "min_run"}
        for _ in range(100):  # the counter follows the commit
            if service.registry.get_sample_value("crater_scheduler_preemptions_held_total", held):
                break
            await asyncio.sleep(0.05)
        assert (
            service.registry.get_sample_value("crater_scheduler_preemptions_held_total", held) == 1
        )
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, urgent("urgent-2"))
        [again] = await tap.wait_for(TaskPending, lambda p: p.task_id == "urgent-2")
        assert "has run under pool default's minimum of 600 s" in again.summary
    assert not tap.of(TaskPreempted)


async def test_a_recent_victim_is_left_alone_across_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    """The memory of recent victims over NATS: a task preempted, retried and running again
    is not preempted again within the cooldown, also by a restarted scheduler (rebuilt from
    the stored deadline to yield)."""
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, preemption_victim_cooldown_seconds=900
    )

    def with_(task_id: str, **fields: object) -> TaskProfiled:
        event = profiled(task_id, gpus=2)
        return event.model_copy(update={"task": event.task.model_copy(update=fields)})

    retried = RestartPolicy(when=[RestartOn.PREEMPTION], backoff_seconds=0)
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=2)))
        low = with_("low", priority=Priority.LOW, preemptible=True, restart_policy=retried)
        await publish(service.broker, low)
        await tap.wait_for(AllocationGranted)
        await publish(service.broker, with_("urgent", priority=Priority.HIGH))
        [preempted] = await tap.wait_for(TaskPreempted)
        assert preempted.task_id == "low"
        await publish(
            service.broker, TaskStatusReported(task_id="low", status=TaskStatus.CANCELLED)
        )
        await tap.wait_for(AllocationGranted, count=2)  # urgent; low waits again
        await publish(
            service.broker, TaskStatusReported(task_id="urgent", status=TaskStatus.SUCCEEDED)
        )
        granted = await tap.wait_for(AllocationGranted, count=3)
        assert (granted[-1].task_id, granted[-1].attempt) == ("low", 2)
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, with_("urgent-2", priority=Priority.HIGH))
        for _ in range(100):
            waiting = tap.of(TaskPending, lambda e: e.task_id == "urgent-2")
            if waiting:
                break
            await asyncio.sleep(0.05)
        [pending] = waiting
        assert "1 task could make room but was preempted within pool default's victim " in (
            pending.summary
        )
    assert len(tap.of(TaskPreempted)) == 1


async def test_heartbeats_are_pulled_in_batches_of_the_setting(
    fresh_nats: NatsServer, database_url: str
) -> None:
    """`heartbeat_batch` sizes the node-health consumer's pulls (two at once may be unacked);
    the other consumers keep theirs."""
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, heartbeat_batch=700
    )
    service, app = build(settings)
    async with TestApp(app):
        await leading(service)
        js = service.broker.connection.jetstream()
        health = await js.consumer_info(Subjects.NODE_HEALTH.stream.name, "scheduler-node-health")
        topology = await js.consumer_info(
            Subjects.NODE_TOPOLOGY.stream.name, "scheduler-node-topology"
        )
    assert health.config.filter_subject == Subjects.NODE_HEALTH.wildcard
    assert (health.config.max_ack_pending, topology.config.max_ack_pending) == (1400, 1000)
