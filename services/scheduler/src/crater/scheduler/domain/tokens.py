"""Reservation tokens: made when an allocation is granted, checked when its launcher reports.

A token is `v1.<allocation_id>.<expiry>.<signature>`: the signature (HMAC-SHA256 under the
scheduler's `token_secret`) covers the allocation, its task, its node and the reservation's
deadline as decided. Only the scheduler signs and checks them (the gateway asks it, over
`query.allocation`), so the secret stays in one service. The deadline in a token is the one
decided at placement; the reservation that counts starts when the grant is stored on the
stream (`ReservationArmed`), so whether a confirmation is late is judged on that real
deadline, never on the token's.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime

VERSION = "v1"


def sign_token(
    secret: bytes, allocation_id: str, task_id: str, node: str, expires: datetime
) -> str:
    """The token of an allocation, handed to its task (CRATER_RESERVATION_TOKEN)."""
    expiry = int(expires.timestamp())
    signature = _signature(secret, allocation_id, task_id, node, expiry)
    return f"{VERSION}.{allocation_id}.{expiry}.{signature}"


def token_allocation(token: str) -> str | None:
    """The allocation a well-formed token names; None: it is not a token."""
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != VERSION or not parts[1] or not parts[2].isdigit():
        return None
    return parts[1]


def token_refusal(
    secret: bytes, token: str, allocation_id: str, task_id: str, node: str
) -> str | None:
    """Why `token` is not the token of `allocation_id` (of `task_id`, on `node`); None: it is."""
    named = token_allocation(token)
    if named is None:
        return (
            "malformed: a reservation token reads v1.<allocation_id>.<expiry>.<signature>, as "
            "the grant (CRATER_RESERVATION_TOKEN) handed it"
        )
    if named != allocation_id:
        return f"it is the token of allocation {named!r}, not of {allocation_id!r}"
    expiry = int(token.split(".")[2])
    expected = _signature(secret, allocation_id, task_id, node, expiry)
    if not hmac.compare_digest(expected, token.rsplit(".", 1)[1]):
        return (
            f"forged: its signature is not this scheduler's for allocation {allocation_id!r} of "
            f"task {task_id!r} (altered, or signed with another secret)"
        )
    return None


def _signature(secret: bytes, allocation_id: str, task_id: str, node: str, expiry: int) -> str:
    claim = f"{allocation_id}.{task_id}.{node}.{expiry}"
    return hmac.new(secret, claim.encode(), hashlib.sha256).hexdigest()
