"""Simulated task runner: what a node agent would report for the tasks placed on it.

A grant for a node this fleet simulates puts the task's load on the node, then, without
holding up the consumer, reports `running` shortly after and `succeeded` (or `failed`) after
a seeded duration. An inference replica that serves traffic (it reports its latencies on
`inference.latency`) does not finish by itself: it serves until released or preempted.
Status event ids derive from the grant's, so a redelivered grant, or a restarted probe
re-running it inside JetStream's duplicate window, cannot double a report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    LatencySamplesReported,
    TaskPreempted,
    TaskProfiled,
    TaskStatus,
    utc_now,
)
from crater.probe.reports import (
    STALE_AFTER,
    GrantOutcome,
    Publish,
    Reported,
    publish_retried,
    status_report,
)
from crater.probe.sim.simulation import FleetSimulator, Load, RunPlan, plan_run, true_use_mb

log = logging.getLogger("crater.probe.runner")
V = TypeVar("V")

# Allocations already run or released, remembered so that a late or redelivered grant is
# not run again; bounded, since only recent redeliveries can happen.
REMEMBERED = 100_000


class TaskRunner:
    def __init__(
        self,
        simulator: FleetSimulator,
        publish: Publish,
        *,
        seed: int,
        seconds_min: float,
        seconds_max: float,
        start_max_seconds: float = 1.0,
        failure_rate: float = 0.0,
        clock: Callable[[], datetime] = utc_now,
        stale_after: timedelta = STALE_AFTER,
    ) -> None:
        self.simulator = simulator
        self._publish = publish
        self._seed = seed
        self._seconds = (seconds_min, seconds_max)
        self._start_max = start_max_seconds
        self._failure_rate = failure_rate
        self._clock = clock
        self._stale_after = stale_after
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._done: OrderedDict[str, None] = OrderedDict()
        # task id -> true use per card, MiB (None: nothing modelled, it fills its reservation)
        self._use: OrderedDict[str, int | None] = OrderedDict()
        # task id -> its allocations placed before its profile was seen here
        self._unprofiled: OrderedDict[str, list[str]] = OrderedDict()
        # replicas heard serving traffic: they serve until released, never end alone
        self._servers: OrderedDict[str, None] = OrderedDict()
        self._allocation_of: OrderedDict[str, str] = OrderedDict()  # task id -> allocation

    @property
    def running(self) -> int:
        return len(self._runs)

    def plan(self, allocation_id: str) -> RunPlan:
        return plan_run(
            allocation_id,
            self._seed,
            seconds_min=self._seconds[0],
            seconds_max=self._seconds[1],
            start_max_seconds=self._start_max,
            failure_rate=self._failure_rate,
        )

    def granted(self, event: AllocationGranted) -> GrantOutcome:
        """Start simulating a granted task; returns at once, the run goes on in a task."""
        if event.node not in self.simulator:
            return GrantOutcome.NOT_OURS
        allocation = event.allocation_id
        if allocation in self._runs or allocation in self._done:
            return GrantOutcome.DUPLICATE
        if event.reservation_expires_at + self._stale_after <= self._clock():
            return GrantOutcome.STALE
        load = Load(
            allocation_id=allocation,
            gpu_ids=tuple(event.gpu_ids),
            gpu_memory_mb=event.gpu_memory_mb,
            cpu_cores=len(event.cpu_cores),
            memory_mb=event.memory_mb,
            used_mb=self._use.get(event.task_id),
            task_id=event.task_id,
        )
        if event.task_id not in self._use:
            # its profile is still on its way (another consumer): until `profiled` says what
            # it uses, it fills its reservation; the predictor counts no reading taken before
            # the task runs, and the profile is nearly always in by then
            _remember(self._unprofiled, event.task_id, [])
            self._unprofiled[event.task_id].append(allocation)
        self.simulator.place(event.node, load)
        _remember(self._allocation_of, event.task_id, allocation)
        run = asyncio.create_task(
            self._run(event, self.plan(allocation)), name=f"task-{allocation}"
        )
        self._runs[allocation] = run
        run.add_done_callback(lambda _: self._finished(allocation, run))
        return GrantOutcome.STARTED

    def profiled(self, event: TaskProfiled) -> bool:
        """Learn what the task will really use per card once placed (`true_use_mb`): the
        predictor's modelled figure without its learned correction, so that neither the
        correction nor the reservation feeds the readings the predictor learns from. False
        for a task with nothing modelled on a GPU (CPU-only, or an unknown model)."""
        prediction, task = event.prediction, event.task
        modelled = prediction.gpu_memory_per_gpu_mb - prediction.breakdown_mb.get(
            "learned_correction", 0
        )
        use = None
        if modelled > 0 and prediction.model_family and prediction.parameters:
            use = true_use_mb(
                self._seed, prediction.model_family, task.task_type.value, modelled, task.task_id
            )
        _remember(self._use, task.task_id, use)
        for allocation in self._unprofiled.pop(task.task_id, []):
            self.simulator.set_use(allocation, use)
        return use is not None

    def served(self, sample: LatencySamplesReported) -> bool:
        """A replica placed here serves traffic: it runs until released, and its own report
        of its GPU memory pressure (its KV cache as the load fills it) is what its simulated
        cards show, so the node's metrics tell the autoscaler what a real node's NVML would.
        False: no task placed here, or no pressure said."""
        task = sample.task_id or sample.replica_id
        allocation = self._allocation_of.get(task) if task else None
        if task is None or allocation is None or allocation not in self._runs:
            return False
        _remember(self._servers, task, None)
        if sample.gpu_memory_pressure is None:
            return False
        card_mb = self.simulator.card_memory_mb(allocation)
        if card_mb is None:
            return False
        return self.simulator.set_use(allocation, int(sample.gpu_memory_pressure * card_mb))

    def true_use(self, task_id: str) -> int | None:
        """What the task will use per card, MiB, when its profile has been seen and its
        model is known."""
        return self._use.get(task_id)

    def released(self, event: AllocationReleased) -> bool:
        """The scheduler took the resources back (finished, expired, node lost, ...)."""
        return self._stop(event.allocation_id)

    def preempted(self, event: TaskPreempted) -> bool:
        """A preempted task stops: no more reports, its load leaves the node."""
        return self._stop(event.allocation_id)

    def _stop(self, allocation_id: str) -> bool:
        run = self._runs.pop(allocation_id, None)
        if run is not None:
            run.cancel()
        ours = self.simulator.release(allocation_id) or run is not None
        if ours:
            self._remember(allocation_id)
        return ours

    def _remember(self, allocation_id: str) -> None:
        self._done[allocation_id] = None
        self._done.move_to_end(allocation_id)
        while len(self._done) > REMEMBERED:
            self._done.popitem(last=False)

    def _finished(self, allocation_id: str, run: asyncio.Task[None]) -> None:
        if self._runs.get(allocation_id) is run:
            del self._runs[allocation_id]
            self._remember(allocation_id)
        self.simulator.release(allocation_id)
        if not run.cancelled() and run.exception() is not None:
            log.error("simulated task %s failed: %r", allocation_id, run.exception())

    async def _run(self, grant: AllocationGranted, plan: RunPlan) -> None:
        await asyncio.sleep(plan.start_delay_seconds)
        await self._report(grant, TaskStatus.RUNNING, f"running on {grant.node}")
        await asyncio.sleep(plan.duration_seconds)
        if grant.task_id in self._servers:  # judged now: its profile may have come late
            await asyncio.Event().wait()  # serves until released or preempted (cancelled)
        if plan.succeeds:
            await self._report(grant, TaskStatus.SUCCEEDED, "simulated run completed")
        else:
            await self._report(grant, TaskStatus.FAILED, "simulated run failed (seeded fault)")

    async def _report(self, grant: AllocationGranted, status: Reported, message: str) -> None:
        await publish_retried(self._publish, status_report(grant, status, message))

    async def close(self) -> None:
        """Stop every simulated run (on shutdown)."""
        runs = list(self._runs.values())
        for allocation_id in list(self._runs):
            self._stop(allocation_id)
        for run in runs:
            with contextlib.suppress(asyncio.CancelledError):
                await run


def _remember(memory: OrderedDict[str, V], key: str, value: V) -> None:
    """Keep `key` (the newest), forgetting the oldest past REMEMBERED."""
    if key not in memory:
        memory[key] = value
    memory.move_to_end(key)
    while len(memory) > REMEMBERED:
        memory.popitem(last=False)
