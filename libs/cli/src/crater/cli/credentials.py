"""The CLI's credential for the gateway: the API key or JWT in CRATER_API_TOKEN, as
crater_client reads it (`crater up` prints where its admin key is)."""

from __future__ import annotations

import os


def api_headers() -> dict[str, str]:
    token = os.environ.get("CRATER_API_TOKEN", "").strip()
    return {"authorization": f"Bearer {token}"} if token else {}
