"""Cancels of tasks not yet profiled (the task ends cancelled when it reaches the scheduler),
and every node a preempting gang is nominated to.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 15:00:00
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
    op.create_table(
        "scheduler_early_cancels",
        sa.Column("task_id", sa.String(length=128), primary_key=True),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("scheduler_tasks") as batch:
        batch.add_column(sa.Column("nominated_nodes", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_tasks") as batch:
        batch.drop_column("nominated_nodes")
    op.drop_table("scheduler_early_cancels")
