"""Audit explain on a long log: record a run through the scheduler's real service layer into
a SQLite file (as benchmarks.scheduler.audit_replay does: 40 nodes heartbeating every 10 s,
30 tasks a minute, the settings the service ships with), then answer
`GET /api/v1/tasks/{id}/audit[?placements=true]` as the scheduler does
(`SchedulerService.explain`, what the gateway's query runs) for a task near the log's
beginning, one in its middle and one near its end; timed, with the event loop's worst lag
while it ran (the live scheduler shares that loop), and what was read and replayed.

    uv run --frozen python -m benchmarks.scheduler.audit_explain [--minutes 62] [--keep FILE]

`--keep FILE`: record into FILE, or reuse it when it exists (a log recorded by another build
is migrated first); `--index`: fill in the task index first (`crater audit index`), timed,
for a log recorded before it. Prints the figures and writes
benchmarks/results/audit_explain.json."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from benchmarks.scheduler.audit_replay import record, shipped
from crater.contracts import AuditExplainQuery
from crater.runtime.db import make_engine, make_session_factory, upgrade_to_head_async
from crater.runtime.outbox import OutboxRelay
from crater.scheduler.adapters.orm import audit_log, outbox
from crater.scheduler.app import MIGRATIONS_DIR, scheduler_config
from crater.scheduler.service_layer.handlers import SchedulerMetrics, SchedulerService

RESULTS = Path(__file__).resolve().parents[1] / "results" / "audit_explain.json"


async def lagging(stop: asyncio.Event, worst: list[float]) -> None:
    """The event loop's worst lateness, waking every 5 ms, until `stop`."""
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(0.005)
        worst[0] = max(worst[0], time.perf_counter() - asked - 0.005)


async def explained(url: str, repeat: int, index: bool) -> dict[str, Any]:
    clock = time.perf_counter()
    await upgrade_to_head_async(url, MIGRATIONS_DIR)
    migrated_s = time.perf_counter() - clock
    engine = make_engine(url)
    figures: dict[str, Any] = {"migrate_seconds": round(migrated_s, 3)}
    if index:
        from crater.scheduler import audit

        clock = time.perf_counter()
        async with engine.connect() as connection:
            figures["indexed_records"] = await audit.index_tasks(connection)
        figures["index_seconds"] = round(time.perf_counter() - clock, 3)
        print(
            f"crater audit index: {figures['indexed_records']} records in "
            f"{figures['index_seconds']} s"
        )
    sessions = make_session_factory(engine)
    service = SchedulerService(
        sessions,
        OutboxRelay(sessions, outbox, NatsBroker("nats://127.0.0.1:1")),
        scheduler_config(shipped()),
        SchedulerMetrics(CollectorRegistry()),
    )
    async with sessions() as session:
        records = int(await session.scalar(select(func.max(audit_log.c.seq))) or 0)
        profiled = (
            await session.execute(
                select(audit_log.c.seq, audit_log.c.input)
                .where(audit_log.c.kind == "TaskProfiled")
                .order_by(audit_log.c.seq)
            )
        ).all()
    chosen = [profiled[1], profiled[len(profiled) // 2], profiled[-40]]
    figures["records"] = records
    runs = []
    for seq, body in chosen:
        task_id = json.loads(body)["task"]["task_id"]
        for placements in (False, True):
            query = AuditExplainQuery(task_id=task_id, placements=placements)
            seconds = []
            worst = [0.0]
            answer: Any = None
            for _ in range(repeat):
                stop = asyncio.Event()
                watcher = asyncio.create_task(lagging(stop, worst))
                await asyncio.sleep(0.01)
                clock = time.perf_counter()
                answer = await service.explain(query)
                seconds.append(time.perf_counter() - clock)
                stop.set()
                await watcher
            run = {
                "task_id": task_id,
                "profiled_at_record": int(seq),
                "placements": placements,
                "steps": len(answer.steps),
                "placements_answered": sum(s.placement is not None for s in answer.steps),
                "seconds_best": round(min(seconds), 3),
                "seconds_worst": round(max(seconds), 3),
                "event_loop_worst_lag_ms": round(worst[0] * 1000, 1),
            }
            for name in ("truncated", "records_read", "events_replayed", "replayed_from"):
                if hasattr(answer, name):  # what this build says of its work
                    run[name] = getattr(answer, name)
            runs.append(run)
            print(
                f"explain {task_id} (profiled at record {seq}) placements={placements}: "
                f"{run['seconds_best']} s best of {repeat}, worst {run['seconds_worst']} s, "
                f"{run['steps']} steps, {run['placements_answered']} placements; event loop "
                f"lag up to {run['event_loop_worst_lag_ms']} ms"
                + "".join(
                    f"; {k} {run[k]}" for k in ("records_read", "events_replayed") if k in run
                )
                + (f"; from snapshot {run['replayed_from']}" if "replayed_from" in run else "")
                + ("; TRUNCATED" if run.get("truncated") else "")
            )
    figures["runs"] = runs
    await engine.dispose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--minutes", type=int, default=62)
    parser.add_argument("--tasks-per-minute", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--index", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = args.keep or Path(folder) / "audit.db"
        url = f"sqlite+aiosqlite:///{path}"
        recorded_s = None
        if not path.exists():
            clock = time.perf_counter()
            asyncio.run(record(url, args.nodes, args.minutes, args.tasks_per_minute))
            recorded_s = round(time.perf_counter() - clock, 1)
        figures = asyncio.run(explained(url, args.repeat, args.index))
    result = {
        "what": "SchedulerService.explain (GET /api/v1/tasks/{id}/audit) on a recorded log "
        "(SQLite), for a task near the beginning, the middle and the end",
        "nodes": args.nodes,
        "minutes": args.minutes,
        "record_seconds": recorded_s,
        **figures,
        "machine": f"{platform.machine()} {platform.python_version()}, {os.cpu_count()} cores",
        "load_average_1m": round(os.getloadavg()[0], 2),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{figures['records']} records; written to {args.out}")


if __name__ == "__main__":
    main()
