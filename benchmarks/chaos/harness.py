"""The chaos run: Crater on PostgreSQL, every service its own process, tasks at a steady rate
through the gateway, `kill -9` of services at seeded times (each restarted), a nats-server
restart, simulated nodes going silent; then what AllData was told, checked against what
happened (`analysis`).

`crater chaos --help` runs it; `run(config, data_dir)` is the same from Python (the short run
in `make test`). Results: a JSON file, a summary printed, and a plot of allocations over time
with the chaos marked.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import nats
import yaml
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy.engine import make_url

from benchmarks.chaos import analysis
from benchmarks.chaos.analysis import Action, Grant, Release, StatusReport, TaskEnd, Webhook
from benchmarks.chaos.plan import ChaosConfig, PlannedAction, describe_plan, make_plan, workload
from crater.cli.stack import Stack, wait_healthy
from crater.probe.sim.fleet import FaultSpec, Fleet, build_fleet, read_fleet_spec
from crater.probe.sim.simulation import FaultKind
from crater.runtime.bus import retry_transient
from crater.runtime.db import fresh_postgres_database
from crater.runtime.nats_server import free_port, start_nats_server

# The probe starts this long before the first task, so the fleet is known when tasks come;
# its fault clock starts with it, so silent windows are planned on the same clock.
PROBE_LEAD_SECONDS = 12.0
SUBMIT_RETRY_SECONDS = 120.0  # an AllData client keeps trying this long while the gateway is down
RETRY_PAUSE_SECONDS = 0.5
PROGRESS_SECONDS = 10.0
HEARTBEAT_SECONDS = 5.0  # the probe's health interval (its default)
NO_TASK = "__chaos_no_such_task__"
# How long reading the streams back waits out a stream group still electing its leader.
READ_BACK_SECONDS = 30.0
Echo = Callable[[str], None]


@dataclass
class Submission:
    task_id: str
    offered_at: float  # epoch seconds of the first try
    codes: list[str] = field(default_factory=list)  # each try: HTTP code or the error class
    accepted: bool = False
    refused: bool = False
    refusal: str | None = None  # the answer's body, shortened, when refused


@dataclass
class Live:
    """What the harness sees while the run goes on (progress, silent windows)."""

    grants: int = 0
    health_seen: dict[str, list[float]] = field(default_factory=dict)
    watched: set[str] = field(default_factory=set)

    async def on_message(self, msg: Msg) -> None:
        if msg.subject.endswith(".granted"):
            self.grants += 1
            return
        node = msg.subject.rsplit(".", 1)[-1]
        if node in self.watched:
            self.health_seen.setdefault(node, []).append(time.time())


def run(
    config: ChaosConfig,
    data_dir: Path,
    out: Path | None = None,
    plot: Path | None = None,
    echo: Echo = print,
    with_autoscaler: bool = False,
) -> dict[str, Any]:
    """One chaos run from start to report; returns the report (also written to `out`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fleet_spec = read_fleet_spec(None)
    fleet = build_fleet(fleet_spec)
    # Silent nodes are taken where the workload runs: untainted GPU nodes outside `default`.
    candidates = [
        n.topology.node_id
        for n in fleet.nodes
        if n.topology.gpus and not n.topology.taints and n.topology.pool != "default"
    ]
    plan = make_plan(config, candidates)
    echo(f"chaos run, seed {config.seed}: {config.tasks} tasks at {config.rate:g}/s")
    echo(f"  plan ({len(plan)} actions; seconds after the first task):")
    for line in describe_plan(plan):
        echo("  " + line)
    fleet_file = data_dir / "fleet.yaml"
    faults = [
        FaultSpec(
            node=a.target,
            kind=FaultKind.SILENT,
            at_seconds=a.at_seconds + PROBE_LEAD_SECONDS,
            for_seconds=a.for_seconds,
        )
        for a in plan
        if a.kind == "silent"
    ]
    spec = fleet_spec.model_copy(update={"faults": faults, "name": "chaos"})
    fleet_file.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    mig_slices = _mig_slices(fleet)
    report, records = asyncio.run(
        _run(config, data_dir, plan, fleet_file, mig_slices, echo, with_autoscaler)
    )
    (data_dir / "records.json").write_text(json.dumps(records))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        echo(f"wrote {out}")
    if plot is not None:
        from benchmarks.chaos.plot import plot_run

        plot_run(report, data_dir / "records.json", plot)
        echo(f"wrote {plot}")
    for line in summary_lines(report):
        echo(line)
    return report


async def _run(
    config: ChaosConfig,
    data_dir: Path,
    plan: list[PlannedAction],
    fleet_file: Path,
    mig_slices: dict[tuple[str, int], int],
    echo: Echo,
    with_autoscaler: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    async with fresh_postgres_database(config.database_url, "crater_chaos") as database_url:
        echo(f"  database {make_url(database_url).database} on {_server(config.database_url)}")
        stack = Stack(data_dir=data_dir, env={"CRATER_DATABASE_URL": database_url})
        started = time.monotonic()
        try:
            report, records = await _with_stack(
                stack, config, plan, fleet_file, with_autoscaler, mig_slices, echo
            )
        finally:
            await asyncio.to_thread(stack.stop)
        report["wall_seconds"] = round(time.monotonic() - started, 1)
        report["database"] = make_url(database_url).database
    report["data_dir"] = str(data_dir)
    return report, records


async def _with_stack(
    stack: Stack,
    config: ChaosConfig,
    plan: list[PlannedAction],
    fleet_file: Path,
    with_autoscaler: bool,
    mig_slices: dict[tuple[str, int], int],
    echo: Echo,
) -> tuple[dict[str, Any], dict[str, Any]]:
    services: tuple[str, ...] = ("scheduler", "predictor", "callback", "gateway")
    if with_autoscaler:
        services += ("autoscaler",)
    low, high = config.task_seconds
    env = {
        "CRATER_LOG_LEVEL": "WARNING",  # per-message logs would cost the CPU the run measures
        "CRATER_PROBE_FLEET_FILE": str(fleet_file),
        "CRATER_PROBE_FAULTS": "true",
        "CRATER_PROBE_TASK_SECONDS_MIN": str(low),
        "CRATER_PROBE_TASK_SECONDS_MAX": str(high),
        **config.service_env,
    }
    echo(f"  starting nats-server and {', '.join(services)} under {stack.data_dir}/ ...")
    await asyncio.to_thread(stack.start, services, env)
    # The probe last: its fault clock (silent windows) starts with it, PROBE_LEAD before t0.
    probe_started = time.monotonic()
    stack._spawn("probe", free_port(), ["run", "probe"])  # the stack has no public add
    await asyncio.to_thread(wait_healthy, stack.processes["probe"])
    gateway = stack.url("gateway")
    headers = stack.auth_headers  # production's default: the gateway requires a key
    pools = await _wait_for_fleet(gateway, headers, expected=len(_fleet().nodes))
    wait = probe_started + PROBE_LEAD_SECONDS - time.monotonic()
    if wait > 0:
        await asyncio.sleep(wait)
    late = max(0.0, -wait)
    bodies = workload(config, pools)
    live = Live(watched={a.target for a in plan if a.kind == "silent"})
    connection = await nats.connect(
        stack.nats_url, max_reconnect_attempts=-1, error_cb=_quiet, reconnect_time_wait=0.5
    )
    await connection.subscribe("crater.v1.allocation.granted", cb=live.on_message)
    await connection.subscribe("crater.v1.node.health.*", cb=live.on_message)
    t0 = time.time()
    echo(f"  t0 {datetime.fromtimestamp(t0, UTC).isoformat()} (fleet known; {late:.1f} s late)")
    submissions: dict[str, Submission] = {}
    actions: list[Action] = []
    receiver_file = stack.data_dir / "webhooks.jsonl"
    async with httpx.AsyncClient(base_url=gateway, timeout=10, headers=headers) as client:
        submitting = asyncio.create_task(_submit_all(client, bodies, config.rate, t0, submissions))
        chaos = asyncio.create_task(_chaos(stack, plan, t0, config.down_seconds, actions, echo))
        progress = asyncio.create_task(
            _progress(t0, submissions, live, receiver_file, actions, echo)
        )
        await submitting
        await chaos
        accepted = [s.task_id for s in submissions.values() if s.accepted]
        drained = await _drain(receiver_file, accepted, config, t0, echo)
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await progress
    await connection.close()
    duplicates = await _receiver_duplicates(stack.url("receiver"))
    records = await _read_streams(stack.nats_url)
    webhooks = _read_webhooks(receiver_file)
    silent_observed = _silences(live.health_seen, t0)
    for action in plan:
        if action.kind == "silent":
            # As the bus saw it (the probe's fault clock starts a little after its spawn).
            seen = silent_observed.get(action.target)
            start, length = t0 + action.at_seconds, action.for_seconds
            if seen and seen["longest_gap_seconds"] > 2 * HEARTBEAT_SECONDS:
                start, length = t0 + seen["from"], seen["longest_gap_seconds"]
            actions.append(
                Action("silent", action.target, action.at_seconds, start, for_seconds=length)
            )
    saved = {
        "t0": t0,
        "grants": [asdict(g) for g in records["grants"]],
        "releases": [asdict(r) for r in records["releases"]],
        "actions": [asdict(a) for a in actions],
        "submitted": [s.offered_at for s in submissions.values()],
        "accepted": [s.task_id for s in submissions.values() if s.accepted],
        "health_seen": live.health_seen,
        "reports": [asdict(r) for r in records["reports"]],
        "ends": [asdict(e) for e in records["ends"]],
    }
    return build_report(
        config=config,
        plan=plan,
        t0=t0,
        submissions=submissions,
        actions=actions,
        records=records,
        webhooks=webhooks,
        receiver_duplicates=duplicates,
        mig_slices=mig_slices,
        drained=drained,
        silent_observed=silent_observed,
    ), saved


def build_report(
    *,
    config: ChaosConfig,
    plan: list[PlannedAction],
    t0: float,
    submissions: dict[str, Submission],
    actions: list[Action],
    records: dict[str, Any],
    webhooks: list[Webhook],
    receiver_duplicates: int | None,
    mig_slices: dict[tuple[str, int], int],
    drained: dict[str, Any],
    silent_observed: dict[str, Any],
) -> dict[str, Any]:
    accepted = [s.task_id for s in submissions.values() if s.accepted]
    codes: Counter[str] = Counter(c for s in submissions.values() for c in s.codes)
    report: dict[str, Any] = {
        "when": datetime.fromtimestamp(t0, UTC).isoformat(),
        "commit": _commit(),
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, {platform.python_version()}",
        "config": {**asdict(config), "database_url": _server(config.database_url)},
        "plan": [asdict(a) for a in plan],
        "submissions": {
            "offered": len(submissions),
            "accepted": len(accepted),
            "accepted_after_retry": sum(
                1 for s in submissions.values() if s.accepted and len(s.codes) > 1
            ),
            "refused": sum(1 for s in submissions.values() if s.refused),
            "never_answered": sum(
                1 for s in submissions.values() if not s.accepted and not s.refused
            ),
            "answers": dict(codes.most_common()),
            "refusal_examples": [
                {"task_id": s.task_id, "answer": s.refusal}
                for s in submissions.values()
                if s.refused
            ][: analysis.EXAMPLES],
        },
        "drain": drained,
        **judge(
            t0=t0,
            silent_nodes={a.target for a in plan if a.kind == "silent"},
            accepted=accepted,
            records=records,
            webhooks=webhooks,
            receiver_duplicates=receiver_duplicates,
            mig_slices=mig_slices,
            actions=actions,
            lost_after=lost_after_seconds(config.service_env),
        ),
        "silent_nodes": silent_observed,
        "bus": {
            "task_status_reports": len(records["reports"]),
            "task_ended": len(records["ends"]),
            "task_pending_events": records["pending_events"],
            "message_rejected": records["rejections"],
            "dead_letters": records["dead_letters"],
        },
    }
    report["checks"] = checks(report)
    return report


def judge(
    *,
    t0: float,
    silent_nodes: set[str],
    accepted: list[str],
    records: dict[str, Any],
    webhooks: list[Webhook],
    receiver_duplicates: int | None,
    mig_slices: dict[tuple[str, int], int],
    actions: list[Action],
    lost_after: float,
) -> dict[str, Any]:
    """The figures, from what was recorded: the part of the report `reanalyse` redoes."""
    grants: list[Grant] = records["grants"]
    releases: list[Release] = records["releases"]
    ordered: list[Grant | Release] = sorted([*grants, *releases], key=lambda r: r.seq)
    booking = analysis.replay_allocations(ordered, mig_slices)
    booking["node_reports_after_release"] = analysis.reports_after_release(
        releases, records["reports"]
    )
    rows = analysis.recovery(actions, [g.ts for g in grants])
    windows = {
        a.target: (a.started_at, a.started_at + (a.for_seconds or 0.0))
        for a in actions
        if a.kind == "silent"
    }
    booking["node_lost_while_reporting"] = analysis.premature_node_lost(
        releases, windows, lost_after, t0
    )
    return {
        "lifecycle": analysis.webhook_report(accepted, webhooks, receiver_duplicates),
        "allocations": booking,
        "false_failures": analysis.false_failures(
            webhooks, grants, releases, records["reports"], records["ends"], silent_nodes, t0
        ),
        "recovery": rows,
        "recovery_by_target": analysis.recovery_summary(rows),
    }


def reanalyse(report_file: Path, data_dir: Path, echo: Echo = print) -> dict[str, Any]:
    """Judge a finished run again from its records (`records.json`, `webhooks.jsonl` under
    its data dir), e.g. after a rule here changed; rewrites the report."""
    report: dict[str, Any] = json.loads(report_file.read_text())
    saved = json.loads((data_dir / "records.json").read_text())
    records = {
        "grants": [Grant(**{**g, "gpu_ids": tuple(g["gpu_ids"])}) for g in saved["grants"]],
        "releases": [Release(**r) for r in saved["releases"]],
        "reports": [StatusReport(**r) for r in saved["reports"]],
        "ends": [TaskEnd(**e) for e in saved["ends"]],
    }
    report.update(
        judge(
            t0=saved["t0"],
            silent_nodes={a["target"] for a in report["plan"] if a["kind"] == "silent"},
            accepted=saved["accepted"],
            records=records,
            webhooks=_read_webhooks(data_dir / "webhooks.jsonl"),
            receiver_duplicates=report["lifecycle"]["duplicate_deliveries_same_id"],
            mig_slices=_mig_slices(_fleet()),
            actions=[Action(**a) for a in saved["actions"]],
            lost_after=lost_after_seconds(report["config"].get("service_env") or {}),
        )
    )
    report["checks"] = checks(report)
    report_file.write_text(json.dumps(report, indent=2) + "\n")
    for line in summary_lines(report):
        echo(line)
    return report


def lost_after_seconds(service_env: dict[str, str]) -> float:
    """When the scheduler may call a silent node lost: its heartbeat timeout and lost-node
    grace, as the run set them (else their defaults)."""
    timeout = float(service_env.get("CRATER_SCHEDULER_HEARTBEAT_TIMEOUT_SECONDS", 30.0))
    grace = float(service_env.get("CRATER_SCHEDULER_NODE_LOST_SECONDS", 60.0))
    return timeout + grace


def _fleet() -> Fleet:
    """The demo fleet the probe simulates (its faults are the plan's)."""
    return build_fleet(read_fleet_spec(None))


def _mig_slices(fleet: Fleet) -> dict[tuple[str, int], int]:
    """Compute slices of each MIG-capable card: the largest profile's `<g>g`."""
    return {
        (n.topology.node_id, g.index): max(int(p.split("g.")[0]) for p in g.mig_profiles)
        for n in fleet.nodes
        for g in n.topology.gpus
        if g.mig_profiles
    }


def checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's "done when", each with the measured figure and whether it holds."""
    life = report["lifecycle"]
    per_task = life["terminal_webhooks_per_task"]
    not_one = sum(v for k, v in per_task.items() if k != "1")
    pending = life["pending_per_task"]
    figures = {
        "lost": (life["lost"], life["lost"] == 0),
        "double_booked": (
            report["allocations"]["double_booked_events"],
            report["allocations"]["double_booked_events"] == 0,
        ),
        "false_failures": (
            report["false_failures"]["false_failures"],
            report["false_failures"]["false_failures"] == 0,
        ),
        "tasks_without_exactly_one_terminal": (not_one, not_one == 0),
        "out_of_lifecycle_order": (life["out_of_order_tasks"], life["out_of_order_tasks"] == 0),
        "pending_per_task_max": (pending["max"], pending["max"] <= pending["target"]),
    }
    return {name: {"value": value, "ok": ok} for name, (value, ok) in figures.items()}


def summary_lines(report: dict[str, Any]) -> list[str]:
    life = report["lifecycle"]
    sub = report["submissions"]
    pending = life["pending_per_task"]
    false = report["false_failures"]
    lines = [
        "",
        f"chaos run {report['when']} (seed {report['config']['seed']}, "
        f"{report['wall_seconds']} s wall)",
        f"  submitted {sub['offered']}, accepted {sub['accepted']} "
        f"({sub['accepted_after_retry']} after a retry), refused {sub['refused']}, "
        f"never answered {sub['never_answered']}; answers {sub['answers']}",
        f"  final states {life['final_states']}; lost {life['lost']} "
        f"{life['lost_by_last_status'] or ''} "
        f"(drain: {report['drain']['outcome']} after {report['drain']['seconds']} s)",
        f"  GPUs double-booked: {report['allocations']['double_booked_events']} events on "
        f"{report['allocations']['double_booked_gpus']} GPUs "
        f"({report['allocations']['grants']} grants replayed, "
        f"{report['allocations']['held_at_end']} held at the end; node reports after the "
        f"release {report['allocations']['node_reports_after_release']['kinds']})",
        f"  node-lost while the node was reporting: "
        f"{report['allocations']['node_lost_while_reporting']['count']} releases, at "
        f"{report['allocations']['node_lost_while_reporting']['at_seconds']} s",
        f"  false failures: {false['false_failures']} {false['causes']} "
        f"(of {false['failed_tasks']} failed; {false['failed_on_silent_nodes_excluded']} on "
        f"silent nodes excluded)",
        f"  terminal webhooks per task: {life['terminal_webhooks_per_task']} "
        f"({life['tasks_with_conflicting_terminals']} with conflicting terminals)",
        f"  out of lifecycle order: {life['out_of_order_tasks']} tasks "
        f"{dict(list(life['out_of_order_kinds'].items())[:6])}",
        f"  duplicates: same webhook id {life['duplicate_deliveries_same_id']}, "
        f"distinct ids {life['duplicates_distinct_ids']}",
        f"  pending per task: max {pending['max']}, p99 {pending['p99']}, mean {pending['mean']},"
        f" {pending['tasks_over_target']} tasks over {pending['target']}",
        "  kill -> next allocation, restart (s):",
    ]
    for target, row in report["recovery_by_target"].items():
        lines.append(
            f"    {target:<12} x{row['count']}: next allocation max "
            f"{row['to_next_allocation_seconds_max']} median "
            f"{row['to_next_allocation_seconds_median']}; restart max "
            f"{row['restart_seconds_max']} median {row['restart_seconds_median']}"
        )
    verdict = ", ".join(
        f"{name} {c['value']} {'ok' if c['ok'] else 'FAIL'}" for name, c in report["checks"].items()
    )
    lines.append(f"  checks: {verdict}")
    return lines


# -- the pieces -------------------------------------------------------------------------------


def _server(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


async def _wait_for_fleet(
    gateway: str, headers: dict[str, str], expected: int, timeout: float = 60.0
) -> set[str]:
    deadline = time.monotonic() + timeout
    nodes: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=gateway, timeout=5, headers=headers) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                response = await client.get("/api/v1/nodes")
                if response.status_code == 200:
                    nodes = response.json()["nodes"]
                    if len(nodes) >= expected:
                        return {n["pool"] for n in nodes}
            await asyncio.sleep(0.5)
    raise TimeoutError(f"the scheduler knows {len(nodes)} of {expected} nodes after {timeout} s")


async def _submit_all(
    client: httpx.AsyncClient,
    bodies: list[dict[str, Any]],
    rate: float,
    t0: float,
    submissions: dict[str, Submission],
    stop: asyncio.Event | None = None,
) -> None:
    """Each task at its time on a steady schedule; a try that fails does not delay the rest.
    With `stop`: no more once it is set (the failover benchmark submits until its kills end)."""
    running = []
    for n, body in enumerate(bodies):
        if stop is not None and stop.is_set():
            break
        delay = t0 + n / rate - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        record = Submission(body["task_id"], time.time())
        submissions[record.task_id] = record
        running.append(asyncio.create_task(_submit(client, body, record)))
    await asyncio.gather(*running)


async def _submit(client: httpx.AsyncClient, body: dict[str, Any], record: Submission) -> None:
    """As AllData would: retry while the gateway is down or answers 5xx. A 409 after a try
    that got no answer means the gateway took the first one: accepted."""
    deadline = time.monotonic() + SUBMIT_RETRY_SECONDS
    while time.monotonic() < deadline:
        try:
            response = await client.post("/api/v1/schedule", json=body)
        except httpx.HTTPError as error:
            record.codes.append(type(error).__name__)
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            continue
        record.codes.append(str(response.status_code))
        if response.status_code == 202:
            record.accepted = True
            return
        unanswered = any(not c.isdigit() or c.startswith("5") for c in record.codes[:-1])
        if response.status_code == 409 and unanswered:
            record.accepted = True
            return
        if response.status_code < 500:
            record.refused = True
            record.refusal = f"{response.status_code} {response.text[:300]}"
            return
        await asyncio.sleep(RETRY_PAUSE_SECONDS)


async def _chaos(
    stack: Stack,
    plan: list[PlannedAction],
    t0: float,
    down_seconds: float,
    actions: list[Action],
    echo: Echo,
) -> None:
    """Kills and nats-server restarts at their planned times, one at a time (a kill waits for
    the previous restart to finish). Silent nodes are the probe's own (its fleet file)."""
    for planned in plan:
        if planned.kind == "silent":
            continue
        delay = t0 + planned.at_seconds - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        at = time.time()
        if planned.kind == "kill":
            await asyncio.to_thread(stack.kill, planned.target)
        else:
            await asyncio.to_thread(stack.nats.stop)  # type: ignore[union-attr]
        await asyncio.sleep(down_seconds)
        restarting = time.monotonic()
        try:
            if planned.kind == "kill":
                await asyncio.to_thread(_restart, stack, planned.target)
            else:
                await asyncio.to_thread(_restart_nats, stack)
        except (RuntimeError, TimeoutError, OSError) as error:
            # A service that does not come back is a finding, not the end of the run.
            actions.append(
                Action(planned.kind, planned.target, at - t0, at, error=str(error)[-500:])
            )
            echo(f"  {at - t0:7.1f} s  {planned.kind} {planned.target}: NOT back: {error}")
            continue
        took = time.monotonic() - restarting
        actions.append(Action(planned.kind, planned.target, at - t0, at, restart_seconds=took))
        echo(
            f"  {at - t0:7.1f} s  {planned.kind} {planned.target}: back in "
            f"{took + down_seconds:.1f} s (planned at {planned.at_seconds:.1f} s)"
        )


def _restart(stack: Stack, name: str, tries: int = 3) -> None:
    for attempt in range(1, tries + 1):
        try:
            stack.restart(name)
            return
        except (RuntimeError, TimeoutError):
            # e.g. it could not reach nats-server while that restarted: try again
            if attempt == tries:
                raise


def _restart_nats(stack: Stack) -> None:
    """The same store directory and port: every client reconnects to the same server."""
    old = stack.nats
    assert old is not None
    stack.nats = start_nats_server(
        old.store_dir, port=old.port, log_file=stack.data_dir / "logs" / "nats-server.log"
    )


async def _progress(
    t0: float,
    submissions: dict[str, Submission],
    live: Live,
    receiver_file: Path,
    actions: list[Action],
    echo: Echo,
) -> None:
    while True:
        await asyncio.sleep(PROGRESS_SECONDS)
        accepted = sum(1 for s in submissions.values() if s.accepted)
        ended = len(_ended(receiver_file))
        echo(
            f"  {time.time() - t0:7.1f} s  submitted {len(submissions)}, accepted {accepted}, "
            f"grants {live.grants}, tasks ended {ended}, chaos actions done {len(actions)}"
        )


def _ended(receiver_file: Path) -> set[str]:
    ended: set[str] = set()
    if not receiver_file.exists():
        return ended
    with receiver_file.open() as lines:
        for line in lines:
            try:
                body = json.loads(line)["body"]
            except (ValueError, KeyError):
                continue  # a line being written
            if body.get("status") in analysis.TERMINAL and not body.get("duplicate_submission"):
                ended.add(body.get("task_id"))
    return ended


async def _drain(
    receiver_file: Path, accepted: list[str], config: ChaosConfig, t0: float, echo: Echo
) -> dict[str, Any]:
    """Wait for a terminal webhook of every accepted task, at most `drain_seconds`; then
    `settle_seconds` more, so late duplicates are counted too."""
    started = time.monotonic()
    wanted = set(accepted)
    outcome = "timed out"
    echo(f"  {time.time() - t0:7.1f} s  draining: waiting for {len(wanted)} tasks to end")
    while time.monotonic() - started < config.drain_seconds:
        if not wanted - _ended(receiver_file):
            outcome = "every task ended"
            break
        await asyncio.sleep(1.0)
    seconds = round(time.monotonic() - started, 1)
    await asyncio.sleep(config.settle_seconds)
    # Lost is judged after the settle too: a task may end in it.
    return {
        "outcome": outcome,
        "seconds": seconds,
        "settle_seconds": config.settle_seconds,
        "unended_after_settle": len(wanted - _ended(receiver_file)),
    }


async def _receiver_duplicates(receiver: str) -> int | None:
    """Deliveries of a webhook id the receiver already had (it keeps only the first)."""
    try:
        async with httpx.AsyncClient(base_url=receiver, timeout=30) as client:
            answer = (await client.get("/deliveries", params={"task_id": NO_TASK})).json()
    except httpx.HTTPError:
        return None
    duplicates: int = answer["duplicates"]
    return duplicates


def _read_webhooks(receiver_file: Path) -> list[Webhook]:
    webhooks: list[Webhook] = []
    if not receiver_file.exists():
        return webhooks
    for line in receiver_file.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        body = record["body"]
        # The callback's default body is AllData's own shape: the attempt comes in the
        # crater-attempt header (the crater format has it in the body too).
        attempt = body.get("attempt") or record.get("headers", {}).get("crater-attempt")
        webhooks.append(
            Webhook(
                webhook_id=record["webhook_id"],
                received_at=datetime.fromisoformat(record["received_at"]).timestamp(),
                task_id=str(body.get("task_id")),
                status=str(body.get("status")),
                attempt=int(attempt) if attempt else None,
                duplicate_submission=bool(body.get("duplicate_submission")),
                release_reason=body.get("release_reason"),
            )
        )
    return webhooks


async def _read_streams(nats_url: str | list[str]) -> dict[str, Any]:
    """The allocation stream and the task stream, in stream order, read back after the run
    (plain JSON: the harness reads what was written, even across contract versions)."""
    connection: Client = await nats.connect(nats_url)
    try:
        js = connection.jetstream()
        grants: list[Grant] = []
        releases: list[Release] = []
        reports: list[StatusReport] = []
        ends: list[TaskEnd] = []
        pending = 0
        async for seq, ts, subject, data in _stream(js, "CRATER_ALLOCATIONS", "crater.v1.>"):
            if subject.endswith(".granted"):
                grants.append(
                    Grant(
                        seq,
                        ts,
                        data["allocation_id"],
                        data["task_id"],
                        data["node"],
                        tuple(data["gpu_ids"]),
                        int(data.get("gpu_milli") or 1000),
                        data.get("mig_profile"),
                        int(data.get("attempt") or 1),
                    )
                )
            elif subject.endswith(".released"):
                releases.append(
                    Release(
                        seq,
                        ts,
                        data["allocation_id"],
                        data["task_id"],
                        data["node"],
                        data["reason"],
                    )
                )
        async for seq, ts, subject, data in _stream(js, "CRATER_TASKS", "crater.v1.>"):
            if subject.endswith(".status"):
                reports.append(
                    StatusReport(
                        seq, ts, data["task_id"], data.get("allocation_id"), data["status"]
                    )
                )
            elif subject.endswith(".ended"):
                ends.append(
                    TaskEnd(
                        seq,
                        ts,
                        data["task_id"],
                        data["status"],
                        data.get("allocation_id"),
                        data.get("release_reason"),
                    )
                )
            elif subject.endswith(".pending"):
                pending += 1
        return {
            "grants": grants,
            "releases": releases,
            "reports": reports,
            "ends": ends,
            "pending_events": pending,
            "rejections": await _count(js, "CRATER_REJECTIONS"),
            "dead_letters": await _count(js, "CRATER_DEAD_LETTERS"),
        }
    finally:
        await connection.close()


async def _count(js: Any, stream: str) -> int | None:
    try:
        info = await js.stream_info(stream)
    except Exception:
        return None  # no such stream (yet)
    messages: int = info.state.messages
    return messages


async def _stream(
    js: Any, stream: str, subject: str, batch: int = 2000
) -> AsyncIterator[tuple[int, float, str, dict[str, Any]]]:
    """(stream sequence, stored at, subject, body) of every message, oldest first. A cluster
    whose host was just brought back may answer 503 while the stream's group catches up: the
    reads wait for it as the services do."""
    info = await retry_transient(
        lambda: js.stream_info(stream), what=f"read {stream}", seconds=READ_BACK_SECONDS
    )
    last = info.state.last_seq
    if not info.state.messages:
        return
    sub = await retry_transient(
        lambda: js.pull_subscribe(
            subject,
            stream=stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=60.0,
            ),
        ),
        what=f"read {stream}",
        seconds=READ_BACK_SECONDS,
    )
    try:
        seq = 0
        while seq < last:
            try:
                messages = await sub.fetch(batch, timeout=5)
            except nats.errors.TimeoutError:
                break
            for msg in messages:
                seq = msg.metadata.sequence.stream
                stored = msg.metadata.timestamp
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue  # a poison message someone published: not an event
                if isinstance(data, dict):
                    yield seq, stored.timestamp() if stored else 0.0, msg.subject, data
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _quiet(error: Exception) -> None:
    """nats-py prints every reconnect failure; the nats-server restart is planned."""


def _silences(seen: dict[str, list[float]], t0: float) -> dict[str, Any]:
    """Per watched node: the longest gap between its health reports, as the bus showed it."""
    observed = {}
    for node, times in seen.items():
        gaps = [(b - a, a) for a, b in itertools.pairwise(times)]
        if gaps:
            gap, start = max(gaps)
            observed[node] = {"longest_gap_seconds": round(gap, 1), "from": round(start - t0, 1)}
    return observed


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode:
        return None
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as `crater chaos` (see --help)")
