"""A day of a cluster that trains and serves, run through the production scheduling core: one
cluster whose inference pool lends its idle cards to training (a cohort; reclaimed by
preemption with the grace period), against the same cluster split into two fixed pools.

The workload, drawn from a seed, is the same in both runs:

- inference: replicas (1 or 2 GPUs, high priority, never preempted) requested at a diurnal
  rate (a sine over the day, trough at 04:00, peak at 16:00) with heavy-tailed lifetimes
  (log-normal); a replica meets its SLO when it starts within `slo_seconds` of its request.
- training: a stream of jobs (1-8 GPUs, low priority, preemptible) whose offered load is
  above the training pool's size all day, with log-normal durations.

A preempted training job checkpoints within the grace period (its stop takes a uniform
`stop_seconds`), its GPUs go back, and it is submitted again with the work left; its
restart costs `restart_seconds` of its GPUs (the work lost). Nodes never fail here (the
heartbeat timeout is set past the day).

Measured: GPU utilisation (time-average of the cards held), training GPU-hours delivered
(useful work, restarts excluded, partial jobs included), inference SLO attainment, reclaim
latency (an inference replica that preempted borrowers: request to start), preemptions and
GPU-hours lost.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid5

import numpy as np

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Confidence,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    ReleaseReason,
    ResourcePrediction,
    TaskPreempted,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.prewarm import Prewarm
from crater.scheduler.domain.quotas import Quota
from crater.scheduler.sim.openb import CPU_UNIT_MILLI, SIM_TIME, OpenbNode
from crater.scheduler.sim.openb import topology as openb_topology

DAY = 86_400.0
_IDS = UUID("0c6f6a1e-3b1d-4c55-9a43-736861726564")
_PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=0,
    host_memory_mb=0,
    confidence=Confidence.LOW,
    method="simulation: no prediction",
    dataloader_num_workers=0,
    dataloader_prefetch_factor=1,
)


@dataclass(frozen=True)
class Setup:
    inference_nodes: int = 8
    training_nodes: int = 8
    gpus_per_node: int = 8
    cores_per_node: int = 128
    memory_per_node_mb: int = 2_048_000
    grace_seconds: int = 30
    stop_seconds: tuple[float, float] = (5.0, 25.0)  # a victim's checkpoint-and-stop
    restart_seconds: float = 120.0  # a resumed job's lost time (load, warm up)
    slo_seconds: float = 60.0  # an inference replica must start within this
    keep_idle_gpus: int = 8  # the inference pool's headroom, never lent
    prewarm_lead_seconds: float | None = None  # the inference pool's pre-warm (None: off)
    days: int = 1  # days run one after the other (a pre-warm learns from the days before)
    # shared: an inference replica that its own pool cannot hold even by reclaiming has
    # training tasks (lower priority) yield and borrows their cards, which training does not
    # take back (`borrow.preempt`, `lend.reclaim: lower-priority`; Kueue's borrowWithinCohort)
    preempt_to_borrow: bool = True

    @property
    def horizon(self) -> float:
        return self.days * DAY

    # inference: mean GPUs in use at the trough and the peak of the day
    inference_trough_gpus: float = 12.0
    inference_peak_gpus: float = 52.0
    inference_median_seconds: float = 900.0
    inference_sigma: float = 1.2  # log-normal: heavy-tailed lifetimes
    # training: offered GPUs as a share of the training pool, job durations
    training_load: float = 1.6
    training_median_seconds: float = 5400.0
    training_sigma: float = 0.8


@dataclass(frozen=True)
class Job:
    name: str
    kind: str  # "inference" | "training"
    at: float  # seconds into the day
    gpus: int
    seconds: float  # work it needs


def _lognormal_mean(median: float, sigma: float) -> float:
    return median * float(np.exp(sigma * sigma / 2))


def workload(setup: Setup, seed: int) -> list[Job]:
    """The day's inference replicas and training jobs, by arrival time."""
    rng = np.random.default_rng(seed)
    jobs: list[Job] = []
    # Inference: a thinned Poisson process, rate(t) * mean lifetime * mean GPUs = GPUs in use.
    sizes, weights = np.array([1, 2]), np.array([0.7, 0.3])
    mean_gpus = float((sizes * weights).sum())
    life = _lognormal_mean(setup.inference_median_seconds, setup.inference_sigma)

    def rate(t: float) -> float:
        mid = (setup.inference_peak_gpus + setup.inference_trough_gpus) / 2
        half = (setup.inference_peak_gpus - setup.inference_trough_gpus) / 2
        in_use = mid - half * np.cos(2 * np.pi * (t - 4 * 3600) / DAY)
        return float(in_use / (life * mean_gpus))

    top = setup.inference_peak_gpus / (life * mean_gpus)
    # Start a few hours early so the day opens on a warm inference pool.
    t = -4 * 3600.0
    k = 0
    while True:
        t += float(rng.exponential(1 / top))
        if t >= setup.horizon:
            break
        if rng.random() * top > rate(t):
            continue
        seconds = float(
            rng.lognormal(np.log(setup.inference_median_seconds), setup.inference_sigma)
        )
        gpus = int(rng.choice(sizes, p=weights))
        if t + seconds > 0:
            jobs.append(Job(f"inf-{k}", "inference", max(t, 0.0), gpus, t + seconds - max(t, 0)))
            k += 1
    # Training: Poisson arrivals at the offered load.
    tsizes, tweights = np.array([1, 2, 4, 8]), np.array([0.3, 0.3, 0.25, 0.15])
    tmean = _lognormal_mean(setup.training_median_seconds, setup.training_sigma)
    pool_gpus = setup.training_nodes * setup.gpus_per_node
    per_second = setup.training_load * pool_gpus / (tmean * float((tsizes * tweights).sum()))
    t, k = 0.0, 0
    # a backlog at dawn: the pool's worth of jobs already queued
    while sum(j.gpus for j in jobs if j.kind == "training") < pool_gpus * setup.training_load:
        gpus = int(rng.choice(tsizes, p=tweights))
        seconds = float(rng.lognormal(np.log(setup.training_median_seconds), setup.training_sigma))
        jobs.append(Job(f"trn-{k}", "training", 0.0, gpus, seconds))
        k += 1
    while True:
        t += float(rng.exponential(1 / per_second))
        if t >= setup.horizon:
            break
        gpus = int(rng.choice(tsizes, p=tweights))
        seconds = float(rng.lognormal(np.log(setup.training_median_seconds), setup.training_sigma))
        jobs.append(Job(f"trn-{k}", "training", t, gpus, seconds))
        k += 1
    return sorted(jobs, key=lambda j: (j.at, j.name))


def config(setup: Setup, shared: bool) -> SchedulerConfig:
    """The two pools; shared: one cohort, inference lends its idle cards and, with
    `preempt_to_borrow`, borrows training's cards by preemption when its own pool is full;
    training borrows without a limit and takes back only what lower priorities borrowed."""
    borrows = shared and setup.preempt_to_borrow
    pools = {
        "inference": PoolPolicy(
            cohort="day" if shared else None,
            borrow_limit=Quota() if borrows or not shared else Quota(gpus=0),
            borrow_preempts=borrows,
            keep_idle_gpus=setup.keep_idle_gpus if shared else 0,
            prewarm=(
                Prewarm(setup.prewarm_lead_seconds)
                if shared and setup.prewarm_lead_seconds is not None
                else None
            ),
        ),
        "training": PoolPolicy(
            cohort="day" if shared else None, reclaim="lower-priority" if borrows else "any"
        ),
    }
    return SchedulerConfig(
        grace_period_seconds=setup.grace_seconds,
        pools=pools,
        heartbeat_timeout_seconds=10 * setup.horizon,  # no node fails in this simulation
        node_lost_seconds=10 * setup.horizon,
    )


@dataclass
class DayResult:
    mode: str
    gpus: int
    seconds: float = DAY  # the span measured
    gpu_seconds_held: float = 0.0
    training_gpu_seconds: float = 0.0
    lost_gpu_seconds: float = 0.0
    inference_total: int = 0
    inference_met: int = 0
    inference_waits: list[float] = field(default_factory=list)
    # owner asks (its replica is requested) -> the borrowed capacity it reclaimed is back
    reclaim_latencies: list[float] = field(default_factory=list)
    # the borrower is told to yield -> it is gone (the reclaim itself, without the owner's
    # queueing on its own pool before any borrower's going could make room for it)
    reclaim_yields: list[float] = field(default_factory=list)
    # and -> the replica starts (may also wait on its own pool's replicas: fragmentation)
    reclaim_starts: list[float] = field(default_factory=list)
    preemptions: int = 0
    prewarm_preemptions: int = 0  # borrowers told to yield ahead of expected demand
    borrow_preemptions: int = 0  # training told to yield so a replica borrows its cards
    inference_borrowed: int = 0  # replicas started on training's cards
    borrowed_gpu_seconds: float = 0.0
    # (hour, GPUs held by inference, by training on its own pool, training on borrowed cards)
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        waits = np.asarray(self.reclaim_latencies or [0.0])
        starts = np.asarray(self.reclaim_starts or [0.0])
        return {
            "mode": self.mode,
            "gpu_utilisation_pct": round(
                100 * self.gpu_seconds_held / (self.gpus * self.seconds), 2
            ),
            "training_gpu_hours": round(self.training_gpu_seconds / 3600, 1),
            "inference_replicas": self.inference_total,
            "inference_slo_attainment_pct": round(
                100 * self.inference_met / max(self.inference_total, 1), 2
            ),
            "reclaims": len(self.reclaim_latencies),
            "reclaim_p50_s": round(float(np.percentile(waits, 50)), 2),
            "reclaim_p99_s": round(float(np.percentile(waits, 99)), 2),
            "reclaim_max_s": round(float(waits.max()), 2),
            "reclaim_yield_p99_s": round(
                float(np.percentile(np.asarray(self.reclaim_yields or [0.0]), 99)), 2
            ),
            "reclaimed_start_p99_s": round(float(np.percentile(starts, 99)), 2),
            "preemptions": self.preemptions,
            "prewarm_preemptions": self.prewarm_preemptions,
            "borrow_preemptions": self.borrow_preemptions,
            "inference_borrowed": self.inference_borrowed,
            "work_lost_gpu_hours": round(self.lost_gpu_seconds / 3600, 2),
            "borrowed_gpu_hours": round(self.borrowed_gpu_seconds / 3600, 1),
        }


@dataclass
class _Running:
    job: Job
    attempt: int
    task_id: str
    gpus: int
    started: float  # seconds into the day
    useful_from: float  # after its restart cost
    left: float  # work left when it started
    borrowed: bool
    allocations: set[str] = field(default_factory=set)


def _held_as(run: _Running) -> str:
    """Which count a run's cards go to: inference (wherever), training on its own pool, or
    training on borrowed cards."""
    return "borrowed" if run.borrowed and run.job.kind == "training" else run.job.kind


def _at(seconds: float) -> datetime:
    return SIM_TIME + timedelta(seconds=seconds)


def _request(job: Job, task_id: str, stated: dict[str, int] | None = None) -> TaskProfiled:
    inference = job.kind == "inference"
    request = TaskRequest.model_validate(
        {
            **(stated or {}),
            "task_id": task_id,
            "task_type": "inference" if inference else "training",
            "model_config": {"name": job.kind},
            "pool": job.kind,
            "tenant": job.kind,
            "priority": "high" if inference else "low",
            "preemptible": not inference,
            "resource_requirements": {
                "gpu": {"count": job.gpus},
                "cpu": {"cores": 4 * job.gpus},
                "memory": {"capacity_mb": 64_000 * job.gpus},
            },
        }
    )
    return TaskProfiled(
        event_id=uuid5(_IDS, f"task:{task_id}"),
        occurred_at=_at(job.at),
        task=request,
        prediction=_PREDICTION,
    )


# What a job's task states of its run time (expected_run_seconds, max_run_seconds), given the
# job and the work it has left; and a look at the core after each event with its decisions.
Stated = Callable[[Job, float], dict[str, int]]
Observer = Callable[[Scheduler, float, list[Event]], None]


def run_day(
    setup: Setup,
    jobs: list[Job],
    shared: bool,
    seed: int = 0,
    stated: Stated | None = None,
    observe: Observer | None = None,
) -> DayResult:
    """One day through `Scheduler.handle`; `shared`: the inference pool lends. `stated`:
    the run times each task states (none by default); `observe`: called after each event
    with the core, the time and the event's decisions (start estimates measure themselves)."""
    scheduler = Scheduler(config(setup, shared))
    nodes = [("inference", i) for i in range(setup.inference_nodes)] + [
        ("training", i) for i in range(setup.training_nodes)
    ]
    for pool, i in nodes:
        name = f"{pool[:3]}-{i:02d}"
        shape = OpenbNode(
            name,
            setup.cores_per_node * CPU_UNIT_MILLI,
            setup.memory_per_node_mb,
            setup.gpus_per_node,
            "H100",
        )
        topology = openb_topology(shape).model_copy(update={"pool": pool})
        scheduler.handle(
            NodeTopologyReported(
                event_id=uuid5(_IDS, f"node:{name}"), occurred_at=_at(0), node=topology
            )
        )
    rng = np.random.default_rng(seed + 7)
    horizon = setup.horizon
    result = DayResult("shared" if shared else "split", len(nodes) * setup.gpus_per_node, horizon)
    # (time, order, kind, payload)
    queue: list[tuple[float, int, str, Any]] = []
    order = 0

    def push(t: float, kind: str, payload: Any) -> None:
        nonlocal order
        heapq.heappush(queue, (t, order, kind, payload))
        order += 1

    for job in jobs:
        push(job.at, "submit", (job, 1, job.seconds))
    for hour in range(24 * setup.days + 1):
        push(hour * 3600.0, "sample", None)
    waiting: dict[str, tuple[Job, int, float, float]] = {}  # task -> job, attempt, left, since
    running: dict[str, _Running] = {}
    by_allocation: dict[str, str] = {}
    reclaiming: set[str] = set()  # inference tasks that preempted borrowers
    victim_of: dict[str, str] = {}  # a reclaimed allocation -> the owner's task
    told: dict[str, float] = {}  # a reclaimed allocation -> when it was told to yield
    asked: dict[str, float] = {}  # an inference task -> when it was requested
    held = {"inference": 0, "training": 0, "borrowed": 0}
    last = 0.0

    def advance(now: float) -> None:
        nonlocal last
        span = now - last
        if span > 0:
            total = sum(held.values())
            result.gpu_seconds_held += total * span
            result.borrowed_gpu_seconds += held["borrowed"] * span
            last = now

    def feed(event: Event, now: float) -> None:
        decisions = scheduler.handle(event)
        if observe is not None:
            observe(scheduler, now, decisions)
        for d in decisions:
            if isinstance(d, AllocationGranted):
                on_grant(d, now)
            elif isinstance(d, TaskPreempted):
                result.preemptions += 1
                if d.reclaimed_by_pool is not None and d.preempted_by is not None:
                    reclaiming.add(d.preempted_by)
                    victim_of[d.allocation_id] = d.preempted_by
                    told[d.allocation_id] = now
                elif d.reclaimed_by_pool is not None:
                    result.prewarm_preemptions += 1
                elif d.preempted_by is not None:
                    result.borrow_preemptions += 1
                lo, hi = setup.stop_seconds
                push(now + float(rng.uniform(lo, hi)), "stop", (d.task_id, d.allocation_id))
                # The clock moves a second past the deadline, as the nodes' heartbeats move it in
                # production: a victim still there is released then.
                if d.must_stop_by is not None:
                    push((d.must_stop_by - SIM_TIME).total_seconds() + 1.0, "tick", None)
            elif isinstance(d, AllocationReleased):
                on_release(d, now)

    def on_grant(g: AllocationGranted, now: float) -> None:
        by_allocation[g.allocation_id] = g.task_id
        run = running.get(g.task_id)
        if run is None:
            job, attempt, left, since = waiting.pop(g.task_id)
            restart = setup.restart_seconds if attempt > 1 else 0.0
            run = running[g.task_id] = _Running(
                job, attempt, g.task_id, 0, now, now + restart, left, g.borrowed_from is not None
            )
            if job.kind == "inference":
                wait = now - since
                result.inference_waits.append(wait)
                result.inference_total += 1
                result.inference_met += wait <= setup.slo_seconds
                result.inference_borrowed += g.borrowed_from is not None
                if g.task_id in reclaiming:
                    result.reclaim_starts.append(wait)
            push(now + restart + left, "done", (g.task_id, attempt))
        run.gpus += len(g.gpu_ids)
        run.allocations.add(g.allocation_id)
        held[_held_as(run)] += len(g.gpu_ids)
        feed(
            TaskStatusReported(
                event_id=uuid5(_IDS, f"running:{g.allocation_id}"),
                occurred_at=_at(now),
                task_id=g.task_id,
                status=TaskStatus.RUNNING,
                allocation_id=g.allocation_id,
            ),
            now,
        )

    def on_release(r: AllocationReleased, now: float) -> None:
        owner = victim_of.pop(r.allocation_id, None)
        if owner is not None:
            result.reclaim_latencies.append(now - asked[owner])
            result.reclaim_yields.append(now - told.pop(r.allocation_id))
        run = running.get(r.task_id)
        if run is None or r.allocation_id not in run.allocations:
            return
        run.allocations.discard(r.allocation_id)
        held[_held_as(run)] -= len(r.gpu_ids)
        if run.allocations:
            return
        del running[r.task_id]
        worked = max(0.0, now - run.useful_from)
        lost = min(now - run.started, run.useful_from - run.started) * run.gpus
        if run.job.kind == "training":
            result.training_gpu_seconds += min(worked, run.left) * run.gpus
            result.lost_gpu_seconds += lost
        if r.reason is ReleaseReason.PREEMPTED:
            left = run.left - worked
            if left > 0:
                nxt = run.attempt + 1
                push(now, "submit", (run.job, nxt, left))

    while queue:
        now, _, kind, payload = heapq.heappop(queue)
        if now > horizon:
            break
        advance(now)
        if kind == "submit":
            job, attempt, left = payload
            task_id = job.name if attempt == 1 else f"{job.name}.{attempt}"
            waiting[task_id] = (job, attempt, left, now)
            asked[task_id] = now
            again = Job(job.name, job.kind, now, job.gpus, left)
            feed(_request(again, task_id, stated(job, left) if stated else None), now)
        elif kind == "done":
            task_id, attempt = payload
            if task_id in running:
                feed(
                    TaskStatusReported(
                        event_id=uuid5(_IDS, f"done:{task_id}"),
                        occurred_at=_at(now),
                        task_id=task_id,
                        status=TaskStatus.SUCCEEDED,
                    ),
                    now,
                )
        elif kind == "stop":
            task_id, allocation_id = payload
            if task_id in running:
                feed(
                    TaskStatusReported(
                        event_id=uuid5(_IDS, f"stop:{allocation_id}"),
                        occurred_at=_at(now),
                        task_id=task_id,
                        status=TaskStatus.CANCELLED,
                        allocation_id=allocation_id,
                        message="preempted: checkpointed and stopped",
                    ),
                    now,
                )
        elif kind == "tick":
            feed(
                NodeHealthReported(
                    event_id=uuid5(_IDS, f"tick:{now}"),
                    occurred_at=_at(now),
                    node_id="clock",
                    condition=NodeCondition.READY,
                    score=100,
                ),
                now,
            )
        else:
            result.timeline.append(
                (now / 3600, held["inference"], held["training"], held["borrowed"])
            )
    advance(horizon)
    # Work done by the jobs still running at the end of the day counts too.
    for run in running.values():
        if run.job.kind == "training":
            result.training_gpu_seconds += (
                min(max(0.0, horizon - run.useful_from), run.left) * run.gpus
            )
    # Inference replicas still waiting at the end missed their SLO if they waited too long.
    for job, _, _, since in waiting.values():
        if job.kind == "inference" and horizon - since > setup.slo_seconds:
            result.inference_total += 1
    return result


def compare(setup: Setup, seed: int) -> tuple[DayResult, DayResult]:
    """The split cluster and the shared one on the same day's workload."""
    jobs = workload(setup, seed)
    return run_day(setup, jobs, shared=False, seed=seed), run_day(
        setup, jobs, shared=True, seed=seed
    )
