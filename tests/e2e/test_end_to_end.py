"""Crater as it is deployed: every service its own process, a real nats-server, a real
database, tasks through the gateway, webhooks at the reference receiver."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from crater.cli.stack import Stack
from crater.contracts import AllocationReleased, TaskSubmitted
from crater.runtime.db import make_engine
from crater.scheduler.adapters.orm import allocations, tasks
from tests.support.events import EventTap

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def request(task_id: str, gpus: int, gpu_mb: int, pool: str, **extra: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "task_type": "inference" if pool == "inference" else "training",
        "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "bf16"},
        "resource_requirements": {
            "gpu": {"count": gpus, "memory_mb": gpu_mb},
            "cpu": {"cores": 8},
            "memory": {"capacity_mb": 65536},
        },
        "pool": pool,
        **extra,
    }


@pytest.fixture
def stack(tmp_path: Path, database_url: str) -> Iterator[Stack]:
    with Stack(data_dir=tmp_path / "crater", env={"CRATER_DATABASE_URL": database_url}) as running:
        running.start(
            extra_env={
                "CRATER_DATABASE_URL": database_url,
                "CRATER_PROBE_TASK_SECONDS_MIN": "1",
                "CRATER_PROBE_TASK_SECONDS_MAX": "2",
                "CRATER_PROBE_TASK_START_SECONDS": "0.2",
            }
        )
        yield running


async def deliveries(stack: Stack) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=stack.url("receiver")) as client:
        found: list[dict[str, Any]] = (await client.get("/deliveries")).json()["deliveries"]
        return found


async def wait_for_webhooks(stack: Stack, wanted: set[tuple[str, str]], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    seen: set[tuple[str, str]] = set()
    while time.monotonic() < deadline:
        seen = {(d["body"]["task_id"], d["body"]["status"]) for d in await deliveries(stack)}
        if wanted <= seen:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"webhooks missing: {sorted(wanted - seen)}; got {sorted(seen)}")


def crater(stack: Stack, *args: str) -> str:
    """Run the `crater` command line against the stack, as a person would."""
    done = subprocess.run(
        [sys.executable, "-m", "crater.cli", *args],
        env={
            **os.environ,
            "CRATER_GATEWAY_URL": stack.url("gateway"),
            "CRATER_API_TOKEN": stack.api_token,
            "COLUMNS": "200",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def check_cli(stack: Stack) -> None:
    nodes = json.loads(crater(stack, "list-nodes", "--json"))["nodes"]
    assert len(nodes) == 38
    example = EXAMPLES / "infer-llama3-8b.json"
    assert "submitted chat-llama3-replica-01" in crater(stack, "submit", str(example))
    found = json.loads(crater(stack, "tasks", "--json"))["tasks"]
    assert {"train-e2e", "serve-e2e", "huge-e2e"} <= {t["task_id"] for t in found}
    placement = json.loads(
        crater(
            stack,
            "schedule-test",
            "--resource-request",
            '{"gpu": {"count": 1, "memory_mb": 20000}}',
            "--pool",
            "inference",
            "--json",
        )
    )
    assert placement["fits"], placement["summary"]
    assert all(f["node_id"].startswith("rtx4090") for f in placement["fits"])
    assert "t4-01" in {m["node_id"] for m in placement["misfits"]}


TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}


async def test_tasks_flow_from_gateway_to_webhooks_in_one_trace(stack: Stack) -> None:
    tap = await EventTap.start(stack.nats_url)
    gateway = stack.gateway_client(timeout=10)
    try:
        # the fleet must be known before anything can be placed
        deadline = time.monotonic() + 30
        while not (await gateway.get("/api/v1/nodes")).json()["nodes"]:
            assert time.monotonic() < deadline, "the scheduler never saw the fleet"
            await asyncio.sleep(0.3)

        submitted = [
            request("train-e2e", gpus=2, gpu_mb=40960, pool="training"),
            request("serve-e2e", gpus=1, gpu_mb=16384, pool="inference"),
            request("huge-e2e", gpus=64, gpu_mb=81920, pool="training"),
        ]
        for body in submitted:
            response = await gateway.post("/api/v1/schedule", json=body)
            assert response.status_code == 202, response.text

        bad = await gateway.post(
            "/api/v1/schedule", json=request("bad", gpus=-1, gpu_mb=1, pool="training")
        )
        assert bad.status_code == 422
        assert any(e["field"] == "resource_requirements.gpu.count" for e in bad.json()["detail"])

        await wait_for_webhooks(
            stack,
            {
                ("train-e2e", "scheduled"),
                ("train-e2e", "running"),
                ("train-e2e", "succeeded"),
                ("serve-e2e", "scheduled"),
                ("serve-e2e", "succeeded"),
                ("huge-e2e", "rejected"),
            },
            seconds=60,
        )
        received = await deliveries(stack)
        # what AllData was told: one end per task, and nothing after it
        for task_id in ("train-e2e", "serve-e2e", "huge-e2e"):
            told = [d for d in received if d["body"]["task_id"] == task_id]
            # webhook-id is the event id (the default alldata body does not repeat it)
            ends = {d["webhook_id"] for d in told if d["body"]["status"] in TERMINAL}
            assert len(ends) == 1, told
            assert told[-1]["body"]["status"] in TERMINAL, told  # received last
        scheduled_delivery = next(
            d
            for d in received
            if d["body"]["task_id"] == "train-e2e" and d["body"]["status"] == "scheduled"
        )
        scheduled = scheduled_delivery["body"]
        # AllData's own shape by default; the attempt comes in a header
        assert list(scheduled) == ["task_id", "status", "allocated_resources"]
        assert scheduled_delivery["headers"]["crater-attempt"] == "1"
        resources = scheduled["allocated_resources"]
        assert len(resources["gpu_ids"]) == 2
        assert all(isinstance(gpu, str) for gpu in resources["gpu_ids"])
        assert len(resources["cpu_cores"]) == 8
        assert resources["node"].startswith(("a100", "h100"))

        # the scheduler's database holds the allocations and the final states (committed with
        # the task.ended the 'succeeded' webhooks came from)
        await tap.wait_for(AllocationReleased, count=2, timeout=30)
        engine = make_engine(stack.database_url)
        async with engine.connect() as connection:
            rows = (await connection.execute(select(allocations))).all()
            states = dict((await connection.execute(select(tasks.c.task_id, tasks.c.status))).all())
        await engine.dispose()
        assert {r.task_id for r in rows} == {"train-e2e", "serve-e2e"}
        assert all(r.released_at is not None for r in rows)
        assert states == {
            "train-e2e": "succeeded",
            "serve-e2e": "succeeded",
            "huge-e2e": "rejected",
        }

        # and the CLI's read APIs answer through the gateway
        listed = (await gateway.get("/api/v1/tasks/train-e2e")).json()
        assert listed["status"] == "succeeded"
        await check_cli(stack)

        # one task's path through gateway, predictor, scheduler and callback is one trace:
        # the scheduler's span of the batch that took the task is linked to it (one span per
        # batch), and what it published for the task goes on in the task's trace
        [event] = tap.of(TaskSubmitted, lambda e: e.task_id == "train-e2e")
        assert event.trace is not None
        trace_id = "0x" + event.trace.traceparent.split("-")[1]
        services = set()
        spans_file = stack.data_dir / "traces.jsonl"
        for _ in range(50):
            services = {
                span["resource"]["attributes"]["service.name"]
                for span in map(json.loads, spans_file.read_text().splitlines())
                if trace_id
                in {span["context"]["trace_id"]}
                | {link["context"]["trace_id"] for link in span.get("links") or []}
            }
            if {"crater-gateway", "crater-predictor", "crater-scheduler"} <= services:
                break
            await asyncio.sleep(0.2)
        assert {"crater-gateway", "crater-predictor", "crater-scheduler", "crater-callback"} <= (
            services
        )
    finally:
        await gateway.aclose()
        await tap.close()
