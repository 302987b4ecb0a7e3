"""Alembic environment of the predictor's tables (version table: predictor_alembic_version)."""

from crater.predictor.adapters.orm import metadata
from crater.runtime.db import run_alembic_env

run_alembic_env(metadata, version_table="predictor_alembic_version")
