"""The data path as deployed: every service its own process, a real nats-server, the
simulated demo fleet. A task asking PCIe bandwidth and SSD space goes through the gateway,
the predictor and the scheduler; its grant names the SSD chosen by its GPUs, and the
environment the task is handed over HTTP points at it. Links too slow are refused with the
reason, in words, on a dry run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crater.cli.stack import Stack
from crater.contracts import AllocationGranted
from tests.support.events import EventTap

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(tmp_path: Path, database_url: str) -> Iterator[Stack]:
    with Stack(data_dir=tmp_path / "crater", env={"CRATER_DATABASE_URL": database_url}) as running:
        running.start(
            extra_env={
                "CRATER_DATABASE_URL": database_url,
                "CRATER_PROBE_TASK_SECONDS_MIN": "60",
                "CRATER_PROBE_TASK_SECONDS_MAX": "90",
                "CRATER_PROBE_TASK_START_SECONDS": "0.2",
            }
        )
        yield running


def body(task_id: str, gpu: dict[str, Any], ssd_gb: int) -> dict[str, Any]:
    """AllData's kind of fine-tuning (its predicted need fits a 40 GB card)."""
    return {
        "task_id": task_id,
        "task_type": "llm_finetune",
        "model_config": {"name": "meta-llama/Llama-3-8b-chat-hf", "precision": "bf16"},
        "resource_requirements": {
            "gpu": {**gpu, "memory_mb": 16384},
            "cpu": {"cores": 8},
            "memory": {"capacity_mb": 65536},
            "ssd": {"capacity_gb": ssd_gb},
        },
    }


async def fleet_known(gateway: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 60
    while True:
        nodes = (await gateway.get("/api/v1/nodes")).json().get("nodes", [])
        if any(n["node_id"].startswith("a100-pcie") for n in nodes):
            return
        assert time.monotonic() < deadline, "the scheduler never saw the a100-pcie nodes"
        await asyncio.sleep(0.3)


async def test_the_grant_names_the_ssd_by_the_gpus_and_slow_links_are_explained(
    stack: Stack,
) -> None:
    tap = await EventTap.start(stack.nats_url)
    gateway = stack.gateway_client(timeout=30)
    try:
        await fleet_known(gateway)
        # the default pool's GPU nodes: v100 (gen 3 x16, 15.8 GB/s) and a100-pcie (gen 4
        # x16, 31.5): 25 GB/s rules the V100s out, 100 rules out every node
        never = body("too-fast", {"count": 2, "pcie_bandwidth_gbps": 100}, 0)
        dry = await gateway.post("/api/v1/schedule?dry_run=true", json=never)
        assert dry.status_code == 200, dry.text
        placement = dry.json()["placement"]
        assert placement["outcome"] == "rejected", placement
        assert "with a PCIe link of 100 GB/s (measured, else nominal" in placement["summary"]
        assert "InsufficientPcieBandwidth" in {m["code"] for m in placement["misfits"]}

        wanted = body("data-path", {"count": 2, "pcie_bandwidth_gbps": 25}, 500)
        dry = await gateway.post("/api/v1/schedule?dry_run=true", json=wanted)
        placement = dry.json()["placement"]
        assert placement["outcome"] == "placed", placement
        assert (
            "4 nodes have fewer than 2 free GPUs with a PCIe link of 25 GB/s"
            in (
                placement["summary"]  # the V100s
            )
        )
        [member] = placement["members"]
        submitted = await gateway.post("/api/v1/schedule", json=wanted)
        assert submitted.status_code == 202, submitted.text
        [granted] = await tap.wait_for(
            AllocationGranted, lambda e: e.task_id == "data-path", timeout=60
        )
        assert granted.node.startswith("a100-pcie")
        assert (granted.node, granted.gpu_ids, granted.disk) == (
            member["node_id"],
            member["gpu_ids"],
            member["disk"],
        )
        assert granted.disk is not None
        assert f"SSD {granted.disk} on " in granted.explanation
        assert "500 GB held" in granted.explanation

        # what the task is handed, over HTTP: the chosen disk and its mount
        task = (await gateway.get("/api/v1/tasks/data-path")).json()
        [held] = task["allocations"]
        environment = held["environment"]
        assert environment["CRATER_SSD_DEVICE"] == granted.disk
        assert held["checkpoint_path"].startswith(environment["CRATER_SSD_PATH"])
    finally:
        await gateway.aclose()
        await tap.close()
