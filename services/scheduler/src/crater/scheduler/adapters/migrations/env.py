from crater.runtime.db import run_alembic_env
from crater.scheduler.adapters.orm import metadata

run_alembic_env(metadata, version_table="scheduler_alembic_version")
