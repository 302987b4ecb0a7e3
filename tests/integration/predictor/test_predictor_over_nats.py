"""The predictor as it runs: a real nats-server, real JetStream consumers."""

from __future__ import annotations

import json

from faststream import TestApp

from crater.contracts import MessageRejected, TaskProfiled, TaskRequest, TaskSubmitted
from crater.predictor.app import PredictorSettings, build
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.support.events import EventTap, publish_raw


def submitted(task_id: str) -> TaskSubmitted:
    return TaskSubmitted.from_request(
        TaskRequest.model_validate(
            {
                "task_id": task_id,
                "task_type": "training",
                "model_config": {"name": "meta-llama/Llama-2-7b-hf"},
                "resource_requirements": {"gpu": {"count": 2, "memory_mb": 40000}},
            }
        )
    )


async def test_submitted_task_is_profiled_once_even_when_published_twice(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    service, app = build(PredictorSettings(nats_url=fresh_nats.url))
    async with TestApp(app):
        event = submitted("train-1")
        await publish(service.broker, event)
        await publish(service.broker, event)  # a retrying producer: JetStream drops the copy
        [profiled] = await tap.wait_for(TaskProfiled)
        assert profiled.task.task_id == "train-1"
        assert profiled.prediction.gpu_memory_per_gpu_mb > 0
        await publish(service.broker, submitted("train-2"))
        await tap.wait_for(TaskProfiled, count=2)
        assert len(tap.of(TaskProfiled, lambda e: e.task.task_id == "train-1")) == 1


async def test_bad_input_is_rejected_with_field_and_reason_and_consuming_goes_on(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    service, app = build(PredictorSettings(nats_url=fresh_nats.url))
    async with TestApp(app):
        subject = "crater.v1.task.submitted"
        await publish_raw(fresh_nats.url, subject, b"{definitely not json")
        bad = {"task_id": "t", "task_type": "training", "model_config": {"name": "m"}}
        bad["resource_requirements"] = {"gpu": {"count": "two"}}
        await publish_raw(fresh_nats.url, subject, json.dumps(bad).encode())
        await publish_raw(fresh_nats.url, subject, b"x" * 10)
        await publish(service.broker, submitted("after-bad-input"))

        rejected = await tap.wait_for(MessageRejected, count=3)
        assert rejected[0].errors[0].field == "body"
        assert "not valid JSON" in rejected[0].errors[0].reason
        assert rejected[1].errors[0].field == "resource_requirements.gpu.count"
        assert rejected[1].consumer == "predictor"
        [profiled] = await tap.wait_for(TaskProfiled)
        assert profiled.task.task_id == "after-bad-input"
