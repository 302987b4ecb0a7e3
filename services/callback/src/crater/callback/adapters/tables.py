"""The delivery log: the callback's own tables, in its own metadata and Alembic history."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    true,
)

from crater.runtime.outbox import inbox_table, outbox_table

# Named constraints, so later migrations can alter them on SQLite (batch mode) too.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

deliveries = Table(
    "callback_deliveries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # The source event's id: stable across redeliveries, sent as the `webhook-id` header.
    Column("webhook_id", String(36), nullable=False),
    Column("endpoint", String(512), nullable=False),
    Column("task_id", String(256), nullable=False),
    Column("task_status", String(32), nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_status_code", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    # The body recorded for the event (Crater's WebhookBody), kept for audit and for replaying
    # a dead letter later; what is POSTed is rendered from it in `format` (domain/payload.py).
    Column("payload", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("completed_at", DateTime(timezone=True), nullable=True),
    # Revision 0002: deliveries are scheduled here and sent by the delivery loop.
    # When the next attempt is due (pending only).
    Column("next_attempt_at", DateTime(timezone=True), nullable=True),
    # The replica sending it now, and until when that claim holds (a crash lets it lapse).
    Column("claimed_by", String(36), nullable=True),
    Column("claimed_until", DateTime(timezone=True), nullable=True),
    # 0 for the first round of attempts; an operator's retry or replay starts another.
    Column("round", Integer, nullable=False, default=0, server_default="0"),
    # Attempts allowed in all (None: the service's max_attempts); raised by retry/replay.
    Column("attempt_limit", Integer, nullable=True),
    # Revision 0003: order per task across subjects and streams (domain/ordering.py).
    # Where it goes among its task's deliveries to the endpoint (equal: by id).
    Column("position", BigInteger, nullable=False, default=0, server_default="0"),
    # Waits until then for an earlier event of its task that has not arrived (None: free).
    Column("held_until", DateTime(timezone=True), nullable=True),
    # Revision 0004: what AllData is told (domain/lifecycle.py).
    # When first released for sending (claimed): judged then, once; a repeat keeps its place.
    Column("released_at", DateTime(timezone=True), nullable=True),
    # False: a refused duplicate submission, outside its task's lifecycle: neither ordered
    # against the task's deliveries nor judged by the guard.
    Column("lifecycle", Boolean, nullable=False, default=True, server_default=true()),
    # Revision 0006: the endpoint's body format when the delivery was recorded (alldata,
    # crater): every attempt renders the same bytes. Rows from before it were sent as crater.
    Column("format", String(16), nullable=False, server_default="crater"),
    UniqueConstraint("webhook_id", "endpoint"),
    Index(None, "task_id"),
    Index(None, "state"),
    # The delivery loop: due heads per (task, endpoint), oldest first.
    Index(None, "task_id", "endpoint", "state"),
    Index(None, "state", "next_attempt_at"),
)

# Revision 0003: every recorded event of a task (with or without a delivery), so the next
# one can be placed after its predecessors.
task_events = Table(
    "callback_task_events",
    metadata,
    Column("event_id", String(36), primary_key=True),
    Column("task_id", String(256), nullable=False, index=True),
    Column("event_type", String(64), nullable=False),
    # The scheduler's task_sequence (None for other producers' events).
    Column("number", BigInteger, nullable=True),
    Column("previous", BigInteger, nullable=True),
    Column("allocation_id", String(128), nullable=True),
    Column("grants", Boolean, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("waiting", Boolean, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    # Revision 0005: the attempt the event says it belongs to (pending, grant, end); None: it
    # does not say, and its webhook is told the one of the latest event before it.
    Column("attempt", Integer, nullable=True),
)

# Revision 0004: one row per task: the lock that serialises recording and releasing its
# deliveries across replicas, and its end (the first terminal webhook recorded).
tasks = Table(
    "callback_tasks",
    metadata,
    Column("task_id", String(256), primary_key=True),
    Column("end_event_id", String(36), nullable=True),
    Column("end_position", BigInteger, nullable=True),
    Column("end_status", String(32), nullable=True),
    Column("ended_at", DateTime(timezone=True), nullable=True),
)

attempts = Table(
    "callback_attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "delivery_id",
        Integer,
        ForeignKey("callback_deliveries.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    Column("attempt", Integer, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("status_code", Integer, nullable=True),
    Column("latency_ms", Float, nullable=False),
    Column("error", Text, nullable=True),
    Column("attempted_at", DateTime(timezone=True), nullable=False),
)

outbox = outbox_table(metadata, "callback")
inbox = inbox_table(metadata, "callback")
