"""Pools from a file, taints, labels and MIG slices as the scheduler runs: real nats-server,
real database (SQLite and PostgreSQL), a restart in the middle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    Confidence,
    NodeTopology,
    NodeTopologyReported,
    PlacementAnswer,
    PlacementQuery,
    QuerySubjects,
    ResourcePrediction,
    Taint,
    TaskPending,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.support.events import EventTap
from tests.support.topologies import node

A100_MIG = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=0,
    host_memory_mb=0,
    confidence=Confidence.LOW,
    method="test",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=1,
)


def submitted(task_id: str, **body: Any) -> TaskProfiled:
    request = TaskRequest.model_validate(
        {"task_id": task_id, "task_type": "inference", "model_config": {"name": "m"}, **body}
    )
    return TaskProfiled(task=request, prediction=PREDICTION)


def mig_node(name: str) -> NodeTopology:
    t = node(name, gpus=1, cores=8, numa_nodes=1, memory_mb=64_000, pool="serve")
    cards = [g.model_copy(update={"mig_capable": True, "mig_profiles": A100_MIG}) for g in t.gpus]
    return t.model_copy(update={"gpus": cards, "labels": {"rack": "r1"}})


async def dry_run(nats_url: str, body: dict[str, Any]) -> PlacementAnswer:
    query = PlacementQuery.model_validate(body)
    connection = await nats.connect(nats_url)
    try:
        reply = await connection.request(
            QuerySubjects.PLACEMENT, query.model_dump_json().encode(), timeout=5
        )
    finally:
        await connection.close()
    return PlacementAnswer.model_validate_json(reply.data)


async def test_slices_and_over_committed_cores_are_held_across_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  serve:\n    overcommit: {cpu: 2.0}\n")
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, pools_file=pools
    )
    slice_of = {"gpu": {"count": 1, "mig_profile": "3g.40gb"}, "cpu": {"cores": 8}}
    service, app = build(settings)
    async with TestApp(app):
        tainted = node("gpu-02", gpus=1, pool="serve").model_copy(
            update={"taints": [Taint.parse("dedicated=llm:NoSchedule")]}
        )
        for topology in (mig_node("mig-01"), tainted):
            await publish(service.broker, NodeTopologyReported(node=topology))
        for task_id in ("slice-1", "slice-2"):
            await publish(
                service.broker,
                submitted(task_id, pool="serve", resource_requirements=slice_of),
            )
        granted = await tap.wait_for(AllocationGranted, count=2)
        assert [(g.node, g.gpu_ids, g.mig_profile) for g in granted] == [
            ("mig-01", [0], "3g.40gb")
        ] * 2
        # 8 cores promised twice over: each slice has all eight
        assert [len(g.cpu_cores) for g in granted] == [8, 8]

    # a new process: the slices and the twice-held cores come back from the database
    service, app = build(settings)
    async with TestApp(app):
        await publish(
            service.broker,
            submitted(
                "slice-3",
                pool="serve",
                resource_requirements={"gpu": {"count": 1, "mig_profile": "1g.10gb"}},
            ),
        )
        [pending] = await tap.wait_for(TaskPending)
        assert {r.code for r in pending.reasons} == {"UntoleratedTaint", "NoMigSlice"}
        answer = await dry_run(
            fresh_nats.url,
            {
                "resource_requirements": {"gpu": {"count": 1}, "cpu": {"cores": 1}},
                "pool": "serve",
                "node_selector": {"rack": "r1"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            },
        )
        assert answer.fits == []
        assert {(m.node_id, m.code) for m in answer.misfits} == {
            ("gpu-02", "NodeSelectorMismatch"),
            ("mig-01", "InsufficientGpus"),  # cut into slices: no whole card
        }
        cores = await dry_run(
            fresh_nats.url,
            {
                "resource_requirements": {"cpu": {"cores": 1}},
                "pool": "serve",
                "node_selector": {"rack": "r1"},
            },
        )
        assert {m.node_id: m.code for m in cores.misfits} == {
            "gpu-02": "NodeSelectorMismatch",
            "mig-01": "InsufficientCpu",  # 16 of 16 core-slots held
        }
        # a slice returns to the card it was cut from: the waiting slice takes its place
        done = TaskStatusReported(task_id="slice-1", status=TaskStatus.SUCCEEDED)
        await publish(service.broker, done)
        [*_, third] = await tap.wait_for(AllocationGranted, count=3)
        assert (third.task_id, third.node, third.gpu_ids, third.mig_profile) == (
            "slice-3",
            "mig-01",
            [0],
            "1g.10gb",
        )
