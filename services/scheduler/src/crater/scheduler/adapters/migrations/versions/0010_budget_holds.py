"""Tenants held by their hard budget: the tenant.budget_exceeded that holds each, until its
period ends or the budget is raised

Revision ID: 0010
Revises: 0009
Create Date: 2027-03-02 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_budget_holds",
        sa.Column("tenant", sa.String(length=63), primary_key=True),
        sa.Column("event", sa.JSON(), nullable=False),
        sa.Column("held_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_budget_holds")
