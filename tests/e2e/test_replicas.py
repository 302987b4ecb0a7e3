"""Several replicas of the gateway, the predictor and the callback, each its own process, on
one nats-server and one database (SQLite file, PostgreSQL): a duplicate sent to both gateways
at once is accepted once; every task is profiled once; one callback replica is killed (-9)
mid-flow and every task's webhooks still all arrive, in its order, none sent as two."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.chaos.analysis import webhook_report
from benchmarks.chaos.harness import _read_webhooks
from crater.cli.stack import Stack
from crater.contracts import TaskProfiled
from tests.e2e.test_end_to_end import deliveries, request
from tests.support.events import EventTap

pytestmark = pytest.mark.e2e

TASKS = 24
REPLICAS = {"gateway": 2, "predictor": 2, "callback": 2}


@pytest.fixture
def stack(tmp_path: Path, database_url: str) -> Iterator[Stack]:
    with Stack(data_dir=tmp_path / "crater", env={"CRATER_DATABASE_URL": database_url}) as running:
        running.start(
            services=("scheduler", "predictor", "callback", "probe", "gateway"),
            extra_env={
                "CRATER_DATABASE_URL": database_url,
                "CRATER_PROBE_TASK_SECONDS_MIN": "1",
                "CRATER_PROBE_TASK_SECONDS_MAX": "3",
                "CRATER_PROBE_TASK_START_SECONDS": "0.2",
                # a killed replica's claims lapse soon (the default: the timeout + 10 s)
                "CRATER_CALLBACK_WEBHOOK_TIMEOUT_SECONDS": "2",
                "CRATER_CALLBACK_CLAIM_SECONDS": "3",
                "CRATER_CALLBACK_POLL_SECONDS": "0.2",
            },
            replicas=REPLICAS,
        )
        yield running


async def test_replicas_accept_once_profile_once_and_deliver_in_order_through_a_kill(
    stack: Stack,
) -> None:
    assert {"gateway-2", "predictor-2", "callback-2"} <= set(stack.processes)
    tap = await EventTap.start(stack.nats_url)
    one = stack.gateway_client(timeout=10)
    two = httpx.AsyncClient(base_url=stack.url("gateway-2"), timeout=10, headers=stack.auth_headers)
    try:
        deadline = time.monotonic() + 30
        while not (await two.get("/api/v1/nodes")).json()["nodes"]:
            assert time.monotonic() < deadline, "the scheduler never saw the fleet"
            await asyncio.sleep(0.3)

        # The same task id at both gateways at once: one accepts it, the other refuses it.
        same = request("twice-00", gpus=1, gpu_mb=16384, pool="inference")
        answers = await asyncio.gather(
            one.post("/api/v1/schedule", json=same), two.post("/api/v1/schedule", json=same)
        )
        assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]

        accepted = ["twice-00"]
        for n in range(TASKS):
            pool = "inference" if n % 2 else "training"
            body = request(f"rep-{n:02d}", gpus=1, gpu_mb=16384, pool=pool)
            response = await (one if n % 2 else two).post("/api/v1/schedule", json=body)
            assert response.status_code == 202, response.text
            accepted.append(body["task_id"])

        # Kill one callback replica once webhooks flow: its share goes to the other.
        deadline = time.monotonic() + 30
        while len(await deliveries(stack)) < TASKS // 2:
            assert time.monotonic() < deadline, "no webhooks"
            await asyncio.sleep(0.2)
        stack.kill("callback-2")

        ended: set[str] = set()
        deadline = time.monotonic() + 75
        while not set(accepted) <= ended and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            ended = {
                w.task_id
                for w in _read_webhooks(stack.data_dir / "webhooks.jsonl")
                if w.status in ("succeeded", "failed", "cancelled", "rejected")
            }
        repeated = (await two.get(stack.url("receiver") + "/deliveries")).json()["duplicates"]
        report = webhook_report(
            accepted, _read_webhooks(stack.data_dir / "webhooks.jsonl"), repeated
        )
        print(
            {k: report[k] for k in ("accepted", "ended", "lost", "out_of_order_tasks")},
            "repeated sends of one webhook-id:",
            repeated,
        )
        assert report["lost"] == 0, report["lost_examples"]
        assert report["out_of_order_tasks"] == 0, report["out_of_order_examples"]
        assert report["tasks_with_more_than_one_terminal"] == 0
        assert report["duplicates_distinct_ids"] == {}  # nothing told twice as two webhooks
        # A repeat of one webhook-id (dropped by the receiver) can only come from a POST the
        # killed replica made and never recorded: at most what it had in flight.
        assert repeated <= TASKS

        # The two predictors split the submissions: each task profiled once.
        profiled = [e.task.task_id for e in tap.of(TaskProfiled)]
        assert sorted(profiled) == sorted(set(profiled))
        assert set(accepted) <= set(profiled)
    finally:
        await one.aclose()
        await two.aclose()
        await tap.close()
