"""AllData's own formats (../shared/compat, unedited) against Crater as deployed: every
service its own process, a real nats-server, the reference receiver standing in for AllData.
Each fixture is accepted as it is, or produced in exactly its shape, by the gateway and over
NATS."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from crater.cli.stack import Stack
from crater.contracts import (
    AllocationGranted,
    QuerySubjects,
    ResolveAnswer,
    Subjects,
    TaskProfiled,
    TaskRequest,
    TaskUnderutilized,
    utc_now,
)
from tests.support.alldata import fixture, shape
from tests.support.events import EventTap

pytestmark = pytest.mark.e2e

TASK = fixture("alldata_task.json")
TASK_ID = json.loads(TASK)["task_id"]
JOB = fixture("alldata_job.json")
WEBHOOK = json.loads(fixture("alldata_webhook.json"))
ALLOCATION_CONFIG = json.loads(fixture("allocation_config.json"))
JSON = {"content-type": "application/json"}


@pytest.fixture
def stack(tmp_path: Path, database_url: str) -> Iterator[Stack]:
    with Stack(data_dir=tmp_path / "crater", env={"CRATER_DATABASE_URL": database_url}) as running:
        running.start(
            extra_env={
                "CRATER_DATABASE_URL": database_url,
                # the task runs long enough to hear of its own use while it runs
                "CRATER_PROBE_TASK_SECONDS_MIN": "120",
                "CRATER_PROBE_TASK_SECONDS_MAX": "150",
                "CRATER_PROBE_TASK_START_SECONDS": "0.2",
                # an SLA window a test can wait for (shipped: 300 s after a 60 s warm-up)
                "CRATER_PREDICTOR_SLA_WINDOW_SECONDS": "20",
                "CRATER_PREDICTOR_SLA_WARMUP_SECONDS": "0",
            }
        )
        yield running


async def fleet_known(gateway: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 60
    while True:
        nodes = (await gateway.get("/api/v1/nodes")).json().get("nodes", [])
        if any(n["node_id"].startswith("a100-pcie") for n in nodes):
            return
        assert time.monotonic() < deadline, "the scheduler never saw AllData's kind of node"
        await asyncio.sleep(0.3)


async def delivered(stack: Stack, status: str, seconds: float = 60, **keys: Any) -> dict[str, Any]:
    """The first webhook of AllData's task in `status` (whose body has every key of `keys`)
    at the receiver."""
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=stack.url("receiver")) as receiver:
        while True:
            found = (await receiver.get("/deliveries", params={"task_id": TASK_ID})).json()
            for delivery in found["deliveries"]:
                body = delivery["body"]
                if body["status"] == status and all(k in body for k in keys):
                    return dict(delivery)
            assert time.monotonic() < deadline, f"no {status!r} webhook; got {found}"
            await asyncio.sleep(0.3)


def allocation_config_in_the_task(environment: dict[str, str]) -> dict[str, Any]:
    """What a training script placed with `environment` reads through crater_client."""
    script = "import json, crater_client; print(json.dumps(crater_client.get_allocation_config()))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CRATER_", "CUDA_"))}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**clean, **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads(done.stdout)
    return config


def assert_scheduled_as_alldata_parses_it(body: dict[str, Any]) -> dict[str, Any]:
    assert shape(body) == shape(WEBHOOK), body  # keys, key order and JSON types
    resources: dict[str, Any] = body["allocated_resources"]
    assert resources["node"].startswith("a100-pcie")
    assert len(resources["gpu_ids"]) == 2
    assert len(resources["cpu_cores"]) == 32
    return resources


async def test_alldata_over_http_resolve_dry_run_submit_webhook_allocation_and_sla(
    stack: Stack,
) -> None:
    tap = await EventTap.start(stack.nats_url)
    gateway = stack.gateway_client(timeout=30)
    try:
        await fleet_known(gateway)

        # alldata_job.json: resolved into a body /api/v1/schedule takes as it is
        resolved = await gateway.post("/api/v1/resolve", content=JOB, headers=JSON)
        assert resolved.status_code == 200, resolved.text
        TaskRequest.model_validate(resolved.json()["task"])

        # alldata_task.json, dry run: where it would go, nothing held
        dry = await gateway.post("/api/v1/schedule?dry_run=true", content=TASK, headers=JSON)
        assert dry.status_code == 200, dry.text
        placement = dry.json()["placement"]
        assert placement["outcome"] == "placed", placement["summary"]
        [member] = placement["members"]
        assert member["node_id"].startswith("a100-pcie")

        # alldata_task.json, for real: accepted unchanged, placed where the dry run said
        submitted = await gateway.post("/api/v1/schedule", content=TASK, headers=JSON)
        assert submitted.status_code == 202, submitted.text
        [granted] = await tap.wait_for(AllocationGranted, lambda e: e.task_id == TASK_ID)
        assert (granted.node, granted.gpu_ids) == (member["node_id"], member["gpu_ids"])

        # alldata_webhook.json: the `scheduled` webhook in exactly its shape
        scheduled = await delivered(stack, "scheduled")
        resources = assert_scheduled_as_alldata_parses_it(scheduled["body"])
        assert resources["gpu_ids"] == [str(g) for g in granted.gpu_ids]
        assert resources["numa_node"] == str(granted.numa_node)

        # allocation_config.json: what the task reads, from the environment AllData gets
        # over HTTP to inject into its pod
        task = (await gateway.get(f"/api/v1/tasks/{TASK_ID}")).json()
        [held] = task["allocations"]
        environment = held["environment"]
        assert environment["CRATER_CPU_CORES"] == "32"  # AllData's scripts read a count
        config = allocation_config_in_the_task(environment)
        assert shape(config) == shape(ALLOCATION_CONFIG), config
        assert config["gpu_ids"] == granted.gpu_ids
        assert config["cpu_cores"] == granted.cpu_cores == resources["cpu_cores"]
        assert config["ssd_path"]
        assert config["optimal_workers"] >= 1

        # sla.min_gpu_utilization_percent 65: the task's own samples at 30% say it runs below
        await delivered(stack, "running")
        now = utc_now()
        for seconds_ago in (30, 20, 10):
            sample = {
                "task_id": TASK_ID,
                "allocation_id": granted.allocation_id,
                "occurred_at": (now - timedelta(seconds=seconds_ago)).isoformat(),
                "interval_seconds": 10,
                "gpus": [
                    {"gpu_id": g, "utilization_percent": 30.0, "memory_used_mb": 15000}
                    for g in granted.gpu_ids
                ],
            }
            posted = await gateway.post(f"/api/v1/tasks/{TASK_ID}/usage", json=sample)
            assert posted.status_code == 202, posted.text
        [breach] = await tap.wait_for(TaskUnderutilized, lambda e: e.task_id == TASK_ID)
        assert (breach.measured_gpu_utilization_percent, breach.min_gpu_utilization_percent) == (
            30.0,
            65.0,
        )
        # AllData hears it as a second `running`, with the two figures
        told = await delivered(stack, "running", 30, gpu_utilization_percent=..., reason=...)
        body = told["body"]
        assert (body["gpu_utilization_percent"], body["min_gpu_utilization_percent"]) == (
            30.0,
            65.0,
        )
    finally:
        await gateway.aclose()
        await tap.close()


async def test_alldata_over_nats_the_task_as_the_submitted_event_and_the_job_resolved(
    stack: Stack,
) -> None:
    tap = await EventTap.start(stack.nats_url)
    gateway = stack.gateway_client(timeout=30)
    connection = await nats.connect(stack.nats_url)
    try:
        await fleet_known(gateway)

        # alldata_job.json in a resolve query, answered by the predictor
        reply = await connection.request(
            QuerySubjects.RESOLVE,
            b'{"job": ' + JOB + b"}",
            timeout=10,
            headers={"content-type": "application/json"},
        )
        answer = ResolveAnswer.model_validate_json(reply.data)
        assert answer.task is not None, answer.errors

        # alldata_task.json, its bytes as they are, the body of the submitted event
        await connection.jetstream().publish(Subjects.TASK_SUBMITTED.subject, TASK)
        [profiled] = await tap.wait_for(TaskProfiled, lambda e: e.task.task_id == TASK_ID)
        assert profiled.task.task_type_as_sent == "llm_finetune"
        [granted] = await tap.wait_for(AllocationGranted, lambda e: e.task_id == TASK_ID)
        assert granted.node.startswith("a100-pcie")

        scheduled = await delivered(stack, "scheduled")
        assert_scheduled_as_alldata_parses_it(scheduled["body"])
    finally:
        await connection.close()
        await gateway.aclose()
        await tap.close()
