"""A task's own usage samples: its SLA minimum, its measured peaks per allocation, its
utilisation window per attempt

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-10 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("predictor_predictions") as batch:
        batch.add_column(sa.Column("min_gpu_utilization_percent", sa.Float(), nullable=True))
    op.create_table(
        "predictor_usage_samples",
        sa.Column("allocation_id", sa.String(length=64), nullable=False),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_mb", sa.Integer(), nullable=False),
        sa.Column("total_mb", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint(
            "allocation_id", "sampled_at", name=op.f("pk_predictor_usage_samples")
        ),
    )
    op.create_table(
        "predictor_usage_windows",
        sa.Column("task_id", sa.String(length=128), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("allocation_id", sa.String(length=256), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("weighted_sum", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("measured", sa.Float(), nullable=True),
        sa.Column("breached", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("task_id", "attempt", name=op.f("pk_predictor_usage_windows")),
    )


def downgrade() -> None:
    op.drop_table("predictor_usage_windows")
    op.drop_table("predictor_usage_samples")
    with op.batch_alter_table("predictor_predictions") as batch:
        batch.drop_column("min_gpu_utilization_percent")
