"""What AllData is told: one row per task (its end, and the lock that serialises recording and
releasing its deliveries), and per delivery when it was first released and whether it belongs
to its task's lifecycle.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 14:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "callback_deliveries"
TERMINAL = "('succeeded', 'failed', 'cancelled', 'rejected')"


def upgrade() -> None:
    op.create_table(
        "callback_tasks",
        sa.Column("task_id", sa.String(length=256), nullable=False),
        sa.Column("end_event_id", sa.String(length=36), nullable=True),
        sa.Column("end_position", sa.BigInteger(), nullable=True),
        sa.Column("end_status", sa.String(length=32), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_callback_tasks")),
    )
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("lifecycle", sa.Boolean(), nullable=False, server_default=sa.true())
        )
    # What was sent before keeps its place: a delivery attempted or settled was released.
    op.execute(
        sa.text(
            f"UPDATE {TABLE} SET released_at = updated_at "
            "WHERE attempts > 0 OR state IN ('delivered', 'dead')"
        )
    )
    # Every task with a delivery has its row (the lock a release takes), and a task already
    # told an end (then from a node's report or a release) keeps that one: the scheduler's
    # task.ended that follows is a second end, not told again.
    op.execute(
        sa.text(f"INSERT INTO callback_tasks (task_id) SELECT DISTINCT task_id FROM {TABLE}")
    )
    first_end = (
        f"SELECT {{column}} FROM {TABLE} d WHERE d.task_id = callback_tasks.task_id "
        f"AND d.task_status IN {TERMINAL} ORDER BY d.id LIMIT 1"
    )
    op.execute(
        sa.text(
            "UPDATE callback_tasks SET "
            f"end_event_id = ({first_end.format(column='webhook_id')}), "
            f"end_position = ({first_end.format(column='position')}), "
            f"end_status = ({first_end.format(column='task_status')}), "
            f"ended_at = ({first_end.format(column='created_at')})"
        )
    )


def downgrade() -> None:
    # Superseded deliveries stay: not pending, the earlier code never sends them.
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("lifecycle")
        batch.drop_column("released_at")
    op.drop_table("callback_tasks")
