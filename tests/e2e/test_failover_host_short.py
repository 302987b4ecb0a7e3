"""The failover benchmark's host mode, short (`python -m benchmarks.failover.run --mode host`
is the full one): three hosts (network namespaces), each with a nats-server of the cluster
and a share of the services, the two schedulers on different hosts; under load the leader's
host is lost whole (SIGKILL of its nats-server and every service on it at once), then
brought back. The standby takes over with a newer epoch, allocations resume, the host comes
back with its scheduler as the standby; nothing is lost, double-booked or failed falsely,
and every task gets its one terminal webhook. Needs root (`ip netns`); skipped otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.failover.run import FailoverConfig, failover_lines, run
from crater.runtime.nats_cluster import netns_permitted
from tests.support.parallel import HEAVY_STACK

NETNS_REFUSED = netns_permitted()

pytestmark = [
    pytest.mark.e2e,
    HEAVY_STACK,
    pytest.mark.skipif(NETNS_REFUSED is not None, reason=f"no hosts: {NETNS_REFUSED}"),
]

# The leader's host lost: the lease lapse (2 s) and, when that host led the lease bucket's or
# the streams' raft groups, their election (nats-server's 4-9 s); slack for a loaded machine.
STALL_BOUND_SECONDS = 30.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir = tmp_path_factory.mktemp("failover-host")
    config = FailoverConfig(
        mode="host",
        kills=1,
        rate=2.0,
        task_seconds=(2.0, 6.0),
        database_url=f"sqlite+aiosqlite:///{data_dir / 'crater.db'}",
        warmup_seconds=6.0,
        steady_seconds=0.5,
        jitter_seconds=0.5,
        host_down_seconds=3.0,
        host_window_seconds=20.0,
        # A message a lost callback replica had taken goes to the other after JetStream's
        # ack wait (30 s): a webhook may come that late. The drain ends once all are in.
        drain_seconds=90.0,
        settle_seconds=2.0,
    )
    return run(config, data_dir / "run", out=data_dir / "failover_host.json", echo=print)


def test_losing_the_leaders_host_fails_over_and_loses_nothing(report: dict[str, Any]) -> None:
    summary = "\n".join(failover_lines(report))
    assert len(report["start"]["leaders"]) == 1, summary
    [row] = report["failover"]["kills"]
    assert row["held_leader"], summary
    assert row["old_leader"] in row["processes"], summary
    assert any(p.startswith("nats ") for p in row["processes"]), summary
    assert row["new_epoch"] is not None, summary
    assert row["new_epoch"] > row["old_epoch"], summary
    assert row["next_allocation_seconds"] is not None, summary
    assert row["next_allocation_seconds"] < STALL_BOUND_SECONDS, summary
    assert "error" not in row, summary
    assert row["settled_seconds"] is not None, summary
    assert row["back_as_standby"], summary
    assert len(row["leaders_after"]) == 1, summary
    epochs = report["epochs"]
    assert epochs["grants_below_a_seen_epoch"] == 0, summary
    assert epochs["unstamped_grants"] == 0, summary
    assert report["lifecycle"]["lost"] == 0, summary
    assert report["allocations"]["double_booked_events"] == 0, summary
    assert report["false_failures"]["false_failures"] == 0, summary
    assert report["bus"]["dead_letters"] == 0, summary  # e.g. an event refused as stale
    per_task = report["lifecycle"]["terminal_webhooks_per_task"]
    assert per_task == {"1": report["submissions"]["accepted"]}, summary
