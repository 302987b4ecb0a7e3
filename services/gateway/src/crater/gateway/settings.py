"""The gateway's own settings, read from CRATER_GATEWAY_<NAME>."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from crater.runtime.bus import PUBLISH_GIVE_UP_SECONDS
from crater.runtime.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    """Own settings from CRATER_GATEWAY_<NAME>; http_port 0 means 8080."""

    service = "gateway"
    default_port = 8080  # health and metrics when http_port is 0

    http_host: str = Field(default="127.0.0.1", description="Bind address of the HTTP API.")
    max_body_bytes: int = Field(
        default=256 * 1024, ge=1024, le=16 * 1024 * 1024, description="Largest accepted body."
    )
    max_batch_tasks: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description="Most tasks in one POST /api/v1/schedule array (the body still within "
        "max_body_bytes).",
    )
    batch_concurrency: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="Tasks of one array submitted at once (claim, publish, confirm each).",
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
        ge=PUBLISH_GIVE_UP_SECONDS + 1,
        le=3600,
        description="A task id claimed but never confirmed published (a gateway that died "
        "between the two) may be submitted again after this long; longer than any publish.",
    )

    # Authentication (docs/security.md): required unless in development.
    auth: Literal["off", "required"] = Field(
        default="required",
        description="`required`: every /api/v1 call needs a bearer token (an API key or an "
        "OIDC JWT); /healthz and /metrics stay open. `off` (every caller may do everything) "
        "is refused outside CRATER_ENVIRONMENT=development, where it is the default.",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="A YAML/JSON file of API keys (hashes; `crater tokens --file`); unset: the "
        "keys are in the JetStream key-value bucket crater_gateway_api_keys.",
    )
    jwt_issuer: str | None = Field(default=None, description="OIDC issuer (`iss`) accepted.")
    jwt_audience: str | None = Field(default=None, description="`aud` required in JWTs.")
    jwks_file: Path | None = Field(default=None, description="The issuer's JWKS, as a file.")
    jwks_url: str | None = Field(default=None, description="The issuer's JWKS URL (cached).")
    jwks_cache_seconds: int = Field(default=300, ge=1, le=86_400)
    jwt_algorithms: list[str] = Field(default=["RS256", "ES256", "PS256", "EdDSA"])
    jwt_tenant_claim: str = Field(default="tenant", description="The claim naming the tenant.")
    jwt_leeway_seconds: float = Field(default=30.0, ge=0, le=600)
    rate_limit_per_second: float = Field(
        default=0.0, ge=0, description="Requests per second per credential; 0: no limit."
    )
    rate_limit_burst: int = Field(default=60, ge=1, description="Requests allowed at once.")
    console: bool = Field(
        default=True, description="Serve the web console at /console (docs/console.md)."
    )
    console_session_secret: SecretStr | None = Field(
        default=None,
        description="Signs the console's session cookies (or CRATER_GATEWAY_CONSOLE_SESSION_"
        "SECRET_FILE); replicas behind one address need the same. Unset: a random one per "
        "process, so a restart signs everyone out.",
    )
    console_session_seconds: int = Field(
        default=8 * 3600, ge=60, le=30 * 86_400, description="A console sign-in lasts this long."
    )
    console_refresh_seconds: float = Field(
        default=1.0,
        ge=0.1,
        le=60,
        description="A console panel is refreshed live at most once per this many seconds, "
        "however many events arrive.",
    )
    tls_certfile: Path | None = Field(default=None, description="Serve HTTPS with this cert.")
    tls_keyfile: Path | None = None
    tls_ca_certs: Path | None = Field(
        default=None, description="CA bundle that client certificates must chain to (mTLS)."
    )
    tls_client_cert_required: bool = Field(
        default=False, description="mTLS: refuse TLS handshakes without a valid client cert."
    )

    @model_validator(mode="before")
    @classmethod
    def _open_in_development(cls, data: Any) -> Any:
        # Development (a laptop, the tests) stays open unless told otherwise.
        if isinstance(data, dict) and data.get("environment") == "development":
            data.setdefault("auth", "off")
        return data

    def unsafe_defaults(self) -> list[str]:
        if self.auth == "required":
            return []
        variable = self.variable("auth")
        return [
            f"auth is off: any caller could act as any tenant: set {variable}=required and "
            "create a key (crater tokens create --tenant T --scope admin)"
        ]

    @model_validator(mode="after")
    def _auth_consistent(self) -> GatewaySettings:
        if self.jwt_issuer and not (self.jwks_file or self.jwks_url):
            raise ValueError("jwt_issuer needs jwks_file or jwks_url")
        if (self.jwks_file or self.jwks_url) and not (self.jwt_issuer and self.jwt_audience):
            raise ValueError("a JWKS needs jwt_issuer and jwt_audience")
        if self.tls_client_cert_required and not (self.tls_certfile and self.tls_ca_certs):
            raise ValueError("tls_client_cert_required needs tls_certfile and tls_ca_certs")
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ValueError("tls_certfile and tls_keyfile go together")
        return self
