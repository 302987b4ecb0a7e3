"""Local mode against a recorded host tree over a real nats-server: re-discovery publishes a
changed topology at once and only then, and the full measurement goes out with the topology."""

from __future__ import annotations

import asyncio
from pathlib import Path

from faststream import TestApp

from crater.contracts import NodeHealthReported, NodeTopologyReported
from crater.probe.app import ProbeSettings, build
from crater.runtime.nats_server import NatsServer
from tests.support.events import EventTap
from tests.unit.probe.recorded import dual_socket_tree, write_tree


def settings(nats: NatsServer, root: Path, **overrides: object) -> ProbeSettings:
    return ProbeSettings(
        nats_url=nats.url,
        mode="local",
        host_root=root,
        node_id="box-07",
        metrics_interval_seconds=0.2,
        health_interval_seconds=0.2,
        discovery_interval_seconds=0.2,
        **overrides,  # type: ignore[arg-type]
    )


async def test_a_hardware_change_is_published_at_once_and_nothing_else_is(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path
) -> None:
    root = dual_socket_tree(tmp_path / "host")
    service, app = build(settings(fresh_nats, root))
    async with TestApp(app):
        [first] = await tap.wait_for(NodeTopologyReported)
        assert {d.name for d in first.node.disks} == {"nvme0n1", "sda", "sdb"}
        # Several re-discoveries of unchanged hardware: nothing new goes out.
        await tap.wait_for(NodeHealthReported, count=4)
        await asyncio.sleep(0.6)
        assert len(tap.of(NodeTopologyReported)) == 1
        # A new NVMe drive appears, all at once (a half-written device is another topology).
        staging = tmp_path / "staging"
        write_tree(
            staging,
            {
                "nvme1n1/size": "7501476528\n",
                "nvme1n1/queue/rotational": "0\n",
                "nvme1n1/device/device/numa_node": "0\n",
            },
        )
        (staging / "nvme1n1").rename(root / "sys" / "block" / "nvme1n1")
        [_, changed] = await tap.wait_for(NodeTopologyReported, count=2)
        assert changed.node.fingerprint != first.node.fingerprint
        assert "nvme1n1" in {d.name for d in changed.node.disks}
        await asyncio.sleep(0.6)
        assert len(tap.of(NodeTopologyReported)) == 2
    rounds = service.registry.get_sample_value(
        "crater_probe_round_seconds_count", {"kind": "discovery"}
    )
    assert rounds is not None
    assert rounds >= 3


async def test_full_measurement_is_published_with_the_topology(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path
) -> None:
    root = dual_socket_tree(tmp_path / "host")
    (root / "data").mkdir()  # nvme0n1p1's mount point in the recorded /proc/mounts
    probe = settings(
        fresh_nats,
        root,
        full_measurement=True,
        measure_seconds=0.05,
        measure_disk_file_mb=1,
        measure_memory_mb=1,
    )
    _, app = build(probe)
    async with TestApp(app):
        [plain, measured] = await tap.wait_for(NodeTopologyReported, count=2, timeout=30)
        assert all(n.memory_bandwidth_gbps is None for n in plain.node.numa_nodes)
        bandwidths = [n.memory_bandwidth_gbps for n in measured.node.numa_nodes]
        # The recorded host's CPUs 0-15: at least one node's are ours to pin to.
        assert any(b is not None and b > 0 for b in bandwidths)
        disks = {d.name: d for d in measured.node.disks}
        nvme = disks["nvme0n1"]
        assert nvme.random_read_iops is not None
        assert nvme.random_read_iops > 0
        assert nvme.read_latency_us_p99 is not None
        assert disks["sdb"].random_read_iops is None  # its mount point is not in the tree
        assert measured.node.fingerprint == plain.node.fingerprint
        health = (await tap.wait_for(NodeHealthReported))[-1]
        wear = {c.name: c for c in health.checks}["disk-wear"]
        assert wear.passed
        assert "not readable" in wear.detail
    assert list((root / "data").iterdir()) == []
