"""Scarce capacity kept (issue #26): a task asking no GPU does not take one of the last
`scarce_holders_kept` nodes able to hold a multi-card shape that most nodes cannot hold; it
waits, says why, and takes one once it has waited `scarce_hold_max_wait_seconds`."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskPending,
    TaskProfiled,
)
from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.fragmentation import held_for_scarce
from crater.scheduler.domain.plugins.pipeline import policy_pipeline
from crater.scheduler.sim.openb import SIM_TIME, OpenbNode, OpenbPod, task_event, topology
from tests.unit.scheduler.test_fragmentation import big, demand, g3_cluster

G2 = OpenbNode("g2-a", 96000, 393216, 8, "G2")
G3 = [OpenbNode(f"g3-{k}", 128000, 786432, 8, "G3") for k in range(2)]


def test_a_cpu_only_task_is_held_off_the_last_holders_it_would_break() -> None:
    c = g3_cluster(2)  # two 96-core nodes, two 128-core ones; 120-core eight-card pods seen
    every = np.arange(4)
    # 16 cores leave 112: a 128-core node could no longer hold the scarce shape
    assert held_for_scarce(c, demand(0, cores=16), every, keep=2).tolist() == [
        False,
        False,
        True,
        True,
    ]
    # 4 cores leave 124: it still holds it, so nothing is held
    assert not held_for_scarce(c, demand(0, cores=4), every, keep=2).any()
    # more holders than kept: none of them is among the last
    assert not held_for_scarce(c, demand(0, cores=16), every, keep=1).any()
    # off, or a task asking for GPUs (it pays in the fragmentation score instead)
    assert not held_for_scarce(c, demand(0, cores=16), every, keep=0).any()
    assert not held_for_scarce(c, demand(1, cores=16), every, keep=2).any()
    # the scarce work itself could run only there: it is never held
    assert not held_for_scarce(c, big(8, 120), every, keep=2).any()


def fleet(config: SchedulerConfig) -> Scheduler:
    """One 96-core and two 128-core eight-card nodes; the workload seen so far: one-card pods
    and a few 120-core eight-card ones (only the 128-core nodes hold those)."""
    core = Scheduler(config)
    for n in (G2, *G3):
        core.handle(NodeTopologyReported(occurred_at=SIM_TIME, node=topology(n, 1000)))
    for _ in range(30):
        core.cluster.workload.observe(demand(1, cores=8))
    for _ in range(2):
        core.cluster.workload.observe(big(8, 120))
    return core


def cpu_only(task_id: str, cores: int, after: float = 0.0) -> TaskProfiled:
    event = task_event(OpenbPod(task_id, cores * 1000, 4096, 0, 0, ""), task_id, 1000)
    return event.model_copy(update={"occurred_at": SIM_TIME + timedelta(seconds=after)})


def placed_on(decisions: list[Event], task_id: str) -> str | None:
    for d in decisions:
        if isinstance(d, AllocationGranted) and d.task_id == task_id:
            return d.node
    return None


def test_cpu_only_work_waits_rather_than_break_the_last_holders_then_takes_one() -> None:
    core = fleet(SchedulerConfig())
    beats(core, 0)
    # 90 cores fit the 96-core node, or break a 128-core one: they go where nothing is held
    assert placed_on(core.handle(cpu_only("fill", 90)), "fill") == "g2-a"
    # 32 cores fit only the 128-core nodes, the last two able to hold the scarce shape
    decisions = core.handle(cpu_only("t32", 32))
    assert placed_on(decisions, "t32") is None
    [pending] = [d for d in decisions if isinstance(d, TaskPending)]
    [why] = [r for r in pending.reasons if r.code == "HeldForScarceWork"]
    assert why.filter == "ScarceCapacity"
    assert why.nodes == 2
    assert "kept for scarce work" in pending.summary
    # a task with GPUs is not held (the fragmentation score weighs what it takes)
    assert placed_on(
        core.handle(task_event(OpenbPod("gpu", 8000, 4096, 1, 1000, ""), "gpu", 1000)), "gpu"
    )
    # held still after 590 s; then heartbeats like the last (which retry nothing by
    # themselves) come once it has waited the longest hold: it takes one
    for after in (300, 590):
        assert not [d for d in beats(core, after) if isinstance(d, AllocationGranted)]
    assert placed_on(beats(core, 601), "t32") in {"g3-0", "g3-1"}


def beats(core: Scheduler, after: float) -> list[Event]:
    at = SIM_TIME + timedelta(seconds=after)
    out: list[Event] = []
    for n in (G2, *G3):
        health = NodeHealthReported(
            node_id=n.name, condition=NodeCondition.READY, score=100, occurred_at=at
        )
        out += core.handle(health)
    return out


def test_no_hold_when_off_or_under_a_baseline_pipeline() -> None:
    for config in (
        SchedulerConfig(scarce_holders_kept=0),
        SchedulerConfig(pipeline=policy_pipeline("bestfit")),
    ):
        core = fleet(config)
        core.handle(cpu_only("fill", 90))
        assert placed_on(core.handle(cpu_only("t32", 32)), "t32") is not None


def test_a_held_task_at_the_head_of_its_queue_keeps_no_node_it_is_held_off() -> None:
    """A waiting head keeps the node it waits on from the tasks behind it; a task held off
    the last holders must not keep one of them from the scarce work they are held for."""
    core = fleet(SchedulerConfig())
    core.handle(cpu_only("fill", 90))
    assert placed_on(core.handle(cpu_only("t32", 32)), "t32") is None
    for k in range(2):
        pod = OpenbPod(f"big{k}", 120_000, 65536, 8, 1000, "")
        assert placed_on(core.handle(task_event(pod, f"big{k}", 1000)), f"big{k}") == f"g3-{k}"


def test_a_restart_still_ends_the_hold_on_time() -> None:
    """The wakeup that retries a held task is not stored: a restore arms it again from the
    task's own wait, so the task is placed when its hold ends, not at the next change."""
    core = fleet(SchedulerConfig())
    core.handle(cpu_only("fill", 90))
    assert placed_on(core.handle(cpu_only("t32", 32)), "t32") is None
    again = Scheduler(core.config)
    again.restore(
        nodes=[(n.topology, n.condition, n.last_heartbeat_at) for n in core.cluster.nodes],
        allocations=[replace(a, peers=[]) for a in core.allocations.values()],
        pending=[replace(t, scarce_hold_until=None) for t in core.pending.values()],  # as loaded
        next_seq=core.next_seq,
    )
    for _ in range(2):  # the scarce shapes seen before the restart (fleet's history)
        again.cluster.workload.observe(big(8, 120))
    for after in (300, 590):
        assert not [d for d in beats(again, after) if isinstance(d, AllocationGranted)]
    assert placed_on(beats(again, 601), "t32") in {"g3-0", "g3-1"}
