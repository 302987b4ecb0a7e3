"""AllData's typed client for Crater's gateway: submit, dry-run, cancel, get, list and wait.

Standard library only (urllib). Every refusal is raised as a `CraterError` subclass carrying
what the gateway said: `ValidationFailed.errors` lists (field, reason) pairs, `TaskExists`
the known task's status, `Unavailable` the gateway's Retry-After when it gave one.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "rejected"})
DEFAULT_TIMEOUT_SECONDS = 10.0


class CraterError(Exception):
    """The gateway refused, failed, or could not be reached (`status` None)."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ValidationFailed(CraterError):
    """422 (or 413, a body too large): every invalid field and why."""

    def __init__(self, errors: list[tuple[str, str]], status: int, body: Any) -> None:
        text = "; ".join(f"{f}: {r}" for f, r in errors) or "invalid request"
        super().__init__(text, status, body)
        self.errors = errors


class Conflict(CraterError):
    """409: the request contradicts what Crater knows (e.g. cancelling an ended task)."""


class TaskExists(Conflict):
    """409 on submit: the task id is known already; `task_status` says how far it got."""

    def __init__(self, task_id: str, task_status: str, message: str, body: Any) -> None:
        super().__init__(message, 409, body)
        self.task_id = task_id
        self.task_status = task_status


class NotFound(CraterError):
    """404: no such task is known."""


class Unavailable(CraterError):
    """503, or the gateway unreachable: retry later (`retry_after` seconds when it said)."""

    def __init__(
        self, message: str, status: int | None, body: Any, retry_after: float | None
    ) -> None:
        super().__init__(message, status, body)
        self.retry_after = retry_after


class WaitTimedOut(CraterError, TimeoutError):
    """`wait` ran out of time; `last` is the task as last seen (None: never seen)."""

    def __init__(self, message: str, last: Task | None) -> None:
        super().__init__(message)
        self.last = last


class EndedOtherwise(CraterError):
    """`wait`: the task ended in a status not waited for; `task` is how it ended."""

    def __init__(self, message: str, task: Task) -> None:
        super().__init__(message)
        self.task = task


@dataclass(frozen=True)
class Task:
    """A task as the scheduler knows it (the gateway's TaskSummary); `raw` holds every field."""

    task_id: str
    status: str
    attempt: int
    node: str | None
    gpu_ids: list[int]
    reason: str | None
    raw: dict[str, Any] = field(repr=False)

    @property
    def ended(self) -> bool:
        return self.status in FINAL_STATUSES

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Task:
        return cls(
            task_id=str(data["task_id"]),
            status=str(data["status"]),
            attempt=int(data.get("attempt", 1)),
            node=data.get("node"),
            gpu_ids=list(data.get("gpu_ids") or []),
            reason=data.get("reason"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Accepted:
    """A submission or cancel the gateway accepted (202)."""

    task_id: str
    event_id: str
    status: str  # "submitted" or "cancelling"
    previous: str | None = None  # a cancel: the task's status when cancelled


Tasks = list[Task]
TaskBody = Mapping[str, Any] | str | bytes


class CraterClient:
    """Blocking client; `base_url` is the gateway's (e.g. http://crater-gateway:8080).
    `token` (else CRATER_API_TOKEN): an API key or JWT, sent as `Authorization: Bearer`."""

    def __init__(
        self, base_url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, token: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.token = token or os.environ.get("CRATER_API_TOKEN") or None

    def submit(self, task: TaskBody, *, idempotency_key: str | None = None) -> Accepted:
        """Submit AllData's task body; retries under the same `idempotency_key` submit once."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        answer = self._call("POST", "/api/v1/schedule", _body(task), headers)
        return Accepted(answer["task_id"], answer["event_id"], answer["status"])

    def dry_run(self, task: TaskBody) -> dict[str, Any]:
        """Where would this task go, and why not elsewhere? Nothing is submitted or reserved."""
        answer: dict[str, Any] = self._call("POST", "/api/v1/schedule?dry_run=true", _body(task))
        return answer

    def cancel(self, task_id: str) -> Accepted:
        answer = self._call("POST", f"/api/v1/tasks/{_quote(task_id)}/cancel")
        return Accepted(answer["task_id"], answer["event_id"], answer["status"], answer["previous"])

    def get(self, task_id: str) -> Task:
        return Task.from_json(self._call("GET", f"/api/v1/tasks/{_quote(task_id)}"))

    def list(self, status: str | None = None, limit: int = 100) -> Tasks:
        query = urllib.parse.urlencode({"limit": limit, **({"status": status} if status else {})})
        answer = self._call("GET", f"/api/v1/tasks?{query}")
        return [Task.from_json(t) for t in answer["tasks"]]

    def wait(
        self,
        task_id: str,
        until: Collection[str] = FINAL_STATUSES,
        timeout: float = 600.0,
        poll: float = 1.0,
    ) -> Task:
        """Poll until the task's status is in `until` (default: ended). A task accepted but
        not yet known to the scheduler (404: still being profiled) is waited for too."""
        deadline = time.monotonic() + timeout
        last: Task | None = None
        while True:
            try:
                last = self.get(task_id)
                if last.status in until:
                    return last
                _unreachable(last, until)
            except NotFound:
                pass
            if time.monotonic() + poll > deadline:
                seen = last.status if last else "not known yet"
                raise WaitTimedOut(f"task {task_id!r} still {seen} after {timeout} s", last)
            time.sleep(poll)

    def _call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        request = urllib.request.Request(
            self.base_url + path,
            data=body,
            method=method,
            headers={"accept": "application/json", **(headers or {})},
        )
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        if body is not None:
            request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise _refusal(error) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            raise Unavailable(
                f"gateway {self.base_url} unreachable: {error}", None, None, None
            ) from error


class AsyncCraterClient:
    """The same calls for asyncio code: each runs the blocking client in a worker thread."""

    def __init__(
        self, base_url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, token: str | None = None
    ) -> None:
        self.sync = CraterClient(base_url, timeout, token)

    async def submit(self, task: TaskBody, *, idempotency_key: str | None = None) -> Accepted:
        return await asyncio.to_thread(self.sync.submit, task, idempotency_key=idempotency_key)

    async def dry_run(self, task: TaskBody) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.dry_run, task)

    async def cancel(self, task_id: str) -> Accepted:
        return await asyncio.to_thread(self.sync.cancel, task_id)

    async def get(self, task_id: str) -> Task:
        return await asyncio.to_thread(self.sync.get, task_id)

    async def list(self, status: str | None = None, limit: int = 100) -> Tasks:
        return await asyncio.to_thread(self.sync.list, status, limit)

    async def wait(
        self,
        task_id: str,
        until: Collection[str] = FINAL_STATUSES,
        timeout: float = 600.0,
        poll: float = 1.0,
    ) -> Task:
        """As `CraterClient.wait`, polling with asyncio.sleep so no thread is held between."""
        deadline = asyncio.get_running_loop().time() + timeout
        last: Task | None = None
        while True:
            try:
                last = await self.get(task_id)
                if last.status in until:
                    return last
                _unreachable(last, until)
            except NotFound:
                pass
            if asyncio.get_running_loop().time() + poll > deadline:
                seen = last.status if last else "not known yet"
                raise WaitTimedOut(f"task {task_id!r} still {seen} after {timeout} s", last)
            await asyncio.sleep(poll)


def _unreachable(task: Task, until: Collection[str]) -> None:
    """An ended task never reaches another status: waiting on is pointless."""
    if task.ended:
        raise EndedOtherwise(
            f"task {task.task_id!r} ended {task.status} ({task.reason or 'no reason given'}), "
            f"not {sorted(until)}",
            task,
        )


def _body(task: TaskBody) -> bytes:
    if isinstance(task, bytes):
        return task
    if isinstance(task, str):
        return task.encode()
    return json.dumps(task).encode()


def _quote(task_id: str) -> str:
    return urllib.parse.quote(task_id, safe="")


def _refusal(error: urllib.error.HTTPError) -> CraterError:
    """The gateway's error body as the exception that says it (app.py's answers)."""
    raw = error.read()
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw.decode(errors="replace")
    detail = body.get("detail") if isinstance(body, dict) else None
    errors = (
        [(str(d.get("field")), str(d.get("reason"))) for d in detail if isinstance(d, dict)]
        if isinstance(detail, list)
        else []
    )
    message = "; ".join(f"{f}: {r}" for f, r in errors) or str(detail or body or error.reason)
    status = error.code
    if status in (413, 422):
        return ValidationFailed(errors, status, body)
    if status == 409 and isinstance(body, dict) and "task_id" in body and "status" in body:
        return TaskExists(str(body["task_id"]), str(body["status"]), message, body)
    if status == 409:
        return Conflict(message, status, body)
    if status == 404:
        return NotFound(message, status, body)
    if status in (503, 429):  # 429: this credential's rate limit
        retry = error.headers.get("Retry-After")
        return Unavailable(message, status, body, float(retry) if retry else None)
    return CraterError(f"HTTP {status}: {message}", status, body)
