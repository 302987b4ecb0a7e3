"""The predictor's tables. Schema changes go through Alembic (adapters/migrations)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
)

from crater.runtime.outbox import inbox_table

# Named constraints, so later migrations can alter them on SQLite (batch mode) too.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# What was predicted for each task: the raw model figure and the corrected one published.
predictions = Table(
    "predictor_predictions",
    metadata,
    Column("task_id", String(128), primary_key=True),
    Column("family", String(64), nullable=False),
    Column("task_type", String(32), nullable=False),
    Column("raw_mb", Integer, nullable=False),
    Column("predicted_mb", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("min_gpu_utilization_percent", Float, nullable=True),  # the task's SLA, if any
)

# Which task holds which GPUs of which node: whether whole cards (only then is their use its
# own), when it started running, and the peak learned from it on release.
allocations = Table(
    "predictor_allocations",
    metadata,
    Column("allocation_id", String(64), primary_key=True),
    Column("task_id", String(128), nullable=False, index=True),
    Column("node", String(63), nullable=False, index=True),
    Column("gpu_ids", JSON, nullable=False),
    Column("observed_peak_mb", Integer, nullable=False, default=0),
    Column("active", Boolean, nullable=False, default=True, index=True),
    Column("granted_at", DateTime(timezone=True), nullable=False),
    Column("released_at", DateTime(timezone=True), nullable=True),
    Column("exclusive", Boolean, nullable=False, default=True),
    Column("running_at", DateTime(timezone=True), nullable=True),
)

# Readings on an active allocation's cards, kept until its release decides which count.
samples = Table(
    "predictor_samples",
    metadata,
    Column("allocation_id", String(64), primary_key=True),
    Column("sampled_at", DateTime(timezone=True), primary_key=True),
    Column("used_mb", Integer, nullable=False),
    Column("total_mb", Integer, nullable=False),
)

# The task's own readings (crater_client's usage samples) on an active allocation: the highest
# card's memory per sample. Preferred on release over the node's readings, which may include
# memory the task did not use.
usage_samples = Table(
    "predictor_usage_samples",
    metadata,
    Column("allocation_id", String(64), primary_key=True),
    Column("sampled_at", DateTime(timezone=True), primary_key=True),
    Column("used_mb", Integer, nullable=False),
    Column("total_mb", Integer, nullable=False),
)

# Each attempt's GPU utilisation window, checked against its SLA minimum (domain/sla.py).
usage_windows = Table(
    "predictor_usage_windows",
    metadata,
    Column("task_id", String(128), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("allocation_id", String(256), nullable=True),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("seconds", Float, nullable=False),
    Column("weighted_sum", Float, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("measured", Float, nullable=True),
    Column("breached", Boolean, nullable=False),
)

# Usage and chargeback (domain/usage.py): one record per allocation, from its grant to its
# release, with its task's measured GPU utilisation (seconds sampled, busy seconds). Kept.
usage_records = Table(
    "predictor_usage_records",
    metadata,
    Column("allocation_id", String(64), primary_key=True),
    Column("task_id", String(128), nullable=False),
    Column("tenant", String(128), nullable=False, index=True),
    Column("pool", String(128), nullable=False),
    Column("node", String(253), nullable=False),
    Column("gpu_model", String(128), nullable=True),
    Column("gpus", Integer, nullable=False),
    Column("gpu_milli", Integer, nullable=False),
    Column("gpu_memory_mb", Integer, nullable=False),
    Column("cpu_cores", Integer, nullable=False),
    Column("memory_mb", Integer, nullable=False),
    Column("granted_at", DateTime(timezone=True), nullable=False, index=True),
    Column("released_at", DateTime(timezone=True), nullable=True, index=True),
    Column("sampled_seconds", Float, nullable=False, default=0.0),
    Column("busy_seconds", Float, nullable=False, default=0.0),
    # Revision 0005: the latest host memory (MiB, peak of its interval) and CPU use (percent
    # of the cores granted) the task reported of itself; None: it sent none.
    Column("host_memory_used_mb", Integer, nullable=True),
    Column("cpu_utilization_percent", Float, nullable=True),
)

# A `running` report that arrived before its grant (another consumer, lagging).
early_running = Table(
    "predictor_early_running",
    metadata,
    Column("allocation_id", String(64), primary_key=True),
    Column("running_at", DateTime(timezone=True), nullable=False),
)

# A learned multiplier per (model family, task type), and its error so far.
corrections = Table(
    "predictor_corrections",
    metadata,
    Column("family", String(64), primary_key=True),
    Column("task_type", String(32), primary_key=True),
    Column("factor", Float, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("abs_pct_error_sum", Float, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

inbox = inbox_table(metadata, "predictor")
