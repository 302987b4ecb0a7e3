"""Time limits and start estimates over a real nats-server and database (SQLite and
PostgreSQL): the tasks query answers a waiting task's place and estimated start; a task that
reaches its limit is told to stop by a restarted scheduler (the limit counted from the stored
grant), and, restarted again while it yields, released as `time-limit`."""

from __future__ import annotations

from datetime import timedelta

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    QuerySubjects,
    ReleaseReason,
    TaskEnded,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TasksAnswer,
    TasksQuery,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_scheduler_over_nats import profiled, query
from tests.support.events import EventTap
from tests.support.topologies import node


def stating(task_id: str, gpus: int, **run: int) -> TaskProfiled:
    event = profiled(task_id, gpus=gpus)
    return event.model_copy(update={"task": event.task.model_copy(update=run)})


async def test_a_task_at_its_limit_is_stopped_across_restarts_and_the_queue_is_estimated(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(
        nats_url=fresh_nats.url,
        database_url=database_url,
        grace_period_seconds=5,
        estimate_interval_seconds=0,
    )
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=4)))
        await publish(service.broker, stating("job", 4, max_run_seconds=3, expected_run_seconds=2))
        [granted] = await tap.wait_for(AllocationGranted)
        await publish(service.broker, stating("next", 4, expected_run_seconds=60))
        await publish(service.broker, stating("after", 2))
        for waiting in ("next", "after"):  # both wait (the node is full)
            await tap.wait_for(TaskPending, lambda e, t=waiting: e.task_id == t)
        answer = TasksAnswer.model_validate_json(
            await query(
                fresh_nats.url, QuerySubjects.TASKS, TasksQuery().model_dump_json().encode()
            )
        )
        by_id = {t.task_id: t for t in answer.tasks}
        # job is expected to end 2 s after its grant: next starts then, after 60 s more
        assert by_id["next"].queue_position == 1
        assert by_id["next"].estimated_start_at == granted.occurred_at + timedelta(seconds=2)
        assert by_id["after"].queue_position == 2
        assert by_id["after"].estimated_start_at == granted.occurred_at + timedelta(seconds=62)
        assert by_id["next"].estimate is not None
        assert "position 1 in pool default" in by_id["next"].estimate
        assert by_id["job"].queue_position is None  # placed: no place in the queue

    limit_at = granted.occurred_at + timedelta(seconds=3)
    service, app = build(settings)
    async with TestApp(app):  # restarted: the limit from the stored grant time
        heartbeat = NodeHealthReported(
            node_id="a100-01", condition=NodeCondition.READY, score=100, occurred_at=limit_at
        )
        await publish(service.broker, heartbeat)
        [told] = await tap.wait_for(TaskPreempted)
        assert (told.task_id, told.time_limit_seconds, told.preempted_by) == ("job", 3, None)
        assert told.must_stop_by == limit_at + timedelta(seconds=5)

    service, app = build(settings)
    async with TestApp(app):  # restarted while it yields: still a time limit, not a victim
        assert "job" not in service.state.scheduler.victims
        stop = TaskStatusReported(
            task_id="job",
            status=TaskStatus.CANCELLED,
            message="checkpointed and stopped",
            occurred_at=limit_at + timedelta(seconds=1),
        )
        await publish(service.broker, stop)
        [released] = await tap.wait_for(AllocationReleased)
        assert released.reason is ReleaseReason.TIME_LIMIT
        [ended] = await tap.wait_for(TaskEnded)
        assert ended.release_reason == ReleaseReason.TIME_LIMIT
        assert ended.reason == "it reached its time limit of 3 s and was stopped"
        [_, second] = await tap.wait_for(AllocationGranted, count=2)
        assert second.task_id == "next"
