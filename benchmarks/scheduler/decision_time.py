"""Decision time of the scheduling core at 1,000 and 10,000 nodes.

Builds a simulated fleet of N nodes from the probe's demo profiles, feeds the core their
topologies, then a stream of tasks like the demo's (training, fine-tuning, inference, CPU-only,
GPU shares), each released after a while so the cluster stays busy but not full, and times
`Scheduler.handle` per event (submissions and status reports). With `--waiting N`, one pool is
first filled and N tasks left waiting in its queue; with `--own-pool-release-every K` as well,
every K-th task also ends one of that pool's tasks, so its waiting tasks are retried (and the
first of them placed) on that event. The core alone: no bus, no database.

    .venv/bin/python benchmarks/scheduler/decision_time.py --nodes 1000 10000 --tasks 3000 \
        --waiting 0 1000

Prints p50/p99/p99.9 and writes JSON to benchmarks/results/scheduler_decision_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from crater.contracts import (
    AllocationGranted,
    FabricPlace,
    NodeTopology,
    NodeTopologyReported,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler

if __package__ in (None, ""):  # run as a script: the repository root is where it imports from
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.scheduler.throughput import PREDICTION, scaled_fleet

RESULTS = Path(__file__).resolve().parents[1] / "results" / "scheduler_decision_time.json"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SHAPES = [  # (gpus, milli, memory_mb per card, cores, memory_mb)
    (8, 1000, 70000, 64, 500_000),
    (2, 1000, 40000, 16, 128_000),
    (1, 1000, 20000, 8, 64_000),
    (1, 500, 8000, 4, 16_000),
    (0, 1000, 0, 8, 16_000),
]


def placed(topologies: list[NodeTopology], leaf_size: int) -> list[NodeTopology]:
    """Each node under a leaf switch of `leaf_size` nodes, eight leaves a spine, in fleet
    order (0: the fleet as it is, no place declared)."""
    if not leaf_size:
        return topologies
    return [
        t.model_copy(
            update={
                "fabric": FabricPlace(
                    leaf=f"leaf-{i // leaf_size}", spine=f"spine-{i // (8 * leaf_size)}"
                )
            }
        )
        for i, t in enumerate(topologies)
    ]


def task(
    n: int, rng: random.Random, pools: list[str], gang_every: int = 0, in_leaf: bool = False
) -> TaskRequest:
    gpus, milli, gpu_mb, cores, memory = rng.choice(SHAPES)
    gang: dict[str, Any] = {}
    if gang_every and n % gang_every == 0:  # a data-parallel gang (kept under one leaf)
        gpus, milli, gpu_mb, cores, memory = SHAPES[2]
        gang = {"gang_size": 4}
        if in_leaf:
            gang["network_topology"] = {"required": "leaf"}
    return TaskRequest.model_validate(
        gang
        | {
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


def queue_up(scheduler: Scheduler, waiting: int, pools: list[str]) -> None:
    """Fill the first pool with whole-node tasks that never finish, then leave `waiting` more
    of them in the queue: every later change retries them (a deep pending queue)."""
    n = 0
    while len(scheduler.pending) < waiting:
        request = TaskRequest.model_validate(
            {
                "task_id": f"q{n}",
                "task_type": "training",
                "model_config": {"name": "bench"},
                "resource_requirements": {
                    "gpu": {"count": 1, "memory_mb": 1000},
                    "cpu": {"cores": 2},
                    "memory": {"capacity_mb": 4000},
                },
                "pool": pools[0],
            }
        )
        scheduler.handle(TaskProfiled(occurred_at=T0, task=request, prediction=PREDICTION))
        n += 1
        if n > 100 * (waiting + len(scheduler.cluster)):
            raise RuntimeError("the queue does not fill: tasks never wait")
    for task_id, allocation in list(scheduler.allocations.items()):
        if allocation.task_id.startswith("q"):
            scheduler.handle(
                TaskStatusReported(occurred_at=T0, task_id=task_id, status=TaskStatus.RUNNING)
            )


def run(
    nodes: int,
    tasks: int,
    seed: int,
    waiting: int = 0,
    own_pool_every: int = 0,
    leaf_size: int = 0,
    gang_every: int = 0,
) -> dict[str, Any]:
    rng = random.Random(seed)
    scheduler = Scheduler()
    topologies = placed(scaled_fleet(nodes, seed), leaf_size)
    for topology in topologies:
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    pools = sorted({t.pool for t in topologies})
    if waiting:
        queue_up(scheduler, waiting, pools)
        pools = pools[1:]  # the timed tasks go where there is room
    times: list[float] = []
    cpu_times: list[float] = []  # the same, in CPU time: what other load on the machine adds
    running: list[str] = []
    # Tasks held before the oldest finishes: few enough that releases (and the retries of the
    # waiting tasks they cause) happen early in the run.
    keep = min(nodes, 100)
    for n in range(tasks):
        at = T0 + timedelta(seconds=n * 0.01)
        if waiting and own_pool_every and n % own_pool_every == 0:
            # A task of the deep queue's own pool ends: its waiting tasks are retried.
            held = next((a for a in scheduler.allocations if a.startswith("q")), None)
            if held is not None:
                report = TaskStatusReported(
                    occurred_at=at, task_id=held, status=TaskStatus.SUCCEEDED
                )
                started, cpu = time.perf_counter(), time.thread_time()
                scheduler.handle(report)
                times.append(time.perf_counter() - started)
                cpu_times.append(time.thread_time() - cpu)
        request = task(n, rng, pools, gang_every, in_leaf=leaf_size > 0)
        event = TaskProfiled(occurred_at=at, task=request, prediction=PREDICTION)
        started, cpu = time.perf_counter(), time.thread_time()
        decisions = scheduler.handle(event)
        times.append(time.perf_counter() - started)
        cpu_times.append(time.thread_time() - cpu)
        running += [d.task_id for d in decisions if isinstance(d, AllocationGranted)]
        for task_id in running[: max(0, len(running) - keep)]:
            for status in (TaskStatus.RUNNING, TaskStatus.SUCCEEDED):
                # Timed too: a release retries the waiting tasks, the cost of a deep queue.
                report = TaskStatusReported(occurred_at=at, task_id=task_id, status=status)
                started, cpu = time.perf_counter(), time.thread_time()
                scheduler.handle(report)
                times.append(time.perf_counter() - started)
                cpu_times.append(time.thread_time() - cpu)
        running = running[max(0, len(running) - keep) :]
    ms = sorted(t * 1000 for t in times)
    cpu_ms = sorted(t * 1000 for t in cpu_times)
    return {
        "nodes": len(topologies),
        "tasks": tasks,
        "waiting": waiting,
        "own_pool_release_every": own_pool_every if waiting else 0,
        **({"leaf_size": leaf_size, "gang_every": gang_every} if leaf_size or gang_every else {}),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 3),
        "p99_9_ms": round(ms[int(len(ms) * 0.999) - 1], 3),
        "max_ms": round(ms[-1], 3),
        # CPU time of the same calls: near the wall time on a quiet machine, and unchanged by
        # other processes competing for the cores.
        "cpu_p50_ms": round(statistics.median(cpu_ms), 3),
        "cpu_p99_ms": round(cpu_ms[int(len(cpu_ms) * 0.99) - 1], 3),
        "cpu_p99_9_ms": round(cpu_ms[int(len(cpu_ms) * 0.999) - 1], 3),
        "pending_at_end": len(scheduler.pending),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--waiting",
        type=int,
        nargs="+",
        default=[0, 1000],
        help="Tasks left waiting in the queue while the others are timed (a deep queue).",
    )
    parser.add_argument(
        "--own-pool-release-every",
        type=int,
        default=0,
        metavar="K",
        help="With --waiting: every K-th task, a task of the waiting pool ends too (0: never).",
    )
    parser.add_argument(
        "--leaf-size",
        type=int,
        default=0,
        metavar="N",
        help="Nodes declare a place in the fabric: N nodes a leaf switch, 8 leaves a spine "
        "(0: none declared, the fleet as before).",
    )
    parser.add_argument(
        "--gang-every",
        type=int,
        default=0,
        metavar="K",
        help="Every K-th task is a gang of 4 one-GPU members, which with --leaf-size requires "
        "one leaf (network_topology.required: leaf); 0: none.",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="Where the JSON goes.")
    args = parser.parse_args()
    results = []
    for n in args.nodes:
        for waiting in args.waiting:
            result = run(
                n,
                args.tasks,
                args.seed,
                waiting,
                args.own_pool_release_every,
                args.leaf_size,
                args.gang_every,
            )
            print(json.dumps(result), flush=True)
            results.append(result)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # the machine is shared: its load when measured, for reading the times
    load = round(os.getloadavg()[0], 2)
    body = {"runs": results, "machine": machine, "load_average_1m": load}
    args.out.write_text(json.dumps(body, indent=2) + "\n")


if __name__ == "__main__":
    main()
