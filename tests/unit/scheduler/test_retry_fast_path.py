"""The core's retry shortcuts (only stale pools are retried, a demand that found no candidate
node is not filtered again in the same pass, preemption is looked for only when something
ranks below the task) must not change a single decision: under random event sequences the
core decides exactly as a naive retry of every waiting task on every change."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    Confidence,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    ResourcePrediction,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.plugins import policy_pipeline
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.quotas import Quota
from tests.support.topologies import node

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=0,
    host_memory_mb=0,
    confidence=Confidence.LOW,
    method="test",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=1,
)
POOLS = ("default", "batch", "lab")
FLEET = (  # small: most tasks wait, and what frees room matters
    node("a-1", gpus=4, cores=16, memory_mb=128_000, pool="default"),
    node("a-2", gpus=2, cores=8, memory_mb=64_000, pool="default"),
    node("b-1", gpus=2, gpu_memory_mb=16384, cores=8, memory_mb=64_000, pool="batch"),
    node("b-2", gpus=1, gpu_memory_mb=16384, cores=8, memory_mb=64_000, pool="batch"),
    node("c-1", cores=16, memory_mb=64_000, pool="lab"),
    node("c-2", gpus=1, cores=8, memory_mb=32_000, pool="lab"),
)


class NaiveRetry(Scheduler):
    """Every change retries every waiting task from scratch: the reference."""

    def _retry_pending(self, cause: Event) -> list[Event]:
        decisions: list[Event] = []
        self.backfill = {}
        for task in self._queue():
            if task.request.task_id not in self.pending or task.not_before is not None:
                continue
            avoid = self._reserved_for(task)
            granted = self._try_place(task, cause, avoid)
            if granted:
                del self.pending[task.request.task_id]
                decisions += granted
                continue
            over = self.quotas.blocking(task.request.tenant, task.demand, task.gang_size)
            reasons, summary = self._why_waiting(task, avoid, over, None)
            decisions += self._announce(task, cause, reasons, summary)
            if task.request.pool not in self.backfill and not over:
                self._make_head(task)
            decisions += self._preempt_for(task, cause)
        return decisions


CHOICES: tuple[tuple[object, ...], ...] = (
    (0, 1, 1, 2, 4),  # GPUs
    (1000, 1000, 250, 500),  # share of a card (with 1 GPU)
    (0, 16000, 40000),  # memory per card
    (1, 2, 4, 8),  # CPU cores
    (1000, 16_000, 48_000),  # memory MiB
    ("high", "medium", "low"),
    (False, True),  # preemptible
    (1, 1, 1, 2, 3),  # gang size
    (None, "same-node"),
    POOLS,
    ("search", "research", "ads"),
    (None, None, 5, 30),  # sla.max_queue_time_seconds
)
shapes = st.tuples(*(st.sampled_from(c) for c in CHOICES))
# Submissions come in runs of identical ones: identical demands are what the shortcut skips.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.tuples(shapes, st.integers(1, 4))),
        st.tuples(st.just("running"), st.integers(0, 500)),
        st.tuples(st.just("finish"), st.integers(0, 500)),
        st.tuples(st.just("cancel"), st.integers(0, 500)),
        # a cancel of a task submitted a few steps later: it ends cancelled on arrival
        st.tuples(st.just("early-cancel"), st.integers(1, 6)),
        st.tuples(st.just("health"), st.tuples(st.integers(0, 5), st.booleans())),
        st.tuples(st.just("wait"), st.integers(1, 40)),
    ),
    min_size=1,
    max_size=150,
)


def request(task_id: str, shape: tuple[object, ...]) -> TaskRequest:
    gpus, milli, gpu_mb, cores, mem, priority, preemptible, gang, together, pool, tenant, sla = (
        shape
    )
    return TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training",
            "model_config": {"name": "m"},
            "resource_requirements": {
                "gpu": {
                    "count": gpus,
                    "memory_mb": gpu_mb if gpus else 0,
                    "milli": milli if gpus == 1 else 1000,
                },
                "cpu": {"cores": cores},
                "memory": {"capacity_mb": mem},
            },
            "affinity": {"gpu": together},
            "priority": priority,
            "preemptible": preemptible,
            "gang_size": gang,
            "pool": pool,
            "tenant": tenant,
            "sla": {"max_queue_time_seconds": sla},
        }
    )


def config(random_lab: bool) -> SchedulerConfig:
    """Quotas for two tenants; optionally the lab pool placed by the seeded random policy
    (every ranking draws: a skipped one would shift every later draw)."""
    pools = {"lab": PoolPolicy(pipeline=policy_pipeline("random", seed=3))} if random_lab else {}
    return SchedulerConfig(
        quotas={"search": Quota(gpus=6, cpu_cores=24), "ads": Quota(memory_mb=100_000)},
        pools=pools,
        reservation_timeout_ms=60_000,
        grace_period_seconds=10,
    )


def events(script: list[tuple[str, object]]) -> list[Event]:
    out: list[Event] = [NodeTopologyReported(occurred_at=T0, node=t) for t in FLEET]
    submitted: list[str] = []
    clock = 0
    for i, (kind, arg) in enumerate(script):
        clock += 1
        at = T0 + timedelta(seconds=clock)
        if kind == "wait":
            clock += int(arg)  # type: ignore[call-overload]
        elif kind == "submit":
            shape, copies = cast(tuple[tuple[object, ...], int], arg)
            for copy in range(copies):
                submitted.append(f"t{i}-{copy}")
                task = request(submitted[-1], shape)
                out.append(TaskProfiled(occurred_at=at, task=task, prediction=PREDICTION))
        elif kind == "early-cancel":
            ahead = f"t{i + int(arg)}-0"  # type: ignore[call-overload]
            out.append(
                TaskStatusReported(occurred_at=at, task_id=ahead, status=TaskStatus.CANCELLED)
            )
        elif kind == "health":
            row, up = cast(tuple[int, bool], arg)
            condition = NodeCondition.READY if up else NodeCondition.NOT_READY
            out.append(
                NodeHealthReported(
                    occurred_at=at, node_id=FLEET[row].node_id, condition=condition, score=100
                )
            )
        elif submitted:
            status = {
                "running": TaskStatus.RUNNING,
                "finish": TaskStatus.SUCCEEDED,
                "cancel": TaskStatus.CANCELLED,
            }[kind]
            task_id = submitted[int(arg) % len(submitted)]  # type: ignore[call-overload]
            out.append(TaskStatusReported(occurred_at=at, task_id=task_id, status=status))
    return out


def preemptible_recount(scheduler: Scheduler) -> Counter[int]:
    return Counter(
        a.priority for a in scheduler.allocations.values() if a.preemptible and a.yield_by is None
    )


@settings(max_examples=200, deadline=None)
@given(steps, st.booleans())
def test_the_shortcuts_decide_exactly_as_a_naive_retry(
    script: list[tuple[str, object]], random_lab: bool
) -> None:
    fast = Scheduler(config=config(random_lab))
    naive = NaiveRetry(config=config(random_lab))
    for event in events(script):
        expected = [d.model_dump() for d in naive.handle(event)]
        assert [d.model_dump() for d in fast.handle(event)] == expected, event
        assert fast.preemptible == preemptible_recount(fast)
        assert {p: h.task_id for p, h in fast.backfill.items()} == {
            p: h.task_id for p, h in naive.backfill.items()
        }
        assert fast.pending.keys() == naive.pending.keys()
        assert fast.early_cancels == naive.early_cancels


@pytest.mark.parametrize("seed", range(6))
def test_long_random_runs_decide_exactly_as_a_naive_retry(seed: int) -> None:
    """Long runs: deep queues in every pool, releases here and there, nodes going away."""
    rng = random.Random(seed)
    kinds = ["submit"] * 4 + ["running", "finish", "finish", "finish", "cancel", "health", "wait"]
    script: list[tuple[str, object]] = []
    for _ in range(300):
        kind = rng.choice(kinds)
        if kind == "submit":
            shape = tuple(rng.choice(list(s)) for s in CHOICES)
            script.append((kind, (shape, rng.choice([1, 1, 3]))))
        elif kind == "health":
            script.append((kind, (rng.randrange(len(FLEET)), rng.random() < 0.7)))
        else:
            script.append((kind, rng.randrange(1000)))
    fast = Scheduler(config=config(seed % 2 == 1))
    naive = NaiveRetry(config=config(seed % 2 == 1))
    for event in events(script):
        expected = [d.model_dump() for d in naive.handle(event)]
        assert [d.model_dump() for d in fast.handle(event)] == expected, event
        assert fast.preemptible == preemptible_recount(fast)
    assert naive.pending  # the queues were deep


def test_a_release_in_another_pool_leaves_a_deep_queue_alone() -> None:
    """Waiting tasks of a full pool are not tried again when a task ends elsewhere; they are
    when their own pool frees room."""
    scheduler = Scheduler()
    for topology in (node("g-1", gpus=1, pool="gpu"), node("c-1", cores=8, pool="cpu")):
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    gpu_shape = (1, 1000, 0, 1, 1000, "medium", False, 1, None, "gpu", "search", None)
    cpu_shape = (0, 1000, 0, 1, 1000, "medium", False, 1, None, "cpu", "search", None)
    for n in range(5):
        scheduler.handle(
            TaskProfiled(occurred_at=T0, task=request(f"g{n}", gpu_shape), prediction=PREDICTION)
        )
    scheduler.handle(
        TaskProfiled(occurred_at=T0, task=request("c0", cpu_shape), prediction=PREDICTION)
    )
    assert set(scheduler.pending) == {"g1", "g2", "g3", "g4"}
    done = TaskStatusReported(occurred_at=T0, task_id="c0", status=TaskStatus.SUCCEEDED)
    scheduler.handle(done)  # retries the stale pools: both, once
    assert scheduler.stale_pools == set()

    tried: list[str] = []
    scheduler.handle(
        TaskProfiled(occurred_at=T0, task=request("c1", cpu_shape), prediction=PREDICTION)
    )
    diagnose = scheduler.diagnose

    def counting(demand, free=True, among=None):  # type: ignore[no-untyped-def]
        tried.append(demand.pool)
        return diagnose(demand, free, among)

    scheduler.diagnose = counting  # type: ignore[method-assign]
    scheduler.handle(TaskStatusReported(occurred_at=T0, task_id="c1", status=TaskStatus.SUCCEEDED))
    assert "gpu" not in tried
    decisions = scheduler.handle(
        TaskStatusReported(occurred_at=T0, task_id="g0", status=TaskStatus.SUCCEEDED)
    )
    assert [d.model_dump()["task_id"] for d in decisions][-1] == "g1"  # its pool freed a card
    assert "gpu" in tried


def test_node_names_rank_in_order_however_they_arrive() -> None:
    cluster_order = ["n-07", "n-02", "n-10", "n-01", "n-05", "a", "z", "n-03"]
    scheduler = Scheduler()
    for name in cluster_order * 3:  # again: an update keeps its row and its rank
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=node(name, cores=4)))
    cluster = scheduler.cluster
    by_rank = sorted(range(len(cluster)), key=lambda i: int(cluster.name_rank[i]))
    assert [cluster.nodes[i].name for i in by_rank] == sorted(cluster_order)
    assert list(cluster.pool) == ["default"] * len(cluster_order)
    assert len(cluster.cpu_total) == len(cluster.everywhere) == len(cluster_order)
    assert not cluster.everywhere.flags.writeable
