"""Standard Webhooks signatures (https://www.standardwebhooks.com): pure, no clock inside.

The signed content is `{webhook-id}.{webhook-timestamp}.{body}`; the signature header holds
space-separated `v1,<base64 HMAC-SHA256>` entries (several while a secret is being rotated);
a secret is `whsec_` followed by the base64 of its key bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

SECRET_PREFIX = "whsec_"
VERSION = "v1"
DEFAULT_TOLERANCE_SECONDS = 300  # a timestamp further than 5 minutes from now is refused


class SignatureError(ValueError):
    """The webhook is not to be trusted; `replay` when only its timestamp is out of range."""

    def __init__(self, reason: str, *, replay: bool = False) -> None:
        super().__init__(reason)
        self.replay = replay


def decode_secret(secret: str) -> bytes:
    """The key bytes of a `whsec_<base64>` secret (the prefix is optional, as in the spec)."""
    encoded = secret.strip().removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError("a webhook secret is whsec_ followed by base64") from error
    if len(key) < 16:
        raise ValueError("a webhook secret needs at least 16 key bytes (24 to 64 advised)")
    return key


def generate_secret(key_bytes: int = 32) -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(key_bytes)).decode()


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for one attempt."""
    return f"{VERSION},{_digest(decode_secret(secret), webhook_id, timestamp, body)}"


def _digest(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    content = f"{webhook_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()


@dataclass(frozen=True)
class Verifier:
    """What a receiver checks: the signature over id, timestamp and body, and the timestamp
    within `tolerance_seconds` of `now` (a replayed old webhook, or one from the future)."""

    secret: str
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS

    def __post_init__(self) -> None:
        decode_secret(self.secret)  # fail at start, not at the first webhook

    def verify(
        self,
        webhook_id: str | None,
        timestamp: str | None,
        signature: str | None,
        body: bytes,
        now: float,
    ) -> None:
        if not webhook_id or not timestamp or not signature:
            raise SignatureError("missing webhook-id, webhook-timestamp or webhook-signature")
        try:
            sent = int(timestamp)
        except ValueError:
            raise SignatureError("webhook-timestamp is not an integer") from None
        if abs(now - sent) > self.tolerance_seconds:
            raise SignatureError(
                f"webhook-timestamp {sent} is more than {self.tolerance_seconds} s from now",
                replay=True,
            )
        expected = _digest(decode_secret(self.secret), webhook_id, sent, body)
        for entry in signature.split():
            version, _, value = entry.partition(",")
            if version == VERSION and hmac.compare_digest(value, expected):
                return
        raise SignatureError("no valid v1 signature")
