"""Fault injection as it runs: a silent simulated node's heartbeats stop, then resume."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

from faststream import TestApp

from crater.contracts import NodeCondition, NodeHealthReported, NodeMetricsReported
from crater.probe.app import ProbeSettings, build
from crater.runtime.nats_server import NatsServer
from tests.support.events import EventTap

# Long enough that an event loop stalled for a second on a loaded machine (seen: 1.2 s) does
# not read as silence, nor a silence as a stall.
SILENT_AT, SILENT_FOR = 1.0, 4.0
SLACK = 1.0


async def test_a_silent_node_stops_its_heartbeat_and_resumes(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path
) -> None:
    fleet = tmp_path / "quiet.yaml"
    fleet.write_text(
        "seed: 3\nnodes:\n  - {profile: cpu-only, count: 2}\n"
        f"faults:\n  - {{node: cpu-02, kind: silent, at_seconds: {SILENT_AT}, "
        f"for_seconds: {SILENT_FOR}}}\n"
    )
    settings = ProbeSettings(
        nats_url=fresh_nats.url,
        mode="fleet",
        fleet_file=fleet,
        faults=True,
        metrics_interval_seconds=0.1,
        health_interval_seconds=0.1,
    )
    arrivals: dict[str, list[float]] = {"cpu-01": [], "cpu-02": []}
    _, app = build(settings)
    started = time.monotonic()
    async with TestApp(app):
        await tap.wait_for(NodeHealthReported, lambda h: h.node_id == "cpu-02")
        seen = 0
        deadline = started + SILENT_AT + SILENT_FOR + 20.0
        while time.monotonic() < deadline:
            health = tap.of(NodeHealthReported)
            for report in health[seen:]:
                arrivals[report.node_id].append(time.monotonic() - started)
            seen = len(health)
            late = [t for t in arrivals["cpu-02"] if t > SILENT_AT + SILENT_FOR + 0.5]
            if len(late) >= 3:
                break
            await asyncio.sleep(0.02)
    quiet = arrivals["cpu-02"]
    assert len([t for t in quiet if t > SILENT_AT + SILENT_FOR + 0.5]) >= 3, quiet  # resumed
    gaps = [b - a for a, b in itertools.pairwise(quiet)]
    # Heartbeats every 0.1 s, but none for (nearly) the whole silent window.
    assert max(gaps) >= SILENT_FOR - SLACK, gaps
    # The other node kept its heartbeat all along, and both were Ready when they spoke.
    steady = arrivals["cpu-01"]
    assert max(b - a for a, b in itertools.pairwise(steady)) < SILENT_FOR - SLACK
    assert {h.condition for h in tap.of(NodeHealthReported)} == {NodeCondition.READY}
    # No metrics from the silent node during its window either (allowing for the round in
    # flight when it fell silent).
    assert len(tap.of(NodeMetricsReported, lambda m: m.node_id == "cpu-02")) < len(
        tap.of(NodeMetricsReported, lambda m: m.node_id == "cpu-01")
    )
