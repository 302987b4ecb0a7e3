"""Audit replay speed: record a run through the scheduler's real service layer into a SQLite
file (nodes heartbeating every 10 s, tasks arriving, running and ending, as `make up` does),
with the configuration and audit settings the service ships with (`SchedulerSettings()`:
snapshots every 10,000 records), then verify the log and replay it through the production
core, timed as `crater audit replay` runs it (`audit.replay_log`: the records read from the
database, decoded, decided and compared; the reading counts in the time): once from the log's
beginning, once from --from in the second half, which starts at the snapshot before it.

    uv run --frozen python -m benchmarks.scheduler.audit_replay [--nodes 40] [--minutes 60]

Prints the events/s and writes benchmarks/results/audit_replay.json."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from faststream.nats import NatsBroker
from prometheus_client import CollectorRegistry

from crater.contracts import (
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.db import make_engine, make_session_factory, upgrade_to_head_async
from crater.runtime.outbox import OutboxRelay
from crater.scheduler import audit
from crater.scheduler.adapters.orm import outbox
from crater.scheduler.app import MIGRATIONS_DIR, SchedulerSettings, audit_log, scheduler_config
from crater.scheduler.service_layer.handlers import SchedulerMetrics, SchedulerService
from tests.support.profiles import small_training
from tests.support.topologies import node

RESULTS = Path(__file__).resolve().parents[1] / "results" / "audit_replay.json"


def request(task_id: str, gpus: int, at: datetime) -> TaskProfiled:
    return small_training(task_id, gpus, at)


def shipped() -> SchedulerSettings:
    """The scheduler's settings as it ships (the development token secret allowed here)."""
    return SchedulerSettings(environment="development")


async def record(url: str, nodes: int, minutes: int, tasks_per_minute: int) -> None:
    await upgrade_to_head_async(url, MIGRATIONS_DIR)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    relay = OutboxRelay(sessions, outbox, NatsBroker("nats://127.0.0.1:1"))
    settings = shipped()
    service = SchedulerService(
        sessions,
        relay,
        scheduler_config(settings),
        SchedulerMetrics(CollectorRegistry()),
        audit=audit_log(settings),
    )
    await service.take_over(1, "bench")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=minutes + 1)
    await asyncio.gather(
        *(
            service.handle(
                NodeTopologyReported(node=node(f"n{i}", gpus=8), occurred_at=start),
                "node-topology",
            )
            for i in range(nodes)
        )
    )
    running: list[tuple[datetime, str]] = []
    number = 0
    for second in range(0, minutes * 60, 10):
        at = start + timedelta(seconds=second + 1)
        beats = [
            NodeHealthReported(
                node_id=f"n{i}", condition=NodeCondition.READY, score=100, occurred_at=at
            )
            for i in range(nodes)
        ]
        await asyncio.gather(*(service.handle(b, "node-health") for b in beats))
        arriving = [
            request(f"t{number + k}", 1 + (number + k) % 4, at)
            for k in range(tasks_per_minute // 6)
        ]
        number += len(arriving)
        await asyncio.gather(*(service.handle(e, "task-profiled") for e in arriving))
        for event in arriving:
            running.append((at + timedelta(minutes=3), event.task.task_id))
        ending = [t for t in running if t[0] <= at]
        running = [t for t in running if t[0] > at]
        for _, task_id in ending:
            allocation = service.scheduler.allocations.get(task_id)
            if allocation is None:
                continue
            member = next(iter(allocation.members()))
            for status in (TaskStatus.RUNNING, TaskStatus.SUCCEEDED):
                report = TaskStatusReported(
                    task_id=task_id,
                    status=status,
                    allocation_id=member.allocation_id,
                    occurred_at=at,
                )
                await service.handle(report, "task-status")
    await engine.dispose()


async def measure(url: str) -> dict[str, object]:
    engine = make_engine(url)
    async with engine.connect() as connection:
        clock = time.perf_counter()
        entries = await audit.all_entries(connection)
        read_s = time.perf_counter() - clock
        clock = time.perf_counter()
        verified = await audit.verify(connection)
        verify_s = time.perf_counter() - clock
    await engine.dispose()
    kinds: dict[str, int] = {}
    for entry in entries:
        kinds[entry.kind] = kinds.get(entry.kind, 0) + 1
    return {
        "records": len(entries),
        "by_kind": kinds,
        "read_seconds": round(read_s, 3),
        "verify_ok": verified.ok,
        "verify_seconds": round(verify_s, 3),
        "snapshots": verified.snapshots,
    }


def replays(url: str, records: int) -> dict[str, object]:
    """`crater audit replay` as it runs (`audit.replay_in_parallel`, the records read from
    the database included): from the beginning and from --from in the last quarter, in one
    process (--jobs 1, the CLI's default) and one per CPU."""
    config = scheduler_config(shipped())
    cpus = len(os.sched_getaffinity(0))
    middle = records * 3 // 4
    # the machine is shared: its load as the replays begin, for reading the rates
    figures: dict[str, object] = {"cpus": cpus, "load_average_1m": round(os.getloadavg()[0], 2)}
    for name, start, from_snapshot in (("whole", 1, False), ("ranged", middle, True)):
        for jobs in (1, cpus):
            cpu = time.process_time()  # one process: its CPU time, what load cannot inflate
            report = audit.replay_in_parallel(
                url, config, start, jobs=jobs, from_snapshot=from_snapshot
            )
            cpu = time.process_time() - cpu
            figures[f"{name}_jobs_{jobs}"] = {
                "command": f"crater audit replay --jobs {jobs} "
                + ("--from-beginning" if name == "whole" else f"--from {start}"),
                "identical": report.identical,
                "started_at_snapshot": report.started_at,
                "events": report.events,
                "compared": report.compared,
                "seconds": round(report.seconds, 3),
                "events_per_second": round(report.rate),
                **(
                    {
                        "cpu_seconds": round(cpu, 3),
                        "events_per_cpu_second": round(report.events / cpu),
                    }
                    if jobs == 1
                    else {}
                ),
            }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--tasks-per-minute", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite+aiosqlite:///{folder}/audit.db"
        clock = time.perf_counter()
        asyncio.run(record(url, args.nodes, args.minutes, args.tasks_per_minute))
        recorded_s = time.perf_counter() - clock
        figures = asyncio.run(measure(url))
        figures["replays"] = timed = replays(url, cast(int, figures["records"]))
    whole = cast(dict[str, Any], timed["whole_jobs_1"])  # the CLI's default, one process
    spread = cast(dict[str, Any], timed[f"whole_jobs_{timed['cpus']}"])
    result = {
        "what": "audit log of a simulated hour through the real service layer (SQLite), "
        "verified and replayed through the production core",
        "nodes": args.nodes,
        "minutes": args.minutes,
        "tasks_per_minute": args.tasks_per_minute,
        "record_seconds": round(recorded_s, 1),
        **figures,
        # the headline, as before: the whole log replayed, now as the CLI does by default
        "replay_identical": whole["identical"],
        "replay_events": whole["events"],
        "replay_seconds": whole["seconds"],
        "replay_events_per_second": whole["events_per_second"],
        "replay_events_per_second_one_per_cpu": spread["events_per_second"],
        "machine": f"{platform.machine()} {platform.python_version()}, {os.cpu_count()} cores",
        # the machine is shared: its load when measured, for reading the rate
        "load_average_1m": round(os.getloadavg()[0], 2),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    for run in timed.values():
        if isinstance(run, dict):
            cpu = run.get("events_per_cpu_second")
            print(
                f"{run['command']}: {run['events_per_second']:,} events/s "
                f"({run['events']} events in {run['seconds']} s, identical: {run['identical']})"
                + (f"; {cpu:,} events per CPU-second" if cpu else "")
            )


if __name__ == "__main__":
    main()
