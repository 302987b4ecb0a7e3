"""The failover benchmark, short (`python -m benchmarks.failover.run` is the full one): two
schedulers started at the same moment on one database (SQLite), tasks through the gateway,
the leader killed (-9) three times under load and restarted as the standby. Exactly one
leads, grants carry one epoch at a time, never a lower one after a higher; each takeover is
measured; nothing is lost or double-booked (the chaos analysis)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.failover.run import FailoverConfig, failover_lines, run
from tests.support.parallel import HEAVY_STACK

pytestmark = [pytest.mark.e2e, HEAVY_STACK]

KILLS = 3


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir = tmp_path_factory.mktemp("failover")
    config = FailoverConfig(
        kills=KILLS,
        rate=2.0,
        task_seconds=(2.0, 6.0),
        database_url=f"sqlite+aiosqlite:///{data_dir / 'crater.db'}",
        warmup_seconds=6.0,
        steady_seconds=1.0,
        jitter_seconds=0.5,
        drain_seconds=40.0,
        settle_seconds=2.0,
    )
    return run(config, data_dir / "run", out=data_dir / "failover.json", echo=print)


def test_two_schedulers_started_at_once_never_both_place(report: dict[str, Any]) -> None:
    summary = "\n".join(failover_lines(report))
    assert len(report["start"]["leaders"]) == 1, summary
    epochs = report["epochs"]
    assert epochs["grants_below_a_seen_epoch"] == 0, summary
    assert epochs["unstamped_grants"] == 0, summary
    # One epoch at a time: each takeover starts a new run, never back to an older one.
    runs = [r["epoch"] for r in epochs["runs"]]
    assert runs == sorted(set(runs)), summary
    assert len(runs) <= KILLS + 1, summary
    assert report["allocations"]["double_booked_events"] == 0, summary


def test_leader_kills_fail_over_and_lose_nothing(report: dict[str, Any]) -> None:
    summary = "\n".join(failover_lines(report))
    kills = report["failover"]["kills"]
    assert len(kills) == KILLS, summary
    for row in kills:
        assert row["next_allocation_seconds"] is not None, summary
        assert row["new_epoch"] is not None, summary
        assert row["new_epoch"] > row["old_epoch"], summary
        assert row["back_as_standby"], summary
    # A lease lapse (2 s) and a takeover; the loaded test machine gets slack over the 3 s.
    assert report["failover"]["next_allocation_seconds"]["max"] < 10.0, summary
    assert report["lifecycle"]["lost"] == 0, summary
    assert report["allocations"]["double_booked_events"] == 0, summary
    assert report["false_failures"]["false_failures"] == 0, summary
    per_task = report["lifecycle"]["terminal_webhooks_per_task"]
    assert per_task == {"1": report["submissions"]["accepted"]}, summary
