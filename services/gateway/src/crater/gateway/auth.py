"""Who calls: a bearer token, an API key (apikeys.py) or an OIDC JWT checked against the
configured issuer's JWKS, turned into a `Principal` (tenant and scopes), rate limited per
credential. Every refusal is a `Denied`: answered 401/403/429 (503 when what the check needs,
NATS or the JWKS, is unreachable) with a reason, logged and counted by reason
(crater_gateway_auth_denials_total). With `auth` off every caller is `OPEN`: every scope, every
tenant, as before."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import jwt
from fastapi import Request
from fastapi.responses import JSONResponse
from faststream.nats import NatsBroker
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from crater.contracts import TaskRequest
from crater.gateway.apikeys import (
    API_KEYS_BUCKET,
    TOKEN_PREFIX,
    ApiKey,
    KeysFile,
    Scope,
    kv_lookup,
    token_hash,
)
from crater.gateway.settings import GatewaySettings
from crater.runtime.bus import key_value
from crater.runtime.service import BUS_ERRORS

log = logging.getLogger("crater.gateway.auth")

MAX_BUCKETS = 10_000  # rate-limit buckets kept before idle (full) ones are dropped


@dataclass(frozen=True)
class Principal:
    kind: Literal["open", "api-key", "jwt"]
    subject: str  # the key id, or the JWT's issuer and subject: never the token
    tenant: str | None  # None: auth off
    scopes: frozenset[Scope]
    user: str | None = None  # an API key naming its user: the tasks it submits are that user's

    def allows(self, scope: Scope) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes

    @property
    def sees_all(self) -> bool:
        """Auth off, or an admin: every tenant's tasks."""
        return self.tenant is None or Scope.ADMIN in self.scopes

    def owns(self, tenant: str) -> bool:
        return self.sees_all or tenant == self.tenant


OPEN = Principal("open", "open", None, frozenset(Scope))


class Denied(Exception):
    """A refusal: its status, the reason it is counted under, and what the caller is told
    (`field`: as a field error, like the 422s)."""

    def __init__(
        self,
        status: int,
        reason: str,
        detail: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail
        self.field = field
        self.headers = headers or {}


def unauthenticated(reason: str, detail: str) -> Denied:
    return Denied(401, reason, detail, headers={"WWW-Authenticate": 'Bearer realm="crater"'})


class RateLimiter:
    """A token bucket per credential, in memory (per replica): `rate` per second, `burst`
    at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.buckets: dict[str, tuple[float, float]] = {}  # subject: tokens, when

    def take(self, subject: str, now: float | None = None) -> float:
        """0 if allowed (one token taken), else the seconds until a token is back."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        tokens, then = self.buckets.get(subject, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens < 1:
            self.buckets[subject] = (tokens, now)
            return (1 - tokens) / self.rate
        if len(self.buckets) >= MAX_BUCKETS and subject not in self.buckets:
            self._forget_idle(now)
        self.buckets[subject] = (tokens - 1, now)
        return 0.0

    def _forget_idle(self, now: float) -> None:
        full = self.burst / self.rate
        for subject, (_, then) in list(self.buckets.items()):
            if now - then >= full:
                del self.buckets[subject]


def scopes_of(claims: dict[str, Any]) -> frozenset[Scope]:
    """The Crater scopes in a JWT's `scope` (space-separated) or `scp` (list or string)."""
    raw: Any = claims.get("scope", claims.get("scp", []))
    names = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
    known = {s.value for s in Scope}
    return frozenset(Scope(n) for n in names if isinstance(n, str) and n in known)


class Jwks:
    """The issuer's signing keys: a file (reread when a key id is not found in it) or a URL
    (fetched in a worker thread, cached `jwks_cache_seconds`)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.client = (
            jwt.PyJWKClient(
                settings.jwks_url, cache_keys=True, lifespan=settings.jwks_cache_seconds
            )
            if settings.jwks_url
            else None
        )
        self._file_keys: dict[str, jwt.PyJWK] = {}

    def _from_file(self, kid: str | None) -> jwt.PyJWK:
        if kid not in self._file_keys:
            assert self.settings.jwks_file is not None
            jwks = jwt.PyJWKSet.from_dict(json.loads(self.settings.jwks_file.read_text()))
            self._file_keys = {k.key_id or "": k for k in jwks.keys}
        if kid is None and len(self._file_keys) == 1:
            return next(iter(self._file_keys.values()))
        if kid not in self._file_keys:
            raise unauthenticated("unknown_key", f"no key {kid!r} in the issuer's JWKS")
        return self._file_keys[kid]

    async def key(self, token: str) -> jwt.PyJWK:
        if self.client is None:
            kid = jwt.get_unverified_header(token).get("kid")
            return self._from_file(kid if isinstance(kid, str) else None)
        try:
            return await asyncio.to_thread(self.client.get_signing_key_from_jwt, token)
        except jwt.PyJWKClientConnectionError as error:
            log.warning("JWKS %s unreachable: %r", self.settings.jwks_url, error)
            raise Denied(503, "jwks_unavailable", "the issuer's JWKS is unreachable") from None
        except jwt.PyJWKClientError as error:
            raise unauthenticated("unknown_key", f"no signing key for this JWT: {error}") from None


class Authenticator:
    """The credential checks the routes' dependencies run (deps.py `require`)."""

    def __init__(
        self, settings: GatewaySettings, broker: NatsBroker, registry: CollectorRegistry
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.required = settings.auth == "required"
        self.keys_file = KeysFile(settings.api_keys_file) if settings.api_keys_file else None
        self.jwks = Jwks(settings) if settings.jwt_issuer else None
        self.limiter = RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst)
        self._bucket: KeyValue | None = None
        self.denials = Counter(
            "crater_gateway_auth_denials",
            "Requests refused by authentication, scope, tenant or rate limit, by reason.",
            ["reason"],
            registry=registry,
        )

    async def open(self) -> None:
        """Open the API keys' bucket (after the broker started), when it is where keys are."""
        if self.required and self.keys_file is None:
            self._bucket = await key_value(
                self.broker, API_KEYS_BUCKET, self.settings.stream_replicas, history=1
            )

    async def principal(self, request: Request) -> Principal:
        """The caller, once per request (a route's dependencies may ask again)."""
        found = getattr(request.state, "principal", None)
        if isinstance(found, Principal):
            return found
        principal = await self.authenticate(request) if self.required else OPEN
        if principal is not OPEN:
            retry = self.limiter.take(principal.subject)
            if retry > 0:
                raise Denied(
                    429,
                    "rate_limited",
                    f"rate limit of this credential exceeded "
                    f"({self.settings.rate_limit_per_second:g}/s, burst "
                    f"{self.settings.rate_limit_burst}): retry after the Retry-After seconds",
                    headers={"Retry-After": str(max(1, math.ceil(retry)))},
                )
        request.state.principal = principal
        return principal

    async def authenticate(self, request: Request) -> Principal:
        header = request.headers.get("authorization")
        if not header:
            raise unauthenticated("missing", "authentication required: Authorization: Bearer")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthenticated("malformed", "the Authorization header is not `Bearer <token>`")
        if token.startswith(TOKEN_PREFIX):
            return await self.api_key(token)
        if self.jwks is not None and token.count(".") == 2:
            return await self.jwt(token)
        raise unauthenticated("unknown_key", "the bearer token is not a known credential")

    async def lookup(self, hashed: str) -> ApiKey | None:
        try:
            if self.keys_file is not None:
                return self.keys_file.lookup(hashed)
            if self._bucket is None:
                raise Denied(503, "keys_unavailable", "the API keys are not loaded yet")
            return await kv_lookup(self._bucket, hashed)
        except (OSError, ValueError, ValidationError) as error:  # the file: missing, invalid
            log.error("API keys unreadable: %r", error)
            raise Denied(503, "keys_unavailable", "the API keys are unreadable") from None
        except BUS_ERRORS as error:
            log.warning("API keys' bucket unreachable: %r", error)
            raise Denied(503, "keys_unavailable", "NATS unavailable") from None

    async def api_key(self, token: str) -> Principal:
        key = await self.lookup(token_hash(token))
        if key is None:
            raise unauthenticated("unknown_key", "the API key is not known")
        if key.revoked is not None:
            raise unauthenticated("revoked", f"the API key {key.key_id} was revoked")
        return Principal(
            "api-key", f"key:{key.key_id}", key.tenant, frozenset(key.scopes), key.user
        )

    async def jwt(self, token: str) -> Principal:
        assert self.jwks is not None
        settings = self.settings
        try:
            key = await self.jwks.key(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=settings.jwt_algorithms,
                audience=settings.jwt_audience,
                issuer=settings.jwt_issuer,
                leeway=settings.jwt_leeway_seconds,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise unauthenticated("expired", "the JWT has expired") from None
        except jwt.InvalidIssuerError:
            raise unauthenticated("wrong_issuer", "the JWT's issuer is not accepted") from None
        except jwt.InvalidAudienceError:
            raise unauthenticated("wrong_audience", "the JWT is not for this audience") from None
        except jwt.InvalidTokenError as error:
            raise unauthenticated("invalid_token", f"the JWT is invalid: {error}") from None
        tenant = claims.get(settings.jwt_tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise Denied(
                403, "no_tenant", f"the JWT has no `{settings.jwt_tenant_claim}` claim (tenant)"
            )
        subject = f"jwt:{claims['iss']}|{claims['sub']}"
        return Principal("jwt", subject, tenant, scopes_of(claims))

    def refused(self, request: Request, reason: str, detail: str) -> None:
        """Log and count a refusal (also one answered as a plain 404, not to reveal)."""
        principal = getattr(request.state, "principal", None)
        who = principal.subject if isinstance(principal, Principal) else "anonymous"
        client = request.client.host if request.client else "-"
        log.warning(
            "denied %s %s from %s (%s): %s: %s",
            request.method,
            request.url.path,
            client,
            who,
            reason,
            detail,
        )
        self.denials.labels(reason=reason).inc()

    def answer(self, request: Request, denied: Denied) -> JSONResponse:
        self.refused(request, denied.reason, denied.detail)
        content: dict[str, Any] = (
            {"detail": [{"field": denied.field, "reason": denied.detail}]}
            if denied.field
            else {"detail": denied.detail}
        )
        return JSONResponse(status_code=denied.status, content=content, headers=denied.headers)


def require(scope: Scope) -> Callable[[Request], Awaitable[Principal]]:
    """A route's dependency: the caller, who must hold `scope` (admin holds every scope)."""

    async def dependency(request: Request) -> Principal:
        authenticator: Authenticator = request.app.state.auth
        principal = await authenticator.principal(request)
        if not principal.allows(scope):
            raise Denied(403, "scope", f"this credential lacks the `{scope.value}` scope")
        return principal

    return dependency


def submitted_as(principal: Principal, request: TaskRequest) -> TaskRequest:
    """The request under the caller's tenant: a body naming none gets the credential's; one
    naming another is refused (an admin submits for any tenant). The same for its user when
    the credential names one (an API key created with `--user`): the per-user limits of the
    quotas file then count what the credential's holder submits, whatever the body says."""
    if principal.tenant is None:
        return request
    if "tenant" not in request.model_fields_set:
        request = request.model_copy(update={"tenant": principal.tenant})
    elif request.tenant != principal.tenant and not principal.sees_all:
        raise Denied(
            403,
            "tenant",
            f"this credential submits for tenant {principal.tenant!r}, not {request.tenant!r}",
            field="tenant",
        )
    if principal.user is None or principal.sees_all:
        return request
    if request.user is None:
        return request.model_copy(update={"user": principal.user})
    if request.user != principal.user:
        raise Denied(
            403,
            "user",
            f"this credential submits as user {principal.user!r} of tenant "
            f"{principal.tenant!r}, not {request.user!r}",
            field="user",
        )
    return request
