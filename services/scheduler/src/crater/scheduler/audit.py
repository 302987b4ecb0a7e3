"""The audit log: every input the scheduling core decided on and every decision it made, in
the core's order, hash-chained, with signed checkpoints; and what an auditor does with it:
verify, replay, explain, export (docs/audit.md).

A record holds one input and the decisions it caused, as the JSON the core's events dump to.
`source` says who decided: `core` (fed to `Scheduler.handle`; replay feeds these again),
`service` (decided in the service layer, never by the core: a duplicate submission, a refused
report) and `leader` (this process took over with this epoch and loaded the state as stored).
Each record's `hash` is SHA-256 over its fields and the previous record's hash, so altering,
removing or inserting one breaks the chain at that record.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeHealthReported,
    NodeTopologyReported,
    ReplicaReleaseRequested,
    TaskProfiled,
    TaskStatusReported,
    TenantBudgetExceeded,
    TenantBudgetRestored,
)
from crater.scheduler.adapters.orm import audit_checkpoints, audit_log
from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.plugins import Pipeline
from crater.scheduler.domain.views import node_summaries

GENESIS = "0" * 64
CORE, SERVICE, LEADER = "core", "service", "leader"
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
    )
}
READ_CHUNK = 5_000


def now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def decisions_json(decisions: Sequence[Event]) -> str:
    """The decisions as a record stores them, and as replay compares them: byte for byte.
    Each is its kind and the event as the bus carries it."""
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
class AuditLog:
    """The writer: records gathered while a batch is decided, chained and inserted in the
    batch's own transaction (`flush`), so the log holds exactly what committed."""

    signing_key: Ed25519PrivateKey | None = None
    checkpoint_every: int = 1_000
    staged: list[tuple[int | None, str, str, str, str, str]] = field(default_factory=list)

    def begin(self) -> None:
        self.staged = []

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
        """One record: the decision's own time is now, when the core has just decided."""
        kind = kind or type(event).__name__
        body = body if body is not None else event.model_dump_json() if event else "{}"
        self.staged.append((epoch, now_text(), source, kind, body, decisions_json(decisions)))

    async def flush(self, connection: AsyncConnection | AsyncSession) -> list[Entry]:
        staged, self.staged = self.staged, []
        if not staged:
            return []
        last = (
            await connection.execute(
                select(audit_log.c.seq, audit_log.c.hash).order_by(audit_log.c.seq.desc()).limit(1)
            )
        ).first()
        seq, prev = (int(last[0]), str(last[1])) if last is not None else (0, GENESIS)
        entries = []
        for epoch, decided_at, source, kind, body, decisions in staged:
            seq += 1
            digest = entry_hash(seq, epoch, decided_at, source, kind, body, decisions, prev)
            entries.append(
                Entry(seq, epoch, decided_at, source, kind, body, decisions, prev, digest)
            )
            prev = digest
        await connection.execute(insert(audit_log), [e.as_row() for e in entries])
        if self.signing_key is not None:
            for entry in entries:
                if entry.seq % self.checkpoint_every == 0:
                    await connection.execute(insert(audit_checkpoints), [self.sign(entry)])
        return entries

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
    return int(getattr(result, "rowcount", 0) or 0)


# -- verify -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    seq: int
    what: str  # altered | removed | inserted | signature | rewritten
    detail: str

    def __str__(self) -> str:
        return f"record {self.seq}: {self.what}: {self.detail}"


@dataclass
class VerifyReport:
    records: int = 0
    first: int | None = None
    last: int | None = None
    checkpoints: int = 0
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
    if signed is not None and (report.finding is None or signed.seq < report.finding.seq):
        report.finding = signed
    return report


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
    seconds: float = 0.0
    divergence: Divergence | None = None
    restarts: list[int] = field(default_factory=list)  # `leader` records passed

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def replay(
    entries: Iterable[Entry],
    config: SchedulerConfig,
    start: int = 1,
    end: int | None = None,
    progress: Callable[[int], None] | None = None,
    every: int = 10_000,
) -> ReplayReport:
    """Feed the recorded core inputs, from the log's beginning, through a fresh production
    core with `config`; from record `start` on, each decision list must equal the recorded
    one byte for byte. Stops at the first difference (with the state that led to it)."""
    report = ReplayReport()
    core = Scheduler(config=config)
    clock = time.perf_counter()
    fed: list[Entry] = []
    for entry in entries:
        if end is not None and entry.seq > end:
            break
        if entry.source == LEADER:
            report.restarts.append(entry.seq)
            continue
        if entry.source != CORE:
            continue
        fed.append(entry)
        decided = decisions_json(core.handle(entry.event()))
        report.events += 1
        if entry.seq >= start:
            report.compared += 1
            if decided != entry.decisions:
                report.seconds = time.perf_counter() - clock
                report.divergence = Divergence(
                    entry.seq,
                    entry.kind,
                    entry.input,
                    entry.decisions,
                    decided,
                    state_before(fed[:-1], config),
                )
                return report
        if progress is not None and report.events % every == 0:
            progress(report.events)
    report.seconds = time.perf_counter() - clock
    return report


def core_before(entries: Iterable[Entry], config: SchedulerConfig) -> Scheduler:
    """A fresh core fed `entries` (the core's records): the state they led to."""
    core = Scheduler(config=config)
    for entry in entries:
        if entry.source == CORE:
            core.handle(entry.event())
    return core


def state_before(entries: Sequence[Entry], config: SchedulerConfig) -> str:
    """The state the recorded inputs led to, readable: clock, nodes and what is free on
    them, the waiting tasks, the allocations."""
    core = core_before(entries, config)
    lines = [f"clock {core.clock.isoformat() if core.clock else '-'}"]
    for node in node_summaries(core.cluster):
        lines.append(f"  node {node.model_dump_json()}")
    for task_id in core.pending:
        lines.append(f"  waiting {task_id}")
    for task_id, allocation in core.allocations.items():
        nodes = sorted({m.node for m in allocation.members()})
        lines.append(f"  holds {task_id} on {', '.join(nodes)}")
    return "\n".join(lines)


# -- explain ----------------------------------------------------------------------------------


def _mentions(entry: Entry, task_id: str) -> bool:
    needle = json.dumps(task_id)
    return needle in entry.decisions or needle in entry.input


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


def explain(
    entries: Sequence[Entry], task_id: str, config: SchedulerConfig | None = None
) -> list[Step]:
    """The task's story from the log alone: every input naming it and every decision about
    it, in order. With `config`, each placement also gets the filters and scores as they
    were: the recorded inputs before it fed to the core, then the task dry-run there."""
    steps: list[Step] = []
    request: TaskProfiled | None = None
    core: Scheduler | None = Scheduler(config=config) if config is not None else None
    for entry in entries:
        if _mentions(entry, task_id):
            source_event = json.loads(entry.input)
            if entry.kind == TaskProfiled.__name__ and entry.source == CORE:
                candidate = TaskProfiled.model_validate_json(entry.input)
                if candidate.task.task_id == task_id:
                    request = candidate
            about = [d for d in entry.decision_list() if _about(d["event"], task_id)]
            occurred = source_event.get("occurred_at")
            if not about and _about_input(source_event, task_id):
                steps.append(
                    Step(
                        entry.seq,
                        entry.decided_at,
                        entry.epoch,
                        entry.source,
                        entry.kind,
                        occurred,
                        None,
                    )
                )
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
                if (
                    core is not None
                    and request is not None
                    and decision["kind"] == AllocationGranted.__name__
                ):
                    answer = core.dry_run_task(request.task, request.prediction)
                    step.placement = answer.model_dump(mode="json")
                steps.append(step)
        if core is not None and entry.source == CORE:
            core.handle(entry.event())
    return steps


def _about_input(event: dict[str, Any], task_id: str) -> bool:
    task = event.get("task")
    if isinstance(task, dict) and task.get("task_id") == task_id:
        return True
    return event.get("task_id") == task_id


# -- export -----------------------------------------------------------------------------------

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
