"""Card cordons: each node's cordoned cards (a fault the probe reported, or an operator's),
the faults an operator lifted, and a node cordoned whole, so that a restarted scheduler
keeps an operator's cordons and lifts (docs/health.md).

Revision ID: 0013
Revises: 0012 (0013 and 0014 are taken on other branches: re-point at merge)
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_nodes") as batch:
        # null: nothing cordoned (the domain's cordons.stored form otherwise)
        batch.add_column(sa.Column("cordons", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_nodes") as batch:
        batch.drop_column("cordons")
