"""Alembic environment of the callback's tables (version table: callback_alembic_version)."""

from crater.callback.adapters.tables import metadata
from crater.runtime.db import run_alembic_env

run_alembic_env(metadata, version_table="callback_alembic_version")
