"""Ordered GPU models (`resource_requirements.gpu.models`: "H100, else A100-80GB").

Every listed model passes the filters (`Demand.gpu_model` is their alternatives); the placer
tries them in order, the whole task (every gang member) on one model, and the grant says which
it took and why (`choose_in_order`). With `models_policy: wait` the task's demand names its
first model only until `models_wait_seconds` after it was submitted (`PendingTask`), so it
waits, is explained and preempts for that model alone; then its demand widens to every model
(`widen_due`, from a heap as backoffs are). With `models_policy: borrow` (its pool in a
cohort) the task goes through its models one at a time, each on its own pool then on a cohort
mate's idle nodes (`Lending.borrow_by_model`), each step one `one_model`. Deterministic: the
window counts from the submission's event time and is judged against the core's clock."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

import numpy as np

from crater.scheduler.domain.cluster import BoolArray
from crater.scheduler.domain.gpu_match import model_matches
from crater.scheduler.domain.state import PendingTask, SchedulerState

P = TypeVar("P")  # one pick (`placer.Pick`): this module knows nothing of it

ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def ordinal(rank: int) -> str:
    """`first` for 0, ... (at most GPU_MODELS_MAX models are listed)."""
    return ORDINALS[rank] if rank < len(ORDINALS) else f"{rank + 1}th"


def choose_in_order(
    state: SchedulerState,
    task: PendingTask,
    fits: BoolArray,
    avoid: BoolArray | None,
    among: Callable[[BoolArray, BoolArray | None], list[P] | None],
) -> list[P] | None:
    """The picks on the first of `task`'s models (in its order) that holds all of it now,
    each model tried on its own nodes of `fits` (off `avoid`); while it waits for its first
    model, that one only; in one step of models_policy borrow, that step's model only. Sets
    `task.model_choice`: which it took and why."""
    task.model_choice = None
    order = task.full_demand.gpu_model_order
    tiers = list(enumerate(order[:1] if task.prefer_until is not None else order))
    missed: list[str] = []
    if task.model_step is not None:
        rank, before = task.model_step
        tiers, missed = [(rank, order[rank])], list(before)
    cluster = state.cluster
    rows = np.arange(len(cluster))
    for rank, model in tiers:
        other = ~model_matches(cluster, rows, model)
        with scored_as(task, model):
            picks = among(fits & ~other, other if avoid is None else avoid | other)
        if picks is not None:
            lender = None if task.model_step is None else lender_of(state, task, fits & ~other)
            waited = task.prefer_until is not None
            task.model_choice = taken(order, rank, missed, waited, lender)
            return picks
        missed.append(full_at_home(state, task, model, ~other))
    return None


def full_at_home(state: SchedulerState, task: PendingTask, model: str, carries: BoolArray) -> str:
    """Why `model` (on the nodes `carries`) was not taken on `task`'s own pool."""
    carrying = int(np.count_nonzero(state.cluster.in_pool(task.demand.pool) & carries))
    return (
        f"{model} full (none of its {carrying} node{'s' if carrying != 1 else ''} in pool "
        f"{task.demand.pool} has room now)"
        if carrying
        else f"no {model} node in pool {task.demand.pool}"
    )


def missed_at_home(state: SchedulerState, task: PendingTask, rank: int) -> str:
    """`full_at_home` for `task`'s listed model `rank` (models_policy borrow's steps)."""
    model = task.full_demand.gpu_model_order[rank]
    cluster = state.cluster
    return full_at_home(state, task, model, model_matches(cluster, np.arange(len(cluster)), model))


def taken(
    order: tuple[str, ...], rank: int, missed: list[str], waited: bool, lender: str | None = None
) -> str:
    """`took a100-80gb, second choice of h100, a100-80gb: h100 full (...)`; with `lender`
    (models_policy borrow), `took h100, first choice of h100, a100-80gb, borrowed from pool
    inference (models_policy borrow: before a100-80gb on its own pool)`."""
    text = f"took {order[rank]}, {ordinal(rank)} choice of {', '.join(order)}"
    if lender is not None:
        later = ", ".join(order[rank + 1 :])
        why = f"before {later} on its own pool" if later else "its last choice"
        text += f", borrowed from pool {lender} (models_policy borrow: {why})"
    if missed:
        text += ": " + "; ".join(missed)
    if waited:
        text += " (while it waits for its first choice: models_policy wait)"
    return text


def lender_of(state: SchedulerState, task: PendingTask, carries: BoolArray) -> str | None:
    """The cohort mate whose nodes `carries` are (a borrow step tries one lender's nodes at
    a time); None on `task`'s own pool."""
    pools = sorted({str(p) for p in state.cluster.pool[carries]} - {task.demand.pool})
    return pools[0] if pools else None


@contextmanager
def scored_as(task: PendingTask, model: str) -> Iterator[None]:
    """Within the block, `task`'s demand names `model` only: on that model's nodes it is
    scored as a task naming that model alone would be (the reserve for scarce capacity
    charges work that could go elsewhere, and within a tier it cannot)."""
    demand = task.demand
    task.demand = replace(demand, gpu_model=model)
    try:
        yield
    finally:
        task.demand = demand


@contextmanager
def one_model(task: PendingTask, rank: int, missed: list[str]) -> Iterator[None]:
    """Within the block, placement takes `task`'s listed model `rank` only, and a grant says
    `missed` is why the earlier ones were not taken (a step of models_policy borrow)."""
    task.model_step = (rank, tuple(missed))
    try:
        yield
    finally:
        task.model_step = None


def waiting_for_first(task: PendingTask) -> str | None:
    """Why `task` takes no model but its first yet; None when it does not wait for it."""
    if task.prefer_until is None or task.wide_demand is None:
        return None
    order = task.wide_demand.gpu_model_order
    wait = task.request.resource_requirements.gpu.models_wait_seconds
    return (
        f"waits for {order[0]}, its first choice, until {task.prefer_until:%Y-%m-%dT%H:%M:%SZ} "
        f"(models_policy wait, {wait} s); then takes {', '.join(order[1:])} too"
    )


def remember(state: SchedulerState, task: PendingTask) -> None:
    """Wake the core when `task`'s wait for its first model ends (a queued task)."""
    if task.prefer_until is not None:
        heapq.heappush(state.preferences, (task.prefer_until, task.seq, task.request.task_id))


def widen_due(state: SchedulerState, now: datetime) -> list[str]:
    """Waiting tasks whose wait for their first model is over take every listed model from
    now: their pools, to retry."""
    pools: list[str] = []
    while state.preferences and state.preferences[0][0] <= now:
        _, _, task_id = heapq.heappop(state.preferences)
        task = state.pending.get(task_id)
        if task is None or task.prefer_until is None or task.prefer_until > now:
            continue  # placed, ended, or a later attempt's window
        task.widen()
        pools.append(task.request.pool)
    return pools
