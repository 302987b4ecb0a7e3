"""The scheduler's tables. Schema changes go through Alembic (adapters/migrations)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    false,
    text,
    true,
)

from crater.runtime.outbox import inbox_table, outbox_table

metadata = MetaData()

nodes = Table(
    "scheduler_nodes",
    metadata,
    Column("node_id", String(63), primary_key=True),
    Column("pool", String(63), nullable=False, index=True),
    Column("topology", JSON, nullable=False),
    Column("condition", String(16), nullable=False),
    Column("last_heartbeat_at", Float, nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # cordoned cards, lifted faults, a node cordoned whole (cordons.stored); null: none
    Column("cordons", JSON, nullable=True),
)

tasks = Table(
    "scheduler_tasks",
    metadata,
    Column("task_id", String(128), primary_key=True),
    Column("seq", Integer, nullable=False),
    Column("task_type", String(32), nullable=False),
    Column("pool", String(63), nullable=False),
    Column("tenant", String(63), nullable=False),
    Column("priority", String(16), nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("status", String(16), nullable=False, index=True),
    Column("request", JSON, nullable=False),
    Column("prediction", JSON, nullable=True),
    Column("node", String(63), nullable=True),
    Column("gpu_ids", JSON, nullable=False, default=list),
    Column("reason", Text, nullable=True),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # where victims are yielding for this waiting task (preemption in flight)
    Column("nominated_node", String(63), nullable=True),
    # a gang's: every node where victims are yielding for it (nominated_node: the first)
    Column("nominated_nodes", JSON, nullable=True),
    Column("escalated", Boolean, nullable=False, default=False, server_default=false()),
    # restart policy: which attempt is waiting or placed, and a retry's end of backoff
    Column("attempt", Integer, nullable=False, default=1, server_default="1"),
    Column("not_before", DateTime(timezone=True), nullable=True),
    # what AllData was last told of the wait: the filters holding it, and when
    Column("pending_kind", JSON, nullable=True),
    Column("pending_at", DateTime(timezone=True), nullable=True),
)

allocations = Table(
    "scheduler_allocations",
    metadata,
    Column("allocation_id", String(64), primary_key=True),
    Column("task_id", String(128), nullable=False, index=True),
    Column("node", String(63), nullable=False, index=True),
    Column("gpu_ids", JSON, nullable=False),
    Column("cpu_cores", JSON, nullable=False),
    Column("memory_mb", Integer, nullable=False),
    Column("numa_node", Integer, nullable=True),
    Column("checkpoint_path", Text, nullable=True),
    Column("reservation_token", Text, nullable=False),
    Column("reservation_expires_at", DateTime(timezone=True), nullable=False),
    Column("running", Boolean, nullable=False, default=False),
    Column("granted_at", DateTime(timezone=True), nullable=False),
    Column("released_at", DateTime(timezone=True), nullable=True, index=True),
    Column("release_reason", String(16), nullable=True),
    Column("gang_index", Integer, nullable=False, default=0, server_default="0"),
    # preempted: the resources go back at this time at the latest
    Column("yield_by", DateTime(timezone=True), nullable=True),
    # the grant was read back from the stream: its reservation counts from then
    Column("armed", Boolean, nullable=False, default=True, server_default=true()),
    Column("attempt", Integer, nullable=False, default=1, server_default="1"),
    # what the grant handed the task (CRATER_*); None for rows from before it was kept
    Column("environment", JSON, nullable=True),
    # a launcher confirmed it with its token: failed when its heartbeats stop this long
    Column("heartbeat_grace_seconds", Float, nullable=True),
    # told to stop at its time limit (yield_by is then that stop's deadline, not a preemption)
    Column("time_limited", Boolean, nullable=True),
)

# Cancels of tasks the scheduler has not received yet (still being profiled): when the task
# comes it ends cancelled, and its row here goes.
early_cancels = Table(
    "scheduler_early_cancels",
    metadata,
    Column("task_id", String(128), primary_key=True),
    Column("cancelled_at", DateTime(timezone=True), nullable=False),
)

# Tenants their hard budget holds (revision 0009): the tenant.budget_exceeded in force, as
# JSON; the row goes when the hold does (a hold whose period ended goes at the next event).
budget_holds = Table(
    "scheduler_budget_holds",
    metadata,
    Column("tenant", String(63), primary_key=True),
    Column("event", JSON, nullable=False),
    Column("held_at", DateTime(timezone=True), nullable=False),
)

# The fence (crater.scheduler.adapters.fence): the epoch of the leader allowed to commit.
leadership = Table(
    "scheduler_leadership",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("epoch", Integer, nullable=False),
    Column("holder", String(255), nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
)

# The audit log (crater.scheduler.audit): every input the core decided on and every decision,
# in the core's order, each record chained to the previous one by its hash; written in the
# decision's own transaction. Times are ISO strings, so the hashed bytes are the stored ones
# on every database.
audit_log = Table(
    "scheduler_audit_log",
    metadata,
    Column(
        "seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
    ),
    Column("epoch", Integer, nullable=True),
    Column("decided_at", String(40), nullable=False, index=True),
    Column("source", String(16), nullable=False),
    Column("kind", String(63), nullable=False),
    Column("input", Text, nullable=False),
    Column("decisions", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    # Not hashed: true once the record's tasks are in scheduler_audit_tasks (written with it
    # since migration 0010; before, NULL until `crater audit index`). Explain reads the
    # records still NULL by scanning them (the partial index below finds them).
    Column("tasks_indexed", Boolean, nullable=True),
    Index(
        "ix_scheduler_audit_log_unindexed",
        "seq",
        postgresql_where=text("tasks_indexed IS NULL"),
        sqlite_where=text("tasks_indexed IS NULL"),
    ),
)

# The tasks each audit record is about (`audit.task_ids`: its input's task, every decision's
# task): explain finds a task's records here instead of reading the whole log. Derived from
# the records, not part of the chain; written in the record's own transaction.
audit_tasks = Table(
    "scheduler_audit_tasks",
    metadata,
    Column("task_id", String(256), primary_key=True),
    Column(
        "seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
    ),
)

# Signed checkpoints of the audit log: the hash of record `seq`, signed (Ed25519) with the
# operator's key.
audit_checkpoints = Table(
    "scheduler_audit_checkpoints",
    metadata,
    Column(
        "seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
    ),
    Column("hash", String(64), nullable=False),
    Column("signed_at", String(40), nullable=False),
    Column("key_id", String(32), nullable=False),
    Column("signature", String(128), nullable=False),
)

# Snapshots of the core's whole state (crater.scheduler.audit_state), by the seq of the
# audit record that holds their SHA-256: the record is chained like any other, the bytes are
# kept apart so that reading the log does not read them.
audit_snapshots = Table(
    "scheduler_audit_snapshots",
    metadata,
    Column(
        "seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
    ),
    Column("state", LargeBinary, nullable=False),
)

outbox = outbox_table(metadata, "scheduler")
inbox = inbox_table(metadata, "scheduler")
