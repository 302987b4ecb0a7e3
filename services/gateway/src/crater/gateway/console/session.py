"""Signing in to the console: a browser cannot send a bearer header when it navigates, so an
API key given once on the login page becomes a session cookie.

The cookie holds the key's SHA-256 (what the gateway stores of a key; never the token), signed
with the console's secret and stamped with the time (itsdangerous): forged, altered or older
than `console_session_seconds`, it is refused. Every request looks the key up again, so a key
revoked or deleted ends its sessions at once. The cookie is HttpOnly (no script reads it),
SameSite=Strict (no other site's page sends it: with login and logout POST only, that is the
CSRF defence), Secure over HTTPS, and scoped to /console.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

from fastapi import Request
from itsdangerous import BadSignature, URLSafeTimedSerializer

from crater.gateway.apikeys import TOKEN_PREFIX, Scope, token_hash
from crater.gateway.auth import Authenticator, Denied, Principal
from crater.gateway.settings import GatewaySettings

log = logging.getLogger("crater.gateway.console")

COOKIE = "crater_console"
COOKIE_PATH = "/console"
SALT = "crater-console-session"


class LoginRequired(Exception):
    """No usable session: the caller goes to the login page (`reason` is shown there)."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Sessions:
    """Signs and reads session cookies."""

    serializer: URLSafeTimedSerializer
    max_age: int

    @classmethod
    def of(cls, settings: GatewaySettings) -> Sessions:
        secret = settings.console_session_secret
        if secret is None:
            log.info(
                "console sessions signed with a random secret of this process: set "
                "CRATER_GATEWAY_CONSOLE_SESSION_SECRET to keep them across restarts and replicas"
            )
        key = secret.get_secret_value() if secret else secrets.token_urlsafe(32)
        return cls(URLSafeTimedSerializer(key, salt=SALT), settings.console_session_seconds)

    def sign(self, key_hash: str) -> str:
        return self.serializer.dumps({"key": key_hash})

    def read(self, cookie: str) -> str | None:
        """The key hash a cookie holds; None when it is forged, altered or expired."""
        try:
            data = self.serializer.loads(cookie, max_age=self.max_age)
        except BadSignature:  # SignatureExpired is one
            return None
        key = data.get("key") if isinstance(data, dict) else None
        return key if isinstance(key, str) else None


async def principal_of_key(auth: Authenticator, key_hash: str) -> Principal:
    """The principal of a stored key, by its hash: refused (Denied) when unknown or revoked,
    as the REST API refuses it."""
    key = await auth.lookup(key_hash)
    if key is None:
        raise Denied(401, "unknown_key", "the API key is not known")
    if key.revoked is not None:
        raise Denied(401, "revoked", f"the API key {key.key_id} was revoked")
    return Principal("api-key", f"key:{key.key_id}", key.tenant, frozenset(key.scopes))


async def sign_in(auth: Authenticator, sessions: Sessions, token: str) -> tuple[Principal, str]:
    """Check an API key given on the login page; its principal and the cookie's value."""
    token = token.strip()
    if not token.startswith(TOKEN_PREFIX):
        raise Denied(401, "malformed", f"an API key starts with {TOKEN_PREFIX}")
    hashed = token_hash(token)
    principal = await principal_of_key(auth, hashed)
    if not principal.allows(Scope.READ):
        raise Denied(403, "scope", "this key lacks the `read` scope the console needs")
    return principal, sessions.sign(hashed)


async def console_principal(request: Request) -> Principal:
    """Who calls a console route: anyone with auth off; else the bearer credential if the
    request carries one (as the REST API), else the session cookie. Holds `read`, or is
    refused; no session at all raises LoginRequired. Rate limited as the REST API is."""
    auth: Authenticator = request.app.state.auth
    if not auth.required or request.headers.get("authorization"):
        principal = await auth.principal(request)
    else:
        sessions: Sessions = request.app.state.console_sessions
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            raise LoginRequired()
        hashed = sessions.read(cookie)
        if hashed is None:
            raise LoginRequired("your session expired: sign in again")
        try:
            principal = await principal_of_key(auth, hashed)
        except Denied as denied:
            if denied.status != 401:
                raise
            auth.refused(request, denied.reason, denied.detail)
            raise LoginRequired(f"signed out: {denied.detail}") from None
        retry = auth.limiter.take(principal.subject)
        if retry > 0:
            raise Denied(429, "rate_limited", "rate limit of this credential exceeded")
        request.state.principal = principal
    if not principal.allows(Scope.READ):
        raise Denied(403, "scope", "this credential lacks the `read` scope the console needs")
    return principal
