"""A card fault across services (docs/health.md): the probe's heartbeat reports a card
fault (its simulated fleet's uncorrected ECC errors), the scheduler cordons that card, not
the node, ends the task running there (failed, kind node-fault, the card named) and its
restart policy places it again elsewhere; an operator's uncordon over the gateway's route
lifts a cordon. A real nats-server and a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    GpuCordonRequested,
    NodeHealthReported,
    NodesAnswer,
    NodesQuery,
    NodeSummary,
    NodeTopologyReported,
    QuerySubjects,
    RestartPolicy,
    TaskPending,
    TaskStatus,
    TaskStatusReported,
)
from crater.probe.app import build as build_probe
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_reconcile_over_nats import WITHIN, probe_settings, profiled
from tests.support.events import EventTap

FAULT_AT_SECONDS = 6


def fleet(tmp_path: Path, name: str, faults: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        "seed: 5\nnodes:\n"
        f"  - {{profile: dgx-a100-8, count: 1, pool: training, prefix: {name}}}\n" + faults
    )
    return path


async def nodes(nats_url: str) -> dict[str, NodeSummary]:
    connection = await nats.connect(nats_url)
    try:
        reply = await connection.request(
            QuerySubjects.NODES, NodesQuery().model_dump_json().encode(), timeout=5
        )
    finally:
        await connection.close()
    return {n.node_id: n for n in NodesAnswer.model_validate_json(reply.data).nodes}


async def test_a_card_fault_cordons_the_card_and_its_task_runs_again_elsewhere(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    # Every card of "bad" fails at once (uncorrected ECC errors), so whichever card the task
    # is given is among them; "good" joins only once the task runs on "bad".
    faults = "faults:\n" + "".join(
        f"  - {{node: bad-01, kind: ecc, at_seconds: {FAULT_AT_SECONDS}, gpu: {g}}}\n"
        for g in range(8)
    )
    bad = probe_settings(fresh_nats, fleet(tmp_path, "bad", faults)).model_copy(
        update={"faults": True}
    )
    good = probe_settings(fresh_nats, fleet(tmp_path, "good"))
    scheduler, app = build(settings)
    async with TestApp(app):
        _, bad_app = build_probe(bad)
        async with TestApp(bad_app):
            await tap.wait_for(NodeTopologyReported, lambda t: t.node.node_id == "bad-01")
            task = profiled("victim", gpus=1)
            restart = RestartPolicy(when=["failure"], max_attempts=3, backoff_seconds=0)
            request = task.task.model_copy(update={"restart_policy": restart})
            await publish(scheduler.broker, task.model_copy(update={"task": request}))
            [first] = await tap.wait_for(AllocationGranted, timeout=WITHIN)
            assert first.node == "bad-01"
            await tap.wait_for(
                TaskStatusReported,
                lambda r: r.task_id == "victim" and r.status is TaskStatus.RUNNING,
                timeout=WITHIN,
            )
            _, good_app = build_probe(good)
            async with TestApp(good_app):
                await tap.wait_for(
                    NodeTopologyReported, lambda t: t.node.node_id == "good-01", timeout=WITHIN
                )
                # The probe reports the fault in its heartbeat...
                faulty = (
                    await tap.wait_for(
                        NodeHealthReported,
                        lambda h: h.node_id == "bad-01" and bool(h.gpu_faults),
                        timeout=WITHIN,
                    )
                )[0]
                assert faulty.gpu_faults is not None
                assert {f.kind.value for f in faulty.gpu_faults} >= {"ecc-uncorrected"}
                assert faulty.condition.value == "Degraded"  # the node is not taken out
                # ...the task on it ends, failed, and runs again on the other node.
                [released] = await tap.wait_for(
                    AllocationReleased, lambda r: r.task_id == "victim", timeout=WITHIN
                )
                assert released.reason == "failed"
                [retry] = await tap.wait_for(
                    TaskPending, lambda p: p.task_id == "victim" and p.attempt == 2, timeout=WITHIN
                )
                card = first.gpu_ids[0]
                assert f"GPU {card} of bad-01 is cordoned: ecc-uncorrected" in retry.summary
                assert "node-fault" in retry.summary
                [second] = await tap.wait_for(
                    AllocationGranted, lambda g: g.attempt == 2, timeout=WITHIN
                )
                assert (second.task_id, second.node) == ("victim", "good-01")
                known = await nodes(fresh_nats.url)
                bad_row = known["bad-01"]
                assert sorted(bad_row.cordoned_gpus) == list(range(8))
                assert bad_row.gpus_free == 0
                # An operator lifts one card's cordon: that occurrence stays lifted.
                lift = GpuCordonRequested(node_id="bad-01", gpu=3, cordon=False)
                await publish(scheduler.broker, lift)
                deadline = asyncio.get_running_loop().time() + WITHIN
                while asyncio.get_running_loop().time() < deadline:
                    row = (await nodes(fresh_nats.url))["bad-01"]
                    if 3 not in row.cordoned_gpus:
                        break
                    await asyncio.sleep(0.2)
                row = (await nodes(fresh_nats.url))["bad-01"]
                assert 3 not in row.cordoned_gpus
                assert row.gpus_free == 1
