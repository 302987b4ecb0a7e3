"""Configuration from the environment, shared by every service.

Settings every service shares read `CRATER_<FIELD>` (CRATER_NATS_URL, CRATER_DATABASE_URL,
...); a service's own settings read `CRATER_<SERVICE>_<FIELD>` only (CRATER_SCHEDULER_TOKEN_SECRET),
so one environment can configure every process without one's setting reaching another.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///var/crater.db"
SHARED_PREFIX = "CRATER_"


class _SomeFields(PydanticBaseSettingsSource):
    """Another source's values, for some fields only (or for all but those)."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        source: PydanticBaseSettingsSource,
        fields: frozenset[str],
        keep: bool,
    ) -> None:
        super().__init__(settings_cls)
        self.source, self.fields, self.keep = source, fields, keep

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        return {k: v for k, v in self.source().items() if (k in self.fields) == self.keep}


class ServiceSettings(BaseSettings):
    """What every service reads. A subclass names its service; its own fields then come from
    CRATER_<SERVICE>_<FIELD>."""

    model_config = SettingsConfigDict(env_prefix=SHARED_PREFIX, extra="ignore")
    service: ClassVar[str | None] = None
    default_port: ClassVar[int | None] = None  # the service's own: its HTTP port if http_port is 0

    nats_url: str = Field(
        default="nats://127.0.0.1:4222", description="NATS server URL (tls://... for TLS)."
    )
    nats_user: str | None = Field(
        default=None,
        description="NATS user this process connects as: its own identity, whose permissions "
        "are its catalog subjects (docs/security.md, NATS).",
    )
    nats_password: SecretStr | None = Field(default=None, description="That user's password.")
    nats_password_file: str | None = Field(
        default=None, description="A file holding that password (instead of nats_password)."
    )
    nats_tls_ca: str | None = Field(
        default=None, description="CA certificate (PEM) that signed the NATS server's; TLS on."
    )
    nats_tls_cert: str | None = Field(
        default=None, description="Client certificate (PEM), if the server verifies clients."
    )
    nats_tls_key: str | None = Field(default=None, description="That certificate's key (PEM).")
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
    max_deliveries: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Deliveries of a message whose handling keeps failing before it is moved to "
        "the dead-letter stream (CRATER_DEAD_LETTERS); a message that cannot be decoded is moved "
        "at once.",
    )
    max_outage_deliveries: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Deliveries of a message whose handling fails because something it needs "
        "is unreachable (database, NATS, a timeout) before it is dead-lettered: an outage is not "
        "the message's fault. At most 300 s apart, 50 cover about 3.5 hours.",
    )
    redelivery_delay_seconds: float = Field(
        default=3.0,
        gt=0,
        le=60,
        description="Delay before the first redelivery of a message whose handling failed; "
        "doubled on each further delivery (at most 300 s): with 5 deliveries a message is "
        "retried for 45 s (3+6+12+24), long enough for a database restart.",
    )
    max_json_depth: int = Field(
        default=64,
        ge=2,
        le=512,
        description="Deepest JSON nesting accepted, on the bus and at the gateway; checked "
        "before decoding.",
    )

    @classmethod
    def own_prefix(cls) -> str | None:
        return f"{SHARED_PREFIX}{cls.service.upper()}_" if cls.service else None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        prefix = cls.own_prefix()
        if prefix is None:
            return init_settings, env_settings, dotenv_settings, file_secret_settings
        own = frozenset(cls.model_fields) - frozenset(ServiceSettings.model_fields)
        own_env = EnvSettingsSource(settings_cls, env_prefix=prefix)
        return (
            init_settings,
            _SomeFields(settings_cls, own_env, own, keep=True),
            _SomeFields(settings_cls, env_settings, own, keep=False),
            dotenv_settings,
            file_secret_settings,
        )
