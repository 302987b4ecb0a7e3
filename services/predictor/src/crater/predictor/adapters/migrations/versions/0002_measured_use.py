"""Learning from measured use: whole-card allocations, running time, readings per allocation,
`running` reports that came before their grant

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 14:40:00
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
    with op.batch_alter_table("predictor_allocations") as batch:
        # Allocations recorded before this revision are taken as whole-card holders.
        batch.add_column(
            sa.Column("exclusive", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch.add_column(sa.Column("running_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "predictor_samples",
        sa.Column("allocation_id", sa.String(length=64), nullable=False),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_mb", sa.Integer(), nullable=False),
        sa.Column("total_mb", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("allocation_id", "sampled_at", name=op.f("pk_predictor_samples")),
    )
    op.create_table(
        "predictor_early_running",
        sa.Column("allocation_id", sa.String(length=64), nullable=False),
        sa.Column("running_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("allocation_id", name=op.f("pk_predictor_early_running")),
    )


def downgrade() -> None:
    op.drop_table("predictor_early_running")
    op.drop_table("predictor_samples")
    with op.batch_alter_table("predictor_allocations") as batch:
        batch.drop_column("running_at")
        batch.drop_column("exclusive")
