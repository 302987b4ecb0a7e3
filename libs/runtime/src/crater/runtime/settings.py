"""Configuration from the environment, shared by every service.

Settings every service shares read `CRATER_<FIELD>` (CRATER_NATS_URL, CRATER_DATABASE_URL,
...); a service's own settings read `CRATER_<SERVICE>_<FIELD>` only (CRATER_SCHEDULER_TOKEN_SECRET),
so one environment can configure every process without one's setting reaching another.

Safe defaults: CRATER_ENVIRONMENT is `production` unless set to `development`. A service's
`unsafe_defaults()` lists what only development may run with (the development token secret,
unsigned webhooks, ...): in production each refuses the settings (a ValidationError naming the
variable to set), in development each is logged once as a warning when the service starts.

Secrets from files: every secret setting (a SecretStr field) may instead be given as the same
variable with `_FILE` appended (CRATER_SCHEDULER_TOKEN_SECRET_FILE=/run/secrets/token), whose
content, stripped, is the value; setting both is refused naming both.
"""

from __future__ import annotations

import os
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///var/crater.db"
SHARED_PREFIX = "CRATER_"
FILE_SUFFIX = "_FILE"
Environment = Literal["production", "development"]


def is_secret(field: FieldInfo) -> bool:
    """A SecretStr setting (or an optional one): its value may come from a *_FILE."""
    annotation = field.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return SecretStr in typing.get_args(annotation)
    return annotation is SecretStr


class _Refused:
    """A secret file that could not be used: the validator turns it into a ValidationError."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _SecretFiles(PydanticBaseSettingsSource):
    """Secret settings from the files CRATER_..._FILE names: the content, stripped.

    Set (non-empty) along with the variable itself, or unreadable: a `_Refused` value."""

    def __init__(self, settings_cls: type[ServiceSettings]) -> None:
        super().__init__(settings_cls)
        self.service_settings = settings_cls

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ does the work

    def __call__(self) -> dict[str, Any]:
        environ = {k.upper(): v for k, v in os.environ.items()}
        values: dict[str, Any] = {}
        for name, field in self.service_settings.model_fields.items():
            if not is_secret(field):
                continue
            variable = self.service_settings.variable(name)
            path = environ.get(variable + FILE_SUFFIX, "").strip()
            if not path:
                continue
            if environ.get(variable, "").strip():
                values[name] = _Refused(f"set {variable} or {variable}{FILE_SUFFIX}, not both")
                continue
            try:
                values[name] = Path(path).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as error:
                values[name] = _Refused(f"{variable}{FILE_SUFFIX}: cannot read {path}: {error}")
        return values


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


# Shared settings a service may also be given under its own prefix, which then wins: each
# stateful service owns its tables, so each may keep them in a database of its own
# (CRATER_CALLBACK_DATABASE_URL; `crater up` gives the callback its own SQLite file, so its
# commits do not queue behind the scheduler's for the file's one write lock).
PER_SERVICE = frozenset({"database_url"})


class ServiceSettings(BaseSettings):
    """What every service reads. A subclass names its service; its own fields then come from
    CRATER_<SERVICE>_<FIELD>."""

    # Errors name the setting, never echo the input: it holds secrets.
    model_config = SettingsConfigDict(
        env_prefix=SHARED_PREFIX, extra="ignore", hide_input_in_errors=True
    )
    service: ClassVar[str | None] = None
    default_port: ClassVar[int | None] = None  # the service's own: its HTTP port if http_port is 0

    environment: Environment = Field(
        default="production",
        description="production: refuse to start with a development-only default (the "
        "development token secret, unsigned webhooks, an empty Basic-auth password), naming "
        "the setting to set; development: start, with one warning for each.",
    )
    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS server URL (tls://... for TLS); for a cluster every server's, "
        "comma-separated (the seeds: a process connects to any and fails over to the others).",
    )
    stream_replicas: int = Field(
        default=0,
        ge=0,
        le=5,
        description="Servers that keep a copy of every stream and KV bucket Crater declares; a "
        "stream kept on another number is updated to it. 0: auto, 1 on a server alone (the "
        "embedded `crater up`), 3 on a cluster (R3: one server lost loses nothing); set it for "
        "a cluster of two.",
    )
    nats_user: str | None = Field(
        default=None,
        description="NATS user this process connects as: its own identity, whose permissions "
        "are its catalog subjects (docs/security.md, NATS).",
    )
    nats_password: SecretStr | None = Field(
        default=None, description="That user's password (or CRATER_NATS_PASSWORD_FILE)."
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
        description="SQLAlchemy URL: sqlite+aiosqlite:///path or postgresql+asyncpg://...; "
        "one service may be given its own as CRATER_<SERVICE>_DATABASE_URL, which wins (on "
        "SQLite, `crater up` gives the callback its own file: docs/architecture.md, "
        "Persistence).",
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
    def variable(cls, name: str) -> str:
        """The environment variable a field is read from."""
        own = cls.own_prefix()
        shared = name in ServiceSettings.model_fields
        return f"{SHARED_PREFIX if shared or own is None else own}{name.upper()}"

    @property
    def development(self) -> bool:
        return self.environment == "development"

    def unsafe_defaults(self) -> list[str]:
        """What only development may run with, each naming the setting to set; a service's
        settings add theirs."""
        return []

    @model_validator(mode="before")
    @classmethod
    def _secret_files_usable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refused = [v.reason for v in data.values() if isinstance(v, _Refused)]
            if refused:
                raise ValueError("; ".join(refused))
        return data

    @model_validator(mode="after")
    def _safe_outside_development(self) -> ServiceSettings:
        if self.development:
            return self
        unsafe = self.unsafe_defaults()
        if unsafe:
            raise ValueError(
                "; ".join(unsafe)
                + f" (or set {SHARED_PREFIX}ENVIRONMENT=development, never in production)"
            )
        return self

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
        secret_files = _SecretFiles(cls)
        if prefix is None:
            return init_settings, secret_files, env_settings, dotenv_settings, file_secret_settings
        own = frozenset(cls.model_fields) - frozenset(ServiceSettings.model_fields)
        own_env = EnvSettingsSource(settings_cls, env_prefix=prefix)
        return (
            init_settings,
            secret_files,
            _SomeFields(settings_cls, own_env, own | PER_SERVICE, keep=True),
            _SomeFields(settings_cls, env_settings, own, keep=False),
            dotenv_settings,
            file_secret_settings,
        )
