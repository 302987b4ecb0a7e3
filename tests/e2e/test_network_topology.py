"""Network topology across nodes as deployed: every service its own process, a real
nats-server, a simulated fleet whose nodes declare their leaf switch by label. The place
travels probe -> scheduler in the node's topology; a gang's network_topology travels gateway
-> predictor -> scheduler in the task; the gang lands under one leaf, or is refused or waits
with the reason naming the field."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crater.cli.stack import Stack
from crater.contracts import AllocationGranted, TaskPending, TaskRejected
from tests.support.events import EventTap

pytestmark = pytest.mark.e2e

# Two leaves under one spine: leaf-a holds two nodes, leaf-b three (4 x A100 40 GB each).
FLEET = """
name: fabric
seed: 7
nodes:
  - {profile: a100-pcie-4, count: 2, prefix: la, labels: {crater.ai/spine-switch: s1,
     crater.ai/leaf-switch: leaf-a}}
  - {profile: a100-pcie-4, count: 3, prefix: lb, labels: {crater.ai/spine-switch: s1,
     crater.ai/leaf-switch: leaf-b}}
"""


@pytest.fixture
def stack(tmp_path: Path, database_url: str) -> Iterator[Stack]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    with Stack(data_dir=tmp_path / "crater", env={"CRATER_DATABASE_URL": database_url}) as running:
        running.start(
            extra_env={
                "CRATER_DATABASE_URL": database_url,
                "CRATER_PROBE_FLEET_FILE": str(fleet),
                "CRATER_PROBE_TASK_SECONDS_MIN": "600",
                "CRATER_PROBE_TASK_SECONDS_MAX": "900",
                "CRATER_PROBE_TASK_START_SECONDS": "0.2",
            }
        )
        yield running


def gang(task_id: str, members: int, required: str = "leaf") -> dict[str, Any]:
    """A data-parallel fine-tuning gang, each member a whole node (its predicted need fits a
    40 GB card), all of it under one leaf."""
    return {
        "task_id": task_id,
        "task_type": "llm_finetune",
        "model_config": {"name": "meta-llama/Llama-3-8b-chat-hf", "precision": "bf16"},
        "resource_requirements": {
            "gpu": {"count": 4, "memory_mb": 16384},
            "cpu": {"cores": 8},
            "memory": {"capacity_mb": 65536},
        },
        "gang_size": members,
        "network_topology": {"required": required},
    }


async def fleet_placed(gateway: httpx.AsyncClient) -> dict[str, dict[str, str]]:
    """Each node's place as the scheduler knows it (the probe declared it)."""
    deadline = time.monotonic() + 60
    while True:
        nodes = (await gateway.get("/api/v1/nodes")).json().get("nodes", [])
        if len(nodes) == 5:
            return {n["node_id"]: n.get("fabric") for n in nodes}
        assert time.monotonic() < deadline, f"the scheduler never saw the 5 nodes: {nodes}"
        await asyncio.sleep(0.3)


async def submit(gateway: httpx.AsyncClient, body: dict[str, Any]) -> None:
    response = await gateway.post("/api/v1/schedule", json=body)
    assert response.status_code == 202, response.text


async def test_a_gang_lands_under_one_leaf_or_says_why_not(stack: Stack) -> None:
    tap = await EventTap.start(stack.nats_url)
    gateway = stack.gateway_client(timeout=30)
    try:
        places = await fleet_placed(gateway)
        assert places["la-01"] == {"nvlink_domain": None, "leaf": "leaf-a", "spine": "s1"}
        assert places["lb-03"] == {"nvlink_domain": None, "leaf": "leaf-b", "spine": "s1"}

        # three members fit only under leaf-b: all of them go there, ranks in order
        await submit(gateway, gang("ring", 3))
        placed = await tap.wait_for(
            AllocationGranted, lambda e: e.task_id == "ring", count=3, timeout=60
        )
        assert sorted(g.node for g in placed) == ["lb-01", "lb-02", "lb-03"]
        assert sorted(g.gang_index for g in placed) == [0, 1, 2]

        # no leaf could ever hold four: refused, naming the field
        await submit(gateway, gang("too-big", 4))
        [refused] = await tap.wait_for(TaskRejected, lambda e: e.task_id == "too-big", timeout=60)
        assert [e.field for e in refused.errors] == ["network_topology.required"]
        assert "could hold all 4 members even empty: at most 3" in refused.errors[0].reason

        # three more: leaf-a has room for two now, leaf-b none: it waits, and says so
        await submit(gateway, gang("waits", 3))
        [pending] = await tap.wait_for(TaskPending, lambda e: e.task_id == "waits", timeout=60)
        [reason] = [r for r in pending.reasons if r.code == "GangExceedsDomain"]
        assert reason.message.startswith("no leaf has room for all 3 gang members now")
        assert reason.message.endswith("at most 2, under s1/leaf-a")
        task = (await gateway.get("/api/v1/tasks/waits")).json()
        assert "no leaf has room for all 3 gang members now" in str(task), task
    finally:
        await gateway.aclose()
        await tap.close()
