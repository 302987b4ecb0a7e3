"""The placer, the framework's filter and score runs: diagnose (one filter walk, shared with
the dry run), rank, trial (every gang member on the state the previous ones leave), select,
and grant."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Protocol

import numpy as np

from crater.contracts import (
    AllocationGranted,
    Event,
    FabricLevel,
    FilterReason,
    NodeFit,
    NodeMisfit,
    PlacementAnswer,
    ScoreDetail,
    derived_event_id,
)
from crater.scheduler.domain.cluster import (
    WHOLE,
    BoolArray,
    Node,
)
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.events import (
    attempt_key,
    granted,
)
from crater.scheduler.domain.fabric import along_ring, domains_for
from crater.scheduler.domain.fragmentation import held_for_scarce
from crater.scheduler.domain.gpu_order import choose_in_order
from crater.scheduler.domain.ledger import Ledger
from crater.scheduler.domain.placement import Selection, select, unplaceable
from crater.scheduler.domain.plugins import Filter
from crater.scheduler.domain.queue import node_mask
from crater.scheduler.domain.quotas import Usage
from crater.scheduler.domain.state import (
    Allocation,
    PendingTask,
    SchedulerState,
    arm_limit,
    hold,
)
from crater.scheduler.domain.wording import for_nodes

# Capacity verdicts remembered at most (distinct demands since the topology last changed).
VERDICTS_KEPT = 1024
# (node row, total score, per-plugin scores)
Ranked = tuple[int, float, list[ScoreDetail]]
# (nodes that pass every filter, why the others do not)
Diagnosis = tuple[BoolArray, list[FilterReason]]
# One member's node, devices, score and per-plugin scores.
Pick = tuple[Node, Selection, float, list[ScoreDetail]]


class RunsFilters(Protocol):
    """Whoever the collaborators run the filters through (`Scheduler.diagnose`)."""

    def diagnose(
        self, demand: Demand, free: bool = True, among: BoolArray | None = None
    ) -> Diagnosis: ...


class Placer:
    """Filters, ranks and picks nodes for a task, and grants them."""

    def __init__(
        self, state: SchedulerState, ledger: Ledger, owner: RunsFilters | None = None
    ) -> None:
        self.state = state
        self.ledger = ledger
        # Every collaborator runs the filters through `diagnose`: `run_filters` itself, or the
        # owner's `diagnose` (the scheduler's, which a caller may wrap) when there is one.
        self.owner = owner
        # The filters' verdicts on capacity alone (free=False) by demand and node subset:
        # they change only with the topology or the configuration, and every arriving task
        # asks them (can it ever fit?). Valid for `_verdicts_for` only.
        self._verdicts: dict[tuple[Demand, bytes | None], Diagnosis] = {}
        self._verdicts_for: tuple[object, object, int] | None = None

    def __getstate__(self) -> dict[str, object]:
        """A snapshot (audit log) leaves the remembered verdicts out: only a cache."""
        return self.__dict__ | {"_verdicts": {}, "_verdicts_for": None}

    def shunned(self, task: PendingTask) -> tuple[str, ...]:
        """The nodes where `task`'s earlier attempts failed, which it leaves alone while some
        other node could hold it (by the filters, free or not): a node it alone fits is
        tried again rather than never."""
        if not task.failed_on:
            return ()
        could, _ = self.diagnose(task.filter_demand, free=False)
        failed = node_mask(self.state.cluster, task.failed_on)
        return task.failed_on if (could & ~failed).any() else ()

    def diagnose(
        self, demand: Demand, free: bool = True, among: BoolArray | None = None
    ) -> Diagnosis:
        """The filters' verdict, through the owner when there is one."""
        if self.owner is None:
            return self.run_filters(demand, free, among)
        return self.owner.diagnose(demand, free, among)

    def walk_filters(
        self, demand: Demand, free: bool = True, among: BoolArray | None = None
    ) -> tuple[BoolArray, list[tuple[Filter, BoolArray, int]]]:
        """Run the pool's filters in order (the framework's run-filters): the nodes that pass
        every one, and each filter that excludes some, with the nodes it is the first to
        exclude and how many. `diagnose` and `dry_run` both read this one walk."""
        cluster = self.state.cluster
        alive = np.ones(len(cluster), np.bool_) if among is None else among.copy()
        living = len(cluster) if among is None else int(np.count_nonzero(alive))
        excluded: list[tuple[Filter, BoolArray, int]] = []
        for f in self.state.config.pipeline_for(demand.pool).filters:
            passes = f.passes(cluster, demand, free)
            if passes is cluster.everywhere:
                continue  # a filter that asks nothing excludes no node: skip the array work
            # Most filters exclude no node still alive: count the survivors (two calls), and
            # build the excluded rows only when there are some.
            kept = alive & passes
            left = int(np.count_nonzero(kept))
            if left < living:
                excluded.append((f, alive & ~passes, living - left))
            alive, living = kept, left
        return alive, excluded

    def run_filters(
        self, demand: Demand, free: bool = True, among: BoolArray | None = None
    ) -> Diagnosis:
        """Run the filters; each node is charged to the first filter that excludes it."""
        if not free:
            return self._capacity_verdict(demand, among)
        return self._run_filters(demand, free, among)

    def _capacity_verdict(self, demand: Demand, among: BoolArray | None) -> Diagnosis:
        """`_run_filters(free=False)`, remembered: without free amounts every filter reads
        only the nodes' hardware, pool, labels and taints, which change with an upsert
        (`topology_version`), and the pipelines, which change with the configuration."""
        cluster = self.state.cluster
        valid = (cluster, self.state.config, cluster.topology_version)
        if self._verdicts_for != valid or len(self._verdicts) >= VERDICTS_KEPT:
            self._verdicts, self._verdicts_for = {}, valid
        try:
            key = (demand, None if among is None else among.tobytes())
            found = self._verdicts.get(key)
        except TypeError:  # a demand that does not hash (never in practice): no memory
            return self._run_filters(demand, False, among)
        if found is None:
            found = self._verdicts[key] = self._run_filters(demand, False, among)
        return found[0].copy(), list(found[1])  # the caller may change its own copy

    def _run_filters(
        self, demand: Demand, free: bool = True, among: BoolArray | None = None
    ) -> Diagnosis:
        alive, excluded = self.walk_filters(demand, free, among)
        reasons = [
            FilterReason(
                filter=f.name, code=f.code, nodes=count, message=explained(f, demand, free)
            )
            for f, _, count in excluded
        ]
        return alive, reasons

    def rank(self, demand: Demand, candidates: BoolArray) -> Iterator[Ranked]:
        """Candidates best first: weighted score, ties to the smallest node name. Lazy: the
        per-plugin details are built only for the nodes a caller looks at (usually one)."""
        idx = np.flatnonzero(candidates)
        if not len(idx):
            return
        self.state.ranked_pools.add(demand.pool)
        cluster = self.state.cluster
        scores = tuple(
            s
            for s in self.state.config.pipeline_for(demand.pool).scores
            if s.applies is None or s.applies(cluster, idx)
        )
        # One row per plugin, clipped in one call (on a few candidates a numpy call costs
        # its call, not its rows); the weighted sum is added up plugin by plugin as ever.
        rows = np.array([s.rate(cluster, demand, idx) for s in scores], np.float64)
        rows = rows.reshape(len(scores), len(idx)).clip(0.0, 1.0)
        total = np.zeros(len(idx))
        for score, values in zip(scores, rows, strict=True):
            total += score.weight * values
        total = np.round(total, 9)  # equal scores must compare equal on every machine
        names = [s.name for s in scores]
        for k in np.lexsort((cluster.name_rank[idx], -total)):
            details = [
                ScoreDetail(plugin=name, score=round(float(v), 4))
                for name, v in zip(names, rows[:, k], strict=True)
            ]
            yield int(idx[k]), float(total[k]), details

    def _card(self, demand: Demand, row: int) -> int | None:
        """The card a share takes on node `row` where the pool's score chooses it."""
        if not demand.gpus or demand.gpu_milli >= WHOLE:
            return None
        pipeline = self.state.config.pipeline_for(demand.pool)
        return pipeline.card_for(self.state.cluster, demand, row)

    def dry_run(self, demand: Demand) -> PlacementAnswer:
        """Every node that fits, best first with its score and devices, and every node that
        does not, with the first filter it fails. Changes nothing."""
        alive, excluded = self.walk_filters(demand)
        misfits: list[NodeMisfit] = []
        for f, out, _ in excluded:
            reason = f.explain(demand)
            for row in np.flatnonzero(out):
                misfits.append(
                    NodeMisfit(
                        node_id=self.state.cluster.nodes[row].name,
                        filter=f.name,
                        code=f.code,
                        reason=reason,
                    )
                )
        fits: list[NodeFit] = []
        for i, score, details in self.rank(demand, alive):
            node = self.state.cluster.nodes[i]
            selection = select(node, demand, self._card(demand, i))
            if selection is None:
                misfits.append(
                    NodeMisfit(
                        node_id=node.name,
                        filter="Placement",
                        code="NoLocalPlacement",
                        reason=unplaceable(demand),
                    )
                )
                continue
            fits.append(
                NodeFit(
                    node_id=node.name,
                    score=round(score, 4),
                    scores=details,
                    gpu_ids=list(selection.gpu_ids),
                    cpu_cores=list(selection.cpu_cores),
                    numa_node=selection.numa_node,
                    mig_profile=selection.mig_profile,
                    disk=selection.disk,
                )
            )
        counts: dict[str, int] = {}
        for m in misfits:
            counts[m.reason] = counts.get(m.reason, 0) + 1
        detail = "; ".join(for_nodes(n, reason) for reason, n in counts.items())
        summary = f"{len(fits)}/{len(self.state.cluster)} nodes fit" + (
            f"; {detail}" if detail else ""
        )
        misfits.sort(key=lambda m: m.node_id)
        return PlacementAnswer(fits=fits, misfits=misfits, summary=summary)

    def try_place(
        self, task: PendingTask, cause: Event, avoid: BoolArray | None = None
    ) -> list[AllocationGranted]:
        """Place the task (every member of a gang, or none), off the `avoid` nodes."""
        if self.state.quotas.blocking(
            task.request.tenant, task.demand, task.gang_size, task.request.user
        ):
            return []
        fits, _ = self.diagnose(task.filter_demand)
        return self.place(task, cause, fits, avoid)

    def place(
        self, task: PendingTask, cause: Event, fits: BoolArray, avoid: BoolArray | None
    ) -> list[AllocationGranted]:
        """`try_place` once the filters have passed `fits` (for `task.filter_demand`)."""
        picks = self.choose(task, fits, avoid)
        return [] if picks is None else self.grant_gang(task, picks, cause)

    def choose(
        self, task: PendingTask, fits: BoolArray, avoid: BoolArray | None
    ) -> list[Pick] | None:
        """Where every member would go (one pick per member), off the `avoid` nodes; None
        when not all of them fit now. Changes nothing: a dry run asks this too. A task whose
        GPU models are ordered takes the first of them that holds all of it (gpu_order.py)."""
        if task.full_demand.gpu_model_order:
            return choose_in_order(
                self.state,
                task,
                fits,
                avoid,
                lambda on, off: self.choose_among(task, on, off),
            )
        return self.choose_among(task, fits, avoid)

    def choose_among(
        self, task: PendingTask, fits: BoolArray, avoid: BoolArray | None
    ) -> list[Pick] | None:
        """`choose` on the nodes `fits` off `avoid`, whatever the task's order of models."""
        candidates = fits if avoid is None else fits & ~avoid
        if task.gang_size == 1:
            held = self.held_for_scarce(task, candidates)
            if held is not None:
                candidates = candidates & ~held
            for i, score, details in self.rank(task.demand, candidates):
                node = self.state.cluster.nodes[i]
                selection = select(node, task.demand, self._card(task.demand, i))
                if selection is not None:
                    return [(node, selection, score, details)]
            return None
        if task.same_node:
            for i, score, details in self.rank(task.filter_demand, candidates):
                node = self.state.cluster.nodes[i]
                picks = self.trial(task, [(node, score, details)] * task.gang_size)
                if picks is not None:
                    return picks
            return None
        topology = task.request.network_topology
        if topology is None:
            picks = self.trial(task, None, avoid)
        else:
            picks = self.within_fabric(task, candidates, avoid, topology.levels)
        return None if picks is None else along_ring(self.state.cluster, picks)

    def held_for_scarce(self, task: PendingTask, candidates: BoolArray) -> BoolArray | None:
        """The nodes among `candidates` kept for scarce work that `task` (one asking no GPU)
        may not take now (`fragmentation.held_for_scarce`), as a mask of the cluster; None:
        none. Only where the pool's pipeline scores fragmentation (its learned workload says
        what is scarce), and not once the task has waited `scarce_hold_max_wait_seconds`:
        a hold for work that may never come does not starve the work that is here."""
        state = self.state
        until = self.hold_ends(task)
        if until is None or (state.clock is not None and state.clock >= until):
            return None
        idx = np.flatnonzero(candidates)
        held = held_for_scarce(state.cluster, task.demand, idx, state.config.scarce_holders_kept)
        if not held.any():
            return None
        mask = np.zeros(len(candidates), np.bool_)
        mask[idx[held]] = True
        return mask

    def hold_ends(self, task: PendingTask) -> datetime | None:
        """Until when `task` may be kept off capacity held for scarce work (`held_for_scarce`);
        None: never (it asks for GPUs, is a gang, the rule is off or its pool's pipeline does
        not score fragmentation)."""
        config, demand = self.state.config, task.demand
        if demand.gpus or config.scarce_holders_kept <= 0 or task.gang_size != 1:
            return None
        if task.submitted_at is None:
            return None
        if not any(s.name == "Fragmentation" for s in config.pipeline_for(demand.pool).scores):
            return None
        return task.submitted_at + timedelta(seconds=config.scarce_hold_max_wait_seconds)

    def within_fabric(
        self,
        task: PendingTask,
        candidates: BoolArray,
        avoid: BoolArray | None,
        levels: tuple[FabricLevel | None, ...],
    ) -> list[Pick] | None:
        """A spread gang within one domain of the tightest of `levels` that holds it now
        (None: anywhere), each level's domains best fit first (fabric.py)."""
        cluster = self.state.cluster
        if not cluster.fabric_nodes and levels[-1] is None:  # no domains: only anywhere
            return self.trial(task, None, avoid)
        for level in levels:
            if level is None:
                return self.trial(task, None, avoid)
            for domain in domains_for(cluster, level, task.demand, candidates, task.gang_size):
                outside = cluster.fabric(level) != domain
                picks = self.trial(task, None, outside if avoid is None else avoid | outside)
                if picks is not None:
                    return picks
        return None

    def trial(
        self,
        task: PendingTask,
        nodes: list[tuple[Node, float, list[ScoreDetail]]] | None,
        avoid: BoolArray | None = None,
    ) -> list[Pick] | None:
        """Choose every member's devices in turn, each on the state the previous ones leave,
        then put the state back: all of the members, or None. `nodes`: one per member (a
        same-node gang); None: each member on the best node left for it."""
        picks: list[Pick] = []
        held: list[tuple[Node, Selection]] = []
        milli = task.demand.gpu_milli or WHOLE
        try:
            for member in range(task.gang_size):
                found: tuple[Node, Selection, float, list[ScoreDetail]] | None = None
                if nodes is not None:
                    node, score, details = nodes[member]
                    selection = select(node, task.demand)
                    found = None if selection is None else (node, selection, score, details)
                else:
                    candidates, _ = self.diagnose(task.demand)
                    if avoid is not None:
                        candidates &= ~avoid
                    for i, score, details in self.rank(task.demand, candidates):
                        selection = select(
                            self.state.cluster.nodes[i], task.demand, self._card(task.demand, i)
                        )
                        if selection is not None:
                            found = (self.state.cluster.nodes[i], selection, score, details)
                            break
                if found is None:
                    return None
                node, selection = found[0], found[1]
                node.take(
                    selection.gpu_ids,
                    milli,
                    selection.cpu_cores,
                    task.demand.memory_mb,
                    None,
                    selection.mig_profile,
                    selection.disk_hold(task.demand),
                )
                self.state.cluster.refresh(node.name)
                held.append((node, selection))
                picks.append(found)
            return picks
        finally:
            for node, selection in reversed(held):
                node.give_back(
                    selection.gpu_ids,
                    milli,
                    selection.cpu_cores,
                    task.demand.memory_mb,
                    None,
                    selection.mig_profile,
                    selection.disk_hold(task.demand),
                )
                self.state.cluster.refresh(node.name)

    def grant_gang(
        self,
        task: PendingTask,
        picks: list[Pick],
        cause: Event,
    ) -> list[AllocationGranted]:
        return [
            self.grant(task, node, selection, score, details, cause, member)
            for member, (node, selection, score, details) in enumerate(picks)
        ]

    def grant(
        self,
        task: PendingTask,
        node: Node,
        selection: Selection,
        score: float,
        details: list[ScoreDetail],
        cause: Event,
        member: int = 0,
        lent_by: str | None = None,
    ) -> AllocationGranted:
        """`task` (its member `member`) on `selection` of `node`. `lent_by`: on a card that
        task lends during its CPU phase (phases.py), which keeps holding it."""
        request = task.request
        suffix = (f":{member}" if member else "") + attempt_key(task.attempt)
        event_id = derived_event_id(cause.event_id, f"granted:{request.task_id}{suffix}")
        allocation_id = f"alloc-{event_id.hex[:16]}"
        now = self.state.clock or cause.occurred_at
        expires = now + self.state.config.reservation_for(request)
        allocation = Allocation(
            allocation_id,
            request.task_id,
            node.name,
            selection.gpu_ids,
            selection.cpu_cores,
            task.demand.memory_mb,
            expires,
            tenant=request.tenant,
            usage=Usage.of(task.demand),
            user=request.user,
            priority=task.priority,
            preemptible=request.preemptible,
            granted_seq=task.seq,
            group=request.anti_affinity.group,
            gpu_milli=task.demand.gpu_milli or WHOLE,
            pool=request.pool,
            gang_index=member,
            mig_profile=selection.mig_profile,
            armed=False,  # until the grant is read back from the stream
            attempt=task.attempt,
            task=task,
            lent_by=lent_by,
            granted_at=cause.occurred_at,  # as the grant says, and the tables keep
            disk=selection.disk,
            disk_gb=task.demand.disk_gb if selection.disk is not None else 0,
            run_limit=self.state.config.run_limit_for(request),
        )
        if lent_by is not None:
            allocation.gpu_milli = 0  # the card stays its lender's hold
        self.ledger.take(allocation)
        hold(node, allocation)
        self.state.cluster.refresh(node.name)
        if member:
            self.state.allocations[request.task_id].peers.append(allocation)
        else:
            self.state.allocations[request.task_id] = allocation
            self.ledger.count_preemptible(allocation, +1)
            arm_limit(self.state, allocation)
        return granted(
            self.state, task, node, selection, allocation, score, details, cause, event_id
        )


def explained(f: Filter, demand: Demand, free: bool = True) -> str:
    """Why `f` excludes a node, written for one node (`has fewer than 2 free GPUs`); judged
    on the node's capacity (free=False: can it ever fit), the same without `free`."""
    message = f.explain(demand)
    if free:
        return message
    return " ".join(word for word in message.split(" ") if word != "free")
