"""How far the start-time estimates are from the real starts, on a replayed day (issue 27,
item 3).

The day is the shared-cluster simulation's (`crater.scheduler.sim.shared`, `crater up
--scenario shared-day`'s workload: diurnal inference replicas with heavy-tailed lifetimes, a
training stream offered at 1.6x its pool with log-normal durations, preempted training
resubmitted), replayed through the production core. Every `--sample-minutes` of the day the
estimates are taken as the service takes them (`crater.scheduler.sim.forecast`: a copy of the
core run forward), and each waiting task's estimate is compared with the time it really
started. What the tasks state of their run time, by `--modes`:

- `exact`: each states `expected_run_seconds` = the work it has left (the error is then only
  what the forecast cannot know: tasks that arrive later, preemptions they cause);
- `noisy`: `expected_run_seconds` = that times a log-normal factor (sigma 0.5: half of the
  statements within x0.7..x1.4), as a user's guess;
- `limit`: only `max_run_seconds`, 1.2..3x what it really runs (a wall-time request, never
  reached), which then stands for the expectation.

Reported per mode: tasks that waited at a sample and started later, the share of their
estimates that had a time, median and p90 of |estimated - actual start| for each task's first
estimate and for every estimate, the median signed error, and what one forecast cost.

    .venv/bin/python benchmarks/scheduler/start_estimates.py --seeds 1 --sample-minutes 10

Writes benchmarks/results/start_estimates.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from crater.contracts import AllocationGranted, Event
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.sim.forecast import forecast
from crater.scheduler.sim.openb import SIM_TIME
from crater.scheduler.sim.shared import Job, Setup, run_day, workload

if __package__ in (None, ""):  # run as a script: the repository root is where it imports from
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RESULTS = Path(__file__).resolve().parents[1] / "results" / "start_estimates.json"
MODES = ("exact", "noisy", "limit")


def stated_by(mode: str, seed: int) -> Callable[[Job, float], dict[str, int]]:
    """What each task states in `mode`, drawn per job and attempt from the seed (the same
    in every run)."""

    def draw(job: Job, left: float) -> np.random.Generator:
        key = zlib.crc32(f"{seed}:{job.name}:{left:.3f}".encode())
        return np.random.default_rng(key)

    def stated(job: Job, left: float) -> dict[str, int]:
        if mode == "exact":
            return {"expected_run_seconds": max(1, math.ceil(left))}
        if mode == "noisy":
            return {
                "expected_run_seconds": max(1, math.ceil(left * draw(job, left).lognormal(0, 0.5)))
            }
        held = left + 120.0  # a resumed attempt's restart cost runs inside its grant too
        return {"max_run_seconds": max(1, math.ceil(held * draw(job, left).uniform(1.2, 3.0)))}

    return stated


@dataclass
class Measure:
    """Estimates taken during one replay, and the starts they are judged against."""

    every: float
    next_sample: float = 0.0
    # (sample time, task id, estimated start or None)
    estimates: list[tuple[float, str, datetime | None]] = field(default_factory=list)
    started: dict[str, datetime] = field(default_factory=dict)
    costs: list[float] = field(default_factory=list)
    events: list[int] = field(default_factory=list)

    def observe(self, core: Scheduler, now: float, decisions: list[Event]) -> None:
        for d in decisions:
            if isinstance(d, AllocationGranted):
                self.started.setdefault(d.task_id, d.occurred_at)
        if now < self.next_sample:
            return
        self.next_sample = (now // self.every + 1) * self.every
        if not core.pending:
            return
        began = time.perf_counter()
        made = forecast(core)
        self.costs.append(time.perf_counter() - began)
        self.events.append(made.events)
        for task_id, estimate in made.estimates.items():
            self.estimates.append((now, task_id, estimate.start_at))

    def summary(self) -> dict[str, Any]:
        first: dict[str, float] = {}
        every: list[float] = []
        timed = untimed = 0
        waits: list[float] = []  # from each judged estimate to the real start
        for sampled, task_id, estimate in self.estimates:
            actual = self.started.get(task_id)
            if actual is None:
                continue  # still waiting at the end of the day: nothing to judge against
            if estimate is None:
                untimed += 1
                continue
            timed += 1
            error = (estimate - actual).total_seconds()
            every.append(error)
            first.setdefault(task_id, error)
            waits.append((actual - SIM_TIME).total_seconds() - sampled)
        firsts = np.abs(np.asarray(list(first.values()) or [np.nan]))
        alls = np.asarray(every or [np.nan])
        costs = np.asarray(self.costs or [np.nan])
        return {
            "tasks_judged": len(first),
            "estimates": timed + untimed,
            "estimates_with_a_time_pct": round(100 * timed / max(timed + untimed, 1), 1),
            "first_estimate_abs_error_s": {
                "median": round(float(np.median(firsts)), 1),
                "p90": round(float(np.percentile(firsts, 90)), 1),
            },
            "every_estimate_abs_error_s": {
                "median": round(float(np.median(np.abs(alls))), 1),
                "p90": round(float(np.percentile(np.abs(alls), 90)), 1),
            },
            "median_signed_error_s": round(float(np.median(alls)), 1),
            "median_wait_left_s": round(float(np.median(waits or [np.nan])), 1),
            "forecasts": len(self.costs),
            "forecast_seconds": {
                "median": round(float(np.median(costs)), 4),
                "p99": round(float(np.percentile(costs, 99)), 4),
                "max": round(float(costs.max()), 4),
            },
            "forecast_events_median": int(np.median(self.events or [0])),
        }


def at_scale(nodes: int, waiting: int, seed: int = 1) -> dict[str, Any]:
    """What one forecast costs on a large fleet: the probe's demo profiles scaled to `nodes`
    (`crater bench`'s fleet), filled with the decision-time benchmark's task shapes, each
    stating 10 min..2 h of run time, until `waiting` wait; the copy and the forward run
    timed apart, three times."""
    from benchmarks.scheduler.decision_time import T0, task
    from benchmarks.scheduler.throughput import PREDICTION, scaled_fleet
    from crater.contracts import NodeTopologyReported, TaskProfiled
    from crater.scheduler.sim.forecast import run_forward, snapshot

    rng = random.Random(seed)
    core = Scheduler()
    topologies = scaled_fleet(nodes, seed)
    for topology in topologies:
        core.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    pools = sorted({t.pool for t in topologies})
    n = 0
    while len(core.pending) < waiting:
        request = task(n, rng, pools).model_copy(
            update={"expected_run_seconds": rng.randint(600, 7200)}
        )
        when = T0 + timedelta(seconds=n * 0.01)
        core.handle(TaskProfiled(occurred_at=when, task=request, prediction=PREDICTION))
        n += 1
    copies, runs, events, timed = [], [], [], 0
    for _ in range(3):
        began = time.perf_counter()
        clone = snapshot(core)
        copies.append(time.perf_counter() - began)
        began = time.perf_counter()
        made = run_forward(clone)
        runs.append(time.perf_counter() - began)
        events.append(made.events)
        timed = sum(e.start_at is not None for e in made.estimates.values())
    return {
        "nodes": len(topologies),
        "running": len(core.allocations),
        "waiting": len(core.pending),
        "copy_seconds_median": round(float(np.median(copies)), 3),
        "run_forward_seconds_median": round(float(np.median(runs)), 3),
        "events": int(np.median(events)),
        "estimates_with_a_time": timed,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1", help="e.g. 1 or 1-3")
    parser.add_argument("--sample-minutes", type=float, default=10.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--shared", action="store_true", help="the inference pool lends")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--scale",
        default=None,
        metavar="NODES:WAITING",
        help="Also time one forecast on a fleet this large with this many waiting (1000:500).",
    )
    args = parser.parse_args(argv)
    low, _, high = args.seeds.partition("-")
    seeds = list(range(int(low), int(high or low) + 1))
    setup = Setup()
    report: dict[str, Any] = {
        "command": "python benchmarks/scheduler/start_estimates.py "
        + " ".join(argv or sys.argv[1:]),
        "setup": {
            "nodes": setup.inference_nodes + setup.training_nodes,
            "gpus_per_node": setup.gpus_per_node,
            "hours": setup.horizon / 3600,
            "mode": "shared" if args.shared else "split",
            "sample_minutes": args.sample_minutes,
        },
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "load_average_start": os.getloadavg(),
        "runs": {},
    }
    for mode in [m for m in args.modes.split(",") if m]:
        for seed in seeds:
            jobs = workload(setup, seed)
            measure = Measure(every=args.sample_minutes * 60)
            began = time.perf_counter()
            run_day(setup, jobs, args.shared, seed, stated_by(mode, seed), measure.observe)
            result = measure.summary()
            result["wall_seconds"] = round(time.perf_counter() - began, 1)
            report["runs"][f"{mode}/seed{seed}"] = result
            e1, ea = result["first_estimate_abs_error_s"], result["every_estimate_abs_error_s"]
            print(
                f"{mode:6} seed {seed}: {result['tasks_judged']} tasks waited, "
                f"{result['estimates_with_a_time_pct']}% of {result['estimates']} estimates "
                f"timed; |error| first estimate median {e1['median']} s p90 {e1['p90']} s; "
                f"every estimate median {ea['median']} s p90 {ea['p90']} s; signed median "
                f"{result['median_signed_error_s']} s (wait left median "
                f"{result['median_wait_left_s']} s); forecast median "
                f"{result['forecast_seconds']['median'] * 1000:.0f} ms "
                f"(p99 {result['forecast_seconds']['p99'] * 1000:.0f} ms, "
                f"{result['forecast_events_median']} events)",
                flush=True,
            )
    if args.scale:
        nodes, _, waiting = args.scale.partition(":")
        scale = at_scale(int(nodes), int(waiting or 500))
        report["at_scale"] = scale
        print(
            f"at scale: {scale['nodes']} nodes, {scale['running']} running, {scale['waiting']} "
            f"waiting: copy {scale['copy_seconds_median']} s, forward run "
            f"{scale['run_forward_seconds_median']} s ({scale['events']} events, "
            f"{scale['estimates_with_a_time']} estimates with a time)",
            flush=True,
        )
    report["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
