"""The audit log: every input the scheduling core decided on and every decision it made, in
the core's order, hash-chained, with signed checkpoints; and what an auditor does with it:
verify, replay, explain, export (docs/audit.md).

A record holds one input and the decisions it caused, as the JSON the core's events dump to.
`source` says who decided: `core` (fed to `Scheduler.handle`; replay feeds these again),
`service` (decided in the service layer, never by the core: a duplicate submission, a refused
report), `leader` (this process took over with this epoch and loaded the state as stored),
`config` (the core's configuration from here on: loaded with the state, or reloaded from the
pools and quotas files) and `snapshot` (the core's whole state here, `restored`: loaded from
the tables, or `periodic`; its bytes in their own table, their SHA-256 in the record).
Each record's `hash` is SHA-256 over its fields and the previous record's hash, so altering,
removing or inserting one breaks the chain at that record.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import TypeAdapter
from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from crater.contracts import (
    AllocationGranted,
    Event,
    GpuCordonRequested,
    NodeHealthReported,
    NodeTopologyReported,
    ReplicaReleaseRequested,
    TaskPhaseReported,
    TaskProfiled,
    TaskStatusReported,
    TenantBudgetExceeded,
    TenantBudgetRestored,
)
from crater.scheduler import audit_state
from crater.scheduler.adapters.orm import (
    audit_checkpoints,
    audit_log,
    audit_snapshots,
    audit_tasks,
)
from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.plugins import Pipeline
from crater.scheduler.domain.views import node_summaries

log = logging.getLogger("crater.scheduler.audit")

GENESIS = "0" * 64
CORE, SERVICE, LEADER, CONFIG, SNAPSHOT = "core", "service", "leader", "config", "snapshot"
# A configuration record's kind: in force from a restored state on (the core was built with
# it), or reloaded into the running core (`Scheduler.reconfigure`); a reload refused is a
# `service` record of kind CONFIG_REFUSED.
CONFIG_LOADED, CONFIG_RELOADED, CONFIG_REFUSED = "ConfigLoaded", "ConfigReloaded", "ConfigRefused"
SNAPSHOT_KIND = "CoreSnapshot"
RESTORED, PERIODIC = "restored", "periodic"  # why a snapshot was taken
SNAPSHOT_EVERY = 10_000  # records between periodic snapshots, by default
# Every kind of input the core takes, by the name a record stores.
INPUTS: dict[str, type[Event]] = {
    kind.__name__: kind
    for kind in (
        TaskProfiled,
        TaskStatusReported,
        NodeTopologyReported,
        NodeHealthReported,
        ReservationArmed,
        ReplicaReleaseRequested,
        TenantBudgetExceeded,
        TenantBudgetRestored,
        TaskPhaseReported,
        GpuCordonRequested,
    )
}
READ_CHUNK = 5_000
# A run of heartbeats that each decided nothing, in one record: its input is their JSON
# array, in the order decided, its decisions `[]` (each decided none); a run of one is a
# plain NodeHealthReported record. A fleet's heartbeats are most of what the core takes; a
# record each cost a commit more than the decision did.
HEARTBEAT_RUN = "NodeHealthReportedRun"
_HEARTBEATS: TypeAdapter[list[NodeHealthReported]] = TypeAdapter(list[NodeHealthReported])


def now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def decisions_json(decisions: Sequence[Event]) -> str:
    """The decisions as a record stores them, and as replay compares them: byte for byte.
    Each is its kind and the event as the bus carries it."""
    if not decisions:
        return "[]"  # most inputs (heartbeats) decide nothing
    return (
        "["
        + ",".join(
            f'{{"kind":"{type(d).__name__}","event":{d.model_dump_json()}}}' for d in decisions
        )
        + "]"
    )


def entry_hash(
    seq: int,
    epoch: int | None,
    decided_at: str,
    source: str,
    kind: str,
    input_json: str,
    decisions: str,
    prev_hash: str,
) -> str:
    body = json.dumps(
        [seq, epoch, decided_at, source, kind, input_json, decisions, prev_hash],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    seq: int
    epoch: int | None
    decided_at: str
    source: str
    kind: str
    input: str
    decisions: str
    prev_hash: str
    hash: str

    def computed_hash(self, seq: int | None = None) -> str:
        return entry_hash(
            self.seq if seq is None else seq,
            self.epoch,
            self.decided_at,
            self.source,
            self.kind,
            self.input,
            self.decisions,
            self.prev_hash,
        )

    def event(self) -> Event:
        return INPUTS[self.kind].model_validate_json(self.input)

    def decision_list(self) -> list[dict[str, Any]]:
        loaded: list[dict[str, Any]] = json.loads(self.decisions)
        return loaded

    def as_row(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "epoch": self.epoch,
            "decided_at": self.decided_at,
            "source": self.source,
            "kind": self.kind,
            "input": self.input,
            "decisions": self.decisions,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }


# -- the task index -------------------------------------------------------------------------
# Which tasks a record is about, kept beside the log (`scheduler_audit_tasks`, not part of the
# chain: derived from the records) so that explain reads a task's records, not the whole log.

TASK_ID_MAX = 256  # the longest id the index holds: a query's task_id is at most this long


def indexable(task_id: str) -> bool:
    """Whether the index can hold `task_id`; a record about another (too long, a NUL, not
    encodable) is found by scanning the log."""
    if not task_id or len(task_id) > TASK_ID_MAX or "\x00" in task_id:
        return False
    try:
        task_id.encode()
    except UnicodeEncodeError:
        return False
    return True


def task_ids(input_json: str, decisions: str) -> set[str]:
    """The tasks a stored record is about, as explain reads them: its input's task
    (`task.task_id`, or `task_id`) and each decision's `task_id`."""
    ids: set[str] = set()
    if '"task_id"' in input_json:
        try:
            event = json.loads(input_json)
        except ValueError:
            event = None
        if isinstance(event, dict):
            task = event.get("task")
            if isinstance(task, dict) and isinstance(task.get("task_id"), str):
                ids.add(task["task_id"])
            if isinstance(event.get("task_id"), str):
                ids.add(event["task_id"])
    if decisions != "[]":
        for decided in json.loads(decisions):
            decision = decided.get("event") if isinstance(decided, dict) else None
            if isinstance(decision, dict) and isinstance(decision.get("task_id"), str):
                ids.add(decision["task_id"])
    return {i for i in ids if indexable(i)}


def _event_task_ids(event: Event, decisions: Sequence[Event]) -> set[str]:
    """`task_ids` of the record `event` and `decisions` make, from the objects (the JSON
    they dump to has the same fields): no parsing in the decision's commit."""
    ids: set[str] = set()
    task_id = getattr(getattr(event, "task", None), "task_id", None)
    if isinstance(task_id, str):
        ids.add(task_id)
    for item in (event, *decisions):
        task_id = getattr(item, "task_id", None)
        if isinstance(task_id, str):
            ids.add(task_id)
    return {i for i in ids if indexable(i)}


# -- signing ----------------------------------------------------------------------------------


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:32]


def checkpoint_message(seq: int, chain_hash: str, signed_at: str) -> bytes:
    return f"crater-audit-checkpoint/v1:{seq}:{chain_hash}:{signed_at}".encode()


def load_private_key(pem: str | bytes) -> Ed25519PrivateKey:
    data = pem.encode() if isinstance(pem, str) else pem
    key = serialization.load_pem_private_key(data.strip() + b"\n", password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the audit signing key must be an Ed25519 private key (PEM, PKCS#8)")
    return key


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(pem.strip() + b"\n")
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("the audit verification key must be an Ed25519 public key (PEM)")
    return key


def generate_key_pair() -> tuple[bytes, bytes]:
    """A new signing key (PKCS#8 PEM) and its public key (PEM)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


# -- writing ----------------------------------------------------------------------------------


@dataclass
class _Staged:
    epoch: int | None
    decided_at: str
    source: str
    kind: str
    body: str
    decisions: str
    state: bytes | None = None  # a snapshot's bytes
    tasks: set[str] | None = None  # the tasks it is about (None: `task_ids` of its JSON)
    run: list[str] | None = None  # a heartbeat run's heartbeats (its body is their array)


def snapshot_body(why: str, state: bytes, config: SchedulerConfig, fingerprint: str) -> str:
    """A snapshot record's input: why it was taken, the SHA-256 that binds its bytes (kept
    in their own table) to the chain, the build of the core that wrote them, the
    configuration the core ran (a replay starting here runs it), and the state it was in
    (`state_fingerprint`: what a replay passing here must have reached)."""
    return json.dumps(
        {
            "why": why,
            "state": fingerprint,
            "digest": audit_state.digest(state),
            "bytes": len(state),
            "format": audit_state.SNAPSHOT_FORMAT,
            "code": audit_state.code_fingerprint(),
            "config": audit_state.config_dict(config),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def _snapshot(why: str, core: Scheduler, epoch: int | None) -> _Staged | None:
    """A snapshot record of `core` as it is now; None (logged) if it cannot be taken: a
    snapshot only saves replay time, it never fails the decision's commit."""
    try:
        state = audit_state.dump_core(core)
        body = snapshot_body(why, state, core.config, state_fingerprint(core))
    except Exception:
        log.exception("no %s snapshot of the core for the audit log", why)
        return None
    return _Staged(epoch, now_text(), SNAPSHOT, SNAPSHOT_KIND, body, "[]", state, set())


@dataclass
class AuditLog:
    """The writer: records gathered while a batch is decided, chained and inserted in the
    batch's own transaction (`flush`), so the log holds exactly what committed. Every
    `snapshot_every` inputs (None: never; a record each, a heartbeat run's heartbeats each)
    the core's state is recorded too, but not within
    `snapshot_min_seconds` of the core's time since the last (None: no floor): a snapshot
    costs time in proportion to the fleet, and a large fleet's heartbeats alone write
    thousands of records a second (10,000 nodes: one every 5 s, 3 s of CPU each)."""

    signing_key: Ed25519PrivateKey | None = None
    checkpoint_every: int = 1_000
    snapshot_every: int | None = SNAPSHOT_EVERY
    snapshot_min_seconds: float | None = None
    staged: list[_Staged] = field(default_factory=list)
    last_periodic: datetime | None = None  # the core's time at the last periodic snapshot
    run_extra: int = 0  # heartbeats written in runs beyond one a record, by this writer
    # The chain's head (seq, hash) as this writer's last flush left it, once its transaction
    # said it committed (`committed`): the next flush chains from it without reading the
    # table. None: read it (a first flush, or one whose commit nobody confirmed).
    head: tuple[int, str] | None = None
    flushed: tuple[int, str] | None = None

    def begin(self) -> None:
        """A transaction starts: nothing staged, nothing flushed in it yet."""
        self.staged = []
        self.flushed = None

    def committed(self) -> None:
        """The transaction begun last committed: what it flushed is the chain's head (if it
        flushed nothing, the head is as it was). Only the leader appends (its commits pass
        the fence first), so nobody moves the head meanwhile; were one to, the next record's
        seq would collide with theirs and its commit fail."""
        if self.flushed is not None:
            self.head, self.flushed = self.flushed, None

    def add(
        self,
        source: str,
        event: Event | None,
        decisions: Sequence[Event],
        epoch: int | None,
        *,
        kind: str | None = None,
        body: str | None = None,
    ) -> None:
        """One record: the decision's own time is now, when the core has just decided. A
        heartbeat that decided nothing joins the run of such heartbeats just before it (the
        run's time: its first's)."""
        if isinstance(event, NodeHealthReported) and source == CORE and not decisions:
            beat = event.model_dump_json()
            last = self.staged[-1] if self.staged else None
            if last is not None and last.run is not None and last.epoch == epoch:
                last.run.append(beat)
            else:
                run = _Staged(epoch, now_text(), CORE, HEARTBEAT_RUN, "", "[]", None, set(), [beat])
                self.staged.append(run)
            return
        kind = kind or type(event).__name__
        tasks = _event_task_ids(event, decisions) if event is not None and body is None else None
        body = body if body is not None else event.model_dump_json() if event else "{}"
        self.staged.append(
            _Staged(epoch, now_text(), source, kind, body, decisions_json(decisions), None, tasks)
        )

    def add_config(self, kind: str, config: SchedulerConfig, epoch: int | None) -> None:
        """The configuration the core runs from here on (CONFIG_LOADED, CONFIG_RELOADED)."""
        self.add(CONFIG, None, [], epoch, kind=kind, body=audit_state.config_json(config))

    def add_snapshot(self, why: str, core: Scheduler, epoch: int | None) -> None:
        """The core's whole state as it is here (`audit_state.dump_core`)."""
        staged = _snapshot(why, core, epoch)
        if staged is not None:
            self.staged.append(staged)

    async def flush(
        self, connection: AsyncConnection | AsyncSession, core: Scheduler | None = None
    ) -> list[Entry]:
        """Chain and insert what was staged; with `core` (as it is after every staged
        decision), a periodic snapshot of it follows when these records crossed a multiple of
        `snapshot_every`."""
        staged, self.staged = self.staged, []
        if not staged:
            return []
        head, self.head = self.head, None  # until this flush's commit is confirmed
        if head is None:
            last = (
                await connection.execute(
                    select(audit_log.c.seq, audit_log.c.hash)
                    .order_by(audit_log.c.seq.desc())
                    .limit(1)
                )
            ).first()
            head = (int(last[0]), str(last[1])) if last is not None else (0, GENESIS)
        seq, prev = head
        every = self.snapshot_every
        # Counted in inputs, not records: a heartbeat run counts each of its heartbeats (a
        # replay from a snapshot takes time in inputs).
        before = seq + self.run_extra
        self.run_extra += sum(len(item.run) - 1 for item in staged if item.run is not None)
        after = seq + len(staged) + self.run_extra
        if (
            core is not None
            and every
            and after // every > before // every
            and self._snapshot_due(core.clock)
        ):
            periodic = _snapshot(PERIODIC, core, staged[-1].epoch)
            if periodic is not None:
                staged.append(periodic)
                self.last_periodic = core.clock
        entries = []
        states = []
        about = []
        for item in staged:
            seq += 1
            kind, body = item.kind, item.body
            if item.run is not None:  # a run of one is the heartbeat's own record
                many = len(item.run) > 1
                kind = HEARTBEAT_RUN if many else NodeHealthReported.__name__
                body = f"[{','.join(item.run)}]" if many else item.run[0]
            fields = (
                seq,
                item.epoch,
                item.decided_at,
                item.source,
                kind,
                body,
                item.decisions,
                prev,
            )
            digest = entry_hash(*fields)
            entries.append(Entry(*fields, digest))
            if item.state is not None:
                states.append({"seq": seq, "state": item.state})
            tasks = item.tasks if item.tasks is not None else task_ids(item.body, item.decisions)
            about += [{"task_id": task_id, "seq": seq} for task_id in sorted(tasks)]
            prev = digest
        await connection.execute(
            insert(audit_log), [{**e.as_row(), "tasks_indexed": True} for e in entries]
        )
        if about:
            await connection.execute(insert(audit_tasks), about)
        if states:
            await connection.execute(insert(audit_snapshots), states)
        if self.signing_key is not None:
            for entry in entries:
                if entry.seq % self.checkpoint_every == 0:
                    await connection.execute(insert(audit_checkpoints), [self.sign(entry)])
        self.flushed = (seq, prev)
        return entries

    def _snapshot_due(self, clock: datetime | None) -> bool:
        """Whether the core's time (`clock`) is past the floor since the last periodic
        snapshot this writer took (a restart takes its first when due by count)."""
        least, last = self.snapshot_min_seconds, self.last_periodic
        if not least or last is None or clock is None:
            return True
        return (clock - last).total_seconds() >= least

    def sign(self, entry: Entry) -> dict[str, Any]:
        assert self.signing_key is not None
        signed_at = now_text()
        signature = self.signing_key.sign(checkpoint_message(entry.seq, entry.hash, signed_at))
        return {
            "seq": entry.seq,
            "hash": entry.hash,
            "signed_at": signed_at,
            "key_id": key_id(self.signing_key.public_key()),
            "signature": signature.hex(),
        }


# -- reading ----------------------------------------------------------------------------------


def _entry(row: Any) -> Entry:
    return Entry(
        int(row.seq),
        None if row.epoch is None else int(row.epoch),
        row.decided_at,
        row.source,
        row.kind,
        row.input,
        row.decisions,
        row.prev_hash,
        row.hash,
    )


async def read_entries(
    connection: AsyncConnection | AsyncSession, start: int = 1, end: int | None = None
) -> AsyncIterator[Entry]:
    """The records from `start` to `end` (inclusive), in order, read in chunks."""
    after = start - 1
    while True:
        query = select(audit_log).where(audit_log.c.seq > after).order_by(audit_log.c.seq)
        if end is not None:
            query = query.where(audit_log.c.seq <= end)
        rows = (await connection.execute(query.limit(READ_CHUNK))).all()
        for row in rows:
            yield _entry(row)
        if len(rows) < READ_CHUNK:
            return
        after = int(rows[-1].seq)


async def all_entries(
    connection: AsyncConnection | AsyncSession, start: int = 1, end: int | None = None
) -> list[Entry]:
    return [e async for e in read_entries(connection, start, end)]


# What a replay reads of a record: (seq, source, kind, input, decisions); a plain row, not an
# Entry (a replay reads hundreds of thousands).
Row = tuple[int, str, str, str, str]
REPLAY_CHUNK = 20_000


async def read_rows(
    connection: AsyncConnection | AsyncSession,
    start: int = 1,
    end: int | None = None,
    chunk: int = REPLAY_CHUNK,
) -> AsyncIterator[Sequence[Row]]:
    """The replay's columns of records `start`..`end`, in order, a chunk at a time: one
    indexed range query per chunk, rows as the driver gives them."""
    after = start - 1
    columns = (
        audit_log.c.seq,
        audit_log.c.source,
        audit_log.c.kind,
        audit_log.c.input,
        audit_log.c.decisions,
    )
    while True:
        query = select(*columns).where(audit_log.c.seq > after)
        if end is not None:
            query = query.where(audit_log.c.seq <= end)
        rows = (await connection.execute(query.order_by(audit_log.c.seq).limit(chunk))).all()
        if rows:
            yield rows  # type: ignore[misc]  # SQLAlchemy's Row is the tuple above
        if len(rows) < chunk:
            return
        after = int(rows[-1][0])


async def read_snapshots(
    connection: AsyncConnection | AsyncSession,
    start: int = 1,
    end: int | None = None,
    why: str | None = None,
) -> dict[int, bytes]:
    """The snapshots' bytes by record, from `start` to `end`; `why`: only those taken for it
    (RESTORED, PERIODIC)."""
    query = select(audit_snapshots.c.seq, audit_snapshots.c.state).where(
        audit_snapshots.c.seq >= start
    )
    if end is not None:
        query = query.where(audit_snapshots.c.seq <= end)
    if why is not None:
        query = query.join(audit_log, audit_log.c.seq == audit_snapshots.c.seq).where(
            audit_log.c.input.contains(f'"why":"{why}"')
        )
    rows = (await connection.execute(query)).all()
    return {int(seq): bytes(state) for seq, state in rows}


async def snapshot_at_or_before(
    connection: AsyncConnection | AsyncSession, seq: int, *, this_build: bool = False
) -> tuple[Entry, bytes | None] | None:
    """The latest snapshot record at or before record `seq`, with its bytes (None: they are
    missing); None when there is none. `this_build`: only one this build of the core can
    load (its record names this format and code)."""
    query = select(audit_log.c.seq).where(audit_log.c.seq <= seq, audit_log.c.source == SNAPSHOT)
    if this_build:
        for said in (
            f'"code":"{audit_state.code_fingerprint()}"',
            f'"format":"{audit_state.SNAPSHOT_FORMAT}"',
        ):
            query = query.where(audit_log.c.input.contains(said, autoescape=True))
    found = await connection.scalar(query.order_by(audit_log.c.seq.desc()).limit(1))
    if found is None:
        return None
    row = (await connection.execute(select(audit_log).where(audit_log.c.seq == found))).one()
    state = await connection.scalar(
        select(audit_snapshots.c.state).where(audit_snapshots.c.seq == found)
    )
    return _entry(row), None if state is None else bytes(state)


async def seq_at(connection: AsyncConnection | AsyncSession, moment: datetime) -> int:
    """The first record decided at or after `moment` (times are UTC ISO strings)."""
    text = moment.astimezone(UTC).isoformat(timespec="microseconds")
    found = await connection.scalar(
        select(audit_log.c.seq)
        .where(audit_log.c.decided_at >= text)
        .order_by(audit_log.c.seq)
        .limit(1)
    )
    return int(found) if found is not None else 0


async def prune(connection: AsyncConnection | AsyncSession, before: datetime) -> int:
    """Drop the records decided before `before` (retention), keeping the checkpoints: a
    verify from the first kept record starts at its stored `prev_hash`."""
    text = before.astimezone(UTC).isoformat(timespec="microseconds")
    result = await connection.execute(delete(audit_log).where(audit_log.c.decided_at < text))
    # the snapshots of dropped records go with them: a replay starts at a kept one
    first = await connection.scalar(select(audit_log.c.seq).order_by(audit_log.c.seq).limit(1))
    for table in (audit_snapshots, audit_tasks):
        dropped = delete(table)
        if first is not None:
            dropped = dropped.where(table.c.seq < first)
        await connection.execute(dropped)
    return int(getattr(result, "rowcount", 0) or 0)


INDEX_CHUNK = 5_000


async def index_tasks(
    connection: AsyncConnection,
    chunk: int = INDEX_CHUNK,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Fill in the task index for the records written without it (before migration 0011, or
    by an older build since), `chunk` records per transaction, committed as it goes (a
    running scheduler goes on writing meanwhile). Returns how many records it indexed."""
    done = 0
    while True:
        rows = (
            await connection.execute(
                select(audit_log.c.seq, audit_log.c.input, audit_log.c.decisions)
                .where(audit_log.c.tasks_indexed.is_(None))
                .order_by(audit_log.c.seq)
                .limit(chunk)
            )
        ).all()
        if not rows:
            return done
        seqs = [int(row.seq) for row in rows]
        about = [
            {"task_id": task_id, "seq": int(row.seq)}
            for row in rows
            for task_id in sorted(task_ids(row.input, row.decisions))
        ]
        # what a run cut short left, and the records' flags, in one transaction
        await connection.execute(delete(audit_tasks).where(audit_tasks.c.seq.in_(seqs)))
        if about:
            await connection.execute(insert(audit_tasks), about)
        await connection.execute(
            update(audit_log).where(audit_log.c.seq.in_(seqs)).values(tasks_indexed=True)
        )
        await connection.commit()
        done += len(rows)
        if progress is not None:
            progress(done)


# -- verify -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    seq: int
    what: str  # altered | removed | inserted | signature | rewritten | snapshot
    detail: str

    def __str__(self) -> str:
        return f"record {self.seq}: {self.what}: {self.detail}"


@dataclass
class VerifyReport:
    records: int = 0
    first: int | None = None
    last: int | None = None
    checkpoints: int = 0
    snapshots: int = 0
    finding: Finding | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.finding is None


def verify_chain(
    entries: Iterable[Entry], prev_hash: str | None = None, prev_seq: int | None = None
) -> VerifyReport:
    """Walk the chain; the first record altered, removed or inserted is named. `prev_hash`,
    `prev_seq`: the record before the range (None: the range starts the log, or its first
    record's stored link is taken as given: pruned)."""
    report = VerifyReport()
    before: Entry | None = None  # the record two back, for an inserted one
    prev: Entry | None = None
    for entry in entries:
        report.records += 1
        report.first = report.first or entry.seq
        report.last = entry.seq
        if prev is None and prev_seq is None:
            if entry.seq == 1 and entry.prev_hash != GENESIS:
                report.finding = Finding(1, "altered", "the first record does not start the chain")
                return report
            if entry.seq != 1:
                report.notes.append(
                    f"the range starts at record {entry.seq}, its link to record "
                    f"{entry.seq - 1} is taken as stored (pruned, or check a checkpoint)"
                )
            expected_seq, expected_prev = entry.seq, entry.prev_hash
        elif prev is None:
            assert prev_seq is not None
            assert prev_hash is not None
            expected_seq, expected_prev = prev_seq + 1, prev_hash
        else:
            expected_seq, expected_prev = prev.seq + 1, prev.hash
        intact = entry.computed_hash() == entry.hash
        if entry.seq > expected_seq:
            missing = (
                f"record {expected_seq}"
                if entry.seq == expected_seq + 1
                else f"records {expected_seq}..{entry.seq - 1}"
            )
            report.finding = Finding(expected_seq, "removed", f"{missing} missing")
            return report
        if entry.prev_hash != expected_prev:
            if before is not None and prev is not None and entry.prev_hash == before.hash:
                report.finding = Finding(
                    prev.seq,
                    "inserted",
                    f"record {entry.seq} links to record {before.seq}: the record between "
                    "them was not in the chain",
                )
            elif not intact and _renumbered(entry) > 0:
                report.finding = Finding(
                    entry.seq,
                    "removed",
                    f"record {entry.seq} was record {entry.seq + _renumbered(entry)}: "
                    "the records before it were removed and the rest renumbered",
                )
            elif prev is not None:
                report.finding = Finding(
                    prev.seq,
                    "altered",
                    f"its hash was recomputed after a change: record {entry.seq} links to "
                    f"{entry.prev_hash[:16]}…, it hashes to {prev.hash[:16]}…",
                )
            else:
                report.finding = Finding(
                    entry.seq, "altered", "does not link to the record before the range"
                )
            return report
        if not intact:
            shift = _renumbered(entry)
            if shift < 0:
                report.finding = Finding(
                    entry.seq + shift,
                    "inserted",
                    f"record {entry.seq} was record {entry.seq + shift}: a record was "
                    "inserted before it and the rest renumbered",
                )
            else:
                report.finding = Finding(
                    entry.seq,
                    "altered",
                    f"its content no longer hashes to its stored hash {entry.hash[:16]}…",
                )
            return report
        before, prev = prev, entry
    return report


def _renumbered(entry: Entry, reach: int = 64) -> int:
    """By how much `entry`'s seq was moved, if its hash holds for another seq (0: not)."""
    for shift in range(1, reach):
        if entry.computed_hash(entry.seq + shift) == entry.hash:
            return shift
        if entry.seq - shift >= 1 and entry.computed_hash(entry.seq - shift) == entry.hash:
            return -shift
    return 0


def verify_checkpoints(
    checkpoints: Iterable[Any], hashes: dict[int, str], public_key: Ed25519PublicKey | None
) -> tuple[int, Finding | None]:
    """Each checkpoint's signature (with `public_key`), and that the record it names still
    hashes as signed: a chain rewritten whole is caught here."""
    count = 0
    for row in checkpoints:
        count += 1
        if public_key is not None:
            if row.key_id != key_id(public_key):
                return count, Finding(
                    int(row.seq), "signature", f"checkpoint signed by another key ({row.key_id})"
                )
            try:
                public_key.verify(
                    bytes.fromhex(row.signature),
                    checkpoint_message(int(row.seq), row.hash, row.signed_at),
                )
            except (InvalidSignature, ValueError):
                return count, Finding(int(row.seq), "signature", "the checkpoint's signature fails")
        stored = hashes.get(int(row.seq))
        if stored is not None and stored != row.hash:
            return count, Finding(
                int(row.seq),
                "rewritten",
                "the chain up to this record was rewritten: its hash is not the one signed",
            )
    return count, None


async def verify(
    connection: AsyncConnection | AsyncSession,
    start: int = 1,
    end: int | None = None,
    public_key: Ed25519PublicKey | None = None,
) -> VerifyReport:
    prev_hash: str | None = None
    prev_seq: int | None = None
    if start > 1:
        row = (
            await connection.execute(select(audit_log).where(audit_log.c.seq == start - 1))
        ).first()
        if row is not None:
            prev_hash, prev_seq = row.hash, start - 1
    entries = await all_entries(connection, start, end)
    hashes = {e.seq: e.hash for e in entries}
    report = verify_chain(entries, prev_hash, prev_seq)
    query = select(audit_checkpoints).where(audit_checkpoints.c.seq >= start)
    if end is not None:
        query = query.where(audit_checkpoints.c.seq <= end)
    rows = (await connection.execute(query.order_by(audit_checkpoints.c.seq))).all()
    report.checkpoints, signed = verify_checkpoints(rows, hashes, public_key)
    if public_key is None and rows:
        report.notes.append("checkpoint signatures not checked: no public key given")
    states = await read_snapshots(connection, start, end)
    report.snapshots, damaged = verify_snapshots(entries, states)
    for found in (signed, damaged):
        if found is not None and (report.finding is None or found.seq < report.finding.seq):
            report.finding = found
    return report


def snapshot_refusal(body: str, state: bytes | None) -> str | None:
    """Why a snapshot record's bytes cannot be trusted (None: they can): missing, or not the
    bytes whose SHA-256 its chained record (`body`: its input) holds."""
    try:
        recorded = json.loads(body)["digest"]
    except (ValueError, KeyError, TypeError):
        return "its record holds no digest"
    if state is None:
        return "its state is missing from scheduler_audit_snapshots"
    if audit_state.digest(state) != recorded:
        return (
            f"its state does not hash to the digest its chained record holds "
            f"({audit_state.digest(state)[:16]}… is not {str(recorded)[:16]}…)"
        )
    return None


def verify_snapshots(
    entries: Iterable[Entry], states: dict[int, bytes]
) -> tuple[int, Finding | None]:
    """Each snapshot record's bytes against the digest it holds; a stored state no snapshot
    record names is named too."""
    count = 0
    named: set[int] = set()
    for entry in entries:
        if entry.source != SNAPSHOT:
            continue
        count += 1
        named.add(entry.seq)
        why = snapshot_refusal(entry.input, states.get(entry.seq))
        if why is not None:
            return count, Finding(entry.seq, "snapshot", why)
    for seq in sorted(set(states) - named):
        return count, Finding(seq, "snapshot", "a stored state that no snapshot record names")
    return count, None


# -- replay -----------------------------------------------------------------------------------


@dataclass
class Divergence:
    seq: int
    kind: str
    input: str
    recorded: str
    replayed: str
    state: str

    def diff(self) -> str:
        lines = difflib.unified_diff(
            _pretty(self.recorded),
            _pretty(self.replayed),
            fromfile=f"recorded decisions of record {self.seq}",
            tofile="replayed decisions",
            lineterm="",
        )
        return "\n".join(lines)

    def render(self) -> str:
        return "\n".join(
            [
                f"record {self.seq} ({self.kind}) decided differently on replay",
                "input:",
                json.dumps(json.loads(self.input), indent=2, sort_keys=True),
                "state before it:",
                self.state,
                "diff:",
                self.diff(),
            ]
        )


def _pretty(decisions: str) -> list[str]:
    return json.dumps(json.loads(decisions), indent=2, sort_keys=True).splitlines()


@dataclass
class ReplayReport:
    events: int = 0  # inputs fed to the core
    compared: int = 0  # of them, decisions compared (inside --from..--to)
    seconds: float = 0.0  # reading the records included
    divergence: Divergence | None = None
    restarts: list[int] = field(default_factory=list)  # `leader` records passed
    started_at: int = 0  # the snapshot record it started from; 0: the log's beginning
    configs: list[int] = field(default_factory=list)  # configuration records applied
    adopted: list[int] = field(default_factory=list)  # restored snapshots taken on the way
    problem: str | None = None  # why it could not go on (not a decision that differs)
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.divergence is None and self.problem is None

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def _parsers() -> dict[str, Callable[[str], Sequence[Event]]]:
    """Each input kind's JSON decoder to the record's events (one; a heartbeat run's all):
    the model's own validator, called without the classmethod around it (a replay decodes
    every record)."""

    def one(kind: type[Event]) -> Callable[[str], Sequence[Event]]:
        validate = kind.__pydantic_validator__.validate_json
        return lambda body: (validate(body),)

    parsers = {name: one(kind) for name, kind in INPUTS.items()}
    parsers[HEARTBEAT_RUN] = _HEARTBEATS.validate_json
    return parsers


class Replayer:
    """One replay: the production core fed the recorded `core` inputs in order, from a fresh
    core or a snapshot, the configuration records applied where they were, the restored
    snapshots (a take-over, a failed commit) adopted where the live core was reloaded; from
    `start` to `end` every decision list compared with the record, byte for byte.

    `config`: the replay's own settings; they give the token secret (never recorded) and the
    configuration until a record gives one. `what_if`: applied to every configuration in
    force (a what-if replay, whose decisions are expected to differ). `snapshots`: the
    restored snapshots' bytes by record; None: they are passed by, the core carrying its own
    state (said in a note)."""

    def __init__(
        self,
        config: SchedulerConfig,
        start: int = 1,
        end: int | None = None,
        *,
        what_if: Callable[[SchedulerConfig], SchedulerConfig] | None = None,
        snapshots: Mapping[int, bytes] | None = None,
        progress: Callable[[int], None] | None = None,
        every: int = 10_000,
        compare: bool = True,
    ) -> None:
        self.settings = config
        self.what_if = what_if
        self.in_force = what_if(config) if what_if is not None else config
        self.core = Scheduler(config=self.in_force)
        self.start, self.end = start, end
        self.snapshots = snapshots
        self.progress, self.every = progress, every
        self.compare = compare
        self.report = ReplayReport()
        self.finished = False
        self.parse = _parsers()

    # -- where it starts --------------------------------------------------------------------

    def begin_at(self, entry: Entry, state: bytes | None) -> bool:
        """Start from snapshot record `entry` (the core as it was there) instead of a fresh
        core. False, with the reason in `report.problem`, when its record or bytes cannot be
        trusted or loaded: a replay never goes on from a state it cannot vouch for."""
        why = None
        if entry.source != SNAPSHOT:
            why = f"record {entry.seq} is not a snapshot record"
        elif entry.computed_hash() != entry.hash:
            why = "its record no longer hashes to its stored hash (crater audit verify)"
        else:
            why = self._adopt(entry.seq, entry.input, state)
        if why is not None:
            return self._stop(f"snapshot at record {entry.seq} refused: {why}")
        self.report.started_at = entry.seq
        self.report.adopted.clear()
        return True

    def _adopt(
        self, seq: int, body: str, state: bytes | None, *, foreign_ok: bool = False
    ) -> str | None:
        """The core from snapshot record `seq`: why not, or None once it runs. `foreign_ok`:
        a snapshot of another build of the core (a take-over by an upgraded scheduler) is
        passed by, the core keeping its own state (said in a note), rather than refused;
        bytes that do not match their record are refused always."""
        why = snapshot_refusal(body, state)
        if why is not None:
            return why
        assert state is not None
        meta = json.loads(body)
        foreign = _foreign(meta)
        if foreign is not None:
            if not foreign_ok:
                return (
                    f"{foreign}: replay from the log's beginning (--from-beginning) or with "
                    "the build that wrote it"
                )
            self.report.notes.append(
                f"restored snapshot at record {seq} passed by, {foreign}; the core kept its "
                "own state"
            )
            if audit_state.config_json(self.core.config) != audit_state.config_json(self.in_force):
                self.core.reconfigure(self.in_force)  # the one it was loaded with there
            return None
        try:
            config = self._config(meta["config"])
            core = audit_state.load_core(state, config)
        except (audit_state.SnapshotError, audit_state.ConfigRecordError, KeyError) as error:
            return str(error)
        if meta.get("state") not in (None, state_fingerprint(core)):
            return (
                "its bytes do not hold the state its record describes (clock, nodes and what "
                "is free, waiting tasks, allocations)"
            )
        if self.what_if is not None:
            core.reconfigure(config)  # a what-if: every waiting task judged again under it
        self.core, self.in_force = core, config
        self.report.adopted.append(seq)
        return None

    def _config(self, recorded: dict[str, Any]) -> SchedulerConfig:
        """A recorded configuration, with the replay's secret and what-if."""
        theirs = recorded.get("token_secret_fingerprint")
        ours = audit_state.secret_fingerprint(self.settings.token_secret)
        if theirs is not None and theirs != ours:
            note = (
                "the token secret is not the recorded run's (fingerprint "
                f"{theirs}, this one {ours}): every grant's token will differ; set "
                "CRATER_SCHEDULER_TOKEN_SECRET as the scheduler had it"
            )
            if note not in self.report.notes:
                self.report.notes.append(note)
        config = audit_state.config_from_dict(recorded, self.settings.token_secret)
        return self.what_if(config) if self.what_if is not None else config

    def _stop(self, problem: str) -> bool:
        self.report.problem = problem
        self.finished = True
        return False

    # -- the records --------------------------------------------------------------------------

    def feed(self, rows: Iterable[Row]) -> bool:
        """Replay `rows` (the records after the last one fed, in order). False once it ended:
        past `end`, at a difference, or stopped by a problem."""
        if self.finished:
            return False
        report, core, parse = self.report, self.core, self.parse
        start, end, compare = self.start, self.end, self.compare
        progress, every = self.progress, self.every
        events, compared = report.events, report.compared
        try:
            for seq, source, kind, body, recorded in rows:
                if end is not None and seq > end:
                    self.finished = True
                    return False
                if source == CORE:
                    decode = parse.get(kind)
                    if decode is None:
                        return self._stop(
                            f"record {seq}: input kind {kind!r} unknown to this build"
                        )
                    try:
                        inputs = decode(body)
                    except ValueError as error:  # altered, or another build's contract
                        return self._stop(f"record {seq}: its input does not decode: {error}")
                    for event in inputs:  # a heartbeat run's each decided nothing
                        decisions = core.handle(event)
                        events += 1
                        if compare and seq >= start:
                            decided = decisions_json(decisions)  # serialised to compare only
                            compared += 1
                            if decided != recorded:
                                shown = body if len(inputs) == 1 else event.model_dump_json()
                                report.divergence = Divergence(
                                    seq, kind, shown, recorded, decided, ""
                                )
                                self.finished = True
                                return False
                        if progress is not None and events % every == 0:
                            progress(events)
                elif source != SERVICE:
                    if not self._apply(seq, source, kind, body):
                        return False
                    core = self.core
        finally:
            report.events, report.compared = events, compared
        return True

    def _apply(self, seq: int, source: str, kind: str, body: str) -> bool:
        """A record other than an input: a take-over, a configuration, a snapshot."""
        if source == LEADER:
            self.report.restarts.append(seq)
        elif source == CONFIG:
            try:
                config = self._config(json.loads(body))
            except audit_state.ConfigRecordError as error:
                return self._stop(f"record {seq}: its configuration cannot be rebuilt: {error}")
            if kind == CONFIG_RELOADED or (
                self.snapshots is None
                and audit_state.config_json(config) != audit_state.config_json(self.in_force)
            ):
                # A reload, as the live core took it; or, with no restored snapshot to take
                # the core from, the configuration it was built with at a restart.
                refused = self.core.reconfigure(config)
                if refused is not None:
                    return self._stop(f"record {seq}: its configuration is refused: {refused}")
            self.in_force = config
            self.report.configs.append(seq)
        elif source == SNAPSHOT and f'"why":"{PERIODIC}"' in body:
            # The live core's state here: the replay must have reached the same one.
            recorded = json.loads(body).get("state")
            checked = self.compare and seq >= self.start and recorded is not None
            if checked and state_fingerprint(self.core) != recorded:
                return self._stop(
                    f"record {seq}: the state replayed to here is not the one the scheduler "
                    "recorded in its snapshot (clock, nodes and what is free, waiting "
                    "tasks, allocations): its core changed otherwise than by the inputs "
                    "the log holds"
                )
        elif source == SNAPSHOT and f'"why":"{RESTORED}"' in body:
            if self.snapshots is None:
                note = "restored snapshots passed by (no bytes given): the core kept its own state"
                if note not in self.report.notes:
                    self.report.notes.append(note)
                return True
            why = self._adopt(seq, body, self.snapshots.get(seq), foreign_ok=True)
            if why is not None:
                return self._stop(f"restored snapshot at record {seq} refused: {why}")
        return True


def _foreign(meta: dict[str, Any]) -> str | None:
    """Why a snapshot record's bytes are not this build's to load (None: they are)."""
    if meta.get("format") != audit_state.SNAPSHOT_FORMAT:
        return f"format {meta.get('format')!r}: this build reads {audit_state.SNAPSHOT_FORMAT}"
    if meta.get("code") != audit_state.code_fingerprint():
        return (
            f"written by another build of the core (code {meta.get('code')}, this one "
            f"{audit_state.code_fingerprint()})"
        )
    return None


def describe(core: Scheduler) -> str:
    """The state a core is in, readable: clock, nodes and what is free on them, the waiting
    tasks, the allocations."""
    lines = [f"clock {core.clock.isoformat() if core.clock else '-'}"]
    for node in node_summaries(core.cluster):
        lines.append(f"  node {node.model_dump_json()}")
    for task_id in core.pending:
        lines.append(f"  waiting {task_id}")
    for task_id, allocation in core.allocations.items():
        nodes = sorted({m.node for m in allocation.members()})
        lines.append(f"  holds {task_id} on {', '.join(nodes)}")
    return "\n".join(lines)


def _rows(entries: Iterable[Entry], after: int = 0) -> Iterator[Row]:
    return ((e.seq, e.source, e.kind, e.input, e.decisions) for e in entries if e.seq > after)


def replay(
    entries: Iterable[Entry],
    config: SchedulerConfig,
    start: int = 1,
    end: int | None = None,
    progress: Callable[[int], None] | None = None,
    every: int = 10_000,
    *,
    what_if: Callable[[SchedulerConfig], SchedulerConfig] | None = None,
    snapshots: Mapping[int, bytes] | None = None,
    from_snapshot: bool = False,
) -> ReplayReport:
    """Replay `entries` (records in order, from the log's beginning) through the production
    core; from record `start` on, each decision list must equal the recorded one byte for
    byte. Stops at the first difference, with the state that led to it. With `snapshots`
    (record -> bytes, `read_snapshots`), restored ones are adopted where the live core was
    reloaded, and with `from_snapshot` the replay starts at the latest snapshot at or before
    `start` rather than at the beginning."""
    listed = list(entries)
    clock = time.perf_counter()
    base = _base(listed, start, snapshots) if from_snapshot and snapshots else None

    def replayer(until: int | None = end, compare: bool = True) -> Replayer:
        found = Replayer(
            config,
            start,
            until,
            what_if=what_if,
            snapshots=snapshots,
            progress=progress if compare else None,
            every=every,
            compare=compare,
        )
        if base is not None and snapshots is not None:
            found.begin_at(base, snapshots.get(base.seq))
        return found

    run = replayer()
    run.feed(_rows(listed, run.report.started_at))
    report = run.report
    report.seconds = time.perf_counter() - clock
    if report.divergence is not None:  # the state before it: the same replay, one short
        before = replayer(report.divergence.seq - 1, compare=False)
        before.feed(_rows(listed, before.report.started_at))
        report.divergence.state = describe(before.core)
    return report


def _base(entries: Sequence[Entry], start: int, snapshots: Mapping[int, bytes]) -> Entry | None:
    """The latest snapshot record at or before `start` whose bytes are at hand."""
    found = None
    for entry in entries:
        if entry.seq > start:
            break
        if entry.source == SNAPSHOT and entry.seq in snapshots:
            found = entry
    return found


async def replay_log(
    connection: AsyncConnection | AsyncSession,
    config: SchedulerConfig,
    start: int = 1,
    end: int | None = None,
    *,
    what_if: Callable[[SchedulerConfig], SchedulerConfig] | None = None,
    from_snapshot: bool = True,
    progress: Callable[[int], None] | None = None,
    every: int = 10_000,
    base: int | None = None,
) -> ReplayReport:
    """`replay` on the stored log, streamed: from the latest snapshot at or before `start`
    (`from_snapshot`; else from the log's first record), or from the snapshot at record
    `base` (0: the log's first record), the records read a chunk at a time up to `end`. The
    time reported includes the reading."""
    clock = time.perf_counter()
    if base is None:
        found = await snapshot_at_or_before(connection, start) if from_snapshot else None
    else:
        found = await snapshot_at_or_before(connection, base) if base else None
        if found is not None and found[0].seq != base:
            found = None
    first = found[0].seq if found is not None else 0
    restored = await read_snapshots(connection, first + 1, end, why=RESTORED)

    def replayer(until: int | None, compare: bool) -> Replayer:
        made = Replayer(
            config,
            start,
            until,
            what_if=what_if,
            snapshots=restored,
            progress=progress if compare else None,
            every=every,
            compare=compare,
        )
        if base:
            if found is None:
                made._stop(f"no snapshot at record {base} to start from")
            else:
                made.begin_at(*found)
        elif found is not None:
            made.begin_at(*found)
        return made

    async def run(replaying: Replayer) -> None:
        if replaying.finished:
            return
        if found is None:
            oldest = await connection.scalar(select(func.min(audit_log.c.seq)))
            if oldest is not None and oldest > 1:
                replaying._stop(
                    f"the log begins at record {oldest} (the records before it were pruned) "
                    "and no snapshot at or before --from is left to start from"
                )
                return
        async for chunk in read_rows(connection, first + 1, end):
            if not replaying.feed(chunk):
                return

    replaying = replayer(end, True)
    await run(replaying)
    report = replaying.report
    report.seconds = time.perf_counter() - clock
    if report.divergence is not None:
        before = replayer(report.divergence.seq - 1, False)
        await run(before)
        report.divergence.state = describe(before.core)
    return report


def state_fingerprint(core: Scheduler) -> str:
    """The state a core is in, as `describe` writes it, hashed: a snapshot record holds its
    core's, a replay passing it must have reached the same, and the bytes it holds must
    load into the same."""
    return hashlib.sha256(describe(core).encode()).hexdigest()[:32]


# -- replay in parallel -------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A stretch of a replay one process runs: from the snapshot at record `base` (0: the
    log's first record) to record `last` (None: the log's end)."""

    base: int
    last: int | None


async def plan_segments(
    connection: AsyncConnection | AsyncSession,
    start: int,
    end: int | None,
    jobs: int,
    from_snapshot: bool = True,
) -> list[Segment]:
    """The replay of `start`..`end`, from the snapshot at or before `start` (`from_snapshot`)
    or the log's first record, cut at periodic snapshots into at most `jobs` stretches of
    about as many records each (one when there is no snapshot to cut at)."""
    found = await snapshot_at_or_before(connection, start) if from_snapshot else None
    first = found[0].seq if found is not None else 0
    if jobs <= 1:
        return [Segment(first, end)]
    query = select(audit_log.c.seq).where(
        audit_log.c.seq > first,
        audit_log.c.source == SNAPSHOT,
        audit_log.c.input.contains(f'"why":"{PERIODIC}"'),
    )
    if end is not None:
        query = query.where(audit_log.c.seq <= end)
    cuts = [int(seq) for seq in (await connection.scalars(query.order_by(audit_log.c.seq))).all()]
    last = end or await connection.scalar(select(func.max(audit_log.c.seq))) or first
    bases = [first]
    for k in range(1, jobs):
        aim = first + (last - first) * k / jobs
        later = [c for c in cuts if c > bases[-1]]
        if later:
            bases.append(min(later, key=lambda c: (abs(c - aim), c)))
    # each stretch ends at the next one's snapshot record, included: there it must have
    # reached the state that record holds, which the next one starts from
    lasts: list[int | None] = [*bases[1:], end]
    return [Segment(b, e) for b, e in zip(bases, lasts, strict=True)]


def replay_in_parallel(
    database_url: str,
    config: SchedulerConfig,
    start: int = 1,
    end: int | None = None,
    *,
    jobs: int = 1,
    what_if: Callable[[SchedulerConfig], SchedulerConfig] | None = None,
    from_snapshot: bool = True,
    progress: Callable[[int], None] | None = None,
    every: int = 10_000,
) -> ReplayReport:
    """`replay_log`, its stretch between periodic snapshots each in its own process (forked:
    the configuration and what-if travel with it), at most `jobs` at once. Every input still
    goes through the production core and every decision is compared; each stretch but the
    first starts from the live core's snapshot where it begins, whose bytes must load into
    the state its record describes, and the stretch before it must have reached that same
    state there (clock, nodes and what is free, waiting tasks, allocations: the stretches
    join), else the replay says so. The time reported is the wall clock of the whole,
    planning and reading included."""
    import asyncio
    import multiprocessing
    from multiprocessing.connection import Connection, wait

    from crater.runtime.db import make_engine

    clock = time.perf_counter()

    async def on_database(work: Callable[[Any], Any]) -> Any:
        engine = make_engine(database_url)
        try:
            async with engine.connect() as connection:
                return await work(connection)
        finally:
            await engine.dispose()

    def stretch(segment: Segment, tell: Callable[[int], None] | None) -> ReplayReport:
        return cast(
            ReplayReport,
            asyncio.run(
                on_database(
                    lambda connection: replay_log(
                        connection,
                        config,
                        start,
                        segment.last,
                        what_if=what_if,
                        from_snapshot=from_snapshot,
                        progress=tell,
                        every=every,
                        base=segment.base,
                    )
                )
            ),
        )

    forking = "fork" in multiprocessing.get_all_start_methods()
    segments = asyncio.run(
        on_database(
            lambda connection: plan_segments(
                connection, start, end, jobs if forking else 1, from_snapshot
            )
        )
    )
    if len(segments) == 1:
        report = stretch(segments[0], progress)
        report.seconds = time.perf_counter() - clock
        return report
    context = multiprocessing.get_context("fork")
    counted = context.Value("q", 0)

    def tell(count: int) -> None:
        with counted.get_lock():
            counted.value += every

    def worker(pipe: Any, segment: Segment) -> None:
        try:
            pipe.send(stretch(segment, tell if progress is not None else None))
        except BaseException as error:  # said to the parent, never lost with the process
            pipe.send(ReplayReport(problem=f"the replay of {segment} failed: {error!r}"))
        finally:
            pipe.close()

    pipes: list[Connection] = []
    processes = []
    for segment in segments:
        mine, theirs = context.Pipe(duplex=False)
        process = context.Process(target=worker, args=(theirs, segment), daemon=True)
        process.start()
        theirs.close()
        pipes.append(mine)
        processes.append(process)
    reports: dict[int, ReplayReport] = {}
    told = 0
    while len(reports) < len(pipes):
        waiting = [p for i, p in enumerate(pipes) if i not in reports]
        for ready in wait(waiting, timeout=0.5):
            index = next(i for i, p in enumerate(pipes) if p is ready)
            try:
                reports[index] = pipes[index].recv()
            except EOFError:
                reports[index] = ReplayReport(problem=f"the replay of {segments[index]} died")
        if progress is not None and counted.value >= told + every:
            told = counted.value
            progress(told)
    for process in processes:
        process.join()
    report = _joined([reports[i] for i in range(len(segments))])
    report.seconds = time.perf_counter() - clock
    return report


def _joined(reports: list[ReplayReport]) -> ReplayReport:
    """One report of the stretches, in order, up to the first that did not end identical."""
    whole = ReplayReport(started_at=reports[0].started_at)
    for part in reports:
        whole.events += part.events
        whole.compared += part.compared
        whole.restarts += part.restarts
        whole.configs += part.configs
        whole.adopted += part.adopted
        whole.notes += [n for n in part.notes if n not in whole.notes]
        if not part.identical:
            whole.divergence, whole.problem = part.divergence, part.problem
            return whole
    return whole


# -- explain ----------------------------------------------------------------------------------


def _needles(task_id: str) -> list[str]:
    """`task_id` as a record's JSON holds it: as Python's json writes it (non-ASCII escaped),
    and as pydantic writes it (non-ASCII as it is)."""
    needles: list[str] = []
    for needle in (json.dumps(task_id), json.dumps(task_id, ensure_ascii=False)):
        try:
            needle.encode()
        except UnicodeEncodeError:  # a lone surrogate: no record holds it so
            continue
        if needle not in needles:
            needles.append(needle)
    return needles


def _mentions(entry: Entry, task_id: str, needles: Sequence[str] | None = None) -> bool:
    return any(n in entry.decisions or n in entry.input for n in needles or _needles(task_id))


def _about(decision: dict[str, Any], task_id: str) -> bool:
    return decision.get("task_id") == task_id


@dataclass
class Step:
    seq: int
    decided_at: str
    epoch: int | None
    source: str
    input_kind: str
    input_occurred_at: str | None
    decision: dict[str, Any] | None
    placement: dict[str, Any] | None = None  # the dry run as things were: fits, misfits

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "decided_at": self.decided_at,
            "epoch": self.epoch,
            "source": self.source,
            "input_kind": self.input_kind,
            "input_occurred_at": self.input_occurred_at,
            "decision": self.decision,
            "placement": self.placement,
        }


class _Story:
    """A task's story, told a record at a time in the log's order: every input naming it and
    every decision about it. The records that say nothing of it add nothing, so telling it
    from the task's records alone (the index) tells the same story as from the whole log."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.needles = _needles(task_id)
        self.steps: list[Step] = []
        self.request: TaskProfiled | None = None  # the task as last submitted

    def take(self, entry: Entry) -> list[tuple[Step, TaskProfiled | None]]:
        """The steps `entry` adds, each placement with the request to dry-run for it (None:
        not a placement, or the task's request is not in the log)."""
        task_id = self.task_id
        if not _mentions(entry, task_id, self.needles) or entry.kind == HEARTBEAT_RUN:
            return []  # (a run decided nothing; a heartbeat may list the task it runs)
        source_event = json.loads(entry.input)
        if entry.kind == TaskProfiled.__name__ and entry.source == CORE:
            candidate = TaskProfiled.model_validate_json(entry.input)
            if candidate.task.task_id == task_id:
                self.request = candidate
        about = [d for d in entry.decision_list() if _about(d["event"], task_id)]
        occurred = source_event.get("occurred_at")
        said: list[tuple[Step, TaskProfiled | None]] = []
        if not about and _about_input(source_event, task_id):
            step = Step(
                entry.seq, entry.decided_at, entry.epoch, entry.source, entry.kind, occurred, None
            )
            said.append((step, None))
        for decision in about:
            step = Step(
                entry.seq,
                entry.decided_at,
                entry.epoch,
                entry.source,
                entry.kind,
                occurred,
                decision,
            )
            placed = decision["kind"] == AllocationGranted.__name__
            said.append((step, self.request if placed else None))
        self.steps += [step for step, _ in said]
        return said


def explain(
    entries: Sequence[Entry],
    task_id: str,
    config: SchedulerConfig | None = None,
    snapshots: Mapping[int, bytes] | None = None,
) -> list[Step]:
    """The task's story from the log alone, read whole (`explain_log` reads the task's
    records only and replays from snapshots; this is what it must equal): every input naming
    it and every decision about it, in order. With `config` (the settings: the token secret,
    the configuration until a record gives one), each placement also gets the filters and
    scores as they were: the recorded inputs before it replayed (`Replayer`, the
    configuration records applied, the restored `snapshots` adopted), then the task dry-run
    there."""
    story = _Story(task_id)
    walk = Replayer(config, compare=False, snapshots=snapshots) if config is not None else None
    for entry in entries:
        for step, request in story.take(entry):
            if walk is not None and request is not None:
                answer = walk.core.dry_run_task(request.task, request.prediction)
                step.placement = answer.model_dump(mode="json")
        if walk is not None:
            walk.feed(_rows([entry]))
    return story.steps


def _about_input(event: dict[str, Any], task_id: str) -> bool:
    task = event.get("task")
    if isinstance(task, dict) and task.get("task_id") == task_id:
        return True
    return event.get("task_id") == task_id


async def entries_about(
    connection: AsyncConnection | AsyncSession, task_id: str, limit: int | None = None
) -> tuple[list[Entry], int, bool]:
    """The records that may be about `task_id`, in order, without reading the whole log: the
    ones the task index names, and among those written without it (`tasks_indexed` NULL:
    before migration 0011, until `crater audit index`) the ones whose JSON holds the id,
    found by the database. An id the index cannot hold is looked for in every record.
    Returns them (at most `limit`), how many records were read, and whether that is all."""
    cap = None if limit is None else limit + 1
    needles = _needles(task_id)
    holds = or_(
        *(
            column.contains(n, autoescape=True)
            for n in needles
            for column in (audit_log.c.input, audit_log.c.decisions)
        )
    )
    found: dict[int, Entry] = {}
    if indexable(task_id):
        indexed = (
            select(audit_log)
            .join(audit_tasks, audit_tasks.c.seq == audit_log.c.seq)
            .where(audit_tasks.c.task_id == task_id)
            .order_by(audit_tasks.c.seq)
            .limit(cap)
        )
        for row in (await connection.execute(indexed)).all():
            found[int(row.seq)] = _entry(row)
        scanned = select(audit_log).where(audit_log.c.tasks_indexed.is_(None), holds)
    else:
        scanned = select(audit_log).where(holds)
    read = len(found)
    rows = (await connection.execute(scanned.order_by(audit_log.c.seq).limit(cap))).all()
    read += len(rows)
    for row in rows:
        entry = _entry(row)
        if _mentions(entry, task_id, needles):  # LIKE may ignore case
            found[entry.seq] = entry
    listed = [found[seq] for seq in sorted(found)]
    complete = limit is None or (len(listed) <= limit and len(rows) <= limit)
    return listed[:limit], read, complete


@dataclass
class Explained:
    """A task's story (`explain_log`) and what telling it took."""

    steps: list[Step] = field(default_factory=list)
    records_read: int = 0  # log records read to find the story
    events_replayed: int = 0  # inputs fed to replays, for the placements
    replayed_from: list[int] = field(default_factory=list)  # snapshot records; 0: record 1
    truncated: bool = False  # not all of it: `notes` says what is missing
    notes: list[str] = field(default_factory=list)


async def _inline(work: Callable[..., Any], *args: Any) -> Any:
    return work(*args)


EXPLAIN_READ = 2_000  # records read at once (their rows are made on the event loop)
EXPLAIN_SLICE = 250  # records replayed between two looks at the deadline


async def explain_log(
    connection: AsyncConnection | AsyncSession,
    task_id: str,
    config: SchedulerConfig | None = None,
    *,
    max_records: int | None = None,
    max_placements: int | None = None,
    deadline: float | None = None,
    offload: Callable[..., Awaitable[Any]] = _inline,
) -> Explained:
    """The task's story from the stored log, as `explain` tells it from the whole log: the
    task's records found through the task index (`entries_about`), and each placement
    replayed from the latest snapshot at or before it that this build can load, rather than
    from record 1 (`Replayer`, the same replay as `crater audit replay`). Bounded for a
    caller that must answer in time: at most `max_records` records of the story, the first
    `max_placements` placements replayed, nothing replayed after `deadline`
    (`time.monotonic()`); what is left out is said (`truncated`, `notes`), and
    `crater audit explain` has it all. `offload` runs the CPU work (a replay, a dry run):
    `asyncio.to_thread` keeps it off the event loop."""
    told = Explained()
    entries, told.records_read, complete = await entries_about(connection, task_id, max_records)
    if not complete:
        told.truncated = True
        told.notes.append(
            f"the first {max_records} records about the task only: "
            f"crater audit explain {task_id} reads them all"
        )
    story = _Story(task_id)
    wanted = [(s, r) for entry in entries for s, r in story.take(entry) if r is not None]
    told.steps = story.steps
    if config is None or not wanted:
        return told
    if max_placements is not None and len(wanted) > max_placements:
        told.truncated = True
        told.notes.append(
            f"placements replayed for the first {max_placements} of {len(wanted)}: "
            f"crater audit explain {task_id} replays them all"
        )
        wanted = wanted[:max_placements]
    await _placements(connection, config, task_id, wanted, told, deadline, offload)
    return told


async def _placements(
    connection: AsyncConnection | AsyncSession,
    config: SchedulerConfig,
    task_id: str,
    wanted: list[tuple[Step, TaskProfiled]],
    told: Explained,
    deadline: float | None,
    offload: Callable[..., Awaitable[Any]],
) -> None:
    """Each placement's dry run in the state just before its record: a replay from the
    nearest snapshot, or the replay already under way when it is not behind that snapshot."""
    restored: dict[int, bytes] = {}  # restored snapshots on the way, read as it goes
    replaying: Replayer | None = None
    at = 0  # the last record the replay under way was fed

    def late() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def cut(seq: int) -> None:
        left = sum(step.seq >= seq for step, _ in wanted)
        told.truncated = True
        told.notes.append(
            f"{left} of {len(wanted)} placements (from record {seq} on) not replayed in the "
            f"time given: crater audit explain {task_id} replays them all"
        )

    for seq in sorted({step.seq for step, _ in wanted}):
        target = seq - 1  # the state the record was decided in
        if late():
            return cut(seq)
        base = await snapshot_at_or_before(connection, target, this_build=True)
        base_seq = base[0].seq if base is not None else 0
        if replaying is None or replaying.finished or base_seq > at:
            replaying, at = await _replayer(connection, config, target, restored, told, offload)
            if replaying is None:
                continue
        restored.update(await read_snapshots(connection, at + 1, target, why=RESTORED))
        async for chunk in read_rows(connection, at + 1, target, chunk=EXPLAIN_READ):
            for first in range(0, len(chunk), EXPLAIN_SLICE):
                if late():
                    return cut(seq)
                fed = replaying.report.events
                await offload(replaying.feed, chunk[first : first + EXPLAIN_SLICE])
                told.events_replayed += replaying.report.events - fed
                if replaying.finished:
                    break
            if replaying.finished:
                break
        if replaying.finished:
            told.notes.append(
                f"the placement at record {seq} was not replayed: {replaying.report.problem}"
            )
            replaying = None
            continue
        at = target
        for step, request in wanted:
            if step.seq == seq:
                answer = await offload(
                    replaying.core.dry_run_task, request.task, request.prediction
                )
                step.placement = answer.model_dump(mode="json")


async def _replayer(
    connection: AsyncConnection | AsyncSession,
    config: SchedulerConfig,
    target: int,
    restored: dict[int, bytes],
    told: Explained,
    offload: Callable[..., Awaitable[Any]],
    tries: int = 3,
) -> tuple[Replayer | None, int]:
    """A replay to go on to record `target` from: at the latest snapshot at or before it that
    loads (`tries` of them at most), else at the log's beginning; and the record it is at."""
    below = target
    for _ in range(tries):
        found = await snapshot_at_or_before(connection, below, this_build=True)
        if found is None:
            break
        made = Replayer(config, compare=False, snapshots=restored)
        if await offload(made.begin_at, *found):
            told.replayed_from.append(found[0].seq)
            return made, found[0].seq
        told.notes.append(f"snapshot at record {found[0].seq} not used: {made.report.problem}")
        below = found[0].seq - 1
    oldest = await connection.scalar(select(func.min(audit_log.c.seq)))
    if oldest is not None and oldest > 1:
        told.notes.append(
            f"the placement before record {target + 1} was not replayed: the log begins at "
            f"record {oldest} (pruned) and no snapshot before it loads"
        )
        return None, 0
    told.replayed_from.append(0)
    return Replayer(config, compare=False, snapshots=restored), 0


EXPORT_COLUMNS = (
    "seq",
    "decided_at",
    "epoch",
    "source",
    "input_kind",
    "input_event_id",
    "input_occurred_at",
    "decision",
    "decision_event_id",
    "task_id",
    "tenant",
    "pool",
    "priority",
    "node",
    "gpus",
    "gpu_memory_mb",
    "gpu_milli",
    "cpu_cores",
    "memory_mb",
    "score",
    "summary",
)


def decision_rows(entries: Iterable[Entry]) -> Iterator[dict[str, Any]]:
    """One row per decision, with the task's tenant, pool and resources and the times (the
    decision's own, its input's)."""
    tasks: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if entry.kind == HEARTBEAT_RUN:
            continue  # heartbeats that decided nothing
        source_event = json.loads(entry.input)
        if entry.kind == TaskProfiled.__name__:
            task = source_event.get("task", {})
            wants = task.get("resource_requirements", {})
            tasks.setdefault(
                task.get("task_id", ""),
                {
                    "tenant": task.get("tenant"),
                    "pool": task.get("pool"),
                    "priority": task.get("priority"),
                    "gpus": wants.get("gpu", {}).get("count"),
                    "gpu_memory_mb": wants.get("gpu", {}).get("memory_mb"),
                    "cpu_cores": wants.get("cpu", {}).get("cores"),
                    "memory_mb": wants.get("memory", {}).get("capacity_mb"),
                },
            )
        for decided in entry.decision_list():
            decision = decided["event"]
            task_id = decision.get("task_id")
            known = tasks.get(task_id or "", {})
            granted = decided["kind"] == AllocationGranted.__name__
            yield {
                "seq": entry.seq,
                "decided_at": entry.decided_at,
                "epoch": entry.epoch,
                "source": entry.source,
                "input_kind": entry.kind,
                "input_event_id": source_event.get("event_id"),
                "input_occurred_at": source_event.get("occurred_at"),
                "decision": decided["kind"],
                "decision_event_id": decision.get("event_id"),
                "task_id": task_id,
                "tenant": decision.get("tenant") or known.get("tenant"),
                "pool": decision.get("pool") or known.get("pool"),
                "priority": known.get("priority"),
                "node": decision.get("node"),
                "gpus": len(decision["gpu_ids"]) if granted else known.get("gpus"),
                "gpu_memory_mb": decision.get("gpu_memory_mb", known.get("gpu_memory_mb")),
                "gpu_milli": decision.get("gpu_milli"),
                "cpu_cores": len(decision["cpu_cores"]) if granted else known.get("cpu_cores"),
                "memory_mb": decision.get("memory_mb", known.get("memory_mb")),
                "score": decision.get("score"),
                "summary": decision.get("summary") or decision.get("explanation"),
            }


def export_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> int:
    count = 0
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
            count += 1
    return count


def export_parquet(rows: Iterable[dict[str, Any]], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    listed = list(rows)
    schema = pa.schema(
        [
            ("seq", pa.int64()),
            ("decided_at", pa.timestamp("us", tz="UTC")),
            ("epoch", pa.int64()),
            ("source", pa.string()),
            ("input_kind", pa.string()),
            ("input_event_id", pa.string()),
            ("input_occurred_at", pa.timestamp("us", tz="UTC")),
            ("decision", pa.string()),
            ("decision_event_id", pa.string()),
            ("task_id", pa.string()),
            ("tenant", pa.string()),
            ("pool", pa.string()),
            ("priority", pa.string()),
            ("node", pa.string()),
            ("gpus", pa.int64()),
            ("gpu_memory_mb", pa.int64()),
            ("gpu_milli", pa.int64()),
            ("cpu_cores", pa.int64()),
            ("memory_mb", pa.int64()),
            ("score", pa.float64()),
            ("summary", pa.string()),
        ]
    )
    columns: dict[str, list[Any]] = {name: [] for name in EXPORT_COLUMNS}
    for row in listed:
        for name in EXPORT_COLUMNS:
            value = row[name]
            if name in ("decided_at", "input_occurred_at") and isinstance(value, str):
                value = datetime.fromisoformat(value.replace("Z", "+00:00"))
            columns[name].append(value)
    table = pa.table(columns, schema=schema)
    pq.write_table(table, path)
    return len(listed)


def with_weight(config: SchedulerConfig, plugin: str, weight: float) -> SchedulerConfig:
    """`config` with one score plugin's weight changed in every pipeline (a what-if
    replay: its decisions are expected to differ from the record)."""

    def reweighed(pipeline: Pipeline) -> Pipeline:
        names = [s.name for s in pipeline.scores]
        if plugin not in names:
            raise ValueError(f"no score {plugin!r} in the pipeline ({', '.join(names)})")
        scores = tuple(
            replace(s, weight=weight) if s.name == plugin else s for s in pipeline.scores
        )
        return replace(pipeline, scores=scores)

    pools = {
        name: replace(policy, pipeline=reweighed(policy.pipeline))
        if plugin in [s.name for s in policy.pipeline.scores]
        else policy
        for name, policy in config.pools.items()
    }
    return replace(config, pipeline=reweighed(config.pipeline), pools=pools)
