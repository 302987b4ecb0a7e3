"""The environment each allocation hands its task, kept so that GET /api/v1/tasks/{id} can
show it after the `scheduled` webhook.

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-10 10:00:00
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
    with op.batch_alter_table("scheduler_allocations") as batch:
        # rows from before: their environment went out in their grant and was not kept
        batch.add_column(sa.Column("environment", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_allocations") as batch:
        batch.drop_column("environment")
