"""Queries answer from a recent copy of the learned tracks; submissions read the store."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from crater.contracts import PredictionQuery, TaskRequest
from crater.predictor.domain.estimate import Assumptions
from crater.predictor.domain.learning import Rule, Track
from crater.predictor.service_layer.handlers import PredictorHandlers, PredictorMetrics


class CountingStore:
    """The learning store's one read a prediction makes, counted."""

    def __init__(self) -> None:
        self.reads = 0

    async def track(self, family: str, task_type: str) -> Track:
        self.reads += 1
        return Track()


def request() -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": "t1",
            "task_type": "llm_sft",
            "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "bf16"},
        }
    )


async def noop_many(events: Any) -> list[BaseException | None]:
    return [None for _ in events]


async def noop(_: Any) -> None:
    return None


async def test_dry_runs_read_the_store_once_per_window_and_submissions_always() -> None:
    store = CountingStore()
    handlers = PredictorHandlers(
        store,  # type: ignore[arg-type]
        PredictorMetrics(SimpleNamespace(registry=CollectorRegistry())),  # type: ignore[arg-type]
        Assumptions(),
        Rule(),
        noop,
        noop_many,
    )
    for _ in range(5):
        answer = await handlers.prediction_query(PredictionQuery(task=request()))
        assert answer.prediction is not None
    assert store.reads == 1
    await handlers.correction_for(request())  # a submission's prediction
    await handlers.correction_for(request())
    assert store.reads == 3
