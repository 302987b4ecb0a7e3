"""The webhook formats as the callback runs (a real nats-server, a real database, reference
receivers over HTTP): AllData's own shape by default, Crater's typed body on an endpoint that
asks for it; and the SLA breach told as `running` while the task runs, never after its end."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from faststream import TestApp
from sqlalchemy import select

from crater.callback.adapters import tables
from crater.callback.app import CallbackSettings, build
from crater.contracts import TaskUnderutilized, WebhookBody, WebhookDelivered
from crater.runtime.bus import publish
from crater.runtime.db import make_engine
from crater.runtime.nats_server import NatsServer
from tests.integration.callback.conftest import (
    PASSWORD,
    USERNAME,
    ServedReceiver,
    serve_receiver,
)
from tests.support.alldata import fixture, shape
from tests.support.events import EventTap
from tests.support.lifecycle import OCCURRED, ended, granted, status


def settings(nats: NatsServer, database_url: str, **fields: Any) -> CallbackSettings:
    values: dict[str, Any] = {
        "nats_url": nats.url,
        "database_url": database_url,
        "webhook_timeout_seconds": 2.0,
        "initial_backoff_seconds": 0.05,
        "max_backoff_seconds": 0.2,
        "poll_seconds": 0.05,
        "claim_seconds": 3.0,
    }
    return CallbackSettings.model_validate(values | fields)


def endpoints_file(tmp_path: Path, alldata: ServedReceiver, launcher: ServedReceiver) -> str:
    path = tmp_path / "endpoints.yaml"
    path.write_text(
        "endpoints:\n"
        f"  - {{name: alldata, url: '{alldata.url}', username: {USERNAME}, "
        f"password: {PASSWORD}}}\n"
        f"  - {{name: launcher, url: '{launcher.url}', username: {USERNAME}, "
        f"password: {PASSWORD}, format: crater}}\n"
    )
    return str(path)


async def test_alldata_hears_its_own_shape_and_a_crater_endpoint_the_typed_body(
    fresh_nats: NatsServer,
    tap: EventTap,
    receiver: ServedReceiver,
    database_url: str,
    tmp_path: Path,
) -> None:
    async with serve_receiver() as launcher:
        config = endpoints_file(tmp_path, receiver, launcher)
        service, app = build(settings(fresh_nats, database_url, endpoints_file=config))
        grant = granted(
            "train-llama3-8b-20240520-001",
            node="gpu-node-03",
            cpu_cores=list(range(24)),
            numa_node=0,
            checkpoint_path="/crater-cache/checkpoint",
            environment={"CRATER_GPU_IDS": "0,1", "CRATER_CPU_CORES": "0-23"},
        )
        async with TestApp(app):
            await publish(service.broker, grant)
            await tap.wait_for(WebhookDelivered, count=2)

    [alldata] = receiver.state.deliveries
    [typed] = launcher.state.deliveries
    assert alldata.webhook_id == typed.webhook_id == str(grant.event_id)
    # AllData's fixture, keys, order and types, and for this grant the very document.
    assert shape(alldata.body) == shape(json.loads(fixture("alldata_webhook.json")))
    assert alldata.body == json.loads(fixture("alldata_webhook.json"))
    assert alldata.headers["crater-attempt"] == "1"
    assert alldata.headers["crater-format"] == "alldata"
    # What a launcher confirms the allocation with: headers beside AllData's exact body.
    assert alldata.headers["crater-allocation-id"] == grant.allocation_id
    assert alldata.headers["crater-reservation-token"] == grant.reservation_token
    expires = datetime.fromisoformat(alldata.headers["crater-reservation-expires-at"])
    assert expires == grant.reservation_expires_at
    # The launcher's body is Crater's WebhookBody, with the environment to inject.
    body = WebhookBody.model_validate(typed.body)
    assert (body.allocation_id, body.reservation_token, body.reservation_expires_at) == (
        grant.allocation_id,
        grant.reservation_token,
        grant.reservation_expires_at,
    )
    assert body.allocated_resources is not None
    assert body.allocated_resources.gpu_ids == [0, 1]
    assert body.allocated_resources.environment == grant.environment
    assert typed.headers["crater-format"] == "crater"


def underutilized(task_id: str) -> TaskUnderutilized:
    return TaskUnderutilized(
        task_id=task_id,
        allocation_id=f"alloc-{task_id}",
        measured_gpu_utilization_percent=12.5,
        min_gpu_utilization_percent=60,
        window_seconds=300,
        samples=10,
        occurred_at=OCCURRED,
    )


async def superseded(database_url: str, webhook_id: str) -> Any:
    engine = make_engine(database_url)
    d = tables.deliveries.c
    try:
        for _ in range(200):
            async with engine.connect() as connection:
                row = (
                    await connection.execute(
                        select(d.state, d.last_error).where(d.webhook_id == webhook_id)
                    )
                ).first()
            if row is not None:
                return row
            await asyncio.sleep(0.05)
    finally:
        await engine.dispose()
    raise AssertionError(f"webhook {webhook_id} was never recorded")


async def test_an_sla_breach_is_told_while_the_task_runs_and_never_after_its_end(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    service, app = build(
        settings(
            fresh_nats,
            database_url,
            webhook_url=receiver.url,
            webhook_username=USERNAME,
            webhook_password=PASSWORD,
        )
    )
    late = underutilized("done")
    async with TestApp(app):
        for event in (granted("slow"), status("slow"), underutilized("slow")):
            await publish(service.broker, event)
        # Told while the task runs (an end recorded before it is sent would drop it).
        await tap.wait_for(WebhookDelivered, count=3)
        await publish(service.broker, ended("slow"))
        await tap.wait_for(WebhookDelivered, count=4)
        # one at a time: the order wait across the two streams is not what this tests
        await publish(service.broker, granted("done"))
        await tap.wait_for(WebhookDelivered, count=5)
        await publish(service.broker, ended("done"))
        await tap.wait_for(WebhookDelivered, count=6)
        await publish(service.broker, late)  # the task had ended: not told
        row = await superseded(database_url, str(late.event_id))
        dropped = service.registry.get_sample_value(
            "crater_webhook_superseded_total", {"endpoint": receiver.url, "reason": "ended"}
        )

    told = [(d.body["task_id"], d.body["status"]) for d in receiver.state.deliveries]
    assert told == [
        ("slow", "scheduled"),
        ("slow", "running"),
        ("slow", "running"),
        ("slow", "succeeded"),
        ("done", "scheduled"),
        ("done", "succeeded"),
    ]
    breach = receiver.state.deliveries[2]
    assert list(breach.body) == [
        "task_id",
        "status",
        "reason",
        "gpu_utilization_percent",
        "min_gpu_utilization_percent",
    ]
    assert (breach.body["gpu_utilization_percent"], breach.body["min_gpu_utilization_percent"]) == (
        12.5,
        60.0,
    )
    assert breach.headers["crater-attempt"] == "1"
    assert row.state == "superseded"
    assert row.last_error.startswith("superseded (ended)")
    assert dropped == 1.0
