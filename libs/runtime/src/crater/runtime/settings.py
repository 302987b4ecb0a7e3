"""Configuration from the environment (CRATER_*), shared by every service."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///var/crater.db"


class ServiceSettings(BaseSettings):
    """What every service reads. Subclasses add their own fields, under the same prefix."""

    model_config = SettingsConfigDict(env_prefix="CRATER_", extra="ignore")

    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server URL.")
    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: sqlite+aiosqlite:///path or postgresql+asyncpg://...",
    )
    http_host: str = Field(default="127.0.0.1", description="Health and metrics bind address.")
    http_port: int = Field(default=0, ge=0, le=65535, description="0: the service's default.")
    log_level: str = Field(default="INFO")
    migrate_on_start: bool = Field(
        default=True, description="Apply the service's Alembic migrations before consuming."
    )
    trace_file: str | None = Field(
        default=None, description="Append finished spans as JSON lines here (demo, tests)."
    )
    consumer_batch: int = Field(default=64, ge=1, le=10_000, description="JetStream pull batch.")
