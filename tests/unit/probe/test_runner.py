from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    LatencySamplesReported,
    ReleaseReason,
    TaskPreempted,
    TaskProfiled,
    TaskStatusReported,
    TaskType,
    derived_event_id,
    utc_now,
)
from crater.probe.reports import GrantOutcome
from crater.probe.sim.fleet import open_fleet
from crater.probe.sim.runner import TaskRunner
from crater.probe.sim.simulation import FleetSimulator
from tests.support.profiles import small_training


def grant(allocation: str, node: str = "t4-01", expires_in: float = 30.0) -> AllocationGranted:
    return AllocationGranted(
        allocation_id=allocation,
        task_id=f"task-{allocation}",
        node=node,
        pool="inference",
        tenant="default",
        gpu_ids=[0],
        gpu_memory_mb=12000,
        cpu_cores=[0, 1, 2, 3],
        numa_node=0,
        memory_mb=16384,
        checkpoint_path=None,
        reservation_token="token",
        reservation_expires_at=utc_now() + timedelta(seconds=expires_in),
        score=1.0,
        explanation="test",
        environment={"CRATER_GPU_IDS": "0"},
    )


class Recorder:
    def __init__(self, fail_first: int = 0) -> None:
        self.events: list[Event] = []
        self.fail_first = fail_first

    async def __call__(self, event: Event) -> None:
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("nats down")
        self.events.append(event)

    def statuses(self) -> list[tuple[str, str]]:
        return [
            (e.task_id, e.status.value) for e in self.events if isinstance(e, TaskStatusReported)
        ]


def runner(recorder: Recorder, seconds: float = 0.05, **kwargs: object) -> TaskRunner:
    fleet = open_fleet(None, 1)
    return TaskRunner(
        FleetSimulator(fleet.nodes, fleet.seed),
        recorder,
        seed=1,
        seconds_min=seconds,
        seconds_max=seconds,
        start_max_seconds=0.01,
        **kwargs,  # type: ignore[arg-type]
    )


async def wait_until(condition: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_grant_runs_then_succeeds_with_ids_derived_from_the_grant() -> None:
    recorder = Recorder()
    tasks = runner(recorder)
    granted = grant("a-1")
    assert tasks.granted(granted) is GrantOutcome.STARTED
    assert tasks.simulator.busy_gpus("t4-01") == {0}
    assert tasks.granted(granted) is GrantOutcome.DUPLICATE
    await wait_until(lambda: len(recorder.events) == 2)
    running, succeeded = recorder.events
    assert isinstance(running, TaskStatusReported)
    assert isinstance(succeeded, TaskStatusReported)
    assert running.event_id == derived_event_id(granted.event_id, "running")
    assert succeeded.event_id == derived_event_id(granted.event_id, "succeeded")
    assert recorder.statuses() == [("task-a-1", "running"), ("task-a-1", "succeeded")]
    assert running.allocation_id == "a-1"
    await wait_until(lambda: tasks.running == 0)
    assert tasks.simulator.busy_gpus("t4-01") == set()
    assert tasks.granted(granted) is GrantOutcome.DUPLICATE  # a late redelivery


async def test_grants_for_other_nodes_and_expired_reservations_are_left_alone() -> None:
    recorder = Recorder()
    tasks = runner(recorder)
    assert tasks.granted(grant("a-1", node="elsewhere-01")) is GrantOutcome.NOT_OURS
    assert tasks.granted(grant("a-2", expires_in=-3600)) is GrantOutcome.STALE
    await asyncio.sleep(0.1)
    assert recorder.events == []
    assert tasks.running == 0


async def test_preempted_and_released_tasks_stop_and_free_their_gpus() -> None:
    recorder = Recorder()
    tasks = runner(recorder, seconds=30)
    first, second = grant("a-1"), grant("a-2", node="t4-02")
    tasks.granted(first)
    tasks.granted(second)
    await wait_until(lambda: len(recorder.events) == 2)  # both running
    preempted = TaskPreempted(
        task_id=first.task_id,
        allocation_id="a-1",
        node="t4-01",
        preempted_by="urgent",
        grace_period_seconds=0,
    )
    assert tasks.preempted(preempted)
    assert tasks.simulator.busy_gpus("t4-01") == set()
    released = AllocationReleased(
        allocation_id="a-2",
        task_id=second.task_id,
        node="t4-02",
        gpu_ids=[0],
        cpu_cores=[0, 1, 2, 3],
        reason=ReleaseReason.EXPIRED,
    )
    assert tasks.released(released)
    assert not tasks.released(released)
    assert tasks.running == 0
    assert tasks.granted(first) is GrantOutcome.DUPLICATE
    assert {s for _, s in recorder.statuses()} == {"running"}


async def test_a_failed_publish_is_retried_with_the_same_event_id() -> None:
    recorder = Recorder(fail_first=1)
    tasks = runner(recorder, seconds=0.01)
    tasks.granted(grant("a-1"))
    await wait_until(lambda: len(recorder.events) == 2)
    assert recorder.statuses() == [("task-a-1", "running"), ("task-a-1", "succeeded")]


async def test_seeded_failures_report_failed() -> None:
    recorder = Recorder()
    tasks = runner(recorder, seconds=0.01, failure_rate=1.0)
    tasks.granted(grant("a-1"))
    await wait_until(lambda: len(recorder.events) == 2)
    assert recorder.statuses()[-1] == ("task-a-1", "failed")


async def test_close_cancels_every_run() -> None:
    recorder = Recorder()
    tasks = runner(recorder, seconds=30)
    for i in range(5):
        tasks.granted(grant(f"a-{i}", node=f"t4-0{i + 1}"))
    await tasks.close()
    assert tasks.running == 0


@pytest.mark.parametrize(
    ("expired_seconds_ago", "outcome"),
    [
        (-30, GrantOutcome.STARTED),  # live
        (60, GrantOutcome.STARTED),  # a scheduler catching up on a backlog
        (600, GrantOutcome.STALE),  # history replayed to a new consumer
    ],
)
async def test_only_long_expired_grants_are_stale(
    expired_seconds_ago: float, outcome: GrantOutcome
) -> None:
    now = utc_now()
    fleet = open_fleet(None, 1)
    tasks = TaskRunner(
        FleetSimulator(fleet.nodes, 1),
        Recorder(),
        seed=1,
        seconds_min=1,
        seconds_max=1,
        clock=lambda: now,
    )
    old = grant("a-1").model_copy(
        update={"reservation_expires_at": now - timedelta(seconds=expired_seconds_ago)}
    )
    assert tasks.granted(old) is outcome
    await tasks.close()


async def test_a_replica_serving_traffic_serves_until_released() -> None:
    """A replica that reports its latencies does not finish by itself (the shared-day demo's
    fleet vanished when the simulator ended its replicas); an inference task that serves no
    traffic here, and a training task, still end after their duration."""
    recorder = Recorder()
    tasks = runner(recorder, seconds=0.1)
    server, batch, job = grant("a-1"), grant("a-2", node="t4-02"), grant("a-3", node="t4-03")
    tasks.profiled(small_task(server.task_id, "inference"))
    tasks.profiled(small_task(batch.task_id, "inference"))
    tasks.profiled(small_task(job.task_id, "training"))
    for each in (server, batch, job):
        tasks.granted(each)
    assert tasks.served(traffic(server.task_id, None)) is False  # serving; no pressure said
    await wait_until(lambda: ("task-a-3", "succeeded") in recorder.statuses())
    await wait_until(lambda: ("task-a-2", "succeeded") in recorder.statuses())
    await asyncio.sleep(0.3)  # three times its duration
    assert ("task-a-1", "running") in recorder.statuses()
    assert not {t for t, s in recorder.statuses() if s != "running"} & {"task-a-1"}
    assert tasks.running == 1
    released = AllocationReleased(
        allocation_id="a-1",
        task_id=server.task_id,
        node=server.node,
        gpu_ids=[0],
        cpu_cores=[0, 1, 2, 3],
        reason=ReleaseReason.CANCELLED,
    )
    assert tasks.released(released)
    await wait_until(lambda: tasks.running == 0)
    assert tasks.simulator.busy_gpus("t4-01") == set()
    assert tasks.served(traffic(server.task_id, 0.5)) is False  # gone: nothing to set
    await tasks.close()


def traffic(task_id: str, pressure: float | None) -> LatencySamplesReported:
    return LatencySamplesReported(
        service="chat", replica_id=task_id, latencies_ms=[50.0], gpu_memory_pressure=pressure
    )


def small_task(task_id: str, task_type: str) -> TaskProfiled:
    profiled = small_training(task_id)
    task = profiled.task.model_copy(update={"task_type": TaskType(task_type)})
    return profiled.model_copy(update={"task": task})


async def test_a_replica_s_cards_hold_the_memory_it_reports() -> None:
    """What the autoscaler reads from node.metrics follows the replica's own pressure."""
    tasks = runner(Recorder(), seconds=30)
    server, job = grant("a-1"), grant("a-2", node="t4-02")
    tasks.profiled(small_task(server.task_id, "inference"))
    tasks.profiled(small_task(job.task_id, "training"))
    tasks.granted(server)
    tasks.granted(job)
    card_mb = tasks.simulator.card_memory_mb("a-1")
    assert card_mb == tasks.simulator.topology("t4-01").gpus[0].memory_mb

    def sample(task_id: str, pressure: float | None) -> LatencySamplesReported:
        return LatencySamplesReported(
            service="chat", replica_id=task_id, latencies_ms=[50.0], gpu_memory_pressure=pressure
        )

    for pressure in (0.9, 0.2):
        assert tasks.served(sample(server.task_id, pressure))
        used = tasks.simulator.step_node("t4-01").gpus[0].memory_used_mb
        assert 0.85 * pressure * card_mb - 1 <= used <= pressure * card_mb, (pressure, used)
    assert not tasks.served(sample("task-unknown", 0.9))  # not placed here
    assert not tasks.served(sample(server.task_id, None))  # no pressure said: unchanged
    await tasks.close()
