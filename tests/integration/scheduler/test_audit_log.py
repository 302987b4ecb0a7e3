"""The audit log (crater.scheduler.audit), written by the scheduler's service layer in the
decision's transaction, on real SQLite and PostgreSQL: it verifies, names the record that was
tampered with, replays byte for byte through the production core, shows a diff where a changed
weight decides otherwise, explains a task and exports to JSON lines and Parquet."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from faststream.nats import NatsBroker
from prometheus_client import CollectorRegistry
from sqlalchemy import delete, event, func, insert, select, update

from crater.contracts import (
    AuditExplainQuery,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.db import make_engine
from crater.runtime.outbox import OutboxRelay
from crater.scheduler import audit, audit_state
from crater.scheduler.adapters.config_watch import ConfigWatch
from crater.scheduler.adapters.orm import (
    audit_checkpoints,
    audit_log,
    audit_snapshots,
    audit_tasks,
    outbox,
)
from crater.scheduler.app import MIGRATIONS_DIR
from crater.scheduler.domain.core import SchedulerConfig
from crater.scheduler.service_layer.handlers import SchedulerMetrics, SchedulerService
from tests.support.profiles import small_training
from tests.support.topologies import node

pytestmark = pytest.mark.integration

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


def profiled(task_id: str, at: datetime, gpus: int = 1) -> TaskProfiled:
    return small_training(task_id, gpus, at)


def service(sessions: Any, log: audit.AuditLog | None = None) -> SchedulerService:
    relay = OutboxRelay(sessions, outbox, NatsBroker("nats://127.0.0.1:1"))
    return SchedulerService(
        sessions, relay, SchedulerConfig(), SchedulerMetrics(CollectorRegistry()), audit=log
    )


async def recorded_run(scheduler: SchedulerService) -> list[str]:
    """Nodes, heartbeats that change nothing, tasks placed, waiting, running, ended."""
    await scheduler.take_over(1, "test")
    await asyncio.gather(
        *(
            scheduler.handle(
                NodeTopologyReported(node=node(f"n{i}", gpus=4), occurred_at=T0), "node-topology"
            )
            for i in range(3)
        )
    )
    tasks = []
    for step in range(12):
        at = T0 + timedelta(seconds=5 * step + 1)
        for i in range(3):  # heartbeats like the last ones: nothing stored but the log
            beat = NodeHealthReported(
                node_id=f"n{i}", condition=NodeCondition.READY, score=100, occurred_at=at
            )
            await scheduler.handle(beat, "node-health")
        batch = [profiled(f"t{step}-{k}", at, gpus=1 + (step + k) % 3) for k in range(2)]
        tasks += [e.task.task_id for e in batch]
        await asyncio.gather(*(scheduler.handle(e, "task-profiled") for e in batch))
        if step % 4 == 3:  # one earlier task ends: its resources come back
            done = tasks[step - 3]
            allocation = scheduler.scheduler.allocations.get(done)
            if allocation is not None:
                member = next(iter(allocation.members()))
                for status in (TaskStatus.RUNNING, TaskStatus.SUCCEEDED):
                    report = TaskStatusReported(
                        task_id=done,
                        status=status,
                        allocation_id=member.allocation_id,
                        occurred_at=at + timedelta(seconds=1),
                    )
                    await scheduler.handle(report, "task-status")
    return tasks


async def entries(sessions: Any) -> list[audit.Entry]:
    async with sessions() as session:
        return await audit.all_entries(session)


async def verified(sessions: Any, **kwargs: Any) -> audit.VerifyReport:
    async with sessions() as session:
        return await audit.verify(session, **kwargs)


async def test_the_log_verifies_and_replays_identically(sessions: Any) -> None:
    scheduler = service(sessions)
    await recorded_run(scheduler)
    log = await entries(sessions)
    kinds = {e.kind for e in log}
    assert {"TakeOver", "NodeTopologyReported", "NodeHealthReported", "TaskProfiled"} <= kinds
    assert log[0].source == audit.LEADER
    assert log[0].epoch == 1
    assert all(e.epoch == 1 for e in log)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    # heartbeats that changed nothing are in the log (they move the core's clock)
    assert sum(e.kind == "NodeHealthReported" and e.decisions == "[]" for e in log) >= 30
    # the decision's own time, not the input's
    grant = next(e for e in log if '"kind":"AllocationGranted"' in e.decisions)
    assert grant.decided_at > T0.isoformat()

    report = await verified(sessions)
    assert report.ok, report.finding
    assert report.records == len(log)

    replayed = audit.replay(log, SchedulerConfig())
    assert replayed.divergence is None, replayed.divergence and replayed.divergence.render()
    assert replayed.events == sum(e.source == audit.CORE for e in log)
    assert replayed.compared == replayed.events


async def test_a_changed_weight_diverges_at_the_first_decision_it_changes(sessions: Any) -> None:
    await recorded_run(service(sessions))
    log = await entries(sessions)

    def spread(config: SchedulerConfig) -> SchedulerConfig:  # over every recorded config
        return audit.with_weight(config, "GpuBinPack", -1000.0)

    replayed = audit.replay(log, SchedulerConfig(), what_if=spread)
    divergence = replayed.divergence
    assert divergence is not None
    # every record before it decided the same; this one is the first that does not
    same = audit.replay(
        [e for e in log if e.seq < divergence.seq], SchedulerConfig(), what_if=spread
    )
    assert same.divergence is None
    assert divergence.kind == "TaskProfiled"
    diff = divergence.diff()
    assert f"recorded decisions of record {divergence.seq}" in diff
    # the first grant: the same node, but the score the changed weight gave it
    assert '-      "score": ' in diff
    assert '+      "score": ' in diff
    assert "node {" in divergence.render()  # the state that led to it


async def test_an_altered_record_is_named(sessions: Any) -> None:
    await recorded_run(service(sessions))
    target = len(await entries(sessions)) // 2
    async with sessions() as session, session.begin():
        await session.execute(
            update(audit_log)
            .where(audit_log.c.seq == target)
            .values(decided_at="2020-01-01T00:00:00.000000+00:00")
        )
    report = await verified(sessions)
    assert report.finding == audit.Finding(
        target, "altered", report.finding.detail if report.finding else ""
    )


async def test_a_removed_record_is_named(sessions: Any) -> None:
    await recorded_run(service(sessions))
    async with sessions() as session, session.begin():
        await session.execute(delete(audit_log).where(audit_log.c.seq == 7))
    report = await verified(sessions)
    assert report.finding is not None
    assert (report.finding.seq, report.finding.what) == (7, "removed")


def test_tampering_is_named_where_it_happened() -> None:
    """On the chain itself: inserted (renumbered after), altered with its hash recomputed,
    removed with the rest renumbered."""
    chain = _chain(20)
    assert audit.verify_chain(chain).ok

    forged = _link(5, chain[3].hash, "forged")
    renumbered = [replace_seq(e, e.seq + 1) for e in chain[4:]]
    inserted = audit.verify_chain([*chain[:4], forged, *renumbered])
    assert inserted.finding is not None
    assert (inserted.finding.seq, inserted.finding.what) == (5, "inserted")

    rehashed = _link(9, chain[7].hash, "changed")
    altered = audit.verify_chain([*chain[:8], rehashed, *chain[9:]])
    assert altered.finding is not None
    assert (altered.finding.seq, altered.finding.what) == (9, "altered")

    removed = audit.verify_chain([*chain[:10], *[replace_seq(e, e.seq - 1) for e in chain[11:]]])
    assert removed.finding is not None
    assert (removed.finding.seq, removed.finding.what) == (11, "removed")


async def test_signed_checkpoints_catch_a_chain_rewritten_whole(sessions: Any) -> None:
    private, public = audit.generate_key_pair()
    key = audit.load_private_key(private)
    await recorded_run(service(sessions, audit.AuditLog(signing_key=key, checkpoint_every=10)))
    public_key = audit.load_public_key(public)
    report = await verified(sessions, public_key=public_key)
    assert report.ok
    assert report.checkpoints >= 5

    other = audit.load_public_key(audit.generate_key_pair()[1])
    assert (await verified(sessions, public_key=other)).finding is not None

    # From record 13 on, every record altered and re-hashed: the chain holds, the checkpoint
    # at 20 does not.
    log = await entries(sessions)
    rewritten = []
    prev = log[11].hash
    for e in log[12:]:
        decided_at = "2020-01-01T00:00:00.000000+00:00" if e.seq == 13 else e.decided_at
        digest = audit.entry_hash(
            e.seq, e.epoch, decided_at, e.source, e.kind, e.input, e.decisions, prev
        )
        rewritten.append((e.seq, decided_at, prev, digest))
        prev = digest
    async with sessions() as session, session.begin():
        for seq, decided_at, prev_hash, digest in rewritten:
            await session.execute(
                update(audit_log)
                .where(audit_log.c.seq == seq)
                .values(decided_at=decided_at, prev_hash=prev_hash, hash=digest)
            )
    report = await verified(sessions, public_key=public_key)
    assert report.finding is not None
    assert (report.finding.seq, report.finding.what) == (20, "rewritten")
    async with sessions() as session:
        signed = (await session.execute(audit_checkpoints.select())).all()
    assert all(row.key_id == audit.key_id(public_key) for row in signed)


async def test_explain_and_export(sessions: Any, tmp_path: Path) -> None:
    tasks = await recorded_run(service(sessions))
    log = await entries(sessions)
    story = audit.explain(log, tasks[0], SchedulerConfig())
    kinds = [s.decision and s.decision["kind"] for s in story]
    assert "AllocationGranted" in kinds
    granted = next(s for s in story if s.decision and s.decision["kind"] == "AllocationGranted")
    assert granted.placement is not None
    fits = granted.placement["fits"]
    assert fits[0]["node_id"] == granted.decision["event"]["node"]  # type: ignore[index]
    assert all(f["scores"] for f in fits)

    rows = list(audit.decision_rows(log))
    assert audit.export_jsonl(rows, tmp_path / "d.jsonl") == len(rows)
    assert audit.export_parquet(rows, tmp_path / "d.parquet") == len(rows)
    frame = pd.read_parquet(tmp_path / "d.parquet")
    assert len(frame) == len(rows) > 0
    grants = frame[frame.decision == "AllocationGranted"]
    assert set(grants.tenant) == {"default"}
    assert grants.gpus.min() >= 1
    assert str(frame.decided_at.dtype).startswith("datetime64")
    first = json.loads((tmp_path / "d.jsonl").read_text().splitlines()[0])
    assert set(first) == set(audit.EXPORT_COLUMNS)


def _link(seq: int, prev: str, body: str) -> audit.Entry:
    decided_at = f"2027-03-02T09:00:{seq:02d}.000000+00:00"
    digest = audit.entry_hash(seq, 1, decided_at, audit.CORE, "X", body, "[]", prev)
    return audit.Entry(seq, 1, decided_at, audit.CORE, "X", body, "[]", prev, digest)


def _chain(length: int) -> list[audit.Entry]:
    chain: list[audit.Entry] = []
    prev = audit.GENESIS
    for seq in range(1, length + 1):
        chain.append(_link(seq, prev, f"input {seq}"))
        prev = chain[-1].hash
    return chain


def replace_seq(entry: audit.Entry, seq: int) -> audit.Entry:
    from dataclasses import replace

    return replace(entry, seq=seq)


async def test_the_cli_verifies_replays_explains_and_exports(
    sessions: Any, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from crater.cli.main import app

    tasks = await recorded_run(service(sessions, audit.AuditLog(snapshot_every=15)))
    monkeypatch.setenv("CRATER_DATABASE_URL", database_url)
    runner = CliRunner()

    def crater(*args: str) -> Any:
        return runner.invoke(app, ["audit", *args], catch_exceptions=False)

    checked = await asyncio.to_thread(crater, "verify", "--json")
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.output)["ok"] is True
    replayed = await asyncio.to_thread(crater, "replay", "--from", "10", "--json")
    assert replayed.exit_code == 0, replayed.output
    figures = json.loads(replayed.output.splitlines()[-1])
    assert figures["identical"]
    assert 0 < figures["compared"] < figures["events"]
    # the only snapshot at or before record 10: the state as the leader loaded it
    assert figures["started_at"] == 3
    late = await asyncio.to_thread(crater, "replay", "--from", "40", "--json")
    assert late.exit_code == 0, late.output
    from_snapshot = json.loads(late.output.splitlines()[-1])
    assert from_snapshot["identical"]
    assert 15 <= from_snapshot["started_at"] <= 40
    assert from_snapshot["events"] < figures["events"]
    parallel = await asyncio.to_thread(crater, "replay", "--jobs", "2", "--json")
    assert parallel.exit_code == 0, parallel.output
    in_two = json.loads(parallel.output.splitlines()[-1])
    assert in_two["identical"]
    assert in_two["compared"] == in_two["events"] > figures["events"] - 10
    whole = await asyncio.to_thread(crater, "replay", "--from", "40", "--from-beginning", "--json")
    from_beginning = json.loads(whole.output.splitlines()[-1])
    assert from_beginning["identical"]
    assert from_beginning["started_at"] == 0
    assert from_beginning["adopted"] == [3]  # the state loaded there, as the leader did
    assert from_beginning["compared"] == from_snapshot["compared"]
    what_if = await asyncio.to_thread(crater, "replay", "--weight", "GpuBinPack=-1000")
    assert what_if.exit_code == 1
    assert "recorded decisions of record" in what_if.output
    story = await asyncio.to_thread(crater, "explain", tasks[0])
    assert story.exit_code == 0
    assert "AllocationGranted" in story.output
    assert "fits n" in story.output
    fast = await asyncio.to_thread(crater, "explain", tasks[4], "--json")
    scan = await asyncio.to_thread(crater, "explain", tasks[4], "--json", "--scan")
    assert json.loads(fast.stdout) == json.loads(scan.stdout)
    assert any(s["placement"] for s in json.loads(fast.stdout))
    indexed = await asyncio.to_thread(crater, "index")
    assert indexed.exit_code == 0, indexed.output
    assert "indexed 0 records" in indexed.stdout  # the scheduler indexes as it records
    out = tmp_path / "decisions.parquet"
    exported = await asyncio.to_thread(crater, "export", "--out", str(out))
    assert exported.exit_code == 0, exported.output
    assert len(pd.read_parquet(out)) > 0
    async with sessions() as session, session.begin():
        await session.execute(update(audit_log).where(audit_log.c.seq == 9).values(epoch=7))
    tampered = await asyncio.to_thread(crater, "verify")
    assert tampered.exit_code == 1
    assert "record 9: altered" in tampered.output


async def test_explain_on_the_rest_api(sessions: Any, fresh_nats: Any) -> None:
    """GET /api/v1/tasks/{id}/audit: the gateway asks the scheduler on its query subject; the
    scheduler's answer here is `SchedulerService.explain` on the recorded log."""
    import httpx
    import nats
    from nats.aio.msg import Msg

    from crater.contracts import Priority, TaskType
    from crater.contracts.queries import QuerySubjects, TasksAnswer, TaskSummary
    from crater.gateway.app import GatewaySettings, build

    scheduler = service(sessions)
    tasks = await recorded_run(scheduler)
    summary = TaskSummary(
        task_id=tasks[0],
        task_type=TaskType.TRAINING,
        status=TaskStatus.SUCCEEDED,
        pool="default",
        tenant="default",
        priority=Priority.HIGH,
        gpus=1,
        reason=None,
        submitted_at=T0,
        updated_at=T0,
    )
    connection = await nats.connect(fresh_nats.url)

    async def on_tasks(msg: Msg) -> None:
        await msg.respond(TasksAnswer(tasks=[summary]).model_dump_json().encode())

    asked: list[AuditExplainQuery] = []

    async def on_explain(msg: Msg) -> None:
        asked.append(AuditExplainQuery.model_validate_json(msg.data))
        answer = await scheduler.explain(asked[-1])
        await msg.respond(answer.model_dump_json().encode())

    await connection.subscribe(QuerySubjects.TASKS, cb=on_tasks)
    await connection.subscribe(QuerySubjects.AUDIT_EXPLAIN, cb=on_explain)
    await connection.flush()
    app = build(GatewaySettings(nats_url=fresh_nats.url, query_timeout_seconds=10))
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as http,
        ):
            response = await http.get(f"/api/v1/tasks/{tasks[0]}/audit?placements=true")
    finally:
        await connection.close()
    assert response.status_code == 200, response.text
    steps = response.json()["steps"]
    kinds = [s["decision_kind"] for s in steps]
    assert kinds[0] == "AllocationGranted"
    assert "TaskEnded" in kinds or "AllocationReleased" in kinds
    assert steps[0]["placement"]["fits"][0]["node_id"] == steps[0]["decision"]["node"]
    assert all(s["epoch"] == 1 for s in steps)
    # the scheduler is given half the gateway's timeout, and says it told the whole story
    assert asked[0].budget_seconds == 5
    assert response.json()["truncated"] is False
    assert response.json()["records_read"] == len({s["seq"] for s in steps})


async def test_a_replay_crosses_a_leader_take_over(sessions: Any) -> None:
    """A new leader loads its core from the tables; the log goes on under its epoch, and the
    replay (one core from the beginning) still decides every record the same."""
    await recorded_run(service(sessions))
    second = service(sessions)
    await second.take_over(2, "second")
    at = T0 + timedelta(minutes=2)
    for i in range(6):
        event = profiled(f"after-{i}", at + timedelta(seconds=i), gpus=1 + i % 3)
        await second.handle(event, "task-profiled")
    log = await entries(sessions)
    assert [e.seq for e in log if e.source == audit.LEADER] == [1, report_seq(log)]
    assert {e.epoch for e in log if e.seq > report_seq(log)} == {2}
    replayed = audit.replay(log, SchedulerConfig())
    assert replayed.divergence is None, replayed.divergence and replayed.divergence.render()
    assert replayed.restarts == [1, report_seq(log)]
    assert (await verified(sessions)).ok


def report_seq(log: list[audit.Entry]) -> int:
    """The second leader's take-over record."""
    return [e.seq for e in log if e.source == audit.LEADER][-1]


async def test_pruned_records_leave_a_log_that_still_verifies(sessions: Any) -> None:
    """Retention drops the oldest records: the rest verifies from its first kept record's
    stored link (said in a note), and tampering there is still named."""
    await recorded_run(service(sessions))
    log = await entries(sessions)
    cut = log[20].decided_at
    async with sessions() as session, session.begin():
        dropped = await audit.prune(session, datetime.fromisoformat(cut))
    assert dropped == sum(e.decided_at < cut for e in log) > 0
    report = await verified(sessions)
    assert report.ok, report.finding
    assert report.notes
    assert "taken as stored" in report.notes[0]
    target = (await entries(sessions))[5].seq
    async with sessions() as session, session.begin():
        await session.execute(update(audit_log).where(audit_log.c.seq == target).values(kind="X"))
    finding = (await verified(sessions)).finding
    assert finding is not None
    assert (finding.seq, finding.what) == (target, "altered")


async def snapshot_states(sessions: Any, **kwargs: Any) -> dict[int, bytes]:
    async with sessions() as session:
        return await audit.read_snapshots(session, **kwargs)


async def replayed_log(sessions: Any, start: int = 1, **kwargs: Any) -> audit.ReplayReport:
    async with sessions() as session:
        return await audit.replay_log(session, SchedulerConfig(), start, **kwargs)


def write_pools(path: Path, text: str, bump: int) -> None:
    """A pools file changed on disk: its modification time moves, as an edit's would."""
    path.write_text(text)
    stamp = 1_700_000_000_000_000_000 + bump * 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


async def test_a_reload_mid_log_is_recorded_and_replays_identically(
    sessions: Any, tmp_path: Path
) -> None:
    """The pools file changes while the scheduler runs: the reload is a record, in force from
    the event it first decided; a replay with the settings' configuration (the first one)
    still decides every record the same, and one that passed the record by would not."""
    pools = tmp_path / "pools.yaml"
    write_pools(pools, "pools: {}\n", 0)
    now = [0.0]
    relay = OutboxRelay(sessions, outbox, NatsBroker("nats://127.0.0.1:1"))
    scheduler = SchedulerService(
        sessions,
        relay,
        SchedulerConfig(),
        SchedulerMetrics(CollectorRegistry()),
        watch=ConfigWatch(pools, None, interval=1, clock=lambda: now[0]),
    )
    await recorded_run(scheduler)
    write_pools(pools, "pools: [not, a, mapping]\n", 1)  # refused: said in the log
    now[0] = 10.0
    await scheduler.handle(profiled("refused-reload", T0 + timedelta(minutes=2)), "task-profiled")
    # every score but bin packing weighed to nothing: the next grants decide otherwise
    write_pools(pools, "pools: {default: {scores: {GpuBinPack: 1.0}}}\n", 2)
    now[0] = 20.0
    for i in range(2):  # room for what comes next
        topology = NodeTopologyReported(
            node=node(f"big{i}", gpus=8), occurred_at=T0 + timedelta(minutes=3)
        )
        await scheduler.handle(topology, "node-topology")
    for i in range(4):
        at = T0 + timedelta(minutes=3, seconds=i)
        await scheduler.handle(profiled(f"after-reload-{i}", at, gpus=1 + i % 2), "task-profiled")
    log = await entries(sessions)
    reloaded = [e for e in log if e.kind == audit.CONFIG_RELOADED]
    assert len(reloaded) == 1
    assert reloaded[0].source == audit.CONFIG
    assert '"GpuBinPack"' in reloaded[0].input
    refused = [e for e in log if e.kind == audit.CONFIG_REFUSED]
    assert [e.source for e in refused] == [audit.SERVICE]
    assert "pools" in json.loads(refused[0].input)["reason"]
    assert "token_secret" not in reloaded[0].input.replace("token_secret_fingerprint", "")

    replayed = audit.replay(log, SchedulerConfig(), snapshots=await snapshot_states(sessions))
    assert replayed.divergence is None, replayed.divergence and replayed.divergence.render()
    assert reloaded[0].seq in replayed.configs
    stored = await replayed_log(sessions)
    assert stored.identical, stored.problem or (stored.divergence and stored.divergence.render())

    # Without the record, the first grants after the reload decide otherwise.
    blind = audit.replay([e for e in log if e.kind != audit.CONFIG_RELOADED], SchedulerConfig())
    assert blind.divergence is not None
    assert blind.divergence.seq > reloaded[0].seq
    assert '"kind":"AllocationGranted"' in blind.divergence.recorded

    # A what-if over every configuration in force still names the first decision it changes.
    def spread(config: SchedulerConfig) -> SchedulerConfig:
        return audit.with_weight(config, "GpuBinPack", -1000.0)

    what_if = audit.replay(log, SchedulerConfig(), what_if=spread)
    assert what_if.divergence is not None
    assert "recorded decisions of record" in what_if.divergence.diff()


async def test_a_replay_from_a_snapshot_decides_as_one_from_the_beginning(sessions: Any) -> None:
    """Periodic snapshots of the core: a replay from --from starts at the one at or before it
    and decides every record from --from on as the replay from the log's beginning does (a
    node joins after the snapshots, so the state's arrays must grow on from a loaded one)."""
    scheduler = service(sessions, audit.AuditLog(snapshot_every=15))
    await recorded_run(scheduler)
    at = T0 + timedelta(minutes=2)
    await scheduler.handle(
        NodeTopologyReported(node=node("late", gpus=8), occurred_at=at), "node-topology"
    )
    for i in range(6):
        event = profiled(f"late-{i}", at + timedelta(seconds=i + 1), gpus=2 + i % 3)
        await scheduler.handle(event, "task-profiled")
    log = await entries(sessions)
    states = await snapshot_states(sessions)
    periodic = [e.seq for e in log if e.source == audit.SNAPSHOT and '"periodic"' in e.input]
    assert len(periodic) >= 3
    assert set(periodic) <= set(states)
    assert (await verified(sessions)).snapshots == len(states)

    whole = audit.replay(log, SchedulerConfig(), snapshots=states)
    assert whole.divergence is None
    for start in (periodic[0], periodic[1] + 3, log[-1].seq - 2):
        from_snapshot = audit.replay(
            log, SchedulerConfig(), start, snapshots=states, from_snapshot=True
        )
        assert from_snapshot.divergence is None, from_snapshot.divergence.render()
        assert 0 < from_snapshot.started_at <= start
        assert from_snapshot.events < whole.events
        beginning = audit.replay(log, SchedulerConfig(), start, snapshots=states)
        assert beginning.compared == from_snapshot.compared > 0
        stored = await replayed_log(sessions, start)
        assert stored.identical, stored.problem
        assert stored.started_at == from_snapshot.started_at
        assert stored.compared == from_snapshot.compared


async def test_a_snapshot_that_does_not_hash_as_recorded_is_refused(sessions: Any) -> None:
    """The bytes of a snapshot are bound to the chain by the digest in its record: changed,
    missing, or with a record altered, the replay refuses to start from it (saying why) and
    verify names it."""
    await recorded_run(service(sessions, audit.AuditLog(snapshot_every=15)))
    log = await entries(sessions)
    target = next(e.seq for e in log if e.source == audit.SNAPSHOT and '"periodic"' in e.input)
    good = (await snapshot_states(sessions))[target]
    forged = bytearray(good)
    forged[len(forged) // 2] ^= 0xFF
    async with sessions() as session, session.begin():
        await session.execute(
            update(audit_snapshots)
            .where(audit_snapshots.c.seq == target)
            .values(state=bytes(forged))
        )
    refused = await replayed_log(sessions, target + 1)
    assert not refused.identical
    assert refused.events == 0
    assert refused.problem is not None
    assert f"snapshot at record {target} refused" in refused.problem
    assert "does not hash to the digest" in refused.problem
    report = await verified(sessions)
    assert report.finding is not None
    assert (report.finding.seq, report.finding.what) == (target, "snapshot")
    # from the beginning the replay does not need it, and decides every record the same
    assert (await replayed_log(sessions, target + 1, from_snapshot=False)).identical

    async with sessions() as session, session.begin():
        await session.execute(delete(audit_snapshots).where(audit_snapshots.c.seq == target))
    missing = await replayed_log(sessions, target + 1)
    assert missing.problem is not None
    assert "missing" in missing.problem

    async with sessions() as session, session.begin():
        await session.execute(insert(audit_snapshots).values(seq=target, state=good))
        await session.execute(
            update(audit_log)
            .where(audit_log.c.seq == target)
            .values(decided_at="2020-01-01T00:00:00.000000+00:00")
        )
    altered = await replayed_log(sessions, target + 1)
    assert altered.problem is not None
    assert "no longer hashes" in altered.problem


async def test_a_replay_across_a_take_over_starts_the_new_leader_from_its_loaded_state(
    sessions: Any,
) -> None:
    """Each leader records the state it loaded: the replay goes on from it there, as the
    new leader did, rather than from its own."""
    await recorded_run(service(sessions))
    second = service(sessions)
    await second.take_over(2, "second")
    at = T0 + timedelta(minutes=2)
    for i in range(4):
        await second.handle(profiled(f"after-{i}", at + timedelta(seconds=i)), "task-profiled")
    log = await entries(sessions)
    restored = [e.seq for e in log if e.source == audit.SNAPSHOT and '"restored"' in e.input]
    loaded = [e.seq for e in log if e.kind == audit.CONFIG_LOADED]
    assert len(restored) == len(loaded) == 2
    assert all(c + 1 == s for c, s in zip(loaded, restored, strict=True))
    report = await replayed_log(sessions)
    assert report.identical, report.problem or report.divergence
    assert report.adopted == restored
    assert report.restarts == [e.seq for e in log if e.source == audit.LEADER]


async def test_after_pruning_a_replay_starts_at_a_kept_snapshot(sessions: Any) -> None:
    await recorded_run(service(sessions, audit.AuditLog(snapshot_every=15)))
    log = await entries(sessions)
    periodic = [e for e in log if e.source == audit.SNAPSHOT and '"periodic"' in e.input]
    cut = log[periodic[0].seq - 3].decided_at  # the first periodic snapshot is kept
    async with sessions() as session, session.begin():
        await audit.prune(session, datetime.fromisoformat(cut))
    states = await snapshot_states(sessions)
    assert min(states) >= periodic[0].seq
    kept = await replayed_log(sessions, periodic[0].seq + 1)
    assert kept.identical, kept.problem
    assert kept.started_at == periodic[0].seq
    gone = await replayed_log(sessions, 1, from_snapshot=False)
    assert gone.problem is not None
    assert "pruned" in gone.problem


async def test_a_replay_in_parallel_decides_every_record_and_its_stretches_must_join(
    sessions: Any, database_url: str
) -> None:
    """Stretches between periodic snapshots replayed in their own processes: every input
    decided and compared, as by one core. A snapshot at a seam forged with its digest and
    the chain after it recomputed (which only signed checkpoints catch) is named: its bytes
    do not hold the state its record describes; and with that changed too, the stretch
    before it (and one core passing it) does not reach that state there."""
    scheduler = service(sessions, audit.AuditLog(snapshot_every=15))
    await recorded_run(scheduler)
    config = SchedulerConfig()
    one = await replayed_log(sessions, from_snapshot=False)
    three = await asyncio.to_thread(
        audit.replay_in_parallel, database_url, config, jobs=3, from_snapshot=False
    )
    assert three.identical, three.problem or three.divergence
    assert (three.events, three.compared) == (one.events, one.compared)
    async with sessions() as session:
        segments = await audit.plan_segments(session, 1, None, 3, from_snapshot=False)
    assert len(segments) == 3
    seam = segments[1].base

    # The snapshot at the seam, a microsecond later: it decides the same, but is not the
    # state the first stretch ends in. Its digest and every hash after it recomputed.
    log = await entries(sessions)
    state = (await snapshot_states(sessions))[seam]
    core = audit_state.load_core(state, config)
    assert core.clock is not None
    core.clock += timedelta(microseconds=1)
    forged = audit_state.dump_core(core)
    body = json.loads(log[seam - 1].input) | {
        "digest": audit_state.digest(forged),
        "bytes": len(forged),
    }
    async with sessions() as session, session.begin():
        await session.execute(
            update(audit_snapshots).where(audit_snapshots.c.seq == seam).values(state=forged)
        )
    await rechain(sessions, log, seam, json.dumps(body, sort_keys=True, separators=(",", ":")))
    assert (await verified(sessions)).ok  # the chain holds: no key, no checkpoint to catch it
    parted = await asyncio.to_thread(
        audit.replay_in_parallel, database_url, config, jobs=3, from_snapshot=False
    )
    assert parted.problem is not None, parted
    assert f"snapshot at record {seam} refused" in parted.problem
    assert "do not hold the state its record describes" in parted.problem

    # Its record made to describe the forged state too: now the stretch before it does not
    # reach it, and one core from the beginning passing it says so as well.
    body["state"] = audit.state_fingerprint(core)
    await rechain(sessions, log, seam, json.dumps(body, sort_keys=True, separators=(",", ":")))
    parted = await asyncio.to_thread(
        audit.replay_in_parallel, database_url, config, jobs=3, from_snapshot=False
    )
    assert parted.problem is not None, parted
    assert f"record {seam}: the state replayed to here is not the one" in parted.problem
    alone = await asyncio.to_thread(
        audit.replay_in_parallel, database_url, config, jobs=1, from_snapshot=False
    )
    assert alone.problem is not None
    assert f"record {seam}: the state replayed to here" in alone.problem


async def rechain(sessions: Any, log: list[audit.Entry], seq: int, text: str) -> None:
    """Record `seq`'s input replaced by `text`, every hash from it on recomputed (what one
    who can write the database can do; only signed checkpoints catch it)."""
    prev = log[seq - 2].hash
    async with sessions() as session, session.begin():
        for e in log[seq - 1 :]:
            given = text if e.seq == seq else e.input
            digest = audit.entry_hash(
                e.seq, e.epoch, e.decided_at, e.source, e.kind, given, e.decisions, prev
            )
            await session.execute(
                update(audit_log)
                .where(audit_log.c.seq == e.seq)
                .values(input=given, prev_hash=prev, hash=digest)
            )
            prev = digest


class FailsOnPoison(SchedulerService):
    """Fault injection: the database write of one task's event fails after the core decided
    (its commit is rolled back, the core reloaded from the tables)."""

    async def _decide(self, repository: Any, event: Any, known: dict[str, str]) -> Any:
        decisions = await super()._decide(repository, event, known)
        if isinstance(event, TaskProfiled) and event.task.task_id == "poison":
            raise RuntimeError("the disk is full")
        return decisions


async def test_after_a_failed_commit_the_reloaded_state_is_recorded_and_replayed(
    sessions: Any,
) -> None:
    """A commit that fails takes back what the core decided and reloads the core from the
    tables: the next commit records that state (and the configuration it runs), and a replay
    goes on from it, deciding every record as the live core did."""
    relay = OutboxRelay(sessions, outbox, NatsBroker("nats://127.0.0.1:1"))
    scheduler = FailsOnPoison(
        sessions, relay, SchedulerConfig(), SchedulerMetrics(CollectorRegistry())
    )
    await recorded_run(scheduler)
    at = T0 + timedelta(minutes=2)
    with pytest.raises(RuntimeError, match="disk is full"):
        await scheduler.handle(profiled("poison", at), "task-profiled")
    for i in range(3):
        await scheduler.handle(profiled(f"after-{i}", at + timedelta(seconds=i)), "task-profiled")
    log = await entries(sessions)
    assert all("poison" not in e.input for e in log)  # rolled back, not in the log
    restored = [e.seq for e in log if e.source == audit.SNAPSHOT and '"restored"' in e.input]
    loaded = [e.seq for e in log if e.kind == audit.CONFIG_LOADED]
    assert len(restored) == len(loaded) == 2  # the take-over's, and the failed commit's
    assert loaded[1] + 1 == restored[1]
    assert log[restored[1]].kind == "TaskProfiled"  # before the first decision after it
    report = await replayed_log(sessions)
    assert report.identical, report.problem or report.divergence
    assert report.adopted == restored


# -- explain through the task index and the snapshots -------------------------------------------


def told(steps: list[audit.Step]) -> list[dict[str, Any]]:
    return [s.as_dict() for s in steps]


async def whole_log_story(
    sessions: Any, task_id: str, config: SchedulerConfig | None
) -> list[dict[str, Any]]:
    """What `crater audit explain --scan` tells: the whole log read, replayed from record 1."""
    async with sessions() as session:
        restored = await audit.read_snapshots(session, why=audit.RESTORED)
        log = await audit.all_entries(session)
    return told(audit.explain(log, task_id, config, restored))


async def indexed_story(sessions: Any, task_id: str, **kwargs: Any) -> audit.Explained:
    async with sessions() as session:
        return await audit.explain_log(session, task_id, **kwargs)


async def mixed_run(sessions: Any) -> list[str]:
    """Tasks placed at once and later (resources back), periodic snapshots every 15 records,
    a second leader taking over (a restored snapshot), a task reported by both."""
    tasks = await recorded_run(service(sessions, audit.AuditLog(snapshot_every=15)))
    second = service(sessions, audit.AuditLog(snapshot_every=15))
    await second.take_over(2, "second")
    at = T0 + timedelta(minutes=2)
    for i in range(5):
        event = profiled(f"after-{i}", at + timedelta(seconds=i), gpus=1 + i % 3)
        await second.handle(event, "task-profiled")
        tasks.append(event.task.task_id)
    return tasks


async def test_explain_through_the_index_tells_what_the_whole_log_tells(sessions: Any) -> None:
    """Every task's story, placements replayed from the nearest snapshot, is the story the
    whole log replayed from record 1 tells; only the task's records are read."""
    tasks = await mixed_run(sessions)
    log = await entries(sessions)
    periodic = [e.seq for e in log if e.source == audit.SNAPSHOT and '"periodic"' in e.input]
    assert len(periodic) >= 4
    config = SchedulerConfig()
    later = 0
    for task_id in [*tasks, "never-seen"]:
        for placements in (config, None):
            found = await indexed_story(sessions, task_id, config=placements)
            assert told(found.steps) == await whole_log_story(sessions, task_id, placements)
            assert not found.truncated, found.notes
            about = [e for e in log if audit._mentions(e, task_id)]
            assert found.records_read == len(about) < len(log)
        grants = [
            s for s in found.steps if s.decision and s.decision["kind"] == "AllocationGranted"
        ]
        replayed = await indexed_story(sessions, task_id, config=config)
        # a replay per placement at most (one goes on to the next when no snapshot is
        # nearer), each from a snapshot before it, never from record 1
        assert len(replayed.replayed_from) <= len({s.seq for s in grants})
        assert all(0 < base < grants[-1].seq for base in replayed.replayed_from)
        later += any(base in periodic for base in replayed.replayed_from)
    assert later > 0  # some from a periodic snapshot, not only the take-overs' restored ones


async def test_explain_of_a_long_log_reads_the_task_records_and_replays_from_a_snapshot(
    sessions: Any,
) -> None:
    """A log of about 20,000 inputs (heartbeats many per commit, as a cluster sends them,
    each commit's a run in one record): the story of a task placed near the end reads its
    own records, and its placement is replayed from the snapshot before it, not from record
    1; the answer is the one the whole log replayed gives."""
    scheduler = service(sessions, audit.AuditLog(snapshot_every=4_000))  # inputs
    await scheduler.take_over(1, "test")
    await asyncio.gather(
        *(
            scheduler.handle(
                NodeTopologyReported(node=node(f"n{i}", gpus=4), occurred_at=T0), "node-topology"
            )
            for i in range(3)
        )
    )
    await scheduler.handle(profiled("early", T0 + timedelta(seconds=1)), "task-profiled")
    at = T0 + timedelta(seconds=2)
    for batch in range(65):
        at += timedelta(milliseconds=200)
        beats = [
            NodeHealthReported(
                node_id=f"n{i % 3}", condition=NodeCondition.READY, score=100, occurred_at=at
            )
            for i in range(300)
        ]
        await asyncio.gather(*(scheduler.handle(b, "node-health") for b in beats))
        if batch == 50:
            late = profiled("late", at + timedelta(milliseconds=100), gpus=2)
            await scheduler.handle(late, "task-profiled")
    async with sessions() as session:
        records = await session.scalar(select(func.max(audit_log.c.seq)))
        periodic = (
            await session.scalars(
                select(audit_log.c.seq)
                .where(audit_log.c.source == audit.SNAPSHOT)
                .where(audit_log.c.input.contains('"periodic"'))
            )
        ).all()
        placed = await session.scalar(
            select(audit_log.c.seq).where(audit_log.c.input.contains('"task_id":"late"'))
        )
    log = await entries(sessions)
    runs = [e for e in log if e.kind == audit.HEARTBEAT_RUN]
    assert all(e.decisions == "[]" for e in runs)
    heartbeats = sum(len(json.loads(e.input)) for e in runs)
    heartbeats += sum(e.kind == "NodeHealthReported" for e in log)
    assert heartbeats == 65 * 300
    assert records < 1_000  # in a few hundred records
    before = [seq for seq in periodic if seq < placed]
    assert before
    assert before[-1] > 3
    config = SchedulerConfig()

    found = await indexed_story(sessions, "late", config=config)
    assert found.records_read == 1  # of all: its submission, which placed it
    assert [s.decision and s.decision["kind"] for s in found.steps] == ["AllocationGranted"]
    assert found.steps[0].placement is not None
    assert found.replayed_from == [before[-1]]
    # the inputs since that snapshot only: its interval at most, and a batch
    assert found.events_replayed < 4_000 + 300
    assert told(found.steps) == await whole_log_story(sessions, "late", config)

    early = await indexed_story(sessions, "early", config=config)
    assert early.records_read == 1
    assert early.replayed_from == [3]  # the state the leader loaded, not record 1
    assert early.events_replayed == 3  # the nodes' topologies
    assert early.steps[0].placement is not None

    # out of time: the story still, its placement left out and said so
    late_now = await indexed_story(sessions, "late", config=config, deadline=time.monotonic())
    assert late_now.truncated
    assert late_now.steps[0].placement is None
    assert late_now.events_replayed == 0
    assert "crater audit explain late" in late_now.notes[0]
    assert told(late_now.steps) == await whole_log_story(sessions, "late", None)

    # through the scheduler's query: bounded the same way
    answer = await scheduler.explain(AuditExplainQuery(task_id="late", budget_seconds=60))
    assert not answer.truncated
    assert answer.records_read == 1
    assert answer.replayed_from == [before[-1]]
    assert answer.steps[0].placement is not None
    none = await scheduler.explain(AuditExplainQuery(task_id="late", max_placements=0))
    assert none.truncated
    assert none.events_replayed == 0
    assert none.steps[0].placement is None
    assert "first 0 of 1" in none.notes[0]


async def test_an_old_log_without_the_index_still_explains(
    sessions: Any, database_url: str
) -> None:
    """A log recorded before the task index (migration 0011 applied to it afterwards: every
    record's `tasks_indexed` NULL), or partly by an older build since: explain finds the
    task's records by a scan and tells the same story; `crater audit index` fills the index
    in, with exactly what the scheduler writes as it records."""
    from alembic import command

    from crater.runtime.db import alembic_config

    tasks = await mixed_run(sessions)
    config = SchedulerConfig()
    stories = {t: await whole_log_story(sessions, t, config) for t in tasks}
    async with sessions() as session:
        written = (
            await session.execute(
                select(audit_tasks).order_by(audit_tasks.c.seq, audit_tasks.c.task_id)
            )
        ).all()
    assert written  # the live writer's index

    alembic = alembic_config(database_url, MIGRATIONS_DIR)
    await asyncio.to_thread(command.downgrade, alembic, "0010")
    await asyncio.to_thread(command.upgrade, alembic, "head")
    async with sessions() as session:
        unindexed = await session.scalar(
            select(func.count()).where(audit_log.c.tasks_indexed.is_(None))
        )
        assert unindexed == len(await audit.all_entries(session))
        assert not (await session.execute(select(audit_tasks))).all()
    for task_id in tasks:
        found = await indexed_story(sessions, task_id, config=config)
        assert told(found.steps) == stories[task_id]
        assert found.records_read < unindexed  # the database scanned, not us

    engine = make_engine(database_url)
    async with engine.connect() as connection:
        assert await audit.index_tasks(connection, chunk=7) == unindexed
        assert await audit.index_tasks(connection) == 0
    await engine.dispose()
    async with sessions() as session:
        backfilled = (
            await session.execute(
                select(audit_tasks).order_by(audit_tasks.c.seq, audit_tasks.c.task_id)
            )
        ).all()
    assert backfilled == written

    # an older build writing after the migration: its records unindexed among indexed ones
    async with sessions() as session, session.begin():
        middle = audit_log.c.seq.between(20, 60)
        await session.execute(update(audit_log).where(middle).values(tasks_indexed=None))
        await session.execute(delete(audit_tasks).where(audit_tasks.c.seq.between(20, 60)))
    for task_id in tasks:
        found = await indexed_story(sessions, task_id, config=config)
        assert told(found.steps) == stories[task_id]
    assert (await verified(sessions)).ok  # the index is not in the chain


async def test_pruning_drops_the_index_of_dropped_records(sessions: Any) -> None:
    await recorded_run(service(sessions))
    log = await entries(sessions)
    cut = log[30].decided_at
    async with sessions() as session, session.begin():
        await audit.prune(session, datetime.fromisoformat(cut))
    async with sessions() as session:
        first = await session.scalar(select(func.min(audit_log.c.seq)))
        kept = (await session.scalars(select(audit_tasks.c.seq))).all()
    assert kept
    assert min(kept) >= first


def test_the_index_holds_the_tasks_explain_reads() -> None:
    """A record's tasks: its input's (`task.task_id` or `task_id`) and its decisions'; an id
    the index cannot hold (too long, a NUL) is left to the scan; a non-ASCII id, as the
    events' JSON holds it, is found."""
    granted = '[{"kind":"AllocationGranted","event":{"task_id":"a"}},{"kind":"X","event":{}}]'
    assert audit.task_ids('{"task":{"task_id":"b"}}', granted) == {"a", "b"}
    assert audit.task_ids('{"task_id":"c","node_id":"n"}', "[]") == {"c"}
    assert audit.task_ids('{"node_id":"n"}', "[]") == set()
    assert audit.task_ids('{"task_id":"' + "x" * 257 + '"}', "[]") == set()
    assert audit.task_ids('{"task_id":"a\\u0000b"}', "[]") == set()
    assert not audit.indexable("")
    wide = "tâche-ü"
    body = json.dumps({"task_id": wide}, ensure_ascii=False)
    entry = audit.Entry(1, 1, "t", audit.SERVICE, "X", body, "[]", audit.GENESIS, "h")
    assert audit._mentions(entry, wide)
    assert audit.task_ids(body, "[]") == {wide}


async def test_placements_one_after_another_go_on_or_start_again_as_near_as_they_can(
    sessions: Any,
) -> None:
    """Many placements (every task's grant), in the log's order: each replayed to the state
    just before its record, going on with the replay under way where no snapshot is nearer,
    starting again from a nearer snapshot where there is one; each as the whole log tells."""
    tasks = await mixed_run(sessions)
    config = SchedulerConfig()
    expected: dict[tuple[int, str], Any] = {}
    wanted = []
    for task_id in tasks:
        whole = await whole_log_story(sessions, task_id, config)
        found = await indexed_story(sessions, task_id)  # no placements: the steps to fill
        story = audit._Story(task_id)
        async with sessions() as session:
            about, _, _ = await audit.entries_about(session, task_id)
        for entry in about:
            for step, request in story.take(entry):
                if request is not None:
                    wanted.append((step, request))
                    expected[(step.seq, task_id)] = next(
                        s["placement"] for s in whole if s["seq"] == step.seq
                    )
        assert told(found.steps) == told(story.steps)
    wanted.sort(key=lambda w: w[0].seq)
    assert len({s.seq for s, _ in wanted}) > 5
    result = audit.Explained()
    async with sessions() as session:
        await audit._placements(session, config, "all", wanted, result, None, audit._inline)
    for step, request in wanted:
        assert step.placement == expected[(step.seq, request.task.task_id)]
    log = await entries(sessions)
    snapshots = [e.seq for e in log if e.source == audit.SNAPSHOT]
    assert 1 < len(result.replayed_from) < len({s.seq for s, _ in wanted})  # went on, too
    assert set(result.replayed_from) <= set(snapshots)
    assert result.events_replayed < sum(e.source == audit.CORE for e in log)
    assert not result.notes


async def test_periodic_snapshots_keep_their_floor_of_core_time(sessions: Any) -> None:
    """Every 15 records, but never within 20 s of the core's time of the last: a large
    fleet's heartbeats would otherwise have the whole core pickled every few seconds. The
    log still verifies and replays identically from such a snapshot."""
    await recorded_run(
        service(sessions, audit.AuditLog(snapshot_every=15, snapshot_min_seconds=20))
    )
    log = await entries(sessions)
    clock = None
    taken: list[datetime] = []
    for entry in log:
        if entry.source == audit.CORE:
            at = datetime.fromisoformat(json.loads(entry.input)["occurred_at"])
            clock = at if clock is None else max(clock, at)
        elif entry.source == audit.SNAPSHOT and json.loads(entry.input)["why"] == audit.PERIODIC:
            assert clock is not None
            taken.append(clock)
    # by count alone 4, 15, 10 and 15 s apart (the same run without the floor); with it the
    # first, the third (25 s after it), and not the fourth (15 s after that)
    assert len(taken) == 2
    assert all((b - a).total_seconds() >= 20 for a, b in itertools.pairwise(taken))
    assert (await verified(sessions)).ok
    late = await replayed_log(sessions, len(log) - 5, from_snapshot=True)
    assert late.identical, late.divergence
    assert late.started_at > 3  # from a periodic snapshot, not the state as loaded


async def test_heartbeats_that_decide_nothing_share_a_record_and_replay_one_by_one(
    sessions: Any,
) -> None:
    """A pull batch of heartbeats that changed nothing is one record (a run: their array, in
    the order decided); replay feeds each to the core and checks each decided nothing; a
    heartbeat with decisions, or any other input, ends the run; a heartbeat altered inside
    the run is named by verify."""
    scheduler = service(sessions)
    await scheduler.take_over(1, "test")
    topologies = [
        (NodeTopologyReported(node=node(f"n{i}", gpus=4), occurred_at=T0), None) for i in range(3)
    ]
    await scheduler.handle_batch("node-topology", topologies)
    for second in (5, 10):
        at = T0 + timedelta(seconds=second)
        beats = [
            NodeHealthReported(
                node_id=f"n{i}", condition=NodeCondition.READY, score=90 + i, occurred_at=at
            )
            for i in range(3)
        ]
        await scheduler.handle_batch("node-health", [(b, None) for b in beats])
        await scheduler.handle(profiled(f"t{second}", at), "task-profiled")
    log = await entries(sessions)
    runs = [e for e in log if e.kind == audit.HEARTBEAT_RUN]
    assert len(runs) == 2  # one a batch, the task's record between them
    assert all(e.source == audit.CORE and e.decisions == "[]" for e in runs)
    first = json.loads(runs[0].input)
    assert [b["node_id"] for b in first] == ["n0", "n1", "n2"]
    assert [b["score"] for b in first] == [90, 91, 92]
    assert (await verified(sessions)).ok

    replayed = audit.replay(log, SchedulerConfig())
    assert replayed.divergence is None, replayed.divergence and replayed.divergence.render()
    assert replayed.events == 3 + 2 * (3 + 1)  # every heartbeat, one by one
    assert replayed.compared == replayed.events
    assert not [row for row in audit.decision_rows(log) if row["input_kind"] == audit.HEARTBEAT_RUN]

    altered = runs[1].input.replace('"score":91', '"score":11')
    async with sessions() as session, session.begin():
        await session.execute(
            update(audit_log).where(audit_log.c.seq == runs[1].seq).values(input=altered)
        )
    finding = (await verified(sessions)).finding
    assert finding is not None
    assert (finding.seq, finding.what) == (runs[1].seq, "altered")


async def test_periodic_snapshots_count_a_runs_heartbeats(sessions: Any) -> None:
    """A replay from a snapshot takes time in inputs, not records: every 20 inputs here,
    though 14 records hold the 30 of them."""
    scheduler = service(sessions, audit.AuditLog(snapshot_every=20))
    await scheduler.take_over(1, "test")
    topologies = [
        (NodeTopologyReported(node=node(f"n{i}", gpus=4), occurred_at=T0), None) for i in range(3)
    ]
    await scheduler.handle_batch("node-topology", topologies)
    for second in range(1, 9):
        at = T0 + timedelta(seconds=second)
        beats = [
            NodeHealthReported(
                node_id=f"n{i}", condition=NodeCondition.READY, score=100, occurred_at=at
            )
            for i in range(3)
        ]
        await scheduler.handle_batch("node-health", [(b, None) for b in beats])
    log = await entries(sessions)
    periodic = [e for e in log if e.source == audit.SNAPSHOT and '"periodic"' in e.input]
    assert len([e for e in log if e.kind == audit.HEARTBEAT_RUN]) == 8
    assert len(log) - len(periodic) == 14
    assert len(periodic) == 1
    late = await replayed_log(sessions, periodic[0].seq + 1, from_snapshot=True)
    assert late.identical, late.divergence
    assert late.started_at == periodic[0].seq


# -- the chain's head, carried from one commit to the next ----------------------------------------


def head_reads(sessions: Any) -> list[str]:
    """Every read of the chain's head (the last record's seq and hash) from now on."""
    reads: list[str] = []
    engine = sessions.kw["bind"]

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _watch(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "FROM scheduler_audit_log ORDER BY scheduler_audit_log.seq DESC" in " ".join(
            statement.split()
        ):
            reads.append(statement)

    return reads


async def test_a_leader_reads_the_head_once_and_chains_from_its_own_commits(
    sessions: Any,
) -> None:
    """The take-over's flush and the first decision after it read the head; every commit
    after that chains from the last one's, unread, and the log verifies and replays."""
    reads = head_reads(sessions)
    await recorded_run(service(sessions))
    assert len(reads) == 2
    assert (await verified(sessions)).ok
    report = await replayed_log(sessions)
    assert report.identical, report.problem or report.divergence


class FailsAfterFlush(audit.AuditLog):
    """Fault injection: the transaction fails after the poison task's records were chained
    and inserted (a commit that fails late): the head they moved to was never committed."""

    async def flush(self, connection: Any, core: Any = None) -> list[audit.Entry]:
        flushed = await super().flush(connection, core)
        if any('"poison"' in e.input for e in flushed):
            raise RuntimeError("the disk is full")
        return flushed


async def test_a_commit_that_fails_after_its_records_leaves_the_head_where_it_was(
    sessions: Any,
) -> None:
    """The chain goes on from the last committed record, not from the rolled-back ones,
    even when the next commit chains nothing (a redelivery) before another does."""
    scheduler = service(sessions, FailsAfterFlush())
    await recorded_run(scheduler)
    at = T0 + timedelta(minutes=2)
    with pytest.raises(RuntimeError, match="disk is full"):
        await scheduler.handle(profiled("poison", at), "task-profiled")
    again = profiled("again", at + timedelta(seconds=1))
    await scheduler.handle(again, "task-profiled")
    await scheduler.handle(again, "task-profiled")  # a redelivery: nothing recorded
    for i in range(3):
        await scheduler.handle(
            profiled(f"after-{i}", at + timedelta(seconds=2 + i)), "task-profiled"
        )
    log = await entries(sessions)
    assert all("poison" not in e.input for e in log)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert (await verified(sessions)).ok
    report = await replayed_log(sessions)
    assert report.identical, report.problem or report.divergence


async def test_the_head_moves_only_with_a_transaction_said_to_have_committed(
    sessions: Any,
) -> None:
    """The writer's contract, whoever flushes: a flush whose transaction rolled back is
    forgotten at the next `begin`, so a later transaction that flushes nothing and commits
    does not make its head the chain's."""
    log = audit.AuditLog()

    async def transaction(body: str | None, fail: bool = False) -> None:
        async with sessions() as session, session.begin():
            log.begin()
            if body is not None:
                log.add(audit.SERVICE, None, [], 1, kind="Note", body=body)
            await log.flush(session)
            if fail:
                raise RuntimeError("rolled back")
        log.committed()

    await transaction('{"n": 1}')
    with pytest.raises(RuntimeError, match="rolled back"):
        await transaction('{"n": 2}', fail=True)
    await transaction(None)  # nothing recorded (a redelivery): the head stays the first's
    await transaction('{"n": 3}')
    assert [(e.seq, json.loads(e.input)["n"]) for e in await entries(sessions)] == [(1, 1), (2, 3)]
    assert (await verified(sessions)).ok
