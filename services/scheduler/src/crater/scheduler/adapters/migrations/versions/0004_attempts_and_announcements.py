"""Restart attempts, reservations armed when their grant is read back, and what a waiting
task was last announced as (so a restart does not announce every waiting task again).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 15:00:00
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
    with op.batch_alter_table("scheduler_tasks") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("pending_kind", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("pending_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("scheduler_allocations") as batch:
        # rows from before: their grants were published long ago, so they count as armed
        batch.add_column(sa.Column("armed", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_allocations") as batch:
        batch.drop_column("attempt")
        batch.drop_column("armed")
    with op.batch_alter_table("scheduler_tasks") as batch:
        batch.drop_column("pending_at")
        batch.drop_column("pending_kind")
        batch.drop_column("not_before")
        batch.drop_column("attempt")
