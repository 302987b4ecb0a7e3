"""The attempt each recorded event says it belongs to, so a webhook that does not say its own
(a node's running, a preemption) is told the one of the latest event before it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "callback_task_events"


def upgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("attempt")
