"""crater_client against a live Crater: every service its own process, a real nats-server,
a simulated fleet that runs what is placed (the probe's fleet mode)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest

from crater.cli.stack import Stack
from crater.contracts import LendingState, TaskGpusLending, TaskUnderutilized
from crater_client import (
    AsyncCraterClient,
    CraterClient,
    CraterError,
    NotFound,
    RunRefused,
    TaskExists,
    ValidationFailed,
    cpu_phase,
    run_task,
)
from crater_client.monitoring import RESERVATION_TOKEN_HEADER, usage_credentials
from tests.support.events import EventTap

pytestmark = pytest.mark.integration


def task(task_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "task_type": "inference",
        "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "bf16"},
        "resource_requirements": {
            "gpu": {"count": 1, "memory_mb": 20000},
            "cpu": {"cores": 8},
            "memory": {"capacity_mb": 65536},
        },
        "pool": "inference",
        **extra,
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(data_dir=tmp_path_factory.mktemp("crater")) as running:
        running.start(
            services=("scheduler", "predictor", "probe", "gateway"),
            extra_env={
                # tasks run long enough to be seen running and cancelled
                "CRATER_PROBE_TASK_SECONDS_MIN": "20",
                "CRATER_PROBE_TASK_SECONDS_MAX": "25",
                "CRATER_PROBE_TASK_START_SECONDS": "0.2",
                "CRATER_PREDICTOR_SLA_WINDOW_SECONDS": "20",
                "CRATER_PREDICTOR_SLA_WARMUP_SECONDS": "0",
            },
        )
        yield running


def test_alldata_drives_a_task_s_lifecycle_and_gets_refusals_as_exceptions(
    stack: Stack,
) -> None:
    client = CraterClient(stack.url("gateway"), token=stack.api_token)
    dry = client.dry_run(task("life-1"))  # where it would go; holds nothing, not even the id
    # The stack is up once its services are; the probe's nodes reach the scheduler one
    # report at a time (on a loaded machine the inference pool's last), so wait for them.
    deadline = time.monotonic() + 60
    while dry["placement"]["outcome"] != "placed" and time.monotonic() < deadline:
        time.sleep(0.5)
        dry = client.dry_run(task("life-1"))
    assert dry["placement"]["outcome"] == "placed", dry["placement"]["summary"]
    [member] = dry["placement"]["members"]
    with pytest.raises(NotFound):
        client.get("life-1")
    with pytest.raises(ValidationFailed) as refused_dry:
        client.dry_run(task("bad-0", resource_requirements={"gpu": {"count": -1}}))
    assert refused_dry.value.errors[0][0] == "resource_requirements.gpu.count"

    accepted = client.submit(task("life-1"))
    assert (accepted.task_id, accepted.status) == ("life-1", "submitted")
    running = client.wait("life-1", until={"running"}, timeout=60, poll=0.2)
    assert running.status == "running"
    assert running.gpu_ids
    assert running.node == member["node_id"]  # where the dry run said
    assert "life-1" in {t.task_id for t in client.list(status="running")}

    with pytest.raises(TaskExists) as exists:
        client.submit(task("life-1"))
    assert exists.value.task_status == "running"

    with pytest.raises(ValidationFailed) as invalid:
        client.submit(task("bad-1", resource_requirements={"gpu": {"count": "two"}}))
    assert ("resource_requirements.gpu.count", invalid.value.errors[0][1]) == invalid.value.errors[
        0
    ]
    assert "integer" in invalid.value.errors[0][1]

    cancelled = client.cancel("life-1")
    assert (cancelled.status, cancelled.previous) == ("cancelling", "running")
    ended = client.wait("life-1", timeout=60, poll=0.2)
    assert ended.status == "cancelled"
    with pytest.raises(NotFound):
        client.get("never-submitted")


def post_usage(
    gateway: str,
    task_id: str,
    attempt: int,
    second: float,
    util: float,
    credentials: dict[str, str],
    allocation_id: str | None = None,
) -> int:
    body = {
        "event_id": str(uuid4()),
        "occurred_at": (datetime.now(UTC) + timedelta(seconds=second)).isoformat(),
        "task_id": task_id,
        "attempt": attempt,
        "interval_seconds": 10,
        "gpus": [{"gpu_id": 0, "utilization_percent": util, "memory_used_mb": 20000}],
        "allocation_id": allocation_id,
    }
    request = urllib.request.Request(
        f"{gateway}/api/v1/tasks/{task_id}/usage",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **credentials},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


async def test_a_task_below_its_sla_is_said_once(stack: Stack) -> None:
    tap = await EventTap.start(stack.nats_url)
    try:
        client = AsyncCraterClient(stack.url("gateway"), token=stack.api_token)
        await client.submit(task("slow-1", sla={"min_gpu_utilization_percent": 70}))
        running = await client.wait("slow-1", until={"running"}, timeout=60, poll=0.2)
        gateway = stack.url("gateway")
        # 40 s of 25% utilisation, as the task's monitor would report it: two whole windows
        for n in range(1, 5):
            answer = await asyncio.to_thread(
                post_usage, gateway, "slow-1", running.attempt, 10 * n, 25.0, stack.auth_headers
            )
            assert answer == 202
        [breach] = await tap.wait_for(TaskUnderutilized, lambda e: e.task_id == "slow-1")
        assert breach.measured_gpu_utilization_percent == 25.0
        assert breach.min_gpu_utilization_percent == 70.0
        await asyncio.sleep(1.0)
        assert len(tap.of(TaskUnderutilized, lambda e: e.task_id == "slow-1")) == 1
        await client.cancel("slow-1")
    finally:
        await tap.close()


def launched_environment(client: CraterClient, stack: Stack, task_id: str) -> dict[str, str]:
    """What AllData injects into the task's container: its allocation's environment, with the
    gateway's URL."""
    client.submit(task(task_id))
    client.wait(task_id, until={"running"}, timeout=60, poll=0.2)
    [held] = client.get(task_id).raw["allocations"]
    return {**held["environment"], "CRATER_GATEWAY_URL": stack.url("gateway")}


def test_run_task_confirms_heartbeats_and_reports_success(stack: Stack) -> None:
    client = CraterClient(stack.url("gateway"), token=stack.api_token)
    env = launched_environment(client, stack, "launch-ok")
    with run_task(environ=env, heartbeat_seconds=0.5) as running:
        assert running.task_id == "launch-ok"
        time.sleep(2)
    assert running.heartbeats >= 2
    assert running.lost is None
    ended = client.wait("launch-ok", timeout=30, poll=0.2)
    assert ended.status == "succeeded"
    assert ended.reason == "succeeded as its launcher reported (exit code 0)"


def test_run_task_reports_the_exception_and_reraises_it(stack: Stack) -> None:
    client = CraterClient(stack.url("gateway"), token=stack.api_token)
    env = launched_environment(client, stack, "launch-boom")
    with pytest.raises(RuntimeError, match="CUDA out of memory"), run_task(environ=env):
        raise RuntimeError("CUDA out of memory")
    ended = client.wait("launch-boom", timeout=30, poll=0.2)
    assert ended.status == "failed"
    # a CUDA out-of-memory error is reported as such (the `oom` failure kind)
    assert ended.reason == (
        "failed as its launcher reported out of memory (exit code 1): "
        "RuntimeError: CUDA out of memory"
    )


def test_run_task_with_a_wrong_token_is_refused_on_entry(stack: Stack) -> None:
    client = CraterClient(stack.url("gateway"), token=stack.api_token)
    env = launched_environment(client, stack, "launch-forged")
    token = env["CRATER_RESERVATION_TOKEN"]
    forged = {**env, "CRATER_RESERVATION_TOKEN": token[:-8] + "00000000"}
    with pytest.raises(RunRefused) as refused, run_task(environ=forged):
        pytest.fail("the body must not run")
    assert refused.value.status == 403
    [(field, reason)] = refused.value.errors
    assert field == "token"
    assert reason.startswith("forged")
    client.cancel("launch-forged")


def test_a_task_reports_its_usage_with_its_reservation_token_and_no_api_key(
    stack: Stack,
) -> None:
    client = CraterClient(stack.url("gateway"), token=stack.api_token)
    env = launched_environment(client, stack, "usage-own")
    other = launched_environment(client, stack, "usage-other")
    gateway, allocation = stack.url("gateway"), env["CRATER_ALLOCATION_ID"]

    def post(task_id: str, credentials: dict[str, str], allocation_id: str | None) -> int:
        return post_usage(gateway, task_id, 1, 0, 50.0, credentials, allocation_id)

    # crater_client's monitor sends what the task's environment holds: its token
    own = usage_credentials(env)
    assert post("usage-own", own, allocation) == 202
    assert post("usage-own", {}, allocation) == 401  # no credential at all
    assert post("usage-own", own, None) == 422  # which allocation the token is for
    forged = {RESERVATION_TOKEN_HEADER: env["CRATER_RESERVATION_TOKEN"][:-8] + "00000000"}
    assert post("usage-own", forged, allocation) == 403
    # another task's token cannot speak for this task, nor this one's for another allocation
    assert post("usage-own", usage_credentials(other), other["CRATER_ALLOCATION_ID"]) == 403
    assert post("usage-other", own, other["CRATER_ALLOCATION_ID"]) == 403
    client.cancel("usage-own")
    client.cancel("usage-other")


async def test_a_task_lends_its_gpus_for_a_cpu_phase_with_its_own_token(stack: Stack) -> None:
    """`with cpu_phase():` through the gateway to the scheduler, with the task's reservation
    token: lent on entry, returned on leaving (no replica took the cards); another task's
    token is refused 403, and an ended allocation 409."""
    tap = await EventTap.start(stack.nats_url)
    try:
        client = CraterClient(stack.url("gateway"), token=stack.api_token)
        env = await asyncio.to_thread(launched_environment, client, stack, "phase-own")
        other = await asyncio.to_thread(launched_environment, client, stack, "phase-other")
        own = {k: v for k, v in env.items() if k != "CRATER_API_TOKEN"}
        phase = cpu_phase(expected_seconds=60, environ=own, wait_seconds=20)
        await asyncio.to_thread(phase.__enter__)
        assert phase.begun is not None
        assert phase.begun["phase"] == "cpu"
        [lent] = await tap.wait_for(TaskGpusLending, lambda e: e.task_id == "phase-own")
        assert lent.state is LendingState.LENT
        await asyncio.to_thread(phase.__exit__, None, None, None)
        assert phase.free is True  # the scheduler said so, asked with the token
        assert phase.standing is not None
        assert phase.standing["lending"] == "returned"
        [_, back] = await tap.wait_for(TaskGpusLending, lambda e: e.task_id == "phase-own", count=2)
        assert (back.state, back.reason) == (
            LendingState.RETURNED,
            "it asked for them back; no replica was on them",
        )
        # another task's token speaks for its own allocation only
        forged = {**own, "CRATER_RESERVATION_TOKEN": other["CRATER_RESERVATION_TOKEN"]}
        with pytest.raises(CraterError) as refused:
            await asyncio.to_thread(cpu_phase(environ=forged, wait_seconds=0).__enter__)
        assert refused.value.status == 403
        client.cancel("phase-own")
        await asyncio.to_thread(client.wait, "phase-own", timeout=30, poll=0.2)
        with pytest.raises(CraterError) as ended:
            await asyncio.to_thread(cpu_phase(environ=own, wait_seconds=0).__enter__)
        assert ended.value.status == 409
        client.cancel("phase-other")
    finally:
        await tap.close()
