"""Choosing whom to preempt: on the node where the fewest lower-priority preemptible tasks
must yield, the least progressed of them.

A gang preempts all or nothing: only a set of victims that makes room for every member at
once (on one node for a same-node gang, across nodes otherwise) is chosen; else nobody is
asked to yield. A victim is a whole task: a victim gang frees its members on every node."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from crater.scheduler.domain.cluster import WHOLE, Node
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.placement import Selection, select

# (victims, -latest grant among them, node name): the smaller, the cheaper
Cost = tuple[int, int, str]


@dataclass(frozen=True)
class Candidate:
    """A running allocation that may be asked to yield."""

    allocation_id: str
    node: str
    gpu_ids: tuple[int, ...]
    gpu_milli: int
    cpu_cores: tuple[int, ...]
    memory_mb: int
    priority_rank: int  # larger is lower priority
    granted_seq: int  # later grant, less progress lost
    mig_profile: str | None = None  # a MIG slice of gpu_ids[0]
    task_id: str = ""  # the task it belongs to: a gang's members yield together
    disk: tuple[str, int] | None = None  # (SSD, GB) it holds


@dataclass(frozen=True)
class Plan:
    nodes: tuple[str, ...]  # where the victims yield (the waiting task is kept these)
    victims: tuple[Candidate, ...]

    @property
    def node(self) -> str:
        return self.nodes[0]


def members_fit(node: Node, demand: Demand, members: int) -> int:
    """How many copies of `demand` (at most `members`) `node` holds as it is now, each on the
    devices the previous ones leave. `node` is as it was on return."""
    held: list[Selection] = []
    milli = demand.gpu_milli or WHOLE
    try:
        while len(held) < members:
            selection = select(node, demand)
            if selection is None:
                break
            node.take(
                selection.gpu_ids,
                milli,
                selection.cpu_cores,
                demand.memory_mb,
                None,
                selection.mig_profile,
                selection.disk_hold(demand),
            )
            held.append(selection)
        return len(held)
    finally:
        for selection in reversed(held):
            node.give_back(
                selection.gpu_ids,
                milli,
                selection.cpu_cores,
                demand.memory_mb,
                None,
                selection.mig_profile,
                selection.disk_hold(demand),
            )


def plan(
    nodes: Sequence[Node], demand: Demand, candidates: Sequence[Candidate], members: int = 1
) -> Plan | None:
    """The cheapest set of victims that lets `members` copies of `demand` (one task, or a
    same-node gang) fit together on one of `nodes`, or None.

    Cost: fewest victims, then the least progressed (latest granted), then node name."""
    best: tuple[Cost, Plan] | None = None
    for node in nodes:
        found = _cheapest_on(node, demand, candidates, members)
        if found is not None and (best is None or found[0] < best[0]):
            best = (found[0], Plan((node.name,), found[1]))
    return None if best is None else best[1]


def plan_gang(
    nodes: Sequence[Node],
    demand: Demand,
    candidates: Sequence[Candidate],
    members: int,
    roomy: set[str] | None = None,
) -> Plan | None:
    """Victims that make room for all `members` of a gang spread across `nodes`, or None
    when no set of them would (then nobody yields).

    Greedy and deterministic: while the nodes hold fewer members than needed, take the step
    (a node's lowest-priority, least-progressed candidates, the first k of them) with the
    fewest victims per member of room it adds, then the least progressed, then node name. A
    victim that is a gang frees its members on every node. `roomy`: the nodes that may hold
    a member now (None: any); the others hold none until their victims go."""
    with_victims = {c.node for c in candidates}
    room = {
        node.name: members_fit(node, demand, members)
        for node in nodes
        if roomy is None or node.name in roomy or node.name in with_victims
    }
    if sum(room.values()) >= members:
        return None  # room enough without preempting: the gang waits for other reasons
    # Only nodes with victims change: copies of them take the victims' going.
    working = {node.name: copy.deepcopy(node) for node in nodes if node.name in with_victims}
    left = list(candidates)
    chosen: list[Candidate] = []
    freed_on: set[str] = set()
    while (missing := members - sum(room.values())) > 0:
        best: tuple[tuple[Fraction, int, str], tuple[Candidate, ...]] | None = None
        for name in sorted(working):
            for victims, gained in _steps_on(working[name], demand, left, room[name], members):
                key = (
                    Fraction(len(victims), min(gained, missing)),
                    -min(v.granted_seq for v in victims),
                    name,
                )
                if best is None or key < best[0]:
                    best = (key, victims)
        if best is None:
            return None
        tasks = {_owner(v) for v in best[1]}
        yielding = [c for c in left if _owner(c) in tasks]
        for victim in yielding:
            node = working.get(victim.node)
            if node is not None:
                _give_back(node, victim)
                freed_on.add(victim.node)
        chosen += yielding
        left = [c for c in left if _owner(c) not in tasks]
        room.update({name: members_fit(working[name], demand, members) for name in freed_on})
    return Plan(tuple(sorted(freed_on)), tuple(chosen))


def _steps_on(
    node: Node, demand: Demand, candidates: Sequence[Candidate], room: int, members: int
) -> list[tuple[tuple[Candidate, ...], int]]:
    """Each first-k of `node`'s candidates (lowest priority, least progressed first) whose
    going lets `node` hold more members than its `room`, with how many more."""
    mine = sorted(
        (c for c in candidates if c.node == node.name),
        key=lambda c: (-c.priority_rank, -c.granted_seq),
    )
    freed = copy.deepcopy(node)
    steps: list[tuple[tuple[Candidate, ...], int]] = []
    for k, victim in enumerate(mine, start=1):
        _give_back(freed, victim)
        held = members_fit(freed, demand, members)
        if held > room:
            steps.append((tuple(mine[:k]), held - room))
            if held == members:
                break
    return steps


def _owner(candidate: Candidate) -> str:
    return candidate.task_id or candidate.allocation_id


def _cheapest_on(
    node: Node, demand: Demand, candidates: Sequence[Candidate], members: int
) -> tuple[Cost, tuple[Candidate, ...]] | None:
    """The fewest of `node`'s candidates, lowest priority and least progressed first, whose
    going lets `node` hold `members` copies of `demand`; with its cost."""
    mine = sorted(
        (c for c in candidates if c.node == node.name),
        key=lambda c: (-c.priority_rank, -c.granted_seq),
    )
    if not mine:
        return None
    freed = copy.deepcopy(node)
    victims: list[Candidate] = []
    for victim in mine:
        victims.append(victim)
        _give_back(freed, victim)
        if members_fit(freed, demand, members) >= members:
            cost = (len(victims), -min(v.granted_seq for v in victims), node.name)
            return cost, tuple(victims)
    return None


def _give_back(node: Node, victim: Candidate) -> None:
    node.give_back(
        victim.gpu_ids,
        victim.gpu_milli,
        victim.cpu_cores,
        victim.memory_mb,
        None,
        victim.mig_profile,
        victim.disk,
    )
