"""Order per task across subjects and streams: every recorded event of a task with its place
(task events), and each delivery's position and hold.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 13:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "callback_deliveries"


def upgrade() -> None:
    op.create_table(
        "callback_task_events",
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("task_id", sa.String(length=256), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("number", sa.BigInteger(), nullable=True),
        sa.Column("previous", sa.BigInteger(), nullable=True),
        sa.Column("allocation_id", sa.String(length=128), nullable=True),
        sa.Column("grants", sa.Boolean(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("waiting", sa.Boolean(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_callback_task_events")),
    )
    op.create_index(
        op.f("ix_callback_task_events_task_id"), "callback_task_events", ["task_id"], unique=False
    )
    # Deliveries recorded before keep their order among themselves (position 0, by id).
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(
            sa.Column("position", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("held_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("held_until")
        batch.drop_column("position")
    op.drop_index(op.f("ix_callback_task_events_task_id"), table_name="callback_task_events")
    op.drop_table("callback_task_events")
