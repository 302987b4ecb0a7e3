"""Queues as organisations use them, as deployed (issue 27, item 5): every service its own
process, a real nats-server, a simulated fleet of one H100 node and one A100 node. An ordered
list of GPU models travels gateway -> predictor -> scheduler in the task and the task takes
the first listed model with room, saying why it passed the first over; a user's running-GPU
limit from the quotas file holds that user's next task, with the reason; an API key naming
its user fills the task's `user` in, and refuses (403) a task naming another user."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crater.cli.stack import Stack
from crater.contracts import AllocationGranted, TaskPending
from crater.gateway.apikeys import Scope, new_key, read_keys_file, write_keys_file
from tests.support.events import EventTap

pytestmark = pytest.mark.e2e

FLEET = """
name: orgs
seed: 7
nodes:
  - {profile: h100-sxm-8, count: 1, prefix: h}
  - {profile: a100-pcie-4, count: 1, prefix: a}
"""
QUOTAS = """
tenants:
  acme:
    per_user: {running_gpus: 4}
    users:
      bob: {running_gpus: 8}
"""


@pytest.fixture
def stack(tmp_path: Path, database_url: str) -> Iterator[Stack]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS)
    with Stack(data_dir=tmp_path / "crater", env={"CRATER_DATABASE_URL": database_url}) as running:
        running.start(
            extra_env={
                "CRATER_DATABASE_URL": database_url,
                "CRATER_PROBE_FLEET_FILE": str(fleet),
                "CRATER_SCHEDULER_QUOTAS_FILE": str(quotas),
                "CRATER_PROBE_TASK_SECONDS_MIN": "600",
                "CRATER_PROBE_TASK_SECONDS_MAX": "900",
                "CRATER_PROBE_TASK_START_SECONDS": "0.2",
            }
        )
        yield running


def task(task_id: str, **body: Any) -> dict[str, Any]:
    """A fine-tune of four cards that fits a 40 GB card, H100 wanted, else A100."""
    return {
        "task_id": task_id,
        "task_type": "llm_finetune",
        "model_config": {"name": "meta-llama/Llama-3-8b-chat-hf", "precision": "bf16"},
        "resource_requirements": {
            "gpu": {"count": 4, "memory_mb": 16384, "models": ["h100", "a100"]},
            "cpu": {"cores": 8},
            "memory": {"capacity_mb": 65536},
        },
        "tenant": "acme",
        **body,
    }


async def nodes_known(gateway: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 60
    while True:
        nodes = (await gateway.get("/api/v1/nodes")).json().get("nodes", [])
        if len(nodes) == 2:
            return
        assert time.monotonic() < deadline, f"the scheduler never saw the 2 nodes: {nodes}"
        await asyncio.sleep(0.3)


async def test_an_ordered_model_list_and_a_users_limit_through_every_service(
    stack: Stack,
) -> None:
    # alice's own key, added to the running gateway's keys file (it rereads it)
    token, key = new_key("acme", [Scope.SUBMIT, Scope.READ], name="alice", user="alice")
    keys = stack.data_dir / "secrets" / "api-keys.yaml"
    write_keys_file(keys, [*read_keys_file(keys), key])
    tap = await EventTap.start(stack.nats_url)
    admin = stack.gateway_client(timeout=30)
    alice = httpx.AsyncClient(
        base_url=stack.url("gateway"), timeout=30, headers={"authorization": f"Bearer {token}"}
    )
    try:
        await nodes_known(admin)
        # bob's two tasks fill the H100 node, each on its first choice
        for task_id in ("bob-1", "bob-2"):
            answer = await admin.post("/api/v1/schedule", json=task(task_id, user="bob"))
            assert answer.status_code == 202, answer.text
        bobs = await tap.wait_for(
            AllocationGranted, lambda e: e.task_id.startswith("bob-"), count=2, timeout=60
        )
        assert {g.node for g in bobs} == {"h-01"}
        assert all("H100" in (g.gpu_model or "") for g in bobs)

        # alice's key names her: a task naming bob is refused, 403 on the field
        for _ in range(100):  # until the gateway has read the keys file again
            foreign = await alice.post("/api/v1/schedule", json=task("alice-x", user="bob"))
            if foreign.status_code != 401:
                break
            await asyncio.sleep(0.2)
        assert foreign.status_code == 403, foreign.text
        assert foreign.json()["detail"][0]["field"] == "user"

        # alice's first task: the H100s are full, it takes its second choice and says why
        answer = await alice.post("/api/v1/schedule", json=task("alice-1"))
        assert answer.status_code == 202, answer.text
        [first] = await tap.wait_for(
            AllocationGranted, lambda e: e.task_id == "alice-1", timeout=60
        )
        assert first.node == "a-01"
        assert "took a100, second choice of h100, a100: h100 full" in first.explanation

        # her second: her limit of 4 running GPUs holds it, and it says so
        answer = await alice.post("/api/v1/schedule", json=task("alice-2"))
        assert answer.status_code == 202, answer.text
        [waits] = await tap.wait_for(TaskPending, lambda e: e.task_id == "alice-2", timeout=60)
        [reason] = [r for r in waits.reasons if r.code == "UserGpuLimit"]
        assert reason.message.startswith(
            "user alice of tenant acme holds 4 of its 4 running GPUs (tenants.acme.per_user."
            "running_gpus)"
        )
    finally:
        await alice.aclose()
        await admin.aclose()
        await tap.close()
