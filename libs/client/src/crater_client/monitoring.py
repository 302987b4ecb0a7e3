"""A placed task measuring itself: its GPUs (through NVML, when `pynvml` is importable), its
process tree's memory, IO and CPU time (from /proc), one sample per interval posted to the
gateway (`POST /api/v1/tasks/{task_id}/usage`, a `TaskUsageReported`).

It runs in a daemon thread and reads a few small files per tick, so it costs the task next to
nothing; a failed post is counted and logged, never raised: monitoring must not kill training.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from crater_client.allocation import get_allocation_config, get_placement, node_gpu_ids

log = logging.getLogger("crater_client.monitoring")
PROC = Path("/proc")
MIB = 1024 * 1024
POST_TIMEOUT_SECONDS = 5.0
# How a running task without an API key proves a usage sample is its own (the gateway asks
# the scheduler whether the token is its allocation's).
RESERVATION_TOKEN_HEADER = "Crater-Reservation-Token"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class TreeReading:
    """One look at a process and its descendants: resident memory now, and the counters
    (bytes read and written from storage, CPU seconds) summed over the processes alive now."""

    processes: int
    rss_bytes: int
    read_bytes: int
    write_bytes: int
    cpu_seconds: float


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, resident bytes) of one process; None when it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime + stime
    return int(fields[1]), cpu, int(fields[21]) * _PAGE_SIZE


def _io(pid: int) -> tuple[int, int]:
    """Bytes the process had read from and written to storage (0 where the kernel hides it)."""
    try:
        lines = (PROC / str(pid) / "io").read_text().splitlines()
    except OSError:
        return 0, 0
    values = dict(line.split(": ", 1) for line in lines if ": " in line)
    return int(values.get("read_bytes", 0)), int(values.get("write_bytes", 0))


def read_tree(root: int | None = None) -> TreeReading:
    """The process `root` (default: this one) and every process descended from it."""
    root = os.getpid() if root is None else root
    stats: dict[int, tuple[int, float, int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (found := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = found
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [], [root] if root in stats else []
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    io = [_io(pid) for pid in tree]
    return TreeReading(
        processes=len(tree),
        rss_bytes=sum(stats[pid][2] for pid in tree),
        read_bytes=sum(r for r, _ in io),
        write_bytes=sum(w for _, w in io),
        cpu_seconds=sum(stats[pid][1] for pid in tree),
    )


class _Gpus:
    """The task's cards through NVML; nothing when pynvml is missing or NVML fails."""

    def __init__(self, gpu_ids: list[int]) -> None:
        self.handles: dict[int, Any] = {}
        self.nvml: ModuleType | None = None
        if not gpu_ids:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            # NVML numbers cards as the node does, whatever CUDA_VISIBLE_DEVICES says.
            self.handles = {g: pynvml.nvmlDeviceGetHandleByIndex(g) for g in gpu_ids}
            self.nvml = pynvml
        except Exception as error:  # ImportError, or any NVMLError: no GPU readings
            log.info("no GPU readings (%s): reporting host use only", error)

    def read(self) -> dict[int, tuple[float, int, int]]:
        """Per card: (utilisation percent, memory used MiB, memory total MiB)."""
        if self.nvml is None:
            return {}
        found = {}
        for gpu_id, handle in self.handles.items():
            try:
                rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as error:  # a card that fell off the bus: skip it this tick
                log.debug("GPU %s not read: %s", gpu_id, error)
                continue
            found[gpu_id] = (float(rates.gpu), memory.used // MIB, memory.total // MIB)
        return found


class Monitor:
    """The running monitor; `stop()` ends it (also called at interpreter exit)."""

    def __init__(
        self,
        *,
        interval: float,
        gateway_url: str | None,
        task_id: str,
        allocation_id: str | None,
        attempt: int,
        gpu_ids: list[int],
        cores_granted: int,
        ticks_per_interval: int = 5,
        root_pid: int | None = None,
        node: str | None = None,
        credentials: Mapping[str, str] | None = None,
    ) -> None:
        if interval <= 0 or interval > 3600:
            raise ValueError(f"interval: {interval} s is outside (0, 3600]")
        self.interval = interval
        self.url = (
            f"{gateway_url.rstrip('/')}/api/v1/tasks/{task_id}/usage" if gateway_url else None
        )
        # An API key (CRATER_API_TOKEN), else the task's own reservation token: a gateway
        # with authentication takes either on a usage sample (docs/security.md).
        self.credentials = dict(credentials or {})
        self.identity = {
            "task_id": task_id,
            "allocation_id": allocation_id,
            "attempt": attempt,
            "node": node,
        }
        self.cores_granted = max(cores_granted, 1)
        self.tick = interval / max(ticks_per_interval, 1)
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.gpus = _Gpus(gpu_ids)
        self.posted = 0
        self.failed = 0
        self.last_sample: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crater-monitor", daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        atexit.register(self.stop)
        return self

    def stop(self, timeout: float = POST_TIMEOUT_SECONDS + 1) -> None:
        """Stop sampling; the interval under way is reported as a shorter one."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        atexit.unregister(self.stop)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        before, since = read_tree(self.root_pid), time.monotonic()
        while True:
            util: dict[int, list[float]] = {}
            peak: dict[int, tuple[int, int]] = {}
            rss = 0
            stopping = False
            while time.monotonic() - since < self.interval:
                for gpu_id, (used_pct, used_mb, total_mb) in self.gpus.read().items():
                    util.setdefault(gpu_id, []).append(used_pct)
                    peak[gpu_id] = (max(used_mb, peak.get(gpu_id, (0, 0))[0]), total_mb)
                rss = max(rss, read_tree(self.root_pid).rss_bytes)
                if self._stop.wait(self.tick):
                    stopping = True
                    break
            now, after = time.monotonic(), read_tree(self.root_pid)
            elapsed = now - since
            if elapsed > 0:
                rss = max(rss, after.rss_bytes)
                self._report(self._sample(elapsed, before, after, rss, util, peak))
            before, since = after, now
            if stopping:
                return

    def _sample(
        self,
        elapsed: float,
        before: TreeReading,
        after: TreeReading,
        rss: int,
        util: dict[int, list[float]],
        peak: dict[int, tuple[int, int]],
    ) -> dict[str, Any]:
        # A child that exited took its counters along: a falling total reads as no activity.
        def rate(b: float, a: float) -> float:
            return max(a - b, 0) / elapsed

        return {
            "event_id": str(uuid.uuid4()),  # kept by a retry: the gateway publishes it once
            "occurred_at": datetime.now(UTC).isoformat(),
            **self.identity,
            "interval_seconds": round(elapsed, 3),
            "gpus": [
                {
                    "gpu_id": gpu_id,
                    "utilization_percent": round(sum(seen) / len(seen), 2),
                    "memory_used_mb": peak[gpu_id][0],
                    "memory_total_mb": peak[gpu_id][1],
                }
                for gpu_id, seen in sorted(util.items())
            ],
            "host_memory_used_mb": rss // MIB,
            "io_read_bytes_per_second": round(rate(before.read_bytes, after.read_bytes), 1),
            "io_write_bytes_per_second": round(rate(before.write_bytes, after.write_bytes), 1),
            "cpu_utilization_percent": round(
                100 * rate(before.cpu_seconds, after.cpu_seconds) / self.cores_granted, 2
            ),
            "source": "crater-client",
        }

    def _report(self, sample: dict[str, Any]) -> None:
        self.last_sample = sample
        if self.url is None:
            return
        request = urllib.request.Request(
            self.url,
            data=json.dumps(sample).encode(),
            headers={"content-type": "application/json", **self.credentials},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=POST_TIMEOUT_SECONDS) as response:
                response.read()
            self.posted += 1
        except (OSError, ValueError) as error:  # URLError, HTTPError, timeouts: all OSError
            self.failed += 1
            detail = error.read().decode(errors="replace")[:500] if hasattr(error, "read") else ""
            log.warning(
                "usage sample not reported (%d failed so far): %s %s", self.failed, error, detail
            )


def start_monitoring(
    interval: float = 10.0,
    gateway_url: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    ticks_per_interval: int = 5,
) -> Monitor:
    """Start reporting this task's use every `interval` seconds to `gateway_url` (default
    CRATER_GATEWAY_URL; neither: samples are kept in `last_sample` only). GPUs, the task id
    and the granted cores come from the CRATER_* environment (see `get_allocation_config`)."""
    env = os.environ if environ is None else environ
    config, placement = get_allocation_config(env), get_placement(env)
    url = gateway_url or placement.gateway_url
    if url is None:
        log.info("no gateway_url nor CRATER_GATEWAY_URL: samples are kept, not reported")
    return Monitor(
        interval=interval,
        gateway_url=url,
        task_id=placement.task_id,
        allocation_id=placement.allocation_id,
        attempt=placement.attempt,
        # NVML counts every card of the node, whatever CUDA sees
        gpu_ids=node_gpu_ids(env),
        cores_granted=len(config["cpu_cores"]),
        node=placement.node,
        ticks_per_interval=ticks_per_interval,
        credentials=usage_credentials(env),
    ).start()


def usage_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """The headers a usage sample proves itself with: the API key in CRATER_API_TOKEN, else
    the allocation's reservation token (CRATER_RESERVATION_TOKEN), else none."""
    if token := env.get("CRATER_API_TOKEN"):
        return {"authorization": f"Bearer {token}"}
    if reservation := env.get("CRATER_RESERVATION_TOKEN"):
        return {RESERVATION_TOKEN_HEADER: reservation}
    return {}
