"""The gateway's own settings, read from CRATER_GATEWAY_<NAME>."""

from __future__ import annotations

from pydantic import Field

from crater.runtime.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    """Own settings from CRATER_GATEWAY_<NAME>; http_port 0 means 8080."""

    service = "gateway"
    default_port = 8080  # health and metrics when http_port is 0

    http_host: str = Field(default="127.0.0.1", description="Bind address of the HTTP API.")
    max_body_bytes: int = Field(
        default=256 * 1024, ge=1024, le=16 * 1024 * 1024, description="Largest accepted body."
    )
    query_timeout_seconds: float = Field(
        default=2.0, gt=0, le=60, description="How long to wait for the scheduler's answer."
    )
    health_timeout_seconds: float = Field(default=1.0, gt=0, le=30)
    remember_accepted_seconds: int = Field(
        default=7 * 24 * 3600,
        ge=60,
        description="How long an accepted task id is remembered, so that a task the scheduler "
        "has not heard of yet (still being profiled) can be cancelled, and its id is not "
        "submitted twice (the scheduler refuses ids it stored for good).",
    )
    abandoned_claim_seconds: float = Field(
        default=30.0,
        ge=10,
        le=3600,
        description="A task id claimed but never confirmed published (a gateway that died "
        "between the two) may be submitted again after this long; longer than any publish.",
    )
