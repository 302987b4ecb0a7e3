"""The latest host memory and CPU use a task reported of itself, on its usage record (the
per-task metrics: requested against really used)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("predictor_usage_records") as batch:
        batch.add_column(sa.Column("host_memory_used_mb", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cpu_utilization_percent", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("predictor_usage_records") as batch:
        batch.drop_column("cpu_utilization_percent")
        batch.drop_column("host_memory_used_mb")
