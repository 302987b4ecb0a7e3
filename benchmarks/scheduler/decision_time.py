"""Decision time of the scheduling core at 1,000 and 10,000 nodes.

Builds a simulated fleet of N nodes from the probe's demo profiles, feeds the core their
topologies, then a stream of tasks like the demo's (training, fine-tuning, inference, CPU-only,
GPU shares), each released after a while so the cluster stays busy but not full, and times
`Scheduler.handle` per task. The core alone: no bus, no database.

    .venv/bin/python benchmarks/scheduler/decision_time.py --nodes 1000 10000 --tasks 3000

Prints p50/p99/p99.9 and writes JSON to benchmarks/results/scheduler_decision_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from crater.contracts import (
    Confidence,
    NodeTopologyReported,
    ResourcePrediction,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.probe.fleet import build_fleet, read_fleet_spec
from crater.scheduler.domain.core import Scheduler

RESULTS = Path(__file__).resolve().parents[1] / "results" / "scheduler_decision_time.json"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SHAPES = [  # (gpus, milli, memory_mb per card, cores, memory_mb)
    (8, 1000, 70000, 64, 500_000),
    (2, 1000, 40000, 16, 128_000),
    (1, 1000, 20000, 8, 64_000),
    (1, 500, 8000, 4, 16_000),
    (0, 1000, 0, 8, 16_000),
]
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=0,
    host_memory_mb=0,
    confidence=Confidence.LOW,
    method="benchmark",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=2,
)


def fleet(nodes: int, seed: int) -> list[Any]:
    spec = read_fleet_spec(None)
    base = sum(group.count for group in spec.nodes)
    scaled = spec.model_copy(
        update={
            "faults": [],
            "nodes": [
                g.model_copy(update={"count": max(1, round(g.count * nodes / base))})
                for g in spec.nodes
            ],
        }
    )
    return build_fleet(scaled, seed).topologies[:nodes]


def task(n: int, rng: random.Random, pools: list[str]) -> TaskRequest:
    gpus, milli, gpu_mb, cores, memory = rng.choice(SHAPES)
    return TaskRequest.model_validate(
        {
            "task_id": f"t{n}",
            "task_type": "training" if gpus else "evaluation",
            "model_config": {"name": "bench"},
            "resource_requirements": {
                "gpu": {"count": gpus, "milli": milli if gpus == 1 else 1000, "memory_mb": gpu_mb},
                "cpu": {"cores": cores},
                "memory": {"capacity_mb": memory},
            },
            "pool": rng.choice(pools),
        }
    )


def run(nodes: int, tasks: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    scheduler = Scheduler()
    topologies = fleet(nodes, seed)
    for topology in topologies:
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    pools = sorted({t.pool for t in topologies})
    times: list[float] = []
    running: list[str] = []
    for n in range(tasks):
        at = T0 + timedelta(seconds=n * 0.01)
        event = TaskProfiled(occurred_at=at, task=task(n, rng, pools), prediction=PREDICTION)
        started = time.perf_counter()
        decisions = scheduler.handle(event)
        times.append(time.perf_counter() - started)
        running += [d.task_id for d in decisions if type(d).__name__ == "AllocationGranted"]
        for task_id in running[: max(0, len(running) - nodes)]:  # keep about one per node
            scheduler.handle(
                TaskStatusReported(occurred_at=at, task_id=task_id, status=TaskStatus.RUNNING)
            )
            scheduler.handle(
                TaskStatusReported(occurred_at=at, task_id=task_id, status=TaskStatus.SUCCEEDED)
            )
        running = running[max(0, len(running) - nodes) :]
    ms = sorted(t * 1000 for t in times)
    return {
        "nodes": len(topologies),
        "tasks": tasks,
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 3),
        "p99_9_ms": round(ms[int(len(ms) * 0.999) - 1], 3),
        "max_ms": round(ms[-1], 3),
        "pending_at_end": len(scheduler.pending),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    results = []
    for n in args.nodes:
        result = run(n, args.tasks, args.seed)
        print(json.dumps(result), flush=True)
        results.append(result)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": results, "machine": machine}, indent=2) + "\n")


if __name__ == "__main__":
    main()
