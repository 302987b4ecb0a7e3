"""A pool's policy: its filter and score pipeline, its over-commit ratios, whether its
tasks are retried when an attempt ends badly, and how long their placements are held."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from crater.contracts import RestartPolicy
from crater.scheduler.domain.cluster import NO_OVERCOMMIT, Overcommit
from crater.scheduler.domain.plugins import DEFAULT_PIPELINE, Pipeline
from crater.scheduler.domain.prewarm import Prewarm
from crater.scheduler.domain.quotas import Quota

NEVER_RESTART = RestartPolicy()

# What a lender's own tasks take back from the borrowers on its nodes (Kueue's
# reclaimWithinCohort): any borrower whatever its priority, only those of lower priority than
# the task taking back, or none (a borrower leaves when it ends).
Reclaim = Literal["any", "lower-priority", "never"]


@dataclass(frozen=True)
class PoolPolicy:
    pipeline: Pipeline = DEFAULT_PIPELINE
    overcommit: Overcommit = NO_OVERCOMMIT
    # for the pool's tasks that name no restart policy of their own
    restart: RestartPolicy = field(default=NEVER_RESTART)
    # for the pool's tasks that name no reservation timeout; None: the scheduler's default
    reservation_timeout_ms: int | None = None
    # Lending (see docs/pools.md): pools of one cohort lend each other their idle nodes.
    # None: the pool neither lends nor borrows (the default; pools are hard partitions).
    cohort: str | None = None
    # the most of this pool's own capacity lent out at once (a `Quota`: None fields are
    # unlimited); and the most this pool holds of other pools' capacity at once
    lend_limit: Quota = field(default_factory=Quota)
    borrow_limit: Quota = field(default_factory=Quota)
    # whole GPUs this pool keeps idle, never lent (warm headroom for its own bursts)
    keep_idle_gpus: int = 0
    # of its own capacity, what it never lends: it lends at most its capacity less this
    reserved: Quota = field(default_factory=Quota)
    # a lender that learns its demand and takes its capacity back ahead of it (prewarm.py)
    prewarm: Prewarm | None = None
    reclaim: Reclaim = "any"
    # Preempting to borrow (Kueue's borrowWithinCohort, policy LowerPriority): a task of this
    # pool that fits neither its own nodes (after its own preemptions and reclaims) nor a
    # mate's idle ones may have the mates' preemptible tasks of lower priority (at most
    # `borrow_preempt_max_priority`, when set) yield, and borrow the room they leave.
    borrow_preempts: bool = False
    borrow_preempt_max_priority: int | None = None
    # No preemption thrashing (docs/scheduler.md): a task of this pool is not preempted by a
    # higher priority before it has held its grant this long, nor again this long after it
    # last had to yield. None: the scheduler's defaults (`SchedulerConfig`).
    min_run_seconds: float | None = None
    victim_cooldown_seconds: float | None = None
    # Time limit of the pool's tasks that state none (`TaskRequest.max_run_seconds`); None:
    # no limit. It is also their expected run time where they state none, for estimates.
    max_run_seconds: int | None = None

    def takes_back(self, priority: int, preemptible: bool, by: int | None) -> bool:
        """Whether this pool (a lender) takes back a borrower of `priority` on its nodes, for
        a task of its own of priority `by` (None: ahead of expected demand, no task: then
        `lower-priority` takes only borrowers that may be preempted at all)."""
        if self.reclaim == "any":
            return True
        if self.reclaim == "never":
            return False
        return preemptible if by is None else priority < by

    def may_preempt_to_borrow(self, priority: int, preemptible: bool, mine: int) -> bool:
        """Whether a task of this pool at priority `mine` may have a mate's task of
        `priority` yield to borrow its room."""
        ceiling = self.borrow_preempt_max_priority
        return (
            self.borrow_preempts
            and preemptible
            and priority < mine
            and (ceiling is None or priority <= ceiling)
        )


DEFAULT_POLICY = PoolPolicy()
