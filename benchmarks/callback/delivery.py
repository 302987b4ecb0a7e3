"""Webhook delivery under failure: lifecycle events through a real nats-server and the callback
service (its own process), to the reference receiver failing a share of requests at random and
down for a while. Ends when every event was delivered, and checks once-in-effect and order
per task. Each task's events alternate between the two streams (task.* on CRATER_TASKS,
allocation.* on CRATER_ALLOCATIONS), numbered as the scheduler numbers them.

    .venv/bin/python benchmarks/callback/delivery.py --events 10000 --down-seconds 60

Beside it, in the same run: the raw JetStream publish rate of the same events, so the
delivery figure reads as a share of what the bus itself does. Prints the figures and writes
JSON to benchmarks/results/callback_delivery.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from faststream.nats import NatsBroker

from crater.callback.app import MIGRATIONS_DIR
from crater.callback.sim.receiver import Receiver
from crater.contracts import (
    AllocationGranted,
    Event,
    FilterReason,
    ReleaseReason,
    TaskEnded,
    TaskEvent,
    TaskPending,
    TaskPreempted,
    TaskSequence,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import PUBLISH_ACK_TIMEOUT_SECONDS, ensure_streams, publish
from crater.runtime.db import upgrade_to_head_async
from crater.runtime.nats_server import free_port, start_nats_server

RESULTS = Path(__file__).resolve().parents[1] / "results" / "callback_delivery.json"
SECRET = "whsec_Y3JhdGVyLWJlbmNoLXNpZ25pbmcta2V5LTMyLWJ5dGVz"
EVENTS_PER_TASK = 5


def lifecycle(tasks: int) -> list[Event]:
    """Per task, in order, published back to back: pending (tasks stream), granted
    (allocations), the node's `running` report about that allocation (tasks), preempted and
    ended (tasks); each is a webhook (a release is not). The scheduler's four are numbered as
    its outbox numbers them; the node's report is not numbered (it goes after its
    allocation's grant)."""
    events: list[Event] = []
    number = 0
    for n in range(tasks):
        task_id, allocation_id = f"bench-{n:05d}", f"alloc-bench-{n:05d}"
        previous: int | None = None
        for event in task_events(task_id, allocation_id):
            if isinstance(event, TaskEvent):
                number += 1
                sequence = TaskSequence(number=number, previous=previous)
                event = event.model_copy(update={"task_sequence": sequence})
                previous = number
            events.append(event)
    return events


def task_events(task_id: str, allocation_id: str) -> list[Event]:
    gpus, cores = [0, 1], [0, 1, 2, 3]
    return [
        TaskPending(
            task_id=task_id,
            nodes_total=64,
            reasons=[FilterReason(filter="GpuCount", code="Full", nodes=64, message="full")],
            summary="0/64 nodes available: 64 full",
        ),
        AllocationGranted(
            allocation_id=allocation_id,
            task_id=task_id,
            node="gpu-07",
            pool="default",
            tenant="default",
            gpu_ids=gpus,
            gpu_memory_mb=40_000,
            cpu_cores=cores,
            numa_node=0,
            memory_mb=65_536,
            checkpoint_path=f"/nvme0/crater/checkpoints/{task_id}",
            reservation_token="v1.bench",
            reservation_expires_at=datetime.now(UTC) + timedelta(seconds=30),
            score=0.9,
            explanation="gpu-07: bench",
            environment={"CRATER_GPU_IDS": "0,1"},
        ),
        TaskStatusReported(
            task_id=task_id,
            status=TaskStatus.RUNNING,
            allocation_id=allocation_id,
            message="running on gpu-07",
        ),
        TaskPreempted(
            task_id=task_id,
            allocation_id=allocation_id,
            node="gpu-07",
            preempted_by="urgent",
            grace_period_seconds=30,
        ),
        TaskEnded(
            task_id=task_id,
            status=TaskStatus.FAILED,
            reason="preempted by urgent; no restart policy",
            allocation_id=allocation_id,
            release_reason=ReleaseReason.PREEMPTED.value,
        ),
    ]


class ReceiverServer:
    """The reference receiver in this process; stopped and started again on the same port,
    keeping what it received."""

    def __init__(self, receiver: Receiver, port: int) -> None:
        self.app = receiver.app()
        self.port = port
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="error", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            await self.task


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tasks = args.events // EVENTS_PER_TASK
    events = lifecycle(tasks)
    work = Path(tempfile.mkdtemp(prefix="crater-callback-bench-"))
    nats_server = start_nats_server(work / "js", log_file=work / "nats.log")
    database_url = args.database_url or f"sqlite+aiosqlite:///{work / 'callback.db'}"
    await upgrade_to_head_async(database_url, MIGRATIONS_DIR)
    await ensure_streams(nats_server.url)

    # the raw bus: the same events published to JetStream, nobody consuming
    raw = NatsBroker(nats_server.url, log_level=10)
    await raw.start()
    await raw.connection.jetstream().add_stream(name="BENCH_RAW", subjects=["bench.raw"])
    raw_started = time.perf_counter()
    for chunk in range(0, len(events), 500):
        await asyncio.gather(
            *(
                raw.publish(
                    e.model_dump_json().encode(),
                    "bench.raw",
                    stream="BENCH_RAW",
                    timeout=PUBLISH_ACK_TIMEOUT_SECONDS,  # as Crater's own publishes wait
                )
                for e in events[chunk : chunk + 500]
            )
        )
    raw_rate = len(events) / (time.perf_counter() - raw_started)

    receiver = Receiver(
        "alldata", "bench-password", fail_rate=args.fail_rate, seed=7, echo=False, secret=SECRET
    )
    port = free_port()
    server = ReceiverServer(receiver, port)
    await server.start()
    health_port = free_port()
    env = {
        **os.environ,
        "CRATER_NATS_URL": nats_server.url,
        "CRATER_DATABASE_URL": database_url,
        "CRATER_HTTP_PORT": str(health_port),
        "CRATER_LOG_LEVEL": "WARNING",
        "CRATER_MIGRATE_ON_START": "false",
        "CRATER_CALLBACK_WEBHOOK_URL": f"http://127.0.0.1:{port}/webhooks",
        "CRATER_CALLBACK_WEBHOOK_USERNAME": "alldata",
        "CRATER_CALLBACK_WEBHOOK_PASSWORD": "bench-password",
        "CRATER_CALLBACK_WEBHOOK_SECRET": SECRET,
        "CRATER_CALLBACK_MAX_ATTEMPTS": "100",
        "CRATER_CALLBACK_INITIAL_BACKOFF_SECONDS": "0.2",
        "CRATER_CALLBACK_MAX_BACKOFF_SECONDS": str(args.max_backoff_seconds),
        "CRATER_CALLBACK_BREAKER_COOLDOWN_SECONDS": "1",
        "CRATER_CALLBACK_BREAKER_MAX_COOLDOWN_SECONDS": "5",
        "CRATER_CALLBACK_MAX_IN_FLIGHT": str(args.max_in_flight),
    }
    callback = start_callback(env, work / "callback.log")
    broker = NatsBroker(nats_server.url, log_level=10)
    await broker.start()
    try:
        # The clock starts once the callback serves (its start-up is not delivery time).
        await wait_until_serving(f"http://127.0.0.1:{health_port}/healthz", callback)
        started = time.perf_counter()
        for chunk in range(0, len(events), 500):
            await asyncio.gather(*(publish(broker, e) for e in events[chunk : chunk + 500]))
        published_seconds = time.perf_counter() - started
        print(f"published {len(events)} events in {published_seconds:.1f} s", flush=True)

        went_down = came_back = None
        delivered_when_back = 0
        deadline = started + args.timeout
        last_report = 0.0
        while len(receiver.deliveries) < len(events):
            now = time.perf_counter()
            if now > deadline:
                break
            if went_down is None and now - started >= args.down_after:
                await server.stop()
                went_down = now - started
                print(f"receiver down at {went_down:.0f} s for {args.down_seconds} s", flush=True)
            if (
                went_down is not None
                and came_back is None
                and now - started >= (went_down + args.down_seconds)
            ):
                await server.start()
                came_back = now - started
                delivered_when_back = len(receiver.deliveries)
                print(f"receiver back at {came_back:.0f} s", flush=True)
            if now - last_report >= 5:
                last_report = now
                print(
                    f"{now - started:6.0f} s: {len(receiver.deliveries)}/{len(events)} "
                    f"delivered, {receiver.failures_injected} failures injected",
                    flush=True,
                )
            await asyncio.sleep(0.2)
        finished = time.perf_counter() - started
    finally:
        await broker.stop()
        await raw.stop()
        callback.terminate()
        callback.wait(30)
        await server.stop()
        nats_server.stop()

    order = {e.event_id: i for i, e in enumerate(events)}
    per_task: dict[str, list[int]] = defaultdict(list)
    for delivery in receiver.deliveries:
        per_task[delivery.body["task_id"]].append(order[_uuid(delivery.webhook_id)])
    out_of_order = sum(1 for seq in per_task.values() if seq != sorted(seq))
    delivered = len({d.webhook_id for d in receiver.deliveries})
    after_recovery = None
    if came_back is not None and finished > came_back:
        after_recovery = round((delivered - delivered_when_back) / (finished - came_back), 1)
    subjects = Counter(type(e).__name__ for e in events)
    return {
        "events": len(events),
        "events_by_type": dict(sorted(subjects.items())),
        "streams": ["CRATER_TASKS", "CRATER_ALLOCATIONS"],
        "tasks": tasks,
        "delivered_once_in_effect": delivered,
        "missing": len(events) - delivered,
        "duplicates_refused_by_receiver": receiver.duplicates,
        "tasks_out_of_order": out_of_order,
        "failures_injected": receiver.failures_injected,
        "fail_rate": args.fail_rate,
        "max_in_flight": args.max_in_flight,
        "receiver_down_seconds": args.down_seconds,
        "receiver_down_at_seconds": went_down,
        "seconds_to_deliver_all": round(finished, 2),
        "deliveries_per_second": round(delivered / finished, 1),
        "receiver_back_at_seconds": came_back,
        "delivered_before_receiver_back": delivered_when_back,
        "deliveries_per_second_after_recovery": after_recovery,
        "raw_jetstream_publish_per_second": round(raw_rate, 1),
        "published_seconds": round(published_seconds, 2),
        "crater_publish_per_second": round(len(events) / published_seconds, 1),
        "database": database_url.split(":", 1)[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        # What else ran: the machine is shared; compare with the raw JetStream rate above.
        "load_average_1m_at_end": round(os.getloadavg()[0], 1),
    }


async def wait_until_serving(url: str, process: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient(timeout=1.0) as client:
        for _ in range(1800):
            if process.poll() is not None:
                raise RuntimeError(f"the callback exited ({process.returncode}); see its log")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).is_success:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the callback did not serve {url} within 3 minutes")


def start_callback(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "crater.cli", "run", "callback"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _uuid(webhook_id: str) -> Any:
    from uuid import UUID

    return UUID(webhook_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--fail-rate", type=float, default=0.3)
    parser.add_argument("--down-after", type=float, default=10.0, help="Seconds in.")
    parser.add_argument("--down-seconds", type=float, default=60.0)
    parser.add_argument("--max-backoff-seconds", type=float, default=2.0)
    parser.add_argument(
        "--max-in-flight", type=int, default=32, help="Concurrent POSTs to the endpoint."
    )
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--database-url", default=None, help="Default: a SQLite file.")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
