"""Run a placed task under Crater's eye, from inside it:

    with crater_client.run_task() as task:
        train()

On entry the allocation is confirmed with its reservation token (POST /api/v1/allocations/
{id}/confirm): its reservation no longer expires. While the body runs, a daemon thread
heartbeats (`running`, every `heartbeat_seconds`); if they stop for the grace (the process
hung or died), the scheduler fails the task, saying so. On exit the end is reported:
`succeeded` (exit code 0), or `failed` with the exception's type and message, which is
re-raised. `SystemExit(0)` (or None) is a success; `SystemExit(n)` a failure with exit code n;
`KeyboardInterrupt` a failure with exit code 130 (SIGINT's shell convention).

Standard library only. The allocation, its token and the gateway come from the task's
environment (CRATER_ALLOCATION_ID, CRATER_RESERVATION_TOKEN, CRATER_GATEWAY_URL).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal

from crater_client.allocation import AllocationError
from crater_client.client import CraterError, Unavailable, _refusal

log = logging.getLogger("crater_client")

DEFAULT_HEARTBEAT_SECONDS = 15.0
REPORT_ATTEMPTS = 3  # a confirmation or the end: retried when the gateway is unreachable


class RunRefused(CraterError):
    """The gateway refused the confirmation (or a report): `errors` lists (field, reason).
    403: the token is not this allocation's; 404: no such allocation; 409: it was released
    (the task ended, was cancelled, ...); 410: its reservation expired before the task
    confirmed it."""

    def __init__(self, error: CraterError) -> None:
        super().__init__(str(error), error.status, error.body)
        detail = error.body.get("detail") if isinstance(error.body, dict) else None
        self.errors = [
            (str(d.get("field")), str(d.get("reason")))
            for d in (detail if isinstance(detail, list) else [])
            if isinstance(d, dict)
        ]


class RunningTask:
    """A placed task confirmed to Crater, heartbeating until it reports its end. Made by
    `run_task`; use it as a context manager."""

    def __init__(
        self,
        gateway_url: str,
        allocation_id: str,
        token: str,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        grace_seconds: float | None = None,
        timeout: float = 10.0,
    ) -> None:
        if heartbeat_seconds <= 0:
            raise ValueError(f"heartbeat_seconds: {heartbeat_seconds} is not above 0")
        self.gateway_url = gateway_url.rstrip("/")
        self.allocation_id = allocation_id
        self.token = token
        self.heartbeat_seconds = heartbeat_seconds
        # three heartbeats may be lost before the task counts as silent (the gateway allows
        # 5 s to a day)
        self.grace_seconds = min(max(grace_seconds or 4 * heartbeat_seconds, 5.0), 86_400.0)
        self.timeout = timeout
        self.task_id: str | None = None
        # Why Crater no longer holds the allocation, when a heartbeat was refused (released,
        # expired): the task runs on, but nothing it reports counts any more.
        self.lost: str | None = None
        self.heartbeats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the context manager ------------------------------------------------------------------

    def __enter__(self) -> RunningTask:
        answer = self._report(
            "confirm", {"token": self.token, "heartbeat_grace_seconds": self.grace_seconds}
        )
        self.task_id = str(answer["task_id"])
        self._thread = threading.Thread(
            target=self._beat, name=f"crater-heartbeat-{self.allocation_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        _: TracebackType | None,
    ) -> Literal[False]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1)
        status, exit_code, reason = outcome(error)
        body = {"token": self.token, "status": status, "exit_code": exit_code, "reason": reason}
        if out_of_memory(error):
            body["out_of_memory"] = True  # a failure of kind oom (restart_policy)
        try:
            self._report("status", body)
        except CraterError as failure:
            if error is None:
                raise  # the task succeeded and Crater could not be told: say so (exit != 0)
            log.error("could not report %s for %s: %s", status, self.allocation_id, failure)
        return False  # an exception goes on up

    # -- the calls ----------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self._post("status", {"token": self.token, "status": "running"})
                self.heartbeats += 1
            except Unavailable as error:  # the next one may pass; the grace allows a few
                log.warning("heartbeat of %s not delivered: %s", self.allocation_id, error)
            except CraterError as error:  # refused: the allocation is gone
                self.lost = str(error)
                log.error("Crater no longer holds %s: %s", self.allocation_id, error)
                return

    def _report(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a confirmation or an end, retried while the gateway is unreachable."""
        for attempt in range(1, REPORT_ATTEMPTS + 1):
            try:
                return self._post(action, body)
            except Unavailable:
                if attempt == REPORT_ATTEMPTS:
                    raise
                time.sleep(0.5 * 2**attempt)
            except CraterError as error:
                raise RunRefused(error) from None
        raise AssertionError("unreachable")

    def _post(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        allocation = urllib.parse.quote(self.allocation_id, safe="")
        request = urllib.request.Request(
            f"{self.gateway_url}/api/v1/allocations/{allocation}/{action}",
            data=json.dumps({k: v for k, v in body.items() if v is not None}).encode(),
            method="POST",
            headers={"accept": "application/json", "content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer: dict[str, Any] = json.loads(response.read() or b"{}")
                return answer
        except urllib.error.HTTPError as error:
            raise _refusal(error) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            raise Unavailable(
                f"gateway {self.gateway_url} unreachable: {error}", None, None, None
            ) from error


def outcome(error: BaseException | None) -> tuple[str, int, str | None]:
    """How a task that left its `with` block ended: (status, exit code, reason)."""
    if error is None:
        return "succeeded", 0, None
    if isinstance(error, SystemExit):
        code = error.code
        if code is None or code == 0:
            return "succeeded", 0, None
        if isinstance(code, int):
            return "failed", max(-255, min(code, 255)), f"SystemExit({code})"
        return "failed", 1, f"SystemExit: {code}"[:2048]
    if isinstance(error, KeyboardInterrupt):
        return "failed", 130, "KeyboardInterrupt: interrupted (SIGINT)"
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return "failed", 1, text[:2048]


def out_of_memory(error: BaseException | None) -> bool:
    """Whether the task ended out of memory: the host's (MemoryError) or a GPU's (PyTorch's
    torch.cuda.OutOfMemoryError, or the RuntimeError "CUDA out of memory" of releases before
    it), read by name so the client imports no framework."""
    if error is None:
        return False
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    return isinstance(error, RuntimeError) and "CUDA out of memory" in str(error)


def run_task(
    *,
    gateway_url: str | None = None,
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
    grace_seconds: float | None = None,
    environ: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> RunningTask:
    """The placed task this process is, to run `with` it (see the module). `gateway_url`
    defaults to CRATER_GATEWAY_URL; `grace_seconds` (how long without a heartbeat before the
    scheduler fails the task) to four heartbeats. Raises AllocationError naming a missing
    variable; entering raises RunRefused when the gateway refuses the confirmation, and
    Unavailable when it cannot be reached."""
    env = os.environ if environ is None else environ
    url = gateway_url or env.get("CRATER_GATEWAY_URL")
    if not url:
        raise AllocationError(
            "CRATER_GATEWAY_URL",
            "not set: pass gateway_url, or have the scheduler hand it "
            "(CRATER_SCHEDULER_GATEWAY_URL)",
        )
    allocation_id = env.get("CRATER_ALLOCATION_ID")
    if not allocation_id:
        raise AllocationError("CRATER_ALLOCATION_ID", "not set: is this a task Crater placed?")
    token = env.get("CRATER_RESERVATION_TOKEN")
    if not token:
        raise AllocationError(
            "CRATER_RESERVATION_TOKEN", "not set: inject the allocation's whole environment"
        )
    return RunningTask(url, allocation_id, token, heartbeat_seconds, grace_seconds, timeout)
