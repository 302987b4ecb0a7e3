"""Usage records: one per allocation, from grant to release, for usage and chargeback

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "predictor_usage_records",
        sa.Column("allocation_id", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=128), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("gpu_model", sa.String(length=128), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("gpu_memory_mb", sa.Integer(), nullable=False),
        sa.Column("cpu_cores", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sampled_seconds", sa.Float(), nullable=False),
        sa.Column("busy_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("allocation_id", name=op.f("pk_predictor_usage_records")),
    )
    for column in ("tenant", "granted_at", "released_at"):
        op.create_index(
            op.f(f"ix_predictor_usage_records_{column}"), "predictor_usage_records", [column]
        )


def downgrade() -> None:
    op.drop_table("predictor_usage_records")
