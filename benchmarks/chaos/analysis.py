"""What a chaos run did to the truth AllData was told: pure functions over what was recorded.

Inputs are plain records read back after the run: the allocation stream in stream order, the
node's status reports and the scheduler's task ends from the task stream, the webhooks in the
order the receiver got them (first delivery of each webhook id), and the chaos actions. Nothing
here talks to a service, so the figures can be recomputed from a run's saved records, and the
rules are testable on their own.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "rejected"})
# The order AllData expects within one attempt: pending* -> scheduled -> running ->
# preempted? -> terminal. Equal ranks may repeat (a gang's members each get `scheduled`).
RANK = {"pending": 0, "scheduled": 1, "running": 2, "preempted": 3}
TERMINAL_RANK = 4
RANK_NAMES = {0: "pending", 1: "scheduled", 2: "running", 3: "preempted", 4: "terminal"}
# Release reasons that fail a task without the node having said so.
UNCONFIRMED_REASONS = frozenset({"expired", "node-lost", "node_lost"})
PENDING_TARGET = 3
MIG_COMPUTE_SLICES = 7  # A100 / H100; a card's own profiles say otherwise when known
_MIG = re.compile(r"^(\d+)g\.(\d+)gb$")
EXAMPLES = 10


@dataclass(frozen=True)
class Grant:
    seq: int
    ts: float  # the stream's storage time, seconds since the epoch
    allocation_id: str
    task_id: str
    node: str
    gpu_ids: tuple[int, ...]
    gpu_milli: int = 1000
    mig_profile: str | None = None
    attempt: int = 1


@dataclass(frozen=True)
class Release:
    seq: int
    ts: float
    allocation_id: str
    task_id: str
    node: str
    reason: str


@dataclass(frozen=True)
class StatusReport:
    """A node's (or the gateway's cancel) task.status report."""

    seq: int
    ts: float
    task_id: str
    allocation_id: str | None
    status: str


@dataclass(frozen=True)
class TaskEnd:
    """The scheduler's task.ended (one per task, once the fix lands)."""

    seq: int
    ts: float
    task_id: str
    status: str
    allocation_id: str | None
    release_reason: str | None


@dataclass(frozen=True)
class Webhook:
    webhook_id: str
    received_at: float
    task_id: str
    status: str
    attempt: int | None  # None: the webhook did not say (a node's report carries none)
    duplicate_submission: bool
    release_reason: str | None


@dataclass(frozen=True)
class Action:
    """One chaos action as it happened: a kill (and restart), a nats-server restart, or a
    node going silent."""

    kind: str  # kill | nats-restart | silent
    target: str  # the service, "nats-server", or the node
    planned_at: float  # seconds after the run's start (t0)
    started_at: float  # wall time (epoch seconds) it took effect
    restart_seconds: float | None = None  # kill / nats-restart: down until healthy again
    for_seconds: float | None = None  # silent: how long
    error: str | None = None  # the restart failed: why


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(len(ordered) * q / 100))
    return ordered[min(rank, len(ordered)) - 1]


# -- GPUs double-booked -----------------------------------------------------------------------


def _share(grant: Grant, slices: int) -> Fraction:
    """The share of one card a grant holds: a MIG slice's compute slices, else its milli."""
    if grant.mig_profile:
        match = _MIG.match(grant.mig_profile)
        compute = int(match.group(1)) if match else slices
        return Fraction(compute, slices)
    return Fraction(grant.gpu_milli, 1000)


def replay_allocations(
    grants_and_releases: Iterable[Grant | Release],
    mig_slices: dict[tuple[str, int], int] | None = None,
) -> dict[str, Any]:
    """Replay the allocation stream in order and count every moment a GPU is over-committed:
    the shares held on one card (whole cards, gpu_milli shares, MIG compute slices) add up to
    more than the card. A MIG slice holds only its card (`gpu_ids[0]`)."""
    slices = mig_slices or {}
    held: dict[str, Grant] = {}
    load: dict[tuple[str, int], Fraction] = defaultdict(Fraction)
    holders: dict[tuple[str, int], set[str]] = defaultdict(set)
    events = 0
    over_gpus: set[tuple[str, int]] = set()
    examples: list[dict[str, Any]] = []
    repeated_grants = unknown_releases = 0
    peak = granted = 0
    seen: set[str] = set()
    for record in grants_and_releases:
        if isinstance(record, Grant):
            if record.allocation_id in seen:
                repeated_grants += 1  # a redelivered grant: the same allocation, not a new one
                continue
            seen.add(record.allocation_id)
            granted += 1
            held[record.allocation_id] = record
            cards = record.gpu_ids[:1] if record.mig_profile else record.gpu_ids
            for gpu in cards:
                key = (record.node, gpu)
                load[key] += _share(record, slices.get(key, MIG_COMPUTE_SLICES))
                holders[key].add(record.allocation_id)
                if load[key] > 1:
                    events += 1
                    over_gpus.add(key)
                    if len(examples) < EXAMPLES:
                        examples.append(
                            {
                                "seq": record.seq,
                                "node": record.node,
                                "gpu": gpu,
                                "committed": float(load[key]),
                                "allocations": sorted(
                                    f"{held[a].task_id}/{a}" for a in holders[key]
                                ),
                            }
                        )
            peak = max(peak, len(held))
        else:
            grant = held.pop(record.allocation_id, None)
            if grant is None:
                unknown_releases += 1
                continue
            slices_of = grant.gpu_ids[:1] if grant.mig_profile else grant.gpu_ids
            for gpu in slices_of:
                key = (grant.node, gpu)
                load[key] -= _share(grant, slices.get(key, MIG_COMPUTE_SLICES))
                holders[key].discard(grant.allocation_id)
    return {
        "double_booked_events": events,
        "double_booked_gpus": len(over_gpus),
        "examples": examples,
        "grants": granted,
        "repeated_grants": repeated_grants,
        "releases_of_unknown_allocations": unknown_releases,
        "held_at_end": len(held),
        "peak_allocations": peak,
    }


def active_allocations(records: Iterable[Grant | Release]) -> list[tuple[float, int]]:
    """(time, allocations held) after each grant or release, for the plot."""
    held: set[str] = set()
    series: list[tuple[float, int]] = []
    for record in records:
        if isinstance(record, Grant):
            held.add(record.allocation_id)
        else:
            held.discard(record.allocation_id)
        series.append((record.ts, len(held)))
    return series


# -- webhooks at the receiver -----------------------------------------------------------------


def is_terminal(webhook: Webhook) -> bool:
    return webhook.status in TERMINAL and not webhook.duplicate_submission


def by_task(webhooks: Iterable[Webhook]) -> dict[str, list[Webhook]]:
    tasks: dict[str, list[Webhook]] = defaultdict(list)
    for webhook in webhooks:
        tasks[webhook.task_id].append(webhook)
    return tasks


def order_violations(webhooks: Sequence[Webhook]) -> list[str]:
    """What arrived out of AllData's lifecycle order for one task, in arrival order: a status
    ranked below one already received in the same attempt, an older attempt after a newer
    one, or anything after a terminal. Refusals of a duplicate submission are left out: they
    are about the refused request, not the task."""
    found: list[str] = []
    attempt, rank, ended = 1, -1, False
    for webhook in webhooks:
        if webhook.duplicate_submission:
            continue
        if ended:
            found.append(f"{webhook.status} after terminal")
            continue
        if webhook.attempt is None and attempt > 1:
            # AllData cannot tell a late report of an earlier attempt from this one's.
            found.append(f"{webhook.status} without attempt during attempt {attempt}")
            continue
        said = attempt if webhook.attempt is None else webhook.attempt
        if said < attempt:
            found.append(f"attempt {said} after attempt {attempt}")
            continue
        if said > attempt:
            attempt, rank = said, -1
        mine = RANK.get(webhook.status, TERMINAL_RANK)
        if mine < rank:
            found.append(f"{webhook.status} after {RANK_NAMES[rank]}")
        else:
            rank = mine
        ended = mine == TERMINAL_RANK
    return found


def skipped_stages(webhooks: Sequence[Webhook]) -> list[str]:
    """Stages AllData never heard of before a later one (informative, not an order fault):
    `running` or `succeeded` with no `scheduled` before it in the attempt."""
    missing: list[str] = []
    attempt, seen = 1, set[str]()
    for webhook in webhooks:
        if webhook.duplicate_submission:
            continue
        if webhook.attempt is not None and webhook.attempt != attempt:
            attempt, seen = webhook.attempt, set()
        if webhook.status in ("running", "succeeded") and "scheduled" not in seen:
            missing.append(f"{webhook.status} without scheduled")
        seen.add(webhook.status)
    return missing


def attempts_of(webhooks: Sequence[Webhook]) -> list[int]:
    """Each webhook's attempt; one that does not say belongs to the latest one said."""
    latest, found = 1, []
    for webhook in webhooks:
        if webhook.attempt is not None and not webhook.duplicate_submission:
            latest = webhook.attempt
        found.append(latest if webhook.attempt is None else webhook.attempt)
    return found


def webhook_report(
    accepted: Iterable[str], webhooks: Sequence[Webhook], receiver_duplicates: int | None
) -> dict[str, Any]:
    """Final states, lost tasks, terminals per task, lifecycle order, pending counts and
    duplicates, over the tasks the gateway accepted."""
    tasks = by_task(webhooks)
    accepted_ids = list(dict.fromkeys(accepted))
    final: Counter[str] = Counter()
    lost: list[str] = []
    lost_last: Counter[str] = Counter()  # what a lost task was told last: where it stopped
    terminals_per_task: Counter[int] = Counter()
    more_than_one: list[dict[str, Any]] = []
    conflicting = 0
    out_of_order: list[dict[str, Any]] = []
    violation_kinds: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    pending_counts: list[int] = []
    over_pending: list[tuple[str, int]] = []
    distinct_id_duplicates: Counter[str] = Counter()
    for task_id in accepted_ids:
        received = tasks.get(task_id, [])
        terminals = [w for w in received if is_terminal(w)]
        terminals_per_task[len(terminals)] += 1
        if not terminals:
            lost.append(task_id)
            lost_last[received[-1].status if received else "nothing"] += 1
        else:
            final[terminals[0].status] += 1
        if len(terminals) > 1:
            statuses = [w.status for w in terminals]
            conflicting += len(set(statuses)) > 1
            if len(more_than_one) < EXAMPLES:
                more_than_one.append({"task_id": task_id, "terminals": statuses})
        violations = order_violations(received)
        if violations:
            violation_kinds.update(set(violations))
            if len(out_of_order) < EXAMPLES:
                out_of_order.append(
                    {
                        "task_id": task_id,
                        "violations": violations,
                        "received": [f"{w.status}#{w.attempt or '-'}" for w in received],
                    }
                )
        skipped.update(set(skipped_stages(received)))
        pending = sum(1 for w in received if w.status == "pending")
        pending_counts.append(pending)
        if pending > PENDING_TARGET:
            over_pending.append((task_id, pending))
        same: Counter[tuple[str, int]] = Counter(
            (w.status, attempt)
            for w, attempt in zip(received, attempts_of(received), strict=True)
            if w.status != "pending" and not w.duplicate_submission
        )
        for (status, _), count in same.items():
            if count > 1:
                distinct_id_duplicates[status] += count - 1
    tasks_out_of_order = sum(1 for t in accepted_ids if order_violations(tasks.get(t, [])))
    over_pending.sort(key=lambda item: -item[1])
    unknown = sorted(set(tasks) - set(accepted_ids))
    return {
        "accepted": len(accepted_ids),
        "final_states": dict(final),
        "ended": sum(final.values()),
        "lost": len(lost),
        "lost_by_last_status": dict(lost_last.most_common()),
        "lost_examples": [
            {"task_id": t, "received": [w.status for w in tasks.get(t, [])]}
            for t in lost[:EXAMPLES]
        ],
        "terminal_webhooks_per_task": {str(k): v for k, v in sorted(terminals_per_task.items())},
        "tasks_with_more_than_one_terminal": sum(v for k, v in terminals_per_task.items() if k > 1),
        "tasks_with_conflicting_terminals": conflicting,
        "more_than_one_terminal_examples": more_than_one,
        "out_of_order_tasks": tasks_out_of_order,
        "out_of_order_kinds": dict(violation_kinds.most_common()),
        "out_of_order_examples": out_of_order,
        "skipped_stages": dict(skipped.most_common()),
        "pending_per_task": {
            "max": max(pending_counts, default=0),
            "p99": percentile(pending_counts, 99) if pending_counts else 0,
            "mean": round(sum(pending_counts) / len(pending_counts), 3) if pending_counts else 0,
            "total": sum(pending_counts),
            "tasks_over_target": len(over_pending),
            "target": PENDING_TARGET,
            "worst": [{"task_id": t, "pending": n} for t, n in over_pending[:EXAMPLES]],
        },
        "duplicate_deliveries_same_id": receiver_duplicates,
        "duplicates_distinct_ids": dict(distinct_id_duplicates),
        "webhooks_received": len(webhooks),
        "webhooks_for_tasks_not_accepted": sum(len(tasks[t]) for t in unknown),
        "duplicate_submission_refusals": sum(1 for w in webhooks if w.duplicate_submission),
    }


# -- false failures ---------------------------------------------------------------------------


def false_failures(
    webhooks: Sequence[Webhook],
    grants: Sequence[Grant],
    releases: Sequence[Release],
    reports: Sequence[StatusReport],
    ends: Sequence[TaskEnd],
    silent_nodes: set[str],
    t0: float = 0.0,
) -> dict[str, Any]:
    """Tasks AllData was told `failed` because the reservation expired or the node was
    declared lost (or for no reason the streams show) although the node had reported the
    allocation in question `running` (and never `failed`), on a node that did not go silent.
    The allocation in question is the one the scheduler's task.ended names, else the task's
    last grant. A preemption is a true end, counted apart."""
    last_grant: dict[str, Grant] = {}
    grant_of: dict[str, Grant] = {}
    for each in grants:
        last_grant[each.task_id] = each
        grant_of[each.allocation_id] = each
    release_of = {r.allocation_id: r for r in releases}
    node_said: dict[str, set[str]] = defaultdict(set)
    running_at: dict[str, float] = {}
    for report in reports:
        if report.allocation_id:
            node_said[report.allocation_id].add(report.status)
            if report.status == "running":
                running_at.setdefault(report.allocation_id, report.ts)
    end_of = {e.task_id: e for e in ends}
    failed_tasks = {w.task_id for w in webhooks if w.status == "failed" and is_terminal(w)}
    found: list[dict[str, Any]] = []
    causes: Counter[str] = Counter()
    other_causes: Counter[str] = Counter()
    silent_excluded = 0
    node_failed = 0
    never_placed = 0
    for task_id in sorted(failed_tasks):
        end = end_of.get(task_id)
        named = grant_of.get(end.allocation_id or "") if end else None
        grant = named or last_grant.get(task_id)
        if grant is None:
            never_placed += 1  # rejected, or failed before any grant: not this fault
            continue
        said = node_said.get(grant.allocation_id, set())
        if "failed" in said:
            node_failed += 1
            continue
        if "running" not in said and "succeeded" not in said:
            continue
        release = release_of.get(grant.allocation_id)
        cause = release.reason if release else (end.release_reason if end else None)
        if cause is not None and cause not in UNCONFIRMED_REASONS:
            # Preempted (without a restart policy), cancelled, ...: a true end, said so.
            other_causes[cause] += 1
            continue
        if grant.node in silent_nodes:
            silent_excluded += 1
            continue
        causes[cause or "unknown"] += 1
        found.append(
            {
                "task_id": task_id,
                "allocation_id": grant.allocation_id,
                "node": grant.node,
                "node_reported": sorted(said),
                "release_reason": cause,
                # seconds after t0, as the streams stored them: where to look in the logs
                "granted_at": round(grant.ts - t0, 2),
                "running_at": round(running_at[grant.allocation_id] - t0, 2)
                if grant.allocation_id in running_at
                else None,
                "released_at": round(release.ts - t0, 2) if release else None,
            }
        )
    return {
        "false_failures": len(found),
        "causes": dict(causes),
        "node_reported_succeeded_too": sum(1 for f in found if "succeeded" in f["node_reported"]),
        "examples": found[:EXAMPLES],
        "failed_tasks": len(failed_tasks),
        "failed_never_placed": never_placed,
        "failed_as_the_node_reported": node_failed,
        "failed_on_silent_nodes_excluded": silent_excluded,
        "failed_after_running_for_other_reasons": dict(other_causes),
    }


def reports_after_release(
    releases: Sequence[Release], reports: Sequence[StatusReport]
) -> dict[str, Any]:
    """Node reports about an allocation stored after it was released: the node still ran
    work the scheduler had given back (a node back from silence, or a late report), where a
    new grant of the same GPUs would be double-booked on the machine itself."""
    released_at = {r.allocation_id: (r.ts, r.reason) for r in releases}
    late: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    for report in reports:
        if report.allocation_id not in released_at or report.status == "cancelled":
            continue
        ts, reason = released_at[report.allocation_id]
        if report.ts > ts:
            late[f"{report.status} after {reason}"] += 1
            if len(examples) < EXAMPLES:
                examples.append(
                    {
                        "task_id": report.task_id,
                        "allocation_id": report.allocation_id,
                        "status": report.status,
                        "seconds_after_release": round(report.ts - ts, 2),
                        "release_reason": reason,
                    }
                )
    return {"count": sum(late.values()), "kinds": dict(late.most_common()), "examples": examples}


def premature_node_lost(
    releases: Sequence[Release],
    silent: dict[str, tuple[float, float]],
    lost_after: float,
    t0: float = 0.0,
) -> dict[str, Any]:
    """`node-lost` releases of nodes that were reporting: never silent, or silent for less
    than `lost_after` (the scheduler's heartbeat timeout + lost-node grace) when released.
    Counted whatever became of the task (a restart policy hides them from the failures)."""
    early: Counter[str] = Counter()
    times: Counter[float] = Counter()
    for release in releases:
        if release.reason not in UNCONFIRMED_REASONS - {"expired"}:
            continue
        window = silent.get(release.node)
        if window is not None and window[0] + lost_after <= release.ts:
            continue  # silent long enough: rightly lost
        early[release.node] += 1
        times[round(release.ts - t0)] += 1
    return {
        "count": sum(early.values()),
        "nodes": dict(early.most_common()),
        "at_seconds": dict(sorted(times.items())),
        "lost_after_seconds": lost_after,
    }


# -- recovery ---------------------------------------------------------------------------------


def recovery(actions: Sequence[Action], grant_times: Sequence[float]) -> list[dict[str, Any]]:
    """For each kill or restart: seconds from the action to the next allocation the stream
    stored, and how long the service took to be healthy again."""
    times = sorted(grant_times)
    rows = []
    for action in actions:
        if action.kind == "silent":
            continue
        following = next((t for t in times if t > action.started_at), None)
        rows.append(
            {
                "kind": action.kind,
                "target": action.target,
                "at_seconds": round(action.planned_at, 1),
                "restart_seconds": (
                    round(action.restart_seconds, 2) if action.restart_seconds is not None else None
                ),
                "to_next_allocation_seconds": (
                    round(following - action.started_at, 2) if following is not None else None
                ),
                **({"error": action.error} if action.error else {}),
            }
        )
    return rows


def recovery_summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float | int | None]]:
    """Per service: kills, the worst and median restart and kill-to-next-allocation times."""
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        per[row["target"]].append(row)
    summary: dict[str, dict[str, float | int | None]] = {}
    for target, chosen in sorted(per.items()):
        restarts = [r["restart_seconds"] for r in chosen if r["restart_seconds"] is not None]
        gaps = [
            r["to_next_allocation_seconds"]
            for r in chosen
            if r["to_next_allocation_seconds"] is not None
        ]
        summary[target] = {
            "count": len(chosen),
            "restart_seconds_max": max(restarts, default=None),
            "restart_seconds_median": percentile(restarts, 50) if restarts else None,
            "to_next_allocation_seconds_max": max(gaps, default=None),
            "to_next_allocation_seconds_median": percentile(gaps, 50) if gaps else None,
        }
    return summary
