"""A task id the predictor profiled before, submitted again with a body it refuses: the
rejection is a refused duplicate (the known task goes on), never that task's end. A valid
duplicate is passed on, for the scheduler answers it with the known task's status."""

from __future__ import annotations

from faststream import TestApp

from crater.contracts import TaskProfiled, TaskRejected
from crater.predictor.app import build
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.predictor.test_predictor_over_nats import settings, submitted
from tests.support.events import EventTap

# Well-formed, but refused: 3-way tensor parallelism over Llama-2-7B's 32 heads.
ABSURD = {
    "resource_requirements": {"gpu": {"count": 3}},
    "training_config": {"tensor_parallel": 3},
}


async def test_a_refused_body_under_a_known_id_is_a_refused_duplicate(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    async with TestApp(app):
        await publish(service.broker, submitted("train-1"))
        await tap.wait_for(TaskProfiled)

        await publish(service.broker, submitted("train-1", **ABSURD))  # a new event id
        [refused] = await tap.wait_for(TaskRejected)
        assert refused.task_id == "train-1"
        assert refused.duplicate
        first, *why = refused.errors
        assert first.field == "task_id"
        assert "profiled before" in first.reason
        assert any(e.field == "training_config.tensor_parallel" for e in why), why

        # A refused body under a new id is that task's end, as before.
        await publish(service.broker, submitted("absurd", **ABSURD))
        [_, fresh] = await tap.wait_for(TaskRejected, count=2)
        assert fresh.task_id == "absurd"
        assert not fresh.duplicate
        assert all(e.field != "task_id" for e in fresh.errors)

        # A valid body under a known id goes on to the scheduler, which knows its status.
        await publish(service.broker, submitted("train-1", priority="low"))
        profiled = await tap.wait_for(TaskProfiled, count=2)
        assert [p.task.task_id for p in profiled] == ["train-1", "train-1"]
