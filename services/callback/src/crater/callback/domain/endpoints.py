"""Where webhooks go: one or more endpoints, each with the events it wants, its credentials
and its signing secret. Pure: reading the YAML file is `load_endpoints`' only I/O."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from crater.callback.domain.payload import WebhookFormat
from crater.callback.domain.signing import decode_secret
from crater.contracts import WebhookStatus

EVENT_TYPES = frozenset(
    {
        "AllocationGranted",
        "TaskPending",
        "TaskEscalated",
        "TaskStartEstimated",
        "TaskRejected",
        "TaskPreempted",
        "TaskEnded",
        "TaskStatusReported",
        "TaskUnderutilized",
        "TenantBudgetExceeded",
    }
)
# Event types that were webhooks once, and what tells AllData the same now.
RETIRED_EVENT_TYPES = {"AllocationReleased": "TaskEnded (or the next attempt's TaskPending)"}
STATUSES = frozenset(s.value for s in WebhookStatus)


def redact(url: str) -> str:
    """The URL without credentials, query or fragment, fit for logs and metric labels."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Endpoint(BaseModel):
    """One receiver of webhooks. `events` lists webhook statuses (`scheduled`, `failed`, ...)
    and/or source event types (`AllocationGranted`, ...); empty means every event."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="", max_length=512, description="Label; default: the URL.")
    url: str = Field(min_length=1, max_length=2048)
    events: tuple[str, ...] = ()
    username: str = ""
    password: SecretStr = SecretStr("")
    secret: SecretStr | None = Field(default=None, description="whsec_<base64>: sign payloads.")
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    max_in_flight: int = Field(default=32, ge=1, le=1024)
    format: WebhookFormat = Field(
        default=WebhookFormat.ALLDATA,
        description="alldata: exactly the body AllData parses; crater: Crater's typed body.",
    )

    @field_validator("url", "username", mode="before")
    @classmethod
    def _expand(cls, value: Any) -> Any:
        return os.path.expandvars(value) if isinstance(value, str) else value

    @field_validator("password", "secret", mode="before")
    @classmethod
    def _expand_secret(cls, value: Any) -> Any:
        return os.path.expandvars(value) if isinstance(value, str) else value

    @field_validator("events")
    @classmethod
    def _known_events(cls, events: tuple[str, ...]) -> tuple[str, ...]:
        retired = [
            f"{e}: no longer a webhook, use {RETIRED_EVENT_TYPES[e]}"
            for e in events
            if e in RETIRED_EVENT_TYPES
        ]
        if retired:
            raise ValueError("; ".join(retired))
        unknown = [e for e in events if e not in EVENT_TYPES and e not in STATUSES]
        if unknown:
            known = ", ".join(sorted(STATUSES | EVENT_TYPES))
            raise ValueError(f"unknown event(s) {', '.join(unknown)}; known: {known}")
        return events

    @field_validator("secret")
    @classmethod
    def _valid_secret(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None and secret.get_secret_value():
            decode_secret(secret.get_secret_value())
            return secret
        return None

    @model_validator(mode="after")
    def _default_name(self) -> Endpoint:
        if not self.name:
            object.__setattr__(self, "name", redact(self.url))
        return self

    def wants(self, event_type: str, status: str) -> bool:
        return not self.events or event_type in self.events or status in self.events


class EndpointsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoints: list[Endpoint] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> EndpointsFile:
        names = [e.name for e in self.endpoints]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"endpoint names must be unique; repeated: {', '.join(repeated)}")
        return self


def parse_endpoints(text: str) -> list[Endpoint]:
    """Endpoints from YAML (`endpoints: [{url, events, username, password, secret, format},
    ...]`);
    `${VAR}` in a URL, user name, password or secret is read from the environment."""
    return EndpointsFile.model_validate(yaml.safe_load(text) or {}).endpoints


def load_endpoints(path: str | Path) -> list[Endpoint]:
    return parse_endpoints(Path(path).read_text(encoding="utf-8"))
