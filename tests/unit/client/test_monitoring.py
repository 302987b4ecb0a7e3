"""A task measuring itself: /proc of its process tree, and samples posted over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from crater.contracts import TaskUsageReported
from crater_client import read_tree, start_monitoring
from crater_client.monitoring import Monitor

MIB = 1024 * 1024
# Holds 200 MiB, burns CPU, writes 8 MiB to storage (fsync: counted now, not at writeback).
CHILD = """
import os, sys, time
held = bytearray(200 * 1024 * 1024)
for i in range(0, len(held), 4096):
    held[i] = 1
with open(sys.argv[1], "wb") as f:
    f.write(os.urandom(8 * 1024 * 1024)); f.flush(); os.fsync(f.fileno())
print("ready", flush=True)
end = time.monotonic() + 30
while time.monotonic() < end:
    sum(range(10000))
"""


@pytest.fixture
def child(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "written")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    yield process
    process.kill()
    process.wait()


def test_the_tree_counts_a_child_s_memory_cpu_and_writes(child: subprocess.Popen[str]) -> None:
    alone = read_tree(child.pid)
    assert alone.processes == 1
    assert alone.rss_bytes >= 200 * MIB
    assert alone.write_bytes >= 8 * MIB or not Path(f"/proc/{child.pid}/io").exists()
    time.sleep(0.5)
    later = read_tree(child.pid)
    assert later.cpu_seconds > alone.cpu_seconds  # it is busy
    family = read_tree()  # this test process and its descendants: the child among them
    assert family.processes >= 2
    assert family.rss_bytes >= alone.rss_bytes
    assert read_tree(2**22 + 7).processes == 0  # no such process: nothing, no error


class Receiver(ThreadingHTTPServer):
    """A stand-in gateway: records each POSTed body; answers `status`."""

    def __init__(self, status: int = 202) -> None:
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        self.status = status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["content-length"])
                receiver.bodies.append((self.path, json.loads(self.rfile.read(length))))
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(receiver.status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


ENV = {
    "CRATER_GPU_IDS": "",  # no GPU here: the samples say so (empty list), none invented
    "CRATER_CPU_CORE_IDS": "0",
    "CRATER_MEMORY_MB": "1024",
    "CRATER_TASK_ID": "train-1",
    "CRATER_ALLOCATION_ID": "alloc-1",
    "CRATER_ATTEMPT": "3",
}


def test_samples_are_posted_per_interval_in_the_contract_s_shape(
    child: subprocess.Popen[str],
) -> None:
    gateway = Receiver()
    try:
        monitor = Monitor(
            interval=0.4,
            gateway_url=gateway.url,
            task_id="train-1",
            allocation_id="alloc-1",
            attempt=3,
            gpu_ids=[],
            cores_granted=1,
            root_pid=child.pid,
            node="a100-01",
        ).start()
        deadline = time.monotonic() + 15  # two intervals, however loaded the machine
        while len(gateway.bodies) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        monitor.stop()
        assert not monitor.running
        assert monitor.failed == 0
        assert monitor.posted == len(gateway.bodies) >= 2
        paths = {path for path, _ in gateway.bodies}
        assert paths == {"/api/v1/tasks/train-1/usage"}
        samples = [TaskUsageReported.model_validate(body) for _, body in gateway.bodies]
        assert len({s.event_id for s in samples}) == len(samples)
        first = samples[0]
        assert (first.task_id, first.allocation_id, first.attempt) == ("train-1", "alloc-1", 3)
        assert first.node == "a100-01"  # CRATER_NODE_ID, through get_placement
        assert first.gpus == []
        assert first.interval_seconds >= 0.3  # measured, not the nominal 0.4
        assert first.host_memory_used_mb is not None
        assert first.host_memory_used_mb >= 200
        # the child spins one core flat out: a share of the one granted core (how much
        # depends on what else the machine runs)
        assert first.cpu_utilization_percent is not None
        assert first.cpu_utilization_percent > 5
    finally:
        gateway.shutdown()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"CRATER_RESERVATION_TOKEN": "rt"}, {"crater-reservation-token": "rt"}),
        (
            {"CRATER_RESERVATION_TOKEN": "rt", "CRATER_API_TOKEN": "crt_key"},
            {"authorization": "Bearer crt_key"},
        ),
        ({}, {}),
    ],
)
def test_samples_carry_the_api_key_else_the_reservation_token(
    extra: dict[str, str], expected: dict[str, str]
) -> None:
    gateway = Receiver()
    try:
        monitor = start_monitoring(0.2, gateway.url, environ={**ENV, **extra})
        time.sleep(0.5)
        monitor.stop()
        assert gateway.headers
        sent = {k: v for k, v in gateway.headers[0].items() if k in CREDENTIAL_HEADERS}
        assert sent == expected
    finally:
        gateway.shutdown()


CREDENTIAL_HEADERS = ("authorization", "crater-reservation-token")


def test_a_failing_gateway_is_counted_and_logged_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = Receiver(status=503)
    try:
        monitor = start_monitoring(0.2, gateway.url, environ=ENV)
        time.sleep(0.7)
        monitor.stop()
        assert monitor.failed >= 2
        assert monitor.posted == 0
        assert "usage sample not reported" in caplog.text
        assert monitor.last_sample is not None  # it kept measuring
    finally:
        gateway.shutdown()
    nowhere = start_monitoring(0.2, "http://127.0.0.1:9", environ=ENV)  # nothing listens
    time.sleep(0.5)
    assert nowhere.running
    nowhere.stop()
    assert nowhere.failed >= 1
