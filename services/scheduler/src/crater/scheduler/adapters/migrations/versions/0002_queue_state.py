"""Queue state that survives a restart: gang members, preemption deadlines, nominated nodes,
escalations.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 13:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_allocations") as batch:
        batch.add_column(sa.Column("gang_index", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("yield_by", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("scheduler_tasks") as batch:
        batch.add_column(sa.Column("nominated_node", sa.String(length=63), nullable=True))
        batch.add_column(
            sa.Column("escalated", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("scheduler_tasks") as batch:
        batch.drop_column("escalated")
        batch.drop_column("nominated_node")
    with op.batch_alter_table("scheduler_allocations") as batch:
        batch.drop_column("yield_by")
        batch.drop_column("gang_index")
