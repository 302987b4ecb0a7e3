"""diagnose reads the running system, webhooks replay asks first, --json and piped output
(issue #23, the CLI)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from crater.callback.adapters.records import DeliveryRow
from crater.cli import errors, hardware, jetstream, webhooks
from crater.cli.main import app
from crater.contracts import HealthCheck, NodeCondition, NodeHealthReported

runner = CliRunner()


def report(condition: NodeCondition) -> NodeHealthReported:
    return NodeHealthReported(
        node_id="gpu-07",
        condition=condition,
        score=40,
        checks=[HealthCheck(name="gpu-xid", passed=False, detail="Xid 79 on GPU 3")],
    )


def test_diagnose_a_node_reads_its_latest_report_from_the_running_crater(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def latest(nats_url: str, work: Any) -> NodeHealthReported:
        asked.append(nats_url)
        return report(NodeCondition.DEGRADED)

    monkeypatch.setattr(hardware, "on_jetstream", latest)
    result = runner.invoke(app, ["diagnose", "--node", "gpu-07", "--nats-url", "nats://x:1"])
    assert result.exit_code == 0, result.output
    assert asked == ["nats://x:1"]
    assert "Xid 79 on GPU 3" in result.output
    assert "gpu-07: Degraded, health score 40/100 (as its probe reported" in result.output
    as_json = runner.invoke(app, ["diagnose", "--node", "gpu-07", "--json"])
    assert json.loads(as_json.stdout)["checks"][0]["name"] == "gpu-xid"
    monkeypatch.setattr(hardware, "on_jetstream", lambda url, work: report(NodeCondition.NOT_READY))
    assert runner.invoke(app, ["diagnose", "--node", "gpu-07"]).exit_code == errors.NO
    monkeypatch.setattr(hardware, "on_jetstream", lambda url, work: None)
    missing = runner.invoke(app, ["diagnose", "--node", "gpu-07"])
    assert missing.exit_code == errors.NO
    assert "no health report from node 'gpu-07'" in missing.output


def test_diagnose_without_nats_says_so_and_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jetstream, "CONNECT_SECONDS", 1.0)
    result = runner.invoke(
        app, ["diagnose", "--node", "gpu-07", "--nats-url", "nats://127.0.0.1:9"]
    )
    assert result.exit_code == errors.UNREACHABLE
    assert "cannot reach NATS at nats://127.0.0.1:9" in result.output


def row(delivery_id: int) -> DeliveryRow:
    now = datetime.now(UTC)
    return DeliveryRow(
        id=delivery_id,
        webhook_id=f"w{delivery_id}",
        endpoint="https://alldata.example/hook",
        task_id=f"t{delivery_id}",
        task_status="succeeded",
        event_type="task.ended",
        state="dead",
        attempts=20,
        round=0,
        last_status_code=503,
        last_error=None,
        created_at=now,
        updated_at=now,
        next_attempt_at=None,
    )


class FakeLog:
    def __init__(self, rows: list[DeliveryRow]) -> None:
        self.rows, self.replayed = rows, 0

    async def to_replay(self, since: datetime, **filters: Any) -> list[DeliveryRow]:
        return self.rows

    async def replay(self, since: datetime, attempts: int, **filters: Any) -> int:
        self.replayed += 1
        return len(self.rows)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> FakeLog:
    fake = FakeLog([row(1), row(2)])

    def run(database_url: str, work: Any) -> Any:
        import asyncio

        return asyncio.run(work(fake))

    monkeypatch.setattr(webhooks, "_run", run)
    return fake


def test_replay_shows_what_it_would_send_and_asks(log: FakeLog) -> None:
    declined = runner.invoke(app, ["webhooks", "replay", "--since", "2h"], input="n\n")
    assert "t1" in declined.output
    assert "t2" in declined.output
    assert log.replayed == 0
    # CliRunner's stdin is not a terminal: without --yes it refuses, saying so
    assert declined.exit_code == errors.USAGE
    assert "pass --yes" in declined.output
    sent = runner.invoke(app, ["webhooks", "replay", "--since", "2h", "--yes"])
    assert sent.exit_code == 0, sent.output
    assert log.replayed == 1
    assert "2 deliveries since" in sent.output


def test_replay_with_nothing_to_send_sends_nothing(log: FakeLog) -> None:
    log.rows = []
    result = runner.invoke(app, ["webhooks", "replay", "--since", "2h", "--yes"])
    assert result.exit_code == errors.NO
    assert log.replayed == 0


def test_piped_tables_are_plain_columns_never_cut(log: FakeLog) -> None:
    long_error = "connection reset " * 20
    log.rows = [replace(row(1), last_error=long_error, last_status_code=None)]

    async def listing(**filters: Any) -> list[DeliveryRow]:
        return log.rows

    log.list = listing  # type: ignore[attr-defined]
    result = runner.invoke(app, ["webhooks", "list"])
    lines = result.stdout.splitlines()
    assert lines[0].split("\t")[:3] == ["id", "task", "status"]
    assert lines[1].split("\t")[1] == "t1"
    assert long_error.strip() in lines[1]


def test_topology_png_without_graphviz_says_so_before_printing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(hardware.shutil, "which", lambda name: None)
    result = runner.invoke(app, ["topology-export", "--png", str(tmp_path / "t.png")])
    assert result.exit_code == errors.USAGE
    assert result.stdout == ""
    assert "apt-get install graphviz" in result.output
