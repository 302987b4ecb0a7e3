"""Delivery schedule: deliveries wait in the log for the delivery loop (next attempt, claim,
round, attempt limit) instead of being retried inside a consumer's handler.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "callback_deliveries"


def upgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("claimed_by", sa.String(length=36), nullable=True))
        batch.add_column(sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("round", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("attempt_limit", sa.Integer(), nullable=True))
    op.create_index(
        op.f("ix_callback_deliveries_task_id_endpoint_state"),
        TABLE,
        ["task_id", "endpoint", "state"],
        unique=False,
    )
    op.create_index(
        op.f("ix_callback_deliveries_state_next_attempt_at"),
        TABLE,
        ["state", "next_attempt_at"],
        unique=False,
    )
    # Deliveries left pending by the in-handler sender are due at once.
    op.execute(
        sa.text(f"UPDATE {TABLE} SET next_attempt_at = updated_at WHERE state = 'pending'")
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_callback_deliveries_state_next_attempt_at"), table_name=TABLE)
    op.drop_index(op.f("ix_callback_deliveries_task_id_endpoint_state"), table_name=TABLE)
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("attempt_limit")
        batch.drop_column("round")
        batch.drop_column("claimed_until")
        batch.drop_column("claimed_by")
        batch.drop_column("next_attempt_at")
