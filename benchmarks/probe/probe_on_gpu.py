"""Device check: the probe as it runs on a GPU node, a real process over a real nats-server.

Starts a nats-server (the wheel's) with JetStream, then the probe (`python -m crater.probe.app`)
in local mode with the shipped settings but for three: `CRATER_PROBE_MEASURE_PCIE_BANDWIDTH=true`
(off by default) and metrics and health every second (5 s shipped), so the check is short.
It watches the bus as an operator would (a core subscription to `crater.v1.node.>`) and checks
what the probe says of the machine: its topology (each card with its measured PCIe bandwidth),
its metrics and its heartbeat (health checks, and the compute processes on the cards); then a
GPU job takes 20 GiB of the first card and the check waits for the probe to report that memory
and that process; finally it reads the probe's /metrics (the measurement's counter, the GPU
series). Writes `probe_on_gpu.json` (and the probe's log) under $OUT. Exits 1 when something
expected was not seen. Needs a GPU, PyTorch for the job, and the probe's dependencies; no
test imports it.

    PYTHONPATH=libs/contracts/src:libs/runtime/src:services/probe/src \\
        python3 benchmarks/probe/probe_on_gpu.py      (nats-server on PATH, or the wheel's)
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from crater.runtime.nats_server import start_nats_server

JOB_GIB = 20
PROBE_PORT = 9101  # the probe's health and metrics port when http_port is 0
JOB = f"""
import time, torch
held = torch.empty({JOB_GIB} * 2**30, dtype=torch.uint8, device="cuda")
print("job holds", held.numel() // 2**30, "GiB", flush=True)
time.sleep(12)
"""


class Watch:
    """The node events seen, by kind, as JSON."""

    def __init__(self) -> None:
        self.seen: dict[str, list[dict[str, Any]]] = {"topology": [], "metrics": [], "health": []}

    async def on_message(self, msg: Msg) -> None:
        kind = msg.subject.split(".")[3]  # crater.v1.node.<kind>[.<node>]
        if kind in self.seen:
            self.seen[kind].append(json.loads(msg.data))

    async def until(
        self, kind: str, test: Callable[[dict[str, Any]], bool], seconds: float
    ) -> dict[str, Any] | None:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            for event in reversed(self.seen[kind]):
                if test(event):
                    return event
            await asyncio.sleep(0.2)
        return None


def used(metrics: dict[str, Any] | None) -> list[int]:
    """Each card's memory in use (MiB) in a metrics event."""
    return [g["memory_used_mb"] for g in (metrics or {}).get("gpus", [])]


def scrape(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    keep = ("crater_probe_pcie", "crater_gpu_memory_used_bytes", "crater_gpu_utilization")
    return [line for line in text.splitlines() if line.startswith(keep)]


async def check(out: Path, url: str) -> dict[str, Any]:
    watch = Watch()
    connection = await nats.connect(url)
    await connection.subscribe("crater.v1.node.>", cb=watch.on_message)
    env = {
        **os.environ,
        "CRATER_NATS_URL": url,
        "CRATER_ENVIRONMENT": "development",
        "CRATER_PROBE_MODE": "local",
        "CRATER_PROBE_POOL": "gpu",
        "CRATER_PROBE_MEASURE_PCIE_BANDWIDTH": "true",
        "CRATER_PROBE_METRICS_INTERVAL_SECONDS": "1",
        "CRATER_PROBE_HEALTH_INTERVAL_SECONDS": "1",
    }
    log = (out / "probe.log").open("w")
    probe = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crater.probe.app", env=env, stdout=log, stderr=subprocess.STDOUT
    )
    report: dict[str, Any] = {}
    try:
        started = time.monotonic()
        topology = await watch.until("topology", lambda e: bool(e["node"]["gpus"]), 120)
        report["topology_after_s"] = round(time.monotonic() - started, 1)
        gpus = topology["node"]["gpus"] if topology else []
        report["gpus"] = [
            {k: g.get(k) for k in ("index", "model", "memory_mb", "pcie_generation_max",
                                   "pcie_width_max", "pcie_bandwidth_gbps")}
            for g in gpus
        ]  # fmt: skip
        report["pcie_measured"] = bool(gpus) and all(g.get("pcie_bandwidth_gbps") for g in gpus)
        idle = await watch.until("metrics", lambda e: bool(e.get("gpus")), 30)
        report["idle_gpu_memory_used_mb"] = used(idle)
        heartbeat = await watch.until("health", lambda e: bool(e.get("checks")), 30)
        report["heartbeat_checks"] = [
            {"name": c["name"], "passed": c["passed"]} for c in (heartbeat or {}).get("checks", [])
        ]
        job = await asyncio.create_subprocess_exec(sys.executable, "-c", JOB)
        try:
            busy = await watch.until(
                "metrics",
                lambda e: any(g["memory_used_mb"] >= JOB_GIB * 1024 for g in e.get("gpus", [])),
                30,
            )
            seen_job = await watch.until(
                "health",
                lambda e: any(p["pid"] == job.pid for p in e.get("gpu_processes") or []),
                30,
            )
            report["busy_gpu_memory_used_mb"] = used(busy)
            report["job_process_seen"] = [
                p for p in (seen_job or {}).get("gpu_processes") or [] if p["pid"] == job.pid
            ]
            report["metrics_scraped"] = scrape(PROBE_PORT)
        finally:
            await asyncio.wait_for(job.wait(), 60)
        report["events_seen"] = {k: len(v) for k, v in watch.seen.items()}
    finally:
        probe.terminate()
        report["probe_exit"] = await asyncio.wait_for(probe.wait(), 30)
        await connection.drain()
    report["ok"] = bool(
        report.get("pcie_measured")
        and report.get("heartbeat_checks")
        and report.get("busy_gpu_memory_used_mb")
        and report.get("job_process_seen")
    )
    return report


def main() -> int:
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="probe-on-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix="probe-on-gpu-js-"))
    with start_nats_server(store, log_file=out / "nats.log") as server:
        report = asyncio.run(check(out, server.url))
    (out / "probe_on_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
