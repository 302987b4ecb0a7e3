"""Lending by phase from inside a placed task: `with cpu_phase(expected_seconds=600):` tells
Crater that the task's GPUs are idle for that block (evaluation on the CPU, data preparation,
a checkpoint upload), so the scheduler may lend them to inference replicas meanwhile, each
capped to the GPU memory the task does not keep resident; on leaving the block the task asks
them back, and the replicas are gone within the scheduler's reclaim grace
(CRATER_SCHEDULER_PHASE_RECLAIM_GRACE_SECONDS, 10 s by default). docs/client.md.

Posts to the gateway (`POST /api/v1/tasks/{task_id}/phase`) with the task's reservation token
(or CRATER_API_TOKEN), as the usage samples do; with NVML (pynvml) the begin carries what the
task keeps resident on each card. On leaving it asks the scheduler, with its reservation
token, until its cards are its own again (`GET /api/v1/tasks/{task_id}/phase`: `returned`),
at most `wait_seconds`.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal

from crater_client.allocation import get_placement, node_gpu_ids
from crater_client.client import CraterError, Unavailable, _refusal
from crater_client.monitoring import RESERVATION_TOKEN_HEADER, _Gpus, usage_credentials

log = logging.getLogger("crater_client")

POLL_SECONDS = 0.5


class CpuPhase:
    """A CPU phase of the running task: entered on `__enter__`, left on `__exit__`. `begun`
    and `ended` hold the gateway's answers; `free` whether the scheduler said the cards are
    the task's again within `wait_seconds` (None: not asked, no reservation token)."""

    def __init__(
        self,
        *,
        gateway_url: str,
        task_id: str,
        allocation_id: str,
        credentials: Mapping[str, str],
        token: str | None,
        gpu_ids: list[int],
        expected_seconds: float | None = None,
        wait_seconds: float = 30.0,
        timeout: float = 10.0,
        read_gpus: Callable[[], dict[int, tuple[float, int, int]]] | None = None,
    ) -> None:
        if expected_seconds is not None and expected_seconds <= 0:
            raise ValueError(f"expected_seconds: {expected_seconds} is not above 0")
        self.url = (
            f"{gateway_url.rstrip('/')}/api/v1/tasks/{urllib.parse.quote(task_id, safe='')}/phase"
        )
        self.task_id = task_id
        self.allocation_id = allocation_id
        self.credentials = dict(credentials)
        self.token = token
        self.expected_seconds = expected_seconds
        self.wait_seconds = wait_seconds
        self.timeout = timeout
        self.read_gpus = read_gpus if read_gpus is not None else _Gpus(gpu_ids).read
        self.begun: dict[str, Any] | None = None
        self.ended: dict[str, Any] | None = None
        self.free: bool | None = None
        self.standing: dict[str, Any] | None = None  # the scheduler's last word, on leaving

    def __enter__(self) -> CpuPhase:
        readings = self.read_gpus()
        gpus = [
            {"gpu_id": gpu, "utilization_percent": util, "memory_used_mb": used}
            for gpu, (util, used, _) in sorted(readings.items())
        ]
        body: dict[str, Any] = {"phase": "cpu", "gpus": gpus}
        if self.expected_seconds is not None:
            body["expected_seconds"] = self.expected_seconds
        self.begun = self._post(body)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        _: TracebackType | None,
    ) -> Literal[False]:
        try:
            self.ended = self._post({"phase": "gpu"})
        except CraterError as failure:
            if error is None:
                raise
            log.error("could not ask the GPUs of %s back: %s", self.task_id, failure)
            return False
        self.free = self.wait_free()
        return False

    def wait_free(self) -> bool | None:
        """Until the scheduler says the cards are the task's again (`returned`: the replicas
        on them gone), at most `wait_seconds`; None without a reservation token to ask with."""
        if not self.token:
            return None
        url = f"{self.url}?{urllib.parse.urlencode({'allocation_id': self.allocation_id})}"
        headers = {"accept": "application/json", RESERVATION_TOKEN_HEADER: self.token}
        deadline = time.monotonic() + self.wait_seconds
        while True:
            standing = self._call(urllib.request.Request(url, headers=headers))
            self.standing = standing
            if standing.get("lending") == "returned":
                return True
            if time.monotonic() >= deadline:
                log.warning("GPUs of %s not back after %s s", self.task_id, self.wait_seconds)
                return False
            time.sleep(POLL_SECONDS)

    def _post(self, fields: dict[str, Any]) -> dict[str, Any]:
        body = {
            "event_id": str(uuid.uuid4()),  # a retried POST is published once
            "task_id": self.task_id,
            "allocation_id": self.allocation_id,
            **fields,
        }
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "accept": "application/json",
                "content-type": "application/json",
                **self.credentials,
            },
        )
        return self._call(request)

    def _call(self, request: urllib.request.Request) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer: dict[str, Any] = json.loads(response.read() or b"{}")
                return answer
        except urllib.error.HTTPError as error:
            raise _refusal(error) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            unreachable = f"gateway {self.url} unreachable: {error}"
            raise Unavailable(unreachable, None, None, None) from error


def cpu_phase(
    expected_seconds: float | None = None,
    *,
    gateway_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    wait_seconds: float = 30.0,
    timeout: float = 10.0,
) -> CpuPhase:
    """A CPU phase of this placed task, to use with `with`: its GPUs lendable inside the
    block, asked back on leaving it. The task, its allocation, its cards and its token come
    from the CRATER_* environment; the gateway from `gateway_url` or CRATER_GATEWAY_URL."""
    env = os.environ if environ is None else environ
    placement = get_placement(env)
    url = gateway_url or placement.gateway_url
    if url is None:
        raise CraterError("no gateway_url nor CRATER_GATEWAY_URL: the phase cannot be told")
    if placement.allocation_id is None:
        raise CraterError("CRATER_ALLOCATION_ID is not set: the phase cannot be told")
    return CpuPhase(
        gateway_url=url,
        task_id=placement.task_id,
        allocation_id=placement.allocation_id,
        credentials=usage_credentials(env),
        token=env.get("CRATER_RESERVATION_TOKEN") or None,
        gpu_ids=node_gpu_ids(env),
        expected_seconds=expected_seconds,
        wait_seconds=wait_seconds,
        timeout=timeout,
    )
