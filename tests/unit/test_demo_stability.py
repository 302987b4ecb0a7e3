"""The demo stability report counts what AllData heard, minute by minute."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.demo.stability import analyse


def line(webhook_id: str, second: int, task_id: str, status: str, **extra: object) -> str:
    body = {"task_id": task_id, "status": status, **extra}
    received = f"2026-12-01T10:{second // 60:02d}:{second % 60:02d}+00:00"
    return json.dumps({"webhook_id": webhook_id, "received_at": received, "body": body})


def test_minutes_rates_ends_and_repeats(tmp_path: Path) -> None:
    webhooks = tmp_path / "webhooks.jsonl"
    webhooks.write_text(
        "\n".join(
            [
                line("a", 0, "t1", "pending"),
                line("b", 10, "t1", "scheduled"),
                line("c", 20, "t2", "rejected"),
                line("c", 21, "t2", "rejected"),  # the same webhook again
                line("d", 70, "t1", "succeeded"),
                line("e", 75, "t3", "scheduled"),
                line("f", 80, "t1", "rejected", duplicate_submission=True),
            ]
        )
    )
    report = analyse(webhooks)
    assert report["repeated_deliveries"] == 1
    assert report["tasks_by_terminal_webhooks"] == {"0": 1, "1": 2}
    first, second = report["minutes"]
    assert (first["scheduled"], first["rejected"], first["rejection_rate"]) == (1, 1, 1.0)
    assert (second["succeeded"], second["rejected"], second["duplicates_refused"]) == (1, 0, 1)
    assert second["rejection_rate"] == 0.0  # a refused resubmission is no task's end
