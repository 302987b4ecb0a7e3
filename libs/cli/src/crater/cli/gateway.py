"""The CLI's one way to call the gateway: its credential, and what each failure means to
the user (exit codes in crater.cli.errors)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from crater.cli.credentials import api_headers
from crater.cli.errors import NO, UNAUTHORISED, UNREACHABLE, CliError


def call(
    method: str,
    gateway: str,
    path: str,
    *,
    params: dict[str, str | int] | None = None,
    content: bytes | str | None = None,
    timeout: float = 10,
) -> httpx.Response:
    """`method` `gateway``path`; a 2xx answer, or a CliError that says what to do."""
    url = f"{gateway.rstrip('/')}{path}"
    headers = api_headers()
    if content is not None:
        headers["content-type"] = "application/json"
    try:
        response = httpx.request(
            method, url, params=params, content=content, headers=headers, timeout=timeout
        )
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise CliError(
            f"no gateway at {gateway}: is Crater up (`crater up` or `make up`)? "
            "Set CRATER_GATEWAY_URL or --gateway to where it runs.",
            UNREACHABLE,
        ) from None
    except httpx.TimeoutException:
        raise CliError(
            f"the gateway at {gateway} did not answer in {timeout:g} s", UNREACHABLE
        ) from None
    except httpx.HTTPError as error:
        raise CliError(f"cannot talk to the gateway at {gateway}: {error}", UNREACHABLE) from None
    if response.status_code in (401, 403):
        hint = (
            "set CRATER_API_TOKEN to an API key or JWT (`crater up` prints where its admin key "
            "is; `crater tokens create` makes one)"
            if response.status_code == 401
            else "this token may not do that; use one with the needed scope"
        )
        raise CliError(
            f"{'not authorised' if response.status_code == 401 else 'forbidden'} "
            f"({response.status_code}) at {url}: {detail(response) or 'no detail'}; {hint}",
            UNAUTHORISED,
        )
    if response.status_code >= 400:
        raise CliError(f"rejected ({response.status_code}): {detail(response)}", NO)
    return response


def detail(response: httpx.Response) -> str:
    """A gateway error's detail as readable lines: `field: reason` per validation error."""
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text.strip()[:500]
    found = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(found, list):
        lines = []
        for error in found:
            if isinstance(error, dict):
                where = error.get("field") or ".".join(map(str, error.get("loc", [])))
                what = error.get("reason") or error.get("msg") or json.dumps(error)
                lines.append(f"{where}: {what}" if where else str(what))
            else:
                lines.append(str(error))
        return "\n  " + "\n  ".join(lines) if len(lines) > 1 else "".join(lines)
    return str(found)
