"""The failover benchmark: two schedulers (a leader and a hot standby) on one database, the rest
of Crater beside them, tasks at a steady rate through the gateway; again and again, `kill -9`
of the leader (found by its /metrics `crater_leader 1`), the time from the kill to the next
`allocation.granted` on the bus measured, the killed one restarted (it comes back a standby).
Mode `nats`: the same load on a 3-server NATS cluster, one server killed (-9) and restarted at
a time, the longest gap in allocations around each kill measured. Mode `host`: three hosts
(network namespaces, needs root), each with a nats-server of the cluster and a share of the
services (`HOST_PLACEMENT`: the two schedulers on different hosts, gateway, predictor and
callback replicas spread); a kill takes a whole host down at once (SIGKILL of everything on
it), on alternate kills the leader's host and one without the leader, and brings it back
after a while; the time to the next allocation stored in the stream and the longest gap
measured. Then the chaos analysis (`benchmarks.chaos`) of what AllData was told: lost tasks,
GPUs double-booked, false failures, a terminal webhook for every task.

`python -m benchmarks.failover.run --help`; `run(config, data_dir)` from Python (the short
version in `make test`). Results: benchmarks/results/failover[_nats|_host].json and a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from benchmarks.chaos.analysis import Action, percentile
from benchmarks.chaos.harness import (
    Echo,
    Submission,
    _drain,
    _fleet,
    _mig_slices,
    _quiet,
    _read_streams,
    _read_webhooks,
    _receiver_duplicates,
    _restart,
    _submit_all,
    _wait_for_fleet,
    build_report,
    summary_lines,
)
from benchmarks.chaos.plan import ChaosConfig, workload
from crater.cli.stack import Stack
from crater.runtime.db import fresh_postgres_database
from crater.runtime.leadership import EPOCH_HEADER, LeaseTiming, parse_epoch_header

SCHEDULERS = ("scheduler", "scheduler-2")
SERVICES = ("scheduler", "predictor", "callback", "probe", "gateway")
GRANTED = "crater.v1.allocation.granted"
LEASE_BUCKET, LEASE_KEY = "crater_leases", "scheduler"
TARGET_SECONDS = 3.0  # the "done when": p99 kill -> next allocation, and NATS stalls
# Mode host: which host (0, 1, 2: the cluster's servers crater-1..3) each process runs on.
# The probe (the simulated GPU fleet: machines of their own) and AllData's receiver stay
# outside the hosts, as does the harness (AllData's client, balancing over the gateways).
HOST_REPLICAS = {"scheduler": 2, "gateway": 3, "predictor": 2, "callback": 2}
HOST_PLACEMENT = {
    "scheduler": 0,
    "gateway": 0,
    "predictor": 0,
    "scheduler-2": 1,
    "gateway-2": 1,
    "callback": 1,
    "gateway-3": 2,
    "predictor-2": 2,
    "callback-2": 2,
}
MODES = ("leader", "nats", "host")
_EPOCH = re.compile(r"^crater_leader_epoch\s+(\S+)$", re.MULTILINE)
_LEADING = re.compile(r"^crater_leader\s+(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class FailoverConfig:
    mode: str = "leader"  # leader: the leader scheduler | nats: a NATS server | host: a host
    kills: int = 20
    rate: float = 3.0  # tasks per second, steady, until the last kill is done
    task_seconds: tuple[float, float] = (5.0, 25.0)  # simulated run time on the fleet
    seed: int = 17
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
    fresh_database: bool = True  # PostgreSQL: a database of its own, dropped after
    warmup_seconds: float = 15.0  # load before the first kill
    steady_seconds: float = 3.0  # after the killed one is back (and a grant since): next kill
    jitter_seconds: float = 1.0  # a seeded pause on top, so kills fall anywhere in a renewal
    down_seconds: float = 1.0  # between a leader kill and its restart
    nats_down_seconds: float = 10.0  # a NATS server stays down this long (mode nats)
    host_down_seconds: float = 10.0  # a killed host stays down this long (mode host)
    host_window_seconds: float = 30.0  # mode host: the longest gap is taken up to this after
    wait_seconds: float = 60.0  # give up on a failover after this long (counted as a failure)
    drain_seconds: float = 180.0
    settle_seconds: float = 10.0
    service_env: dict[str, str] = field(default_factory=dict)  # extra CRATER_* for services

    def chaos(self, tasks: int) -> ChaosConfig:
        """As the chaos analysis wants it (no plan of its own: the kills here are the plan)."""
        return ChaosConfig(
            tasks=tasks,
            rate=self.rate,
            kills={"scheduler": self.kills} if self.mode == "leader" else {},
            nats_restarts=self.kills if self.mode == "nats" else 0,
            silent_nodes=0,
            seed=self.seed,
            drain_seconds=self.drain_seconds,
            settle_seconds=self.settle_seconds,
            database_url=self.database_url,
            task_seconds=self.task_seconds,
            down_seconds=self.down_seconds,
            service_env=self.service_env,
        )


@dataclass
class Bus:
    """What the harness hears live: each grant (received at, epoch) and each lease write."""

    t0: float = 0.0  # the first task's submission (epoch seconds)
    grants: list[tuple[float, int | None]] = field(default_factory=list)
    lease_writes: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    # Mode host: grants heard on a connection to each server (one of them may be down), each
    # counted once by its Nats-Msg-Id; a connection to the seeds for the streams' state.
    dedupe: bool = False
    connection: Client | None = None
    _heard: set[str] = field(default_factory=set)

    granted: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_grant(self, msg: Msg) -> None:
        if self.dedupe:
            msg_id = (msg.headers or {}).get("Nats-Msg-Id")
            if msg_id is not None:
                if msg_id in self._heard:
                    return
                self._heard.add(msg_id)
        parsed = parse_epoch_header((msg.headers or {}).get(EPOCH_HEADER, ""))
        self.grants.append((time.time(), parsed[1] if parsed else None))
        self.granted.set()

    async def grant_after(self, at: float, timeout: float) -> float:
        """The first grant heard after `at`, waiting for it at most `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while (ts := self.first_grant_after(at)) is None:
                self.granted.clear()
                await self.granted.wait()
        return ts

    async def follow_lease(self, connection: Client) -> None:
        """Each stored write of the scheduler's lease key (a KV watch: a core subscription
        would also hear a standby's refused `create` tries)."""
        last = 0  # mode host: the last revision recorded (a new watch repeats it)
        while True:
            try:
                kv = await connection.jetstream().key_value(LEASE_BUCKET)
                watcher = await kv.watch(LEASE_KEY)
                while True:
                    try:
                        entry = await watcher.updates(timeout=5.0)
                    except nats.errors.TimeoutError:
                        if self.dedupe:  # mode host: its consumer may have gone with a host
                            with contextlib.suppress(Exception):
                                await watcher.stop()
                            break
                        continue
                    if entry is None:
                        continue  # the watch's "caught up" marker
                    if self.dedupe:
                        if (entry.revision or 0) <= last:
                            continue
                        last = entry.revision or 0
                    try:
                        value = json.loads(entry.value) if entry.value else {}
                    except ValueError:
                        value = {}
                    value = value if isinstance(value, dict) else {}
                    self.lease_writes.append((time.time(), {**value, "revision": entry.revision}))
            except asyncio.CancelledError:
                raise
            except Exception:  # a NATS server away (mode nats): watch again
                await asyncio.sleep(0.5)

    def first_grant_after(self, at: float, above_epoch: int | None = None) -> float | None:
        for ts, epoch in self.grants:
            if ts > at and (above_epoch is None or (epoch or 0) > above_epoch):
                return ts
        return None


def non_default_settings(service_env: dict[str, str]) -> list[str]:
    """Every setting given to the services, shipped lease defaults beside the lease ones."""
    shipped = LeaseTiming()
    defaults = {
        "CRATER_SCHEDULER_LEASE_SECONDS": shipped.duration_seconds,
        "CRATER_SCHEDULER_LEASE_RENEW_SECONDS": shipped.renew_seconds,
        "CRATER_SCHEDULER_LEASE_RETRY_SECONDS": shipped.retry_seconds,
    }
    return [
        f"{key}={value}" + (f" (shipped: {defaults[key]})" if key in defaults else "")
        for key, value in sorted(service_env.items())
    ]


def run(
    config: FailoverConfig,
    data_dir: Path,
    out: Path | None = None,
    plot: Path | None = None,
    echo: Echo = print,
) -> dict[str, Any]:
    """One failover run from start to report; returns the report (also written to `out`).
    `data_dir` must be new or empty: a previous run's stores and webhooks would be judged."""
    if data_dir.exists() and any(data_dir.iterdir()):
        raise FileExistsError(f"{data_dir} holds a previous run: give a new --data-dir")
    data_dir.mkdir(parents=True, exist_ok=True)
    echo(
        f"failover run ({config.mode}), seed {config.seed}: {config.kills} kills, tasks at "
        f"{config.rate:g}/s, 2 schedulers"
    )
    changed = non_default_settings(config.service_env)
    if changed:
        echo("  !! NOT THE SHIPPED DEFAULTS: " + ", ".join(changed))
    else:
        echo("  settings: the shipped defaults (lease 2.0 s, renew 0.5 s, retry 0.25 s)")
    report = asyncio.run(_run(config, data_dir, echo))
    report["non_default_settings"] = changed
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        echo(f"wrote {out}")
    if plot is not None:
        from benchmarks.failover.plot import plot_failover

        plot_failover(report, plot)
        echo(f"wrote {plot}")
    for line in failover_lines(report):
        echo(line)
    return report


async def _run(config: FailoverConfig, data_dir: Path, echo: Echo) -> dict[str, Any]:
    fresh = config.fresh_database and not config.database_url.startswith("sqlite")
    async with contextlib.AsyncExitStack() as scope:
        url = config.database_url
        if fresh:
            url = await scope.enter_async_context(
                fresh_postgres_database(config.database_url, "crater_failover")
            )
        hosted = config.mode == "host"
        stack = Stack(
            data_dir=data_dir,
            env={"CRATER_DATABASE_URL": url},
            nats_servers=3 if config.mode in ("nats", "host") else 1,
            nats_hosts=hosted,
            hosts=dict(HOST_PLACEMENT) if hosted else {},
        )
        started = time.monotonic()
        try:
            report = await _with_stack(stack, config, echo)
        finally:
            await asyncio.to_thread(stack.stop)
        report["wall_seconds"] = round(time.monotonic() - started, 1)
    report["data_dir"] = str(data_dir)
    return report


async def _with_stack(stack: Stack, config: FailoverConfig, echo: Echo) -> dict[str, Any]:
    low, high = config.task_seconds
    env = {
        "CRATER_LOG_LEVEL": "WARNING",
        "CRATER_PROBE_TASK_SECONDS_MIN": str(low),
        "CRATER_PROBE_TASK_SECONDS_MAX": str(high),
        **config.service_env,
    }
    hosted = config.mode == "host"
    replicas = HOST_REPLICAS if hosted else {"scheduler": 2}
    nats_note = {
        "nats": "a 3-server NATS cluster",
        "host": "a 3-server NATS cluster on 3 hosts (network namespaces)",
    }.get(config.mode, "one nats-server")
    counts = ", ".join(f"{name} x{n}" for name, n in replicas.items())
    echo(f"  starting {nats_note}, {', '.join(SERVICES)} ({counts}) under {stack.data_dir}/")
    # Both schedulers are spawned at the same moment: they race for the lease.
    await asyncio.to_thread(stack.start, SERVICES, env, replicas=replicas)
    placement = _placement(stack)
    for host, names in placement.items():
        echo(f"  {host}: {', '.join(names)}")
    gateway, headers = stack.url("gateway"), stack.auth_headers
    gateways = [name for name in stack.processes if name.split("-")[0] == "gateway"]
    fleet = _fleet()
    pools = await _wait_for_fleet(gateway, headers, expected=len(fleet.nodes))
    # The lease race may still be on when the fleet is known: wait for it to be decided (a
    # second leader, never acceptable, is still caught: every one that says it leads counts).
    deadline = time.monotonic() + 30.0
    leaders = await _leaders(stack)
    while not leaders and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        leaders = await _leaders(stack)
    start = {"leaders": leaders}
    echo(f"  started at once, leading: {start['leaders']}")
    bus = Bus(dedupe=hosted)
    seeds = stack.nats_url.split(",")
    connection = await nats.connect(
        seeds, max_reconnect_attempts=-1, error_cb=_quiet, reconnect_time_wait=0.2
    )
    listeners = [connection]
    if hosted:  # one connection per server: a grant is heard while any one is up
        bus.connection = connection
        listeners = [
            await nats.connect(
                [seed], max_reconnect_attempts=-1, error_cb=_quiet, reconnect_time_wait=0.2
            )
            for seed in seeds
        ]
    for listener in listeners:
        await listener.subscribe(GRANTED, cb=bus.on_grant)
    following = asyncio.create_task(bus.follow_lease(connection))
    # Enough tasks for any run; the submitting stops when the kills are done.
    most = int(config.rate * (config.warmup_seconds + config.kills * 90)) + 10
    bodies = workload(config.chaos(most), pools)
    submissions: dict[str, Submission] = {}
    stop = asyncio.Event()
    rows: list[dict[str, Any]] = []
    actions: list[Action] = []
    t0 = bus.t0 = time.time()
    receiver_file = stack.data_dir / "webhooks.jsonl"
    # Mode host: each request to the next gateway in turn, as a load balancer would (one on
    # a lost host refuses the connection: the submission is retried, at the next one).
    transport = RoundRobin([stack.url(name) for name in gateways]) if hosted else None
    async with httpx.AsyncClient(
        base_url=gateway, timeout=10, headers=headers, transport=transport
    ) as client:
        submitting = asyncio.create_task(
            _submit_all(client, bodies, config.rate, t0, submissions, stop)
        )
        try:
            await asyncio.sleep(config.warmup_seconds)
            kill = {"leader": _kill_leader, "nats": _kill_nats_server, "host": _kill_host}[
                config.mode
            ]
            rng = random.Random(f"failover:{config.seed}")
            for n in range(config.kills):
                await asyncio.sleep(config.steady_seconds + rng.uniform(0, config.jitter_seconds))
                row = await kill(stack, config, bus, actions, n)
                rows.append(row)
                echo(f"  {time.time() - t0:7.1f} s  kill {n + 1}/{config.kills}: {_row_text(row)}")
        finally:
            stop.set()
            stopped_at = time.time()  # the load's end
            await submitting
        accepted = [s.task_id for s in submissions.values() if s.accepted]
        chaos = config.chaos(len(submissions))
        drained = await _drain(receiver_file, accepted, chaos, t0, echo)
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    for listener in {id(c): c for c in [connection, *listeners]}.values():
        await listener.close()
    records = await _read_streams(seeds)
    stored = sorted(g.ts for g in records["grants"])
    if hosted:  # each kill's window ends at the next kill, or the load's end
        ends = [row["at"] for row in rows[1:]] + [stopped_at]
        takeovers = takeovers_logged(stack.data_dir / "logs")
        for row, end in zip(rows, ends, strict=True):
            window_end = min(row["at"] + config.host_window_seconds, end)
            row.update(stored_figures(row["at"], stored, window_end))
            if row["held_leader"]:
                # The standby's own log line: the harness's KV watch may go with a host.
                taken = next((t for t in takeovers if t > row["at"]), None)
                row["lease_taken_seconds"] = _after(taken, row["at"])
    report = build_report(
        config=chaos,
        plan=[],
        t0=t0,
        submissions=submissions,
        actions=actions,
        records=records,
        webhooks=_read_webhooks(receiver_file),
        receiver_duplicates=await _receiver_duplicates(stack.url("receiver")),
        mig_slices=_mig_slices(fleet),
        drained=drained,
        silent_observed={},
    )
    report["config"] = {**asdict(config), "database_url": "(see chaos config)"}
    report["mode"] = config.mode
    report["start"] = start
    report["epochs"] = epoch_order(bus.grants)
    report["failover"] = summarise(rows, config.mode)
    report["failover"]["kills"] = rows
    report["grant_times"] = [ts - t0 for ts, _ in bus.grants]
    if hosted:
        report["stored_grant_times"] = [ts - t0 for ts in stored]
        report["placement"] = placement
    report["t0"] = t0
    report["actions"] = [asdict(a) for a in actions]
    report["lease_writes"] = len(bus.lease_writes)
    report["checks"].update(failover_checks(report))
    return report


async def _metrics(stack: Stack, name: str) -> tuple[bool, int | None] | None:
    """(leading, epoch) from a scheduler's /metrics; None when it does not answer."""
    process = stack.processes.get(name)
    if process is None or process.popen.poll() is not None:
        return None
    try:
        async with httpx.AsyncClient(timeout=1.0) as client:
            text = (await client.get(f"{process.url}/metrics")).text
    except httpx.HTTPError:
        return None
    leading = _LEADING.search(text)
    epoch = _EPOCH.search(text)
    value = float(epoch.group(1)) if epoch else 0.0
    return (
        bool(leading and float(leading.group(1)) == 1.0),
        int(value) if value and not math.isnan(value) else None,
    )


async def _leaders(stack: Stack) -> dict[str, int | None]:
    """The schedulers that say they lead, with their epochs."""
    found = {}
    for name in SCHEDULERS:
        answer = await _metrics(stack, name)
        if answer is not None and answer[0]:
            found[name] = answer[1]
    return found


async def _the_leader(stack: Stack, timeout: float = 30.0) -> tuple[str, int | None]:
    deadline = time.monotonic() + timeout
    while True:
        leaders = await _leaders(stack)
        if len(leaders) == 1:
            return next(iter(leaders.items()))
        if time.monotonic() > deadline:
            raise TimeoutError(f"not one leader after {timeout} s: {leaders}")
        await asyncio.sleep(0.2)


async def _kill_leader(
    stack: Stack, config: FailoverConfig, bus: Bus, actions: list[Action], n: int
) -> dict[str, Any]:
    leader, epoch = await _the_leader(stack)
    standby = next(name for name in SCHEDULERS if name != leader)
    at = time.time()
    await asyncio.to_thread(stack.kill, leader)
    row: dict[str, Any] = {"n": n + 1, "killed": leader, "old_epoch": epoch}
    # Poll the standby: when it says it leads (the fence claimed, the state loaded, consuming).
    leading_at = None
    deadline = at + config.wait_seconds
    while time.time() < deadline:
        if leading_at is None:
            answer = await _metrics(stack, standby)
            if answer is not None and answer[0]:
                leading_at, row["new_epoch"] = time.time(), answer[1]
        if leading_at is not None and bus.first_grant_after(at, epoch) is not None:
            break
        await asyncio.sleep(0.05)
    taken = next((ts for ts, value in bus.lease_writes if ts > at and not value.get("epoch")), None)
    granted = bus.first_grant_after(at, epoch)
    row.update(
        {
            "lease_taken_seconds": _after(taken, at),
            "leading_seconds": _after(leading_at, at),
            "next_allocation_seconds": _after(granted, at),
            "next_any_allocation_seconds": _after(bus.first_grant_after(at), at),
        }
    )
    await asyncio.sleep(config.down_seconds)
    restarting = time.monotonic()
    error = None
    try:
        await asyncio.to_thread(_restart, stack, leader)
    except (RuntimeError, TimeoutError, OSError) as failure:
        error = str(failure)[-500:]
    row["restart_seconds"] = round(time.monotonic() - restarting, 2)
    actions.append(
        Action("kill", "scheduler", at - bus.t0, at, row["restart_seconds"], error=error)
    )
    back = await _metrics(stack, leader)
    row["back_as_standby"] = back is not None and not back[0]
    # Steady: the new leader has granted since the restart.
    since = time.time()
    deadline = since + config.wait_seconds
    with contextlib.suppress(TimeoutError):
        await bus.grant_after(since, deadline - time.time())
    return row


async def _kill_nats_server(
    stack: Stack, config: FailoverConfig, bus: Bus, actions: list[Action], n: int
) -> dict[str, Any]:
    cluster = stack.nats_cluster
    assert cluster is not None
    index = n % len(cluster.servers)
    at = time.time()
    await asyncio.to_thread(cluster.kill, index)
    await asyncio.sleep(config.nats_down_seconds)
    restarting = time.monotonic()
    await asyncio.to_thread(cluster.restart, index)
    took = time.monotonic() - restarting
    actions.append(Action("nats-restart", "nats-server", at - bus.t0, at, took))
    # Placement around the kill: the longest gap between grants from 5 s before to 15 s after,
    # beside the longest in the 10 s before the kill (the load's own gaps).
    await asyncio.sleep(max(0.0, at + 15.0 - time.time()))
    times = [ts for ts, _ in bus.grants]
    around = _longest_gap(times, at - 5.0, at + 15.0)
    baseline = _longest_gap(times, at - 10.0, at)
    return {
        "n": n + 1,
        "killed": cluster.names[index],
        "next_allocation_seconds": _after(bus.first_grant_after(at), at),
        "longest_gap_seconds": around,
        "baseline_longest_gap_seconds": baseline,
        "restart_seconds": round(took, 2),
        "down_seconds": config.nats_down_seconds,
        "leaders_after": await _leaders(stack),
    }


class RoundRobin(httpx.AsyncBaseTransport):
    """Each request to the next of `urls` in turn (mode host: AllData's load balancer over
    the gateways, without health checks; the client's retry moves on to the next)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = [httpx.URL(url) for url in urls]
        self.turn = itertools.count()
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        target = self.urls[next(self.turn) % len(self.urls)]
        request.url = request.url.copy_with(host=target.host, port=target.port)
        request.headers["host"] = f"{target.host}:{target.port}"
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _placement(stack: Stack) -> dict[str, list[str]]:
    """Mode host: what runs on each host ({} without hosts)."""
    cluster = stack.nats_cluster
    if cluster is None or not cluster.hosts:
        return {}
    return {
        f"host-{i + 1}": [f"nats {cluster.names[i]}", *stack.on_host(i)]
        for i in range(len(cluster.hosts))
    }


async def _kill_host(
    stack: Stack, config: FailoverConfig, bus: Bus, actions: list[Action], n: int
) -> dict[str, Any]:
    """Kill a whole host (its nats-server and every service on it, SIGKILL, at once): the
    leader's on even kills, else one without the leader (each of those in turn); it stays
    down `host_down_seconds` and comes back (everything restarted) before the next kill."""
    cluster = stack.nats_cluster
    assert cluster is not None
    assert bus.connection is not None
    leader, epoch = await _the_leader(stack)
    leader_host = stack.processes[leader].host
    others = [i for i in range(len(cluster.hosts)) if i != leader_host]
    target = leader_host if n % 2 == 0 else others[(n // 2) % len(others)]
    assert target is not None
    held_leader = target == leader_host
    leaders_before = await _stream_leaders(bus.connection)
    survivors = [name for name in SCHEDULERS if stack.processes[name].host != target]
    at = time.time()
    killed = await asyncio.to_thread(stack.kill_host, target)
    row: dict[str, Any] = {
        "n": n + 1,
        "killed": f"host-{target + 1}",
        "at": at,
        "at_seconds": round(at - bus.t0, 2),
        "held_leader": held_leader,
        "processes": [f"nats {cluster.names[target]}", *killed],
        "old_leader": leader,
        "old_epoch": epoch,
        # The streams (and KV buckets) whose raft leader was on the lost host: each must
        # elect another before it takes a write.
        "stream_leaders_on_host": sorted(
            name for name, at_server in leaders_before.items() if at_server == cluster.names[target]
        ),
    }
    # While it is down: when a surviving scheduler leads with a newer epoch (the leader's host
    # lost), and the next grant heard (of that newer epoch).
    leading_at = None
    above = epoch if held_leader else None
    deadline = at + config.wait_seconds
    while time.time() < deadline:
        if held_leader and leading_at is None:
            for name in survivors:
                answer = await _metrics(stack, name)
                if answer is not None and answer[0] and (answer[1] or 0) > (epoch or 0):
                    leading_at, row["new_epoch"] = time.time(), answer[1]
        done = (leading_at is not None or not held_leader) and bus.first_grant_after(
            at, above
        ) is not None
        if done and time.time() >= at + config.host_down_seconds:
            break
        await asyncio.sleep(0.05)
    taken = next((ts for ts, value in bus.lease_writes if ts > at and not value.get("epoch")), None)
    row.update(
        {
            "lease_taken_seconds": _after(taken, at),
            "leading_seconds": _after(leading_at, at),
            "heard_allocation_seconds": _after(bus.first_grant_after(at, above), at),
        }
    )
    await asyncio.sleep(max(0.0, at + config.host_down_seconds - time.time()))
    row["down_seconds"] = round(time.time() - at, 2)
    restarting = time.monotonic()
    error = None
    try:
        await asyncio.to_thread(_restart_host, stack, target)
    except (RuntimeError, TimeoutError, OSError) as failure:
        error = str(failure)[-500:]
    row["host_back_seconds"] = round(time.monotonic() - restarting, 2)
    if error:
        row["error"] = error
    actions.append(
        Action(
            "host-kill",
            f"host-{target + 1}",
            at - bus.t0,
            at,
            row["host_back_seconds"],
            error=error,
        )
    )
    # Steady again: every stream's replicas current (the restarted server caught up), a
    # leader, and a grant since.
    row["settled_seconds"] = await _settled(bus.connection, config.wait_seconds)
    row["leaders_after"] = await _leaders(stack)
    if held_leader:
        back = await _metrics(stack, leader)
        row["back_as_standby"] = back is not None and not back[0]
    since = time.time()
    with contextlib.suppress(TimeoutError):
        await bus.grant_after(since, config.wait_seconds)
    return row


def _restart_host(stack: Stack, index: int, tries: int = 3) -> None:
    for attempt in range(1, tries + 1):
        try:
            stack.restart_host(index)
            return
        except (RuntimeError, TimeoutError):
            if attempt == tries:
                raise


async def _stream_leaders(connection: Client) -> dict[str, str | None]:
    """Each stream's (and KV bucket's) raft leader, by server name; {} if not answered."""
    try:
        async with asyncio.timeout(3.0):
            infos = await connection.jetstream().streams_info()
    except Exception:
        return {}
    return {
        info.config.name or "?": info.cluster.leader if info.cluster else None for info in infos
    }


async def _settled(connection: Client, timeout: float) -> float | None:
    """Seconds until every stream has a leader and all its replicas current; None if not
    within `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            async with asyncio.timeout(3.0):
                infos = await connection.jetstream().streams_info()
            if infos and all(_current(info) for info in infos):
                return round(time.monotonic() - started, 2)
        except Exception:
            pass
        await asyncio.sleep(0.5)
    return None


def _current(info: Any) -> bool:
    cluster = info.cluster
    if cluster is None or cluster.leader is None:
        return False
    peers = cluster.replicas or []
    return len(peers) == (info.config.num_replicas or 1) - 1 and all(
        peer.current and not peer.offline for peer in peers
    )


_TAKING_OVER = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ WARNING crater\.leadership: "
    r"scheduler: the lease of .* lapsed .*: taking over$"
)


def takeovers_logged(log_dir: Path) -> list[float]:
    """When a scheduler wrote the lapsed lease as its own, from its log (local time)."""
    found = []
    for path in sorted(log_dir.glob("scheduler*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if match := _TAKING_OVER.match(line):
                when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                found.append(when.timestamp())
    return sorted(found)


def stored_figures(at: float, stored: list[float], window_end: float) -> dict[str, Any]:
    """Mode host, from when the allocation stream stored each grant (its consumers can act on
    it from then; a grant heard on the bus may not be stored yet while the stream elects): the
    next one after the kill, and the longest gap from 5 s before it to `window_end` (at most
    `host_window_seconds` after it; before the next kill and the load's end), beside the
    longest in the 10 s before (the load's own gaps)."""
    return {
        "next_allocation_seconds": _after(next((t for t in stored if t > at), None), at),
        "longest_gap_seconds": _longest_gap(stored, at - 5.0, window_end),
        "window_seconds": round(window_end - at, 2),
        "baseline_longest_gap_seconds": _longest_gap(stored, at - 10.0, at),
    }


def _after(ts: float | None, at: float) -> float | None:
    return None if ts is None else round(ts - at, 3)


def _longest_gap(times: list[float], start: float, end: float) -> float | None:
    """The longest time without a grant within [start, end] (its edges count as bounds)."""
    inside = sorted(t for t in times if start <= t <= end)
    if not inside:
        return None
    points = [start, *inside, end]
    return round(max(b - a for a, b in itertools.pairwise(points)), 3)


def epoch_order(grants: list[tuple[float, int | None]]) -> dict[str, Any]:
    """Grants as the bus delivered them: the epochs in runs (one epoch at a time), and any
    grant stamped with an epoch below one already seen (two leaders placing)."""
    runs: list[list[int]] = []  # [epoch, grants]
    backwards = unstamped = 0
    highest = 0
    for _, epoch in grants:
        if epoch is None:
            unstamped += 1
            continue
        if epoch < highest:
            backwards += 1
        highest = max(highest, epoch)
        if runs and runs[-1][0] == epoch:
            runs[-1][1] += 1
        else:
            runs.append([epoch, 1])
    return {
        "runs": [{"epoch": e, "grants": c} for e, c in runs],
        "epochs": len({e for e, _ in runs}),
        "grants_below_a_seen_epoch": backwards,
        "unstamped_grants": unstamped,
    }


def summarise(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    def stats(key: str) -> dict[str, Any]:
        values = [r[key] for r in rows if r.get(key) is not None]
        missing = len(rows) - len(values)
        if not values:
            return {"count": 0, "missing": missing}
        return {
            "count": len(values),
            "missing": missing,
            "p50": round(percentile(values, 50), 3),
            "p99": round(percentile(values, 99), 3),
            "max": round(max(values), 3),
            "min": round(min(values), 3),
        }

    if mode == "host":
        every = {key: stats(key) for key in HOST_KEYS}
        held = [r for r in rows if r.get("held_leader")]
        other = [r for r in rows if not r.get("held_leader")]
        for key in ("lease_taken_seconds", "leading_seconds"):  # the leader's host only
            every[key] = summarise(held, "leader")[key]
        for subset, part in ((held, "leader_host"), (other, "other_host")):
            for key in ("next_allocation_seconds", "longest_gap_seconds"):
                every[f"{key} ({part})"] = summarise(subset, "nats")[key]
        return every
    keys = (
        ("lease_taken_seconds", "leading_seconds", "next_allocation_seconds", "restart_seconds")
        if mode == "leader"
        else ("next_allocation_seconds", "longest_gap_seconds", "baseline_longest_gap_seconds")
    )
    return {key: stats(key) for key in keys}


HOST_KEYS = (
    "next_allocation_seconds",
    "longest_gap_seconds",
    "baseline_longest_gap_seconds",
    "heard_allocation_seconds",
    "lease_taken_seconds",
    "leading_seconds",
    "host_back_seconds",
    "settled_seconds",
)


def failover_checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    failover = report["failover"]
    epochs = report["epochs"]
    figures: dict[str, tuple[Any, bool]] = {
        "leaders_at_start": (len(report["start"]["leaders"]), len(report["start"]["leaders"]) == 1),
        "grants_below_a_seen_epoch": (
            epochs["grants_below_a_seen_epoch"],
            epochs["grants_below_a_seen_epoch"] == 0,
        ),
    }
    if report["mode"] == "leader":
        row = failover["next_allocation_seconds"]
        p99 = row.get("p99")
        figures["failover_p99_seconds"] = (
            p99,
            p99 is not None and p99 <= TARGET_SECONDS and row["missing"] == 0,
        )
        standby = sum(1 for k in failover["kills"] if k.get("back_as_standby"))
        figures["restarted_as_standby"] = (standby, standby == len(failover["kills"]))
    else:
        row = failover["longest_gap_seconds"]
        worst = row.get("max")
        name = "host_stall_max_seconds" if report["mode"] == "host" else "nats_stall_max_seconds"
        figures[name] = (
            worst,
            worst is not None and worst < TARGET_SECONDS and row["missing"] == 0,
        )
    if report["mode"] == "host":
        kills = failover["kills"]
        back = sum(1 for k in kills if not k.get("error") and k.get("settled_seconds") is not None)
        figures["hosts_back_and_settled"] = (back, back == len(kills))
        one = sum(1 for k in kills if len(k.get("leaders_after") or {}) == 1)
        figures["one_leader_after_each_kill"] = (one, one == len(kills))
        # Nothing refused on the way: an event dead-lettered (e.g. refused as a deposed
        # leader's) is one some service never acted on.
        dead = report["bus"]["dead_letters"]
        figures["dead_letters"] = (dead, dead == 0)
    return {name: {"value": value, "ok": ok} for name, (value, ok) in figures.items()}


def _row_text(row: dict[str, Any]) -> str:
    if "host_back_seconds" in row:
        what = "the leader's" if row["held_leader"] else "no leader,"
        return (
            f"{row['killed']} ({what} {', '.join(row['processes'])}; stream leaders "
            f"{len(row['stream_leaders_on_host'])}): next grant heard "
            f"{row['heard_allocation_seconds']} s, leading {row['leading_seconds']} s "
            f"(epoch {row['old_epoch']} -> {row.get('new_epoch')}); back in "
            f"{row['host_back_seconds']} s, settled {row['settled_seconds']} s later; "
            f"leaders {row['leaders_after']}"
        )
    if "longest_gap_seconds" in row:
        return (
            f"{row['killed']}: down {row['down_seconds']} s, next allocation "
            f"{row['next_allocation_seconds']} s, longest gap in grants "
            f"{row['longest_gap_seconds']} s (10 s before: {row['baseline_longest_gap_seconds']} s)"
        )
    return (
        f"{row['killed']} (epoch {row['old_epoch']}) -> epoch {row.get('new_epoch')}: lease taken "
        f"{row['lease_taken_seconds']} s, leading {row['leading_seconds']} s, next allocation "
        f"{row['next_allocation_seconds']} s; restarted in {row['restart_seconds']} s, "
        f"standby {row['back_as_standby']}"
    )


def failover_lines(report: dict[str, Any]) -> list[str]:
    lines = summary_lines(report)
    lines.append(f"  mode {report['mode']}; started at once, leading: {report['start']['leaders']}")
    for key, row in report["failover"].items():
        if key != "kills":
            lines.append(f"  {key}: {row}")
    epochs = report["epochs"]
    lines.append(
        f"  epochs on allocation.granted: {epochs['epochs']} in {len(epochs['runs'])} runs, "
        f"{epochs['grants_below_a_seen_epoch']} below a seen epoch, "
        f"{epochs['unstamped_grants']} unstamped"
    )
    verdict = ", ".join(
        f"{name} {c['value']} {'ok' if c['ok'] else 'FAIL'}" for name, c in report["checks"].items()
    )
    lines.append(f"  checks: {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    shipped = FailoverConfig()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover.run", description=__doc__)
    parser.add_argument("--mode", choices=MODES, default=shipped.mode)
    parser.add_argument("--kills", type=int, default=shipped.kills)
    parser.add_argument("--rate", type=float, default=shipped.rate)
    parser.add_argument("--seed", type=int, default=shipped.seed)
    parser.add_argument("--database-url", default=shipped.database_url)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for services")
    args = parser.parse_args(argv)
    service_env = dict(item.split("=", 1) for item in args.env)
    config = replace(
        shipped,
        mode=args.mode,
        kills=args.kills,
        rate=args.rate,
        seed=args.seed,
        database_url=args.database_url,
        service_env=service_env,
    )
    name = "failover" if args.mode == "leader" else f"failover_{args.mode}"
    out = args.out or Path("benchmarks/results") / f"{name}.json"
    report = run(
        config,
        args.data_dir
        or Path("var/failover") / f"{args.mode}-seed-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}",
        out=out,
        plot=None if args.no_plot else out.with_suffix(".png"),
    )
    return 0 if all(c["ok"] for c in report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
