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
from crater.cli import errors, hardware, jetstream, topology_png, webhooks
from crater.cli.main import app
from crater.contracts import HealthCheck, NodeCondition, NodeHealthReported
from crater.gateway.console.topology import Drawing, Text

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


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), data[:8]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # IHDR


def test_topology_png_is_drawn_without_graphviz(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` anywhere
    png = tmp_path / "a100.png"
    result = runner.invoke(app, ["topology-export", "--node", "a100-01", "--png", str(png)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("graph ")  # the DOT text, as without --png
    width, height = _png_size(png)
    assert f"wrote {png} ({width}x{height} px)" in result.output.replace("\n", "")
    assert 600 <= width <= topology_png.MAX_WIDTH
    assert 300 <= height <= 2000


def test_a_wide_topology_is_drawn_smaller_not_wider(tmp_path: Path) -> None:
    wide = Drawing("wide", 5000, 400, [Text(20, 24, "eight NUMA nodes")])
    assert topology_png.paint(wide, tmp_path / "w.png") == (2400, 192)
    assert _png_size(tmp_path / "w.png") == (2400, 192)


def test_tasks_show_a_waiting_tasks_place_and_estimated_start_in_the_last_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from crater.cli import gateway
    from crater.contracts import TasksAnswer, TaskStatus, TaskSummary, TaskType

    now = datetime(2026, 1, 1, 12, tzinfo=UTC)

    def task(task_id: str, **fields: Any) -> TaskSummary:
        base: dict[str, Any] = {
            "task_id": task_id,
            "task_type": TaskType.TRAINING,
            "status": TaskStatus.PENDING,
            "pool": "training",
            "tenant": "search",
            "priority": 500,
            "gpus": 8,
            "reason": "kept for big",
            "submitted_at": now,
            "updated_at": now,
        }
        return TaskSummary(**{**base, **fields})

    answer = TasksAnswer(
        tasks=[
            task("next", queue_position=1, estimated_start_at=now.replace(hour=14)),
            task("later", queue_position=2),  # no estimate
            task("placed", status=TaskStatus.RUNNING, node="a100-01", reason=None),
        ]
    )
    monkeypatch.setattr(
        gateway, "call", lambda *_, **__: SimpleNamespace(content=answer.model_dump_json())
    )
    result = runner.invoke(app, ["tasks"])
    assert result.exit_code == 0, result.output
    header, *rows = (line.split("\t") for line in result.stdout.splitlines())
    assert header[7:] == ["why", "queue"]  # why stays column 8 (`cut -f 8`)
    assert [r[8] for r in rows] == ["#1, ~2026-01-01 14:00:00Z", "#2, ?", ""]
