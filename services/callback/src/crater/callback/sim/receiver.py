"""A reference webhook receiver standing in for AllData (`crater receiver`).

Checks HTTP Basic auth and, given the endpoint's `whsec_` secret, the Standard Webhooks
signature (a wrong one gets 401; a timestamp more than 5 minutes from now, a replay, gets 400);
records each delivery once per `webhook-id` (counting duplicates) with its body and its
`crater-*` headers (sequence, attempt, ...: what the default `alldata` body leaves out), prints
one line per delivery, and can fail on purpose (`fail_rate`, seeded) or answer slowly
(`delay_seconds`) to exercise the sender's retries.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBasic, HTTPBasicCredentials

from crater.callback.domain.signing import DEFAULT_TOLERANCE_SECONDS, SignatureError, Verifier

DEFAULT_PORT = 9180
_basic = HTTPBasic(auto_error=False, realm="crater-receiver")


@dataclass(frozen=True)
class ReceivedWebhook:
    webhook_id: str
    webhook_timestamp: str | None
    received_at: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)  # the crater-* ones

    def crater_field(self, name: str) -> Any:
        """A Crater field: from the body (the `crater` format), else from its `crater-<name>`
        header (the `alldata` format), as a string; None if neither has it."""
        if self.body.get(name) is not None:
            return self.body[name]
        return self.headers.get("crater-" + name.replace("_", "-"))


@dataclass
class Receiver:
    """The receiver's state; `app()` serves it."""

    username: str
    password: str
    record_file: Path | None = None
    fail_rate: float = 0.0
    seed: int | None = None
    echo: bool = True
    secret: str | None = None  # whsec_...: verify signatures; None: do not check them
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS
    delay_seconds: float = 0.0  # answer this much later (a slow receiver)
    deliveries: list[ReceivedWebhook] = field(default_factory=list)
    duplicates: int = 0
    unauthorized: int = 0
    bad_signatures: int = 0
    replays_refused: int = 0
    failures_injected: int = 0
    requests: int = 0
    _seen: set[str] = field(default_factory=set)
    _rng: random.Random = field(init=False)
    _verifier: Verifier | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError("fail_rate must lie in [0, 1]")
        self._rng = random.Random(self.seed)
        if self.secret:
            self._verifier = Verifier(self.secret, self.tolerance_seconds)

    def check_signature(self, request: Request, body: bytes) -> JSONResponse | None:
        """None if the signature holds (or none is checked); else the refusal to send."""
        if self._verifier is None:
            return None
        headers = request.headers
        try:
            self._verifier.verify(
                headers.get("webhook-id"),
                headers.get("webhook-timestamp"),
                headers.get("webhook-signature"),
                body,
                now=time.time(),
            )
        except SignatureError as error:
            if error.replay:
                self.replays_refused += 1
                self._say(f"refused a stale webhook: {error}")
                return JSONResponse({"detail": str(error)}, status_code=400)
            self.bad_signatures += 1
            self._say(f"refused a webhook: {error}")
            return JSONResponse({"detail": str(error)}, status_code=401)
        return None

    def authorised(self, credentials: HTTPBasicCredentials | None) -> bool:
        if credentials is None:
            return False
        # Both compared, in constant time, so a wrong user and a wrong password look alike.
        user_ok = secrets.compare_digest(credentials.username.encode(), self.username.encode())
        password_ok = secrets.compare_digest(credentials.password.encode(), self.password.encode())
        return user_ok and password_ok

    def should_fail(self) -> bool:
        return self.fail_rate > 0 and self._rng.random() < self.fail_rate

    def record(self, webhook: ReceivedWebhook) -> bool:
        """Keep a first delivery (True); count a repeated webhook-id as a duplicate (False)."""
        if webhook.webhook_id in self._seen:
            self.duplicates += 1
            self._say(f"duplicate webhook {webhook.webhook_id[:8]} ignored")
            return False
        self._seen.add(webhook.webhook_id)
        self.deliveries.append(webhook)
        if self.record_file is not None:
            self._append(webhook)
        self._say(describe(webhook))
        return True

    def summary(self, task_id: str | None = None) -> dict[str, Any]:
        chosen = [d for d in self.deliveries if task_id is None or d.body.get("task_id") == task_id]
        return {
            "count": len(chosen),
            "duplicates": self.duplicates,
            "unauthorized": self.unauthorized,
            "bad_signatures": self.bad_signatures,
            "replays_refused": self.replays_refused,
            "failures_injected": self.failures_injected,
            "requests": self.requests,
            "deliveries": [asdict(d) for d in chosen],
        }

    def _append(self, webhook: ReceivedWebhook) -> None:
        assert self.record_file is not None
        self.record_file.parent.mkdir(parents=True, exist_ok=True)
        with self.record_file.open("a", encoding="utf-8") as out:
            out.write(json.dumps(asdict(webhook)) + "\n")

    def _say(self, line: str) -> None:
        if self.echo:
            print(f"[alldata] {line}", flush=True)

    def app(self) -> FastAPI:
        api = FastAPI(title="Crater reference webhook receiver (AllData stand-in)")
        api.state.receiver = self

        @api.get("/healthz")
        async def healthz() -> dict[str, str]:
            return {"status": "ok"}

        @api.get("/deliveries")
        async def deliveries(task_id: str | None = None) -> dict[str, Any]:
            return self.summary(task_id)

        @api.post("/{path:path}")
        async def receive(
            path: str,
            request: Request,
            credentials: Annotated[HTTPBasicCredentials | None, Depends(_basic)],
        ) -> JSONResponse:
            self.requests += 1
            if self.delay_seconds > 0:
                await asyncio.sleep(self.delay_seconds)
            if not self.authorised(credentials):
                self.unauthorized += 1
                return JSONResponse(
                    {"detail": "unauthorized"},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Basic realm="crater-receiver"'},
                )
            raw = await request.body()
            refusal = self.check_signature(request, raw)
            if refusal is not None:
                return refusal
            if self.should_fail():
                self.failures_injected += 1
                return JSONResponse({"detail": "injected failure"}, status_code=503)
            webhook_id = request.headers.get("webhook-id")
            if not webhook_id:
                return JSONResponse({"detail": "missing webhook-id header"}, status_code=400)
            try:
                body = json.loads(raw)
            except ValueError:
                return JSONResponse({"detail": "body is not JSON"}, status_code=400)
            if not isinstance(body, dict):
                return JSONResponse({"detail": "body is not a JSON object"}, status_code=400)
            first = self.record(
                ReceivedWebhook(
                    webhook_id=webhook_id,
                    webhook_timestamp=request.headers.get("webhook-timestamp"),
                    received_at=datetime.now(UTC).isoformat(),
                    path="/" + path,
                    body=body,
                    headers={
                        name: value
                        for name, value in request.headers.items()
                        if name.startswith("crater-")
                    },
                )
            )
            # A duplicate is acknowledged too: the sender must stop retrying it.
            return JSONResponse({"status": "accepted" if first else "duplicate"})

        return api


def describe(webhook: ReceivedWebhook) -> str:
    """One readable line: `task t-1 -> scheduled on gpu-01 gpus 0,1 cores 0-7 numa 0`."""
    body = webhook.body
    if str(body.get("event", "")).startswith("tenant."):  # about a tenant, not a task
        return f"tenant {body.get('tenant')} -> {body.get('event')}: {body.get('reason')}"
    line = f"task {body.get('task_id')} -> {body.get('status')}"
    resources = body.get("allocated_resources")
    if isinstance(resources, dict):
        line += f" on {resources.get('node')}"
        line += f" gpus {_ranges(resources.get('gpu_ids') or [])}"
        line += f" cores {_ranges(resources.get('cpu_cores') or [])}"
        if resources.get("numa_node") is not None:
            line += f" numa {resources['numa_node']}"
    elif body.get("reason"):
        line += f": {body['reason']}"
    return f"{line}  (webhook {webhook.webhook_id[:8]})"


def _ranges(numbers: list[int] | list[str]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8' (the alldata format's ["0", "1"] too); '-' for none."""
    if not numbers:
        return "-"
    ordered = sorted(int(n) for n in numbers)
    parts: list[str] = []
    start = previous = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == previous + 1:
            previous = n
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if n is not None:
            start = previous = n
    return ",".join(parts)


def create_receiver(
    username: str = "alldata",
    password: str = "alldata",
    record_file: str | Path | None = None,
    fail_rate: float = 0.0,
    seed: int | None = None,
    echo: bool = True,
    secret: str | None = None,
) -> FastAPI:
    """The receiver's ASGI app; its state is `app.state.receiver`."""
    path = Path(record_file) if record_file is not None else None
    return Receiver(username, password, path, fail_rate, seed, echo, secret=secret or None).app()


def main(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    username: str = "alldata",
    password: str = "alldata",
    record_file: str | Path | None = None,
    fail_rate: float = 0.0,
    seed: int | None = None,
    secret: str | None = None,
) -> None:
    """Serve the receiver until interrupted (what `crater receiver` runs)."""
    app = create_receiver(username, password, record_file, fail_rate, seed, secret=secret)
    checks = "Basic auth and signatures" if secret else "Basic auth"
    print(
        f"[alldata] receiving webhooks on http://{host}:{port}/ (GET /deliveries), "
        f"checking {checks}",
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
