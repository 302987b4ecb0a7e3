"""The predictor takes `task.submitted` a pull batch at a time: every submission answered,
each answer carrying its own submission's trace, and a submission that fails takes only
itself back (real nats-server, real database)."""

from __future__ import annotations

import secrets
from types import SimpleNamespace
from typing import Any

import pytest
from faststream import TestApp
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from crater.contracts import (
    Event,
    TaskProfiled,
    TaskRejected,
    TaskSubmitted,
    TraceContext,
)
from crater.predictor.adapters.orm import predictions
from crater.predictor.adapters.store import LearningStore
from crater.predictor.app import build
from crater.predictor.domain.estimate import Assumptions
from crater.predictor.domain.learning import Rule
from crater.predictor.service_layer import handlers as predictor_handlers
from crater.predictor.service_layer.handlers import PredictorHandlers, PredictorMetrics
from crater.runtime.bus import outgoing, publish_batch
from crater.runtime.nats_server import NatsServer
from tests.integration.predictor.test_predictor_over_nats import settings, submitted
from tests.support.events import EventTap

pytestmark = pytest.mark.integration


def own_registry() -> Any:
    """What PredictorMetrics reads of a service: a registry (the app's holds its own)."""
    return SimpleNamespace(registry=CollectorRegistry())


def traced(event: TaskSubmitted) -> TaskSubmitted:
    context = TraceContext(traceparent=f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01")
    return event.model_copy(update={"trace": context})


def trace_id(event: Event) -> str:
    assert event.trace is not None
    return event.trace.traceparent.split("-")[1]


async def stored_predictions(store: LearningStore) -> int:
    async with store.sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(predictions)) or 0)


async def test_a_burst_is_answered_whole_each_answer_in_its_own_trace(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    good = [traced(submitted(f"t-{n}")) for n in range(150)]
    # Refused by the predictor (a model it cannot size): answered task.rejected, in the batch.
    unknown = {
        "model_config": {"name": "no-such-model"},
        "resource_requirements": {"gpu": {"count": 1}},
    }
    bad = [traced(submitted(f"bad-{n}", **unknown)) for n in range(3)]
    async with TestApp(app):
        # Published together, so the consumer pulls full batches.
        outcomes = await publish_batch(service.broker, [outgoing(e) for e in good + bad])
        assert not any(outcomes)
        answered = await tap.wait_for(TaskProfiled, count=len(good), timeout=60)
        rejected = await tap.wait_for(TaskRejected, count=len(bad), timeout=60)
    by_task = {e.task_id: e for e in good + bad}
    assert sorted(p.task.task_id for p in answered) == sorted(e.task_id for e in good)
    assert {r.task_id for r in rejected} == {e.task_id for e in bad}
    for answer in [*answered, *rejected]:
        task_id = answer.task.task_id if isinstance(answer, TaskProfiled) else answer.task_id
        assert trace_id(answer) == trace_id(by_task[task_id])
    assert await stored_predictions(service.state) == len(good)


async def test_a_submission_that_fails_takes_back_only_itself(
    fresh_nats: NatsServer, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    real_predict = predictor_handlers.predict

    def predict(request: Any, *args: Any) -> Any:
        if request.task_id == "poison":
            raise RuntimeError("the model catalog is unreadable")
        return real_predict(request, *args)

    monkeypatch.setattr(predictor_handlers, "predict", predict)
    published: list[Event] = []

    async def publish_many(events: Any) -> list[BaseException | None]:
        published.extend(events)
        # The bus refuses the last answer: its submission is delivered again, alone.
        return [None] * (len(events) - 1) + [TimeoutError("no ack")]

    async def publish_one(_: Event) -> None:
        raise AssertionError("a batch publishes together")

    handlers = PredictorHandlers(
        store, PredictorMetrics(own_registry()), Assumptions(), Rule(), publish_one, publish_many
    )
    batch = [submitted("a"), submitted("poison"), submitted("b"), submitted("c")]
    async with TestApp(app):  # migrates the database
        outcomes = await handlers.tasks_submitted([(e, None) for e in batch])
    assert outcomes[0] is None
    assert outcomes[2] is None
    assert isinstance(outcomes[1], RuntimeError)
    assert isinstance(outcomes[3], TimeoutError)
    assert [e.task.task_id for e in published if isinstance(e, TaskProfiled)] == ["a", "b", "c"]
    # Recorded before the answers went: "c" again (its redelivery) adds nothing.
    assert await stored_predictions(store) == 3
    again = await handlers.tasks_submitted([(batch[3], None)])
    assert isinstance(again[0], TimeoutError)  # the stub refuses every last answer
    assert await stored_predictions(store) == 3
