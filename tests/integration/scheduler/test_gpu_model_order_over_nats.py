"""Ordered GPU models over a real nats-server and database (SQLite and PostgreSQL): a task
that waits for its first model says so in `task.pending`; restarted, the scheduler restores
its wait from the stored submission and, past the bound, places it on its second model with
the choice explained; a bad list on the bus is refused naming the field."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    MessageRejected,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskPending,
    TaskProfiled,
    TaskRequest,
    utc_now,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_scheduler_over_nats import PREDICTION
from tests.support.events import EventTap, publish_raw
from tests.support.topologies import node

H100 = {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_memory_mb": 81559}


def request(task_id: str, gpus: int, **gpu: object) -> dict[str, object]:
    return {
        "task_id": task_id,
        "task_type": "training",
        "model_config": {"name": "m"},
        "resource_requirements": {
            "gpu": {"count": gpus, **gpu},
            "cpu": {"cores": 4},
            "memory": {"capacity_mb": 8000},
        },
    }


async def known_nodes(service: Any, count: int) -> None:
    for _ in range(200):
        if len(service.state.scheduler.cluster) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the scheduler never knew {count} nodes")


async def test_a_task_waits_for_its_first_model_across_a_restart_then_takes_the_next(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    submitted = utc_now()
    service, app = build(settings)
    async with TestApp(app):
        for topology in (node("a100-01", gpus=8), node("h100-01", gpus=8, **H100)):
            await publish(service.broker, NodeTopologyReported(node=topology))
        filler = TaskRequest.model_validate(request("filler", 8, type="h100"))
        await known_nodes(service, 2)  # topologies and tasks are consumed apart
        await publish(service.broker, TaskProfiled(task=filler, prediction=PREDICTION))
        await tap.wait_for(AllocationGranted)
        ordered = TaskRequest.model_validate(
            request(
                "t",
                4,
                models=["h100", "a100-80gb"],
                models_policy="wait",
                models_wait_seconds=2,
            )
        )
        event = TaskProfiled(occurred_at=submitted, task=ordered, prediction=PREDICTION)
        await publish(service.broker, event)
        [waits] = await tap.wait_for(TaskPending, lambda e: e.task_id == "t")
        [why] = [r for r in waits.reasons if r.filter == "GpuPreference"]
        assert why.code == "WaitingForPreferredModel"
        assert "waits for h100, its first choice" in why.message
        assert "then takes a100-80gb too" in why.message
        # a bad list on the bus: refused, naming the field, and the consumer goes on
        bad = json.loads(event.model_dump_json(by_alias=True))
        bad["event_id"] = "6f1c2b0e-0000-4000-8000-000000000001"
        bad["task"]["task_id"] = "twice"
        bad["task"]["resource_requirements"]["gpu"]["models"] = ["h100", "H100"]
        await publish_raw(fresh_nats.url, "crater.v1.task.profiled", json.dumps(bad).encode())
        [refused] = await tap.wait_for(MessageRejected)
        assert [e.field for e in refused.errors] == ["task.resource_requirements.gpu.models"]
        assert "name the same product h100" in refused.errors[0].reason
        assert not tap.of(AllocationGranted, lambda e: e.task_id == "t")

    service, app = build(settings)
    async with TestApp(app):  # restarted: the wait restored from the stored submission
        past = submitted + timedelta(seconds=3)
        for name in ("a100-01", "h100-01"):
            beat = NodeHealthReported(
                node_id=name, condition=NodeCondition.READY, score=100, occurred_at=past
            )
            await publish(service.broker, beat)
        [grant] = await tap.wait_for(AllocationGranted, lambda e: e.task_id == "t")
        assert grant.node == "a100-01"
        assert (
            "took a100-80gb, second choice of h100, a100-80gb: h100 full (none of its 1 node "
            "in pool default has room now)" in grant.explanation
        )
