"""Reconciling against reality: a periodic full check that the core's ledger matches itself
and what the nodes report running, fixing and saying what it finds (issue 27, item 7).

Every `reconcile_interval_seconds` of event time (the core's clock, so a replay reconciles at
the same points and decides the same) the pass:

- releases an allocation that its node's agent has not reported running for
  `reconcile_grace_seconds`, measured on the node's own inventories (orphaned: its attempt
  fails, and its restart policy applies);
- blocks the cards of an allocation a node has reported running for the grace that the core
  does not hold there (unknown: nothing is placed on them until it goes), and of a card the
  core holds free that the node reports processes on (NVML), and frees them when it is gone;
- reports a node whose allocations add up past what it offers (over capacity: no task is
  stopped for it);
- recomputes each node's free figures, and what each tenant and pool holds, from the
  allocations, and sets the running figures to them where they differ (ledger mismatch).

Each finding is one `allocation.drift` event saying what was found and what was done. Normal
lag is left alone: a reservation not yet confirmed has its own expiry; an allocation a launcher
confirmed with the token is judged by its heartbeats; one yielding has its deadline; a node
that is NotReady has the lost-node grace; and the grace outlasts the moments when a report of
the node's and one of the task's are in flight in different streams.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from crater.contracts import (
    AllocationDriftFound,
    DriftAction,
    DriftKind,
    Event,
    GpuProcess,
    NodeCondition,
    NodeHealthReported,
    ReleaseReason,
    derived_event_id,
)
from crater.scheduler.domain.cluster import Node
from crater.scheduler.domain.lifecycle import Lifecycle
from crater.scheduler.domain.queue import QueueKey
from crater.scheduler.domain.quotas import Usage
from crater.scheduler.domain.state import (
    Allocation,
    Inventory,
    SchedulerState,
    UnknownKey,
    UnknownRun,
    consumed_until,
    hold,
)

# A node's running figures, each recomputed from its allocations by a fresh `Node`.
NODE_FIGURES = (
    "gpu_milli_free",
    "blocked",
    "cpu_held",
    "cpu_taken",
    "cpu_cores_full",
    "numa_room",
    "memory_free_mb",
    "groups",
    "mig_used",
    "disk_free_gb",
)
# Fractions of a GPU are summed in floats: differences below this are rounding, not drift.
GPU_TOLERANCE = 1e-6


class Reconciler:
    """Keeps each node's latest inventory and runs the periodic pass."""

    def __init__(self, state: SchedulerState, lifecycle: Lifecycle) -> None:
        self.state = state
        self.lifecycle = lifecycle

    # -- input -------------------------------------------------------------------------------

    def on_health(self, event: NodeHealthReported) -> None:
        """Keep the node's latest inventory; a heartbeat without one says its agent keeps
        none (any more): the node is not reconciled against reports."""
        if self.state.cluster.get(event.node_id) is None:
            return
        if event.running is None and event.gpu_processes is None:
            self.state.inventories.pop(event.node_id, None)
            return
        known = self.state.inventories.get(event.node_id)
        if known is not None and known.at > event.occurred_at:
            return  # an older report, delivered late: the newer one stands
        running = None
        if event.running is not None:
            running = {r.allocation_id: r for r in event.running}
        processes: dict[int, tuple[GpuProcess, ...]] | None = None
        if event.gpu_processes is not None:
            processes = {}
            for process in event.gpu_processes:
                processes[process.gpu] = (*processes.get(process.gpu, ()), process)
        self.state.inventories[event.node_id] = Inventory(event.occurred_at, running, processes)

    # -- the pass ----------------------------------------------------------------------------

    def run(self, now: datetime, cause: Event) -> tuple[list[Event], bool]:
        """The pass, when it is due on the core's clock: its decisions, and whether what is
        free changed (waiting tasks are retried then)."""
        interval = self.state.config.reconcile_interval_seconds
        if interval <= 0:
            return [], False
        due = self.state.reconcile_at
        if due is not None and now < due:
            return [], False
        self.state.reconcile_at = now + timedelta(seconds=interval)
        if due is None:
            return [], False  # the first event (or the first after a restart) starts the clock
        return self.reconcile(cause)

    def reconcile(self, cause: Event) -> tuple[list[Event], bool]:
        """One full check, now; its decisions and whether what is free changed."""
        decisions = self._orphans(cause)
        changed = bool(decisions)
        found, moved = self._unknown(cause)
        decisions += found
        changed = changed or moved
        members = self._members_by_node()
        for node in sorted(self.state.cluster.nodes, key=lambda n: n.name):
            found, moved = self._node_ledger(node, members.get(node.name, []), cause)
            decisions += found
            changed = changed or moved
        decisions += self._usage(cause)
        for event in decisions:
            if isinstance(event, AllocationDriftFound):
                self.state.tally[f"drift:{event.kind.value}:{event.action.value}"] += 1
        return decisions, changed

    # -- (a) orphaned allocations ------------------------------------------------------------

    def _orphans(self, cause: Event) -> list[Event]:
        grace = self.state.config.reconcile_grace_seconds
        missing = self.state.missing_since
        # The task reports consumed so far: an end reported before the node dropped the
        # allocation must have been taken first (its stream may lag the heartbeats').
        now = self.state.clock or cause.occurred_at
        reports_in = consumed_until(
            self.state.reports_clock, now, self.state.config.confirmation_lag_seconds
        )
        judged: set[str] = set()
        orphaned: dict[str, tuple[Allocation, datetime, datetime]] = {}
        if not self.state.inventories:
            missing.clear()  # no node reports what it runs: nothing to judge
            return []
        for head in self.state.allocations.values():
            for member in head.members():
                inventory = self._trusted(member.node)
                if inventory is None or inventory.running is None:
                    continue  # no agent's inventory: processes alone cannot name allocations
                if not _accountable(head, member):
                    continue
                judged.add(member.allocation_id)
                if member.allocation_id in inventory.running:
                    missing.pop(member.allocation_id, None)
                    continue
                since = missing.setdefault(member.allocation_id, inventory.at)
                if (inventory.at - since).total_seconds() >= grace and reports_in >= since:
                    orphaned.setdefault(head.task_id, (member, since, inventory.at))
        for allocation_id in [a for a in missing if a not in judged]:
            del missing[allocation_id]  # released, or no longer judged (its node NotReady)
        decisions: list[Event] = []
        for task_id in sorted(orphaned):
            member, since, seen = orphaned[task_id]
            head = self.state.allocations[task_id]
            silent = (seen - since).total_seconds()
            decisions.append(
                self._drift(
                    cause,
                    DriftKind.ORPHANED_ALLOCATION,
                    DriftAction.RELEASED,
                    member.node,
                    reason=f"allocation {member.allocation_id} of task {task_id} is held on "
                    f"{member.node}, whose agent has not reported it running for {silent:g} s "
                    f"(since {since.isoformat()}; grace {grace:g} s): released, its attempt "
                    "failed",
                    allocation=member,
                )
            )
            why = (
                f"its node {member.node} stopped running it: not in the node's reports for "
                f"{silent:g} s (orphaned allocation {member.allocation_id})"
            )
            decisions += self.lifecycle.attempt_over(head, ReleaseReason.FAILED, cause, why=why)
            for gone in head.members():
                missing.pop(gone.allocation_id, None)
        return decisions

    # -- (b) allocations the core does not hold ----------------------------------------------

    def _unknown(self, cause: Event) -> tuple[list[Event], bool]:
        grace = self.state.config.reconcile_grace_seconds
        held = {m.allocation_id: m for h in self.state.allocations.values() for m in h.members()}
        decisions: list[Event] = []
        changed = False
        for name in sorted({*self.state.inventories, *self.state.unknown}):
            node = self.state.cluster.get(name)
            runs = self.state.unknown.setdefault(name, {})
            inventory = self._trusted(name)
            if node is not None and inventory is None and name in self.state.inventories:
                continue  # NotReady: the lost-node grace decides; what was seen stays
            # What the node reports now that the core does not hold there (none: its agent
            # reports nothing any more, or the node is gone).
            seen_now: dict[UnknownKey, tuple[str, tuple[int, ...], str]] = {}
            if node is not None and inventory is not None:
                seen_now = self._sightings(name, inventory, held)
                for key, (task_id, gpu_ids, what) in sorted(seen_now.items()):
                    run = runs.setdefault(key, UnknownRun(task_id, gpu_ids, inventory.at, what))
                    run.what = what
                    seen = (inventory.at - run.first_seen).total_seconds()
                    if run.reported or seen < grace:
                        continue
                    run.reported = True
                    run.held = tuple(
                        g
                        for g in run.gpu_ids
                        if g < len(node.gpu_milli_free) and g not in node.blocked
                    )
                    for gpu in run.held:
                        node.block(gpu)
                    if run.held:
                        self.state.cluster.refresh(name)
                        self.state.stale_pools = None
                        changed = True
                    decisions.append(self._held(cause, name, key, run, seen, grace))
            for key in sorted(k for k in runs if k not in seen_now):
                run = runs.pop(key)
                if not run.reported:
                    continue  # gone within the grace: ordinary lag
                if node is not None:
                    self._free(node, run, runs)
                    changed = changed or bool(run.held)
                decisions.append(self._gone(cause, name, key, run))
            if not runs:
                del self.state.unknown[name]
        return decisions, changed

    def _sightings(
        self, name: str, inventory: Inventory, held: dict[str, Allocation]
    ) -> dict[UnknownKey, tuple[str, tuple[int, ...], str]]:
        """What `name` reports running that the core does not hold there, by key: each
        allocation, and each card the core holds free that processes hold memory on."""
        found: dict[UnknownKey, tuple[str, tuple[int, ...], str]] = {}
        explained = {g for m in held.values() if m.node == name for g in m.gpu_ids}
        for allocation_id, entry in (inventory.running or {}).items():
            explained.update(entry.gpu_ids)
            member = held.get(allocation_id)
            if member is None or member.node != name:
                what = f"allocation {allocation_id} of task {entry.task_id}"
                found[("allocation", allocation_id)] = (entry.task_id, tuple(entry.gpu_ids), what)
        for card, processes in sorted((inventory.processes or {}).items()):
            if card in explained:
                continue  # held here (or run by the agent): whose process it is is not asked
            pids = ", ".join(
                f"{p.pid} ({p.memory_mb} MiB)" if p.memory_mb else str(p.pid)
                for p in sorted(processes, key=lambda p: p.pid)
            )
            what = f"process{'es' if len(processes) > 1 else ''} {pids} on GPU {card}"
            found[("process", str(card))] = ("", (card,), what)
        return found

    def _held(
        self,
        cause: Event,
        node: str,
        key: UnknownKey,
        run: UnknownRun,
        seen: float,
        grace: float,
    ) -> AllocationDriftFound:
        kind, allocation_id = key
        if kind == "process":
            what = (
                f"{node} has reported {run.what} for {seen:g} s (grace {grace:g} s), a card the "
                "scheduler holds free"
            )
        else:
            what = (
                f"{node} has run {run.what} for {seen:g} s (grace {grace:g} s), which the "
                "scheduler does not hold there"
            )
        if run.held:
            reason = f"{what}: GPUs {_cards(run.held)} count busy until it goes"
        elif run.gpu_ids:
            reason = f"{what}: its GPUs {_cards(run.gpu_ids)} are blocked already or not the node's"
        else:
            reason = f"{what}: it names no GPUs, nothing is blocked"
        return self._drift(
            cause,
            DriftKind.UNKNOWN_PROCESS if kind == "process" else DriftKind.UNKNOWN_ALLOCATION,
            DriftAction.HELD if run.held else DriftAction.REPORTED,
            node,
            reason=reason,
            allocation_id=None if kind == "process" else allocation_id,
            task_id=run.task_id or None,
            gpu_ids=run.held or run.gpu_ids,
        )

    def _gone(
        self, cause: Event, node: str, key: UnknownKey, run: UnknownRun
    ) -> AllocationDriftFound:
        kind, allocation_id = key
        ran = "ran on a card it held free" if kind == "process" else "ran without being held there"
        return self._drift(
            cause,
            DriftKind.UNKNOWN_PROCESS if kind == "process" else DriftKind.UNKNOWN_ALLOCATION,
            DriftAction.FREED,
            node,
            reason=f"{run.what}, which {node} {ran}, is gone"
            + (f": GPUs {_cards(run.held)} are free again" if run.held else ""),
            allocation_id=None if kind == "process" else allocation_id,
            task_id=run.task_id or None,
            gpu_ids=run.held,
        )

    def _free(self, node: Node, run: UnknownRun, others: dict[UnknownKey, UnknownRun]) -> None:
        """`run`'s cards go back, except those another unknown allocation still runs on."""
        for gpu in run.held:
            heir = next(
                (
                    o
                    for o in others.values()
                    if o.reported and gpu in o.gpu_ids and gpu not in o.held
                ),
                None,
            )
            if heir is not None:
                heir.held = (*heir.held, gpu)
            else:
                node.unblock(gpu)
        if run.held:
            self.state.cluster.refresh(node.name)
            self.state.stale_pools = None

    # -- (c) over capacity and (d) the node's figures ----------------------------------------

    def _node_ledger(
        self, node: Node, members: list[Allocation], cause: Event
    ) -> tuple[list[Event], bool]:
        fresh = node.emptied()
        for member in members:
            hold(fresh, member)
        decisions: list[Event] = []
        over = over_capacity(fresh, members)
        if over and self.state.over_reported.get(node.name) != over:
            self.state.over_reported[node.name] = over
            decisions.append(
                self._drift(
                    cause,
                    DriftKind.OVER_CAPACITY,
                    DriftAction.REPORTED,
                    node.name,
                    reason=f"{node.name} is held past what it offers: {over}; reported, no "
                    "task is stopped for it (a task that ends gives the room back)",
                )
            )
        elif not over:
            self.state.over_reported.pop(node.name, None)
        for gpu in sorted(node.blocked):
            fresh.block(gpu)
        differences = figure_differences(node, fresh)
        if not differences:
            return decisions, False
        for figure in NODE_FIGURES:
            setattr(node, figure, getattr(fresh, figure))
        self.state.cluster.refresh(node.name)
        self.state.stale_pools = None
        decisions.append(
            self._drift(
                cause,
                DriftKind.LEDGER_MISMATCH,
                DriftAction.CORRECTED,
                node.name,
                reason=f"what is free on {node.name} differed from its {len(members)} "
                f"allocations' sum: {'; '.join(differences)}; set to the sum",
            )
        )
        return decisions, True

    # -- (d) what tenants and pools hold -----------------------------------------------------

    def _usage(self, cause: Event) -> list[Event]:
        tenants: dict[str, Usage] = {}
        pools: dict[QueueKey, Usage] = {}
        for head in self.state.allocations.values():
            for member in head.members():
                tenants[member.tenant] = tenants.get(member.tenant, Usage()) + member.usage
                key = (member.pool, member.tenant)
                pools[key] = pools.get(key, Usage()) + member.usage
        used = self.state.quotas.used
        usage = self.state.pool_usage
        differences: list[str] = []
        for tenant in sorted({*used, *tenants}):
            running, summed = used.get(tenant, Usage()), tenants.get(tenant, Usage())
            if not same_usage(running, summed):
                differences.append(
                    f"tenant {tenant} holds {describe(running)}, its allocations {describe(summed)}"
                )
                used[tenant] = summed
        for key in sorted({*usage, *pools}):
            running, summed = usage.get(key, Usage()), pools.get(key, Usage())
            if not same_usage(running, summed):
                pool, tenant = key
                differences.append(
                    f"tenant {tenant} in pool {pool} holds {describe(running)}, its "
                    f"allocations {describe(summed)}"
                )
                usage[key] = summed
        if not differences:
            return []
        self.state.stale_pools = None  # (each cached share is checked against the holdings)
        return [
            self._drift(
                cause,
                DriftKind.LEDGER_MISMATCH,
                DriftAction.CORRECTED,
                None,
                reason="what tenants hold differed from their allocations' sum: "
                + "; ".join(differences)
                + "; set to the sum",
            )
        ]

    # -- helpers -----------------------------------------------------------------------------

    def _trusted(self, name: str) -> Inventory | None:
        """The node's latest inventory, while the node is heard (a NotReady node is the
        lost-node grace's to judge)."""
        inventory = self.state.inventories.get(name)
        node = self.state.cluster.get(name)
        if inventory is None or node is None or node.condition is NodeCondition.NOT_READY:
            return None
        return inventory

    def _members_by_node(self) -> dict[str, list[Allocation]]:
        members: dict[str, list[Allocation]] = {}
        for head in self.state.allocations.values():
            for member in head.members():
                members.setdefault(member.node, []).append(member)
        for held in members.values():
            held.sort(key=lambda m: m.allocation_id)
        return members

    def _drift(
        self,
        cause: Event,
        kind: DriftKind,
        action: DriftAction,
        node: str | None,
        *,
        reason: str,
        allocation: Allocation | None = None,
        allocation_id: str | None = None,
        task_id: str | None = None,
        gpu_ids: tuple[int, ...] = (),
    ) -> AllocationDriftFound:
        if allocation is not None:
            allocation_id, task_id = allocation.allocation_id, allocation.task_id
            gpu_ids = allocation.gpu_ids
        return AllocationDriftFound(
            event_id=derived_event_id(
                cause.event_id, f"drift:{kind.value}:{node or ''}:{allocation_id or ''}"
            ),
            occurred_at=cause.occurred_at,
            node=node,
            kind=kind,
            action=action,
            allocation_id=allocation_id,
            task_id=task_id,
            gpu_ids=list(gpu_ids),
            reason=reason,
        )


def _accountable(head: Allocation, member: Allocation) -> bool:
    """Whether the node's inventory speaks for `member`: confirmed by its node (not by a
    launcher's token: its heartbeats decide), and not yielding (its deadline decides)."""
    return (
        member.running
        and member.heartbeat_grace is None
        and member.yield_by is None
        and head.yield_by is None
    )


def _cards(gpus: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(g) for g in gpus)


def over_capacity(node: Node, members: list[Allocation]) -> str:
    """What `node` (its figures computed from `members`) is held past its hardware and
    promises, in words; empty: nothing."""
    problems: list[str] = []
    cards = len(node.gpu_milli_free)
    for member in members:
        gone = [g for g in member.gpu_ids if g >= cards]
        if gone:
            problems.append(
                f"allocation {member.allocation_id} holds GPUs {_cards(gone)}, which the node "
                f"no longer reports ({cards} cards)"
            )
    for gpu, free in enumerate(node.gpu_milli_free):
        if free < 0:
            problems.append(f"GPU {gpu} is promised {-free} thousandths past its capacity")
    if node.cpu_taken > node.cpu_capacity:
        problems.append(f"{node.cpu_taken} core-slots are held of {node.cpu_capacity}")
    crowded = (
        sorted(c for c, n in node.cpu_held.items() if n > node.cpu_holders_max)
        if node.cpu_taken
        else []
    )
    if crowded:
        problems.append(
            f"cores {_cards(crowded)} are held by more than {node.cpu_holders_max} task(s)"
        )
    if node.memory_free_mb < 0:
        problems.append(
            f"memory is promised {-node.memory_free_mb} MiB past its {node.memory_capacity_mb} MiB"
        )
    for disk, free in sorted(node.disk_free_gb.items()):
        if free < 0:
            problems.append(f"disk {disk} is promised {-free} GB past its space")
    return "; ".join(problems)


def figure_differences(node: Node, fresh: Node) -> list[str]:
    """Where `node`'s running figures differ from `fresh`'s (recomputed), in words."""
    found: list[str] = []
    cards = zip(node.gpu_milli_free, fresh.gpu_milli_free, strict=True)
    for gpu, (free, recomputed) in enumerate(cards):
        if free != recomputed:
            found.append(f"GPU {gpu} {free} thousandths free, recomputed {recomputed}")
    for figure in NODE_FIGURES[1:]:
        now: object = getattr(node, figure)
        then: object = getattr(fresh, figure)
        if figure == "cpu_held":  # a core no task holds counts the same listed at 0 or not
            now = {core: n for core, n in node.cpu_held.items() if n}
            then = {core: n for core, n in fresh.cpu_held.items() if n}
        if now != then:
            found.append(f"{figure} {now}, recomputed {then}")
    return found


def same_usage(a: Usage, b: Usage) -> bool:
    return (
        abs(a.gpus - b.gpus) < GPU_TOLERANCE
        and a.gpu_memory_mb == b.gpu_memory_mb
        and a.cpu_cores == b.cpu_cores
        and a.memory_mb == b.memory_mb
        and a.disk_gb == b.disk_gb
    )


def describe(usage: Usage) -> str:
    return (
        f"{usage.gpus:g} GPUs, {usage.gpu_memory_mb} MiB GPU memory, {usage.cpu_cores} cores, "
        f"{usage.memory_mb} MiB memory, {usage.disk_gb} GB disk"
    )
