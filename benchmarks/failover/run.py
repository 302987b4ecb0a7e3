"""The failover benchmark: two schedulers (a leader and a hot standby) on one database, the rest
of Crater beside them, tasks at a steady rate through the gateway; again and again, `kill -9`
of the leader (found by its /metrics `crater_leader 1`), the time from the kill to the next
`allocation.granted` on the bus measured, the killed one restarted (it comes back a standby).
Mode `nats`: the same load on a 3-server NATS cluster, one server killed (-9) and restarted at
a time, the longest gap in allocations around each kill measured. Then the chaos analysis
(`benchmarks.chaos`) of what AllData was told: lost tasks, GPUs double-booked, false failures,
a terminal webhook for every task.

`python -m benchmarks.failover.run --help`; `run(config, data_dir)` from Python (the short
version in `make test`). Results: benchmarks/results/failover[_nats].json and a PNG.
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
_EPOCH = re.compile(r"^crater_leader_epoch\s+(\S+)$", re.MULTILINE)
_LEADING = re.compile(r"^crater_leader\s+(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class FailoverConfig:
    mode: str = "leader"  # leader: kill the leader scheduler | nats: kill one NATS server
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

    granted: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_grant(self, msg: Msg) -> None:
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
        while True:
            try:
                kv = await connection.jetstream().key_value(LEASE_BUCKET)
                watcher = await kv.watch(LEASE_KEY)
                while True:
                    try:
                        entry = await watcher.updates(timeout=5.0)
                    except nats.errors.TimeoutError:
                        continue
                    if entry is None:
                        continue  # the watch's "caught up" marker
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
        stack = Stack(
            data_dir=data_dir,
            env={"CRATER_DATABASE_URL": url},
            nats_servers=3 if config.mode == "nats" else 1,
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
    nats_note = "a 3-server NATS cluster" if config.mode == "nats" else "one nats-server"
    echo(f"  starting {nats_note}, {', '.join(SERVICES)} (scheduler x2) under {stack.data_dir}/")
    # Both schedulers are spawned at the same moment: they race for the lease.
    await asyncio.to_thread(stack.start, SERVICES, env, replicas={"scheduler": 2})
    gateway, headers = stack.url("gateway"), stack.auth_headers
    fleet = _fleet()
    pools = await _wait_for_fleet(gateway, headers, expected=len(fleet.nodes))
    start = {"leaders": await _leaders(stack)}
    echo(f"  started at once, leading: {start['leaders']}")
    bus = Bus()
    seeds = stack.nats_url.split(",")
    connection = await nats.connect(
        seeds, max_reconnect_attempts=-1, error_cb=_quiet, reconnect_time_wait=0.2
    )
    await connection.subscribe(GRANTED, cb=bus.on_grant)
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
    async with httpx.AsyncClient(base_url=gateway, timeout=10, headers=headers) as client:
        submitting = asyncio.create_task(
            _submit_all(client, bodies, config.rate, t0, submissions, stop)
        )
        try:
            await asyncio.sleep(config.warmup_seconds)
            kill = _kill_leader if config.mode == "leader" else _kill_nats_server
            rng = random.Random(f"failover:{config.seed}")
            for n in range(config.kills):
                await asyncio.sleep(config.steady_seconds + rng.uniform(0, config.jitter_seconds))
                row = await kill(stack, config, bus, actions, n)
                rows.append(row)
                echo(f"  {time.time() - t0:7.1f} s  kill {n + 1}/{config.kills}: {_row_text(row)}")
        finally:
            stop.set()
            await submitting
        accepted = [s.task_id for s in submissions.values() if s.accepted]
        chaos = config.chaos(len(submissions))
        drained = await _drain(receiver_file, accepted, chaos, t0, echo)
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    await connection.close()
    records = await _read_streams(seeds)
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

    keys = (
        ("lease_taken_seconds", "leading_seconds", "next_allocation_seconds", "restart_seconds")
        if mode == "leader"
        else ("next_allocation_seconds", "longest_gap_seconds", "baseline_longest_gap_seconds")
    )
    return {key: stats(key) for key in keys}


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
        figures["nats_stall_max_seconds"] = (
            worst,
            worst is not None and worst < TARGET_SECONDS and row["missing"] == 0,
        )
    return {name: {"value": value, "ok": ok} for name, (value, ok) in figures.items()}


def _row_text(row: dict[str, Any]) -> str:
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
    parser.add_argument("--mode", choices=("leader", "nats"), default=shipped.mode)
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
    name = "failover" if args.mode == "leader" else "failover_nats"
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
