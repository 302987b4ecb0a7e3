"""What the audit log holds of the core besides inputs and decisions
(crater.scheduler.audit_state): its configuration as a record, rebuilt the same; its whole
state as a snapshot, loaded only through an unpickler that knows a core's classes, and only
when the record's digest and the build that wrote it match."""

from __future__ import annotations

import json
import os
import pickle
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from crater.contracts import (
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler import audit, audit_state
from crater.scheduler.adapters.pools_file import parse_pools
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.quotas import Quota
from tests.support.profiles import small_training
from tests.support.topologies import node

T0 = datetime(2026, 1, 1, tzinfo=UTC)

POOLS = """
pools:
  default:
    scores: {GpuBinPack: 0.7, Fragmentation: 0.3}
    restart_policy: {when: [failure], max_attempts: 2, backoff_seconds: 5}
  research:
    filters: [NodeReady, Pool, GpuCount, GpuMemory, CpuCores, Memory]
    scores: {FGD: 1.0}
    args: {FGD: {workload: [{gpus: 1, gpu_milli: 1000, cpu_cores: 4, popularity: 0.6}]}}
    overcommit: {cpu: 2.0}
    cohort: shared
    lend: {limit: {gpus: 4}, keep_idle: {gpus: 1}, prewarm: {lead_seconds: 120}}
    reservation_timeout_ms: 15000
"""


def configured() -> SchedulerConfig:
    return SchedulerConfig(
        token_secret=b"s" * 40,
        pools=parse_pools(POOLS),
        quotas={"search": Quota(gpus=16), "research": Quota(gpus=8, memory_mb=100_000)},
        gateway_url="https://crater.example",
        borrow_half_life_seconds=600.0,
    )


def test_a_configuration_record_rebuilds_the_same_configuration() -> None:
    config = configured()
    text = audit_state.config_json(config)
    body = json.loads(text)
    assert "token_secret" not in body  # never in the log
    assert body["token_secret_fingerprint"] == audit_state.secret_fingerprint(b"s" * 40)
    assert body["pools"]["research"]["pipeline"]["scores"][0]["args"]["workload"][0]["gpus"] == 1
    rebuilt = audit_state.config_from_json(text, b"s" * 40)
    assert audit_state.config_json(rebuilt) == text
    assert rebuilt.token_secret == b"s" * 40
    assert rebuilt.pools["research"].cohort == "shared"
    assert rebuilt.pools["research"].keep_idle_gpus == 1
    research, recorded = rebuilt.pools["research"], config.pools["research"]
    assert research.prewarm is not None
    assert research.prewarm == recorded.prewarm  # a field added later is recorded too
    assert (research.lend_limit, research.overcommit) == (recorded.lend_limit, recorded.overcommit)
    assert rebuilt.pools["default"].restart.max_attempts == 2
    assert rebuilt.quotas["research"] == Quota(gpus=8, memory_mb=100_000)
    assert [s.weight for s in rebuilt.pools["default"].pipeline.scores] == [0.7, 0.3]


def test_a_configuration_record_this_build_cannot_rebuild_is_refused_by_name() -> None:
    body = json.loads(audit_state.config_json(SchedulerConfig()))
    with pytest.raises(audit_state.ConfigRecordError, match="warp_factor"):
        audit_state.config_from_dict(body | {"warp_factor": 9}, b"x")
    with pytest.raises(audit_state.ConfigRecordError, match="format"):
        audit_state.config_from_dict(body | {"format": "crater-scheduler-config/99"}, b"x")
    broken = json.loads(json.dumps(body))
    broken["pipeline"]["scores"][0]["name"] = "NoSuchScore"
    with pytest.raises(audit_state.ConfigRecordError, match="pipeline"):
        audit_state.config_from_dict(broken, b"x")


def events() -> list[Any]:
    """Nodes, heartbeats, tasks placed and waiting, one ending; then a node joins."""
    out: list[Any] = [
        NodeTopologyReported(node=node(f"n{i}", gpus=4), occurred_at=T0) for i in range(3)
    ]
    for step in range(10):
        at = T0 + timedelta(seconds=5 * step + 1)
        out += [
            NodeHealthReported(
                node_id=f"n{i}", condition=NodeCondition.READY, score=100, occurred_at=at
            )
            for i in range(3)
        ]
        out += [small_training(f"t{step}-{k}", 1 + (step + k) % 3, at) for k in range(2)]
    out.append(
        NodeTopologyReported(node=node("late", gpus=8), occurred_at=T0 + timedelta(seconds=60))
    )
    out += [small_training(f"late-{k}", 2, T0 + timedelta(seconds=61 + k)) for k in range(4)]
    return out


def test_a_snapshot_goes_on_deciding_as_the_core_it_was_taken_of() -> None:
    config = configured()
    inputs = events()
    cut = len(inputs) // 2
    straight = Scheduler(config=config)
    decided = [audit.decisions_json(straight.handle(e)) for e in inputs]

    first = Scheduler(config=config)
    for event in inputs[:cut]:
        first.handle(event)
    allocation = next(iter(first.allocations.values()))
    ended = TaskStatusReported(
        task_id=allocation.task_id,
        status=TaskStatus.SUCCEEDED,
        allocation_id=allocation.allocation_id,
        occurred_at=T0 + timedelta(seconds=59),
    )
    state = audit_state.dump_core(first)
    assert b"s" * 40 not in zlib.decompress(state)  # the secret stays out
    loaded = audit_state.load_core(
        state, audit_state.config_from_json(audit_state.config_json(config), config.token_secret)
    )
    assert loaded.config is not config
    again = [audit.decisions_json(loaded.handle(e)) for e in inputs[cut:]]
    assert again == decided[cut:]
    # and the state it holds is its own: the original core goes on the same
    assert [audit.decisions_json(first.handle(e)) for e in inputs[cut:]] == again
    assert loaded.handle(ended) == first.handle(ended)


class _Shell:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


def test_a_snapshot_that_would_run_code_is_refused() -> None:
    config = SchedulerConfig()
    for payload, named in (
        (_Shell(), "system"),
        (audit_state.digest, "crater.scheduler.audit_state.digest"),
    ):
        forged = zlib.compress(pickle.dumps(payload))
        with pytest.raises(audit_state.SnapshotError, match=named):
            audit_state.load_core(forged, config)
    with pytest.raises(audit_state.SnapshotError, match="does not load"):
        audit_state.load_core(b"not a snapshot", config)
    with pytest.raises(audit_state.SnapshotError, match="not a core"):
        audit_state.load_core(zlib.compress(pickle.dumps({"a": 1})), config)


def snapshot_entry(core: Scheduler, seq: int = 5, **changes: Any) -> tuple[audit.Entry, bytes]:
    state = audit_state.dump_core(core)
    fingerprint = audit.state_fingerprint(core)
    body = json.loads(audit.snapshot_body(audit.PERIODIC, state, core.config, fingerprint))
    body |= changes
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    decided_at = "2026-01-01T00:00:00.000000+00:00"
    digest = audit.entry_hash(
        seq, 1, decided_at, audit.SNAPSHOT, audit.SNAPSHOT_KIND, text, "[]", "0" * 64
    )
    entry = audit.Entry(
        seq, 1, decided_at, audit.SNAPSHOT, audit.SNAPSHOT_KIND, text, "[]", "0" * 64, digest
    )
    return entry, state


def test_a_replay_refuses_a_snapshot_of_another_build_or_with_other_bytes() -> None:
    core = Scheduler(config=SchedulerConfig())
    for event in events()[:10]:
        core.handle(event)
    entry, state = snapshot_entry(core)
    assert audit.Replayer(SchedulerConfig(), 6).begin_at(entry, state)

    other, state = snapshot_entry(core, code="0123456789abcdef")
    replayer = audit.Replayer(SchedulerConfig(), 6)
    assert not replayer.begin_at(other, state)
    assert replayer.report.problem is not None
    assert "another build of the core" in replayer.report.problem
    assert not replayer.feed([(6, audit.CORE, "TaskProfiled", "{}", "[]")])

    replayer = audit.Replayer(SchedulerConfig(), 6)
    assert not replayer.begin_at(entry, state + b"x")
    assert "does not hash to the digest" in (replayer.report.problem or "")


def test_a_restored_snapshot_of_another_build_is_passed_by_not_bytes_that_do_not_match() -> None:
    """A take-over by an upgraded scheduler: a replay with this build keeps its own state
    there (and says so); bytes that are not their record's stop it."""
    core = Scheduler(config=SchedulerConfig())
    entry, state = snapshot_entry(core, code="0123456789abcdef", why=audit.RESTORED)
    row = (entry.seq, entry.source, entry.kind, entry.input, entry.decisions)
    replayer = audit.Replayer(SchedulerConfig(), snapshots={entry.seq: state})
    assert replayer.feed([row])
    assert replayer.report.adopted == []
    assert any("passed by, written by another build" in n for n in replayer.report.notes)

    entry, state = snapshot_entry(core, why=audit.RESTORED)
    row = (entry.seq, entry.source, entry.kind, entry.input, entry.decisions)
    adopted = audit.Replayer(SchedulerConfig(), snapshots={entry.seq: state})
    assert adopted.feed([row])
    assert adopted.report.adopted == [entry.seq]
    refused = audit.Replayer(SchedulerConfig(), snapshots={entry.seq: state[:-1]})
    assert not refused.feed([row])
    assert "does not hash to the digest" in (refused.report.problem or "")


def test_a_snapshot_whose_bytes_do_not_hold_the_state_its_record_describes_is_refused() -> None:
    core = Scheduler(config=SchedulerConfig())
    for event in events()[:10]:
        core.handle(event)
    entry, state = snapshot_entry(core, state="0" * 32)
    replayer = audit.Replayer(SchedulerConfig(), 6)
    assert not replayer.begin_at(entry, state)
    assert "do not hold the state its record describes" in (replayer.report.problem or "")
    # and a replay passing a periodic snapshot must have reached the state it describes
    passing = audit.Replayer(SchedulerConfig())
    rows = [(1, audit.CORE, type(e).__name__, e.model_dump_json(), "") for e in events()[:10]]
    passing.compare = False  # the decisions are not the point here
    assert passing.feed(rows)
    passing.compare = True
    snapshot = (entry.seq + 100, audit.SNAPSHOT, audit.SNAPSHOT_KIND, entry.input, "[]")
    assert not passing.feed([snapshot])
    assert "the state replayed to here is not the one" in (passing.report.problem or "")


def test_a_replay_says_when_its_token_secret_is_not_the_recorded_one() -> None:
    core = Scheduler(config=SchedulerConfig(token_secret=b"r" * 40))
    entry, state = snapshot_entry(core)
    replayer = audit.Replayer(SchedulerConfig(token_secret=b"o" * 40), 6)
    assert replayer.begin_at(entry, state)
    assert replayer.core.config.token_secret == b"o" * 40
    assert any("token secret is not the recorded run's" in n for n in replayer.report.notes)


def test_a_snapshot_that_cannot_be_taken_is_left_out_not_the_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(core: Scheduler) -> bytes:
        raise RuntimeError("no")

    monkeypatch.setattr(audit_state, "dump_core", broken)
    log = audit.AuditLog()
    log.begin()
    log.add_snapshot(audit.RESTORED, Scheduler(config=SchedulerConfig()), 1)
    assert log.staged == []


def test_a_replay_decodes_inputs_with_the_models_own_validators() -> None:
    """The inputs a replay decodes are the core's own kinds, with their own validators; a
    heartbeat run's, each of its heartbeats."""
    event: TaskProfiled = small_training("t", 1, T0)
    decode = audit._parsers()["TaskProfiled"]
    assert decode(event.model_dump_json()) == (event,)
    beats = [
        NodeHealthReported(node_id=f"n{i}", condition=NodeCondition.READY, score=100)
        for i in range(2)
    ]
    run = "[" + ",".join(b.model_dump_json() for b in beats) + "]"
    assert list(audit._parsers()[audit.HEARTBEAT_RUN](run)) == beats


def test_a_record_whose_input_does_not_decode_stops_the_replay_with_the_reason() -> None:
    replayer = audit.Replayer(SchedulerConfig())
    assert not replayer.feed([(7, audit.CORE, "NodeHealthReported", '{"node_id": 3}', "[]")])
    assert (replayer.report.problem or "").startswith("record 7: its input does not decode")
    unknown = audit.Replayer(SchedulerConfig())
    assert not unknown.feed([(8, audit.CORE, "Teleported", "{}", "[]")])
    assert "input kind 'Teleported' unknown to this build" in (unknown.report.problem or "")
