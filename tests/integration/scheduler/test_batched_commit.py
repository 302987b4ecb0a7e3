"""The scheduler's service layer commits the events that arrive together in one transaction,
and a failing event takes only itself back, not its batch (real SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from faststream.nats import NatsBroker
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeTopologyReported,
    TaskProfiled,
    TaskRejected,
    TraceContext,
)
from crater.runtime.leadership import Deposed
from crater.runtime.outbox import OutboxRelay
from crater.scheduler.adapters.orm import outbox, tasks
from crater.scheduler.adapters.repository import SchedulerRepository
from crater.scheduler.domain.core import SchedulerConfig
from crater.scheduler.service_layer.handlers import SchedulerMetrics, SchedulerService
from tests.support.profiles import small_training
from tests.support.topologies import node

pytestmark = pytest.mark.integration


def profiled(task_id: str) -> TaskProfiled:
    return small_training(task_id)


class FailsOn(SchedulerService):
    """Fault injection: the database write of one task's event fails."""

    poison = "poison"

    async def _decide(self, repository: Any, event: Event, known: dict[str, str]) -> Any:
        decisions = await super()._decide(repository, event, known)
        if isinstance(event, TaskProfiled) and event.task.task_id == self.poison:
            raise RuntimeError("the disk is full")
        return decisions


def service(kind: type[SchedulerService], sessions: Any) -> SchedulerService:
    # The relay is never started: the test reads the outbox itself.
    relay = OutboxRelay(sessions, outbox, NatsBroker("nats://127.0.0.1:1"))
    return kind(sessions, relay, SchedulerConfig(), SchedulerMetrics(CollectorRegistry()))


async def counts(sessions: Any) -> tuple[int, int]:
    async with sessions() as session:
        stored = await session.scalar(select(func.count()).select_from(tasks))
        staged = await session.scalar(select(func.count()).select_from(outbox))
        return int(stored or 0), int(staged or 0)


async def test_events_arriving_together_commit_together(sessions: Any) -> None:
    scheduler = service(SchedulerService, sessions)
    await scheduler.take_over(1, "test")
    await asyncio.gather(
        *(
            scheduler.handle(NodeTopologyReported(node=node(f"n{i}", gpus=8)), "node-topology")
            for i in range(4)
        )
    )
    events = [profiled(f"t{i}") for i in range(24)]
    outcomes = await asyncio.gather(*(scheduler.handle(e, "task-profiled") for e in events))

    for event, decisions in zip(events, outcomes, strict=True):
        assert [type(d) for d in decisions] == [AllocationGranted]
        assert isinstance(decisions[0], AllocationGranted)
        assert decisions[0].task_id == event.task.task_id
    batches = [s for m in scheduler.metrics.batch_size.collect() for s in m.samples]
    count = next(s.value for s in batches if s.name.endswith("_count"))
    total = next(s.value for s in batches if s.name.endswith("_sum"))
    assert total == 4 + 24
    assert count < 8  # committed in a few transactions, not one each
    assert await counts(sessions) == (24, 24)
    # Redelivered: the inbox knows them; nothing changes.
    again = await asyncio.gather(*(scheduler.handle(e, "task-profiled") for e in events[:5]))
    assert again == [[]] * 5
    assert await counts(sessions) == (24, 24)


async def test_a_failing_event_takes_back_only_itself(sessions: Any) -> None:
    scheduler = service(FailsOn, sessions)
    await scheduler.take_over(1, "test")
    await scheduler.handle(NodeTopologyReported(node=node("n0", gpus=8)), "node-topology")
    events = [profiled("a"), profiled("b"), profiled(FailsOn.poison), profiled("c")]
    outcomes = await asyncio.gather(
        *(scheduler.handle(e, "task-profiled") for e in events), return_exceptions=True
    )

    assert isinstance(outcomes[2], RuntimeError)
    for i in (0, 1, 3):
        assert [type(d) for d in outcomes[i]] == [AllocationGranted]  # type: ignore[union-attr]
    assert await counts(sessions) == (3, 3)
    # The core holds what is stored: the poisoned task is neither placed nor waiting.
    assert sorted(scheduler.scheduler.allocations) == ["a", "b", "c"]
    assert FailsOn.poison not in scheduler.scheduler.pending
    async with sessions() as session:
        stored = await SchedulerRepository(session).load(SchedulerConfig())
    assert sorted(stored.allocations) == ["a", "b", "c"]


async def test_repeats_within_one_batch_take_effect_once(sessions: Any) -> None:
    scheduler = service(SchedulerService, sessions)
    await scheduler.take_over(1, "test")
    await scheduler.handle(NodeTopologyReported(node=node("n0", gpus=8)), "node-topology")
    first = profiled("once")
    resubmitted = profiled("once")  # the same task under a new event id
    outcomes = await asyncio.gather(
        scheduler.handle(first, "task-profiled"),
        scheduler.handle(first, "task-profiled"),  # redelivered while the first is pending
        scheduler.handle(resubmitted, "task-profiled"),
        scheduler.handle(profiled("other"), "task-profiled"),
    )

    assert [[type(d) for d in o] for o in outcomes] == [
        [AllocationGranted],
        [],  # a redelivery: the inbox, silently
        [TaskRejected],  # a new submission of a known id: refused aloud
        [AllocationGranted],
    ]
    [refused] = outcomes[2]
    assert isinstance(refused, TaskRejected)
    assert refused.duplicate
    assert refused.task_id == "once"
    [error] = refused.errors
    assert error.field == "task_id"
    assert "status scheduled" in error.reason  # placed earlier in the same batch
    assert "new task_id" in error.reason
    assert await counts(sessions) == (2, 3)  # two tasks; the refusal staged beside the grants
    assert sorted(scheduler.scheduler.allocations) == ["once", "other"]


# -- fencing: two schedulers on one database (adapters/fence.py) ------------------------------


async def test_a_deposed_leader_commits_nothing_and_says_so(sessions: Any) -> None:
    old, new = service(SchedulerService, sessions), service(SchedulerService, sessions)
    told: list[str] = []
    old.on_deposed = lambda: told.append("deposed")
    await old.take_over(5, "old")
    await old.handle(NodeTopologyReported(node=node("n0", gpus=8)), "node-topology")
    assert [type(d) for d in await old.handle(profiled("before"), "task-profiled")] == [
        AllocationGranted
    ]

    await new.take_over(6, "new")  # the old one has not noticed yet
    with pytest.raises(Deposed, match="no longer holds epoch 5"):
        await old.handle(profiled("late"), "task-profiled")
    assert told == ["deposed"]
    assert old.epoch is None
    assert await counts(sessions) == (1, 1)  # "late": neither stored nor staged

    # the new leader loaded what the old one committed, and decides on
    assert sorted(new.scheduler.allocations) == ["before"]
    assert [type(d) for d in await new.handle(profiled("late"), "task-profiled")] == [
        AllocationGranted
    ]
    assert await counts(sessions) == (2, 2)


async def test_the_fence_only_moves_up_and_a_standby_never_commits(sessions: Any) -> None:
    first, second = service(SchedulerService, sessions), service(SchedulerService, sessions)
    await first.take_over(9, "first")
    with pytest.raises(Deposed, match="holds epoch 9"):
        await second.take_over(8, "second")  # an older epoch, late: refused
    assert second.epoch is None
    with pytest.raises(Deposed, match="does not lead"):
        await second.handle(NodeTopologyReported(node=node("n0", gpus=8)), "node-topology")
    assert await counts(sessions) == (0, 0)
    await first.handle(NodeTopologyReported(node=node("n0", gpus=8)), "node-topology")


async def test_a_batch_is_one_transaction_a_poisoned_event_fails_alone_and_traces_are_kept(
    sessions: Any,
) -> None:
    """A batch consumer's batch (`handle_batch`): committed together; one event whose write
    fails is the only one with an error (its message is handed back), the others commit and
    are acked; each decision carries the trace context its event came with."""
    scheduler = service(FailsOn, sessions)
    await scheduler.take_over(1, "test")
    await scheduler.handle_batch(
        "node-topology", [(NodeTopologyReported(node=node("n0", gpus=8)), None)]
    )
    traced = TraceContext(traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    batch = [
        (profiled("a"), traced),
        (profiled(FailsOn.poison), None),
        (profiled("b"), None),
        (profiled("a"), None),  # the same task id again: refused aloud, not an error
    ]
    outcomes = await scheduler.handle_batch("task-profiled", batch)

    assert outcomes[0] is None
    assert isinstance(outcomes[1], RuntimeError)
    assert outcomes[2:] == [None, None]
    assert await counts(sessions) == (2, 3)  # a and b stored; two grants and the refusal
    async with sessions() as session:
        payloads = (await session.execute(select(outbox.c.payload))).scalars().all()
    [grant] = [
        AllocationGranted.model_validate_json(p)
        for p in payloads
        if json.loads(p).get("task_id") == "a" and "allocation_id" in json.loads(p)
    ]
    assert grant.trace == traced  # its event's own context, not the batch's
    assert grant.task_sequence is not None
    # Delivered again (the ack was lost): the inbox knows them; the poisoned one still fails.
    again = await scheduler.handle_batch("task-profiled", batch[:3])
    assert again[0] is None
    assert again[2] is None
    assert isinstance(again[1], RuntimeError)
    assert await counts(sessions) == (2, 3)
