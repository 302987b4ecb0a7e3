"""Does `crater up` keep placing its workloads as in its first minutes? Runs the demo (or reads
a finished demo's webhooks) and prints, per minute, the tasks AllData heard placed, rejected,
failed and succeeded, the rejection rate, and the `pending` webhooks per task.

    python benchmarks/demo/stability.py --minutes 30            # runs `crater up` itself
    python benchmarks/demo/stability.py --webhooks var/demo/webhooks.jsonl   # reads a run

The demo runs with its shipped defaults (`crater up`: 1 task/s, seed 7). Figures go to
benchmarks/results/demo_stability.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "demo_stability.json"
TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}


def run_demo(minutes: float, data_dir: Path) -> Path:
    """`crater up` for `minutes`, its output shown as it goes; the webhooks file it wrote."""
    command = ["crater", "up", "--duration", str(minutes * 60), "--data-dir", str(data_dir)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return data_dir / "webhooks.jsonl"


def analyse(webhooks: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in webhooks.read_text().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"{webhooks}: no webhooks")
    start = min(datetime.fromisoformat(r["received_at"]) for r in records)
    per_minute: dict[int, Counter[str]] = defaultdict(Counter)
    told: dict[str, list[str]] = defaultdict(list)
    seen_ids: set[str] = set()
    repeats = 0
    for record in records:
        if record["webhook_id"] in seen_ids:
            repeats += 1  # the same webhook again (at-least-once HTTP): counted once
            continue
        seen_ids.add(record["webhook_id"])
        body = record["body"]
        minute = int((datetime.fromisoformat(record["received_at"]) - start).total_seconds() // 60)
        if body.get("duplicate_submission"):  # a refused resubmission, not a task's end
            per_minute[minute]["duplicate"] += 1
            continue
        per_minute[minute][body["status"]] += 1
        told[body["task_id"]].append(body["status"])
    minutes = []
    for minute in sorted(per_minute):
        counts = per_minute[minute]
        ended = sum(counts[s] for s in TERMINAL)
        minutes.append(
            {
                "minute": minute,
                "scheduled": counts["scheduled"],
                "succeeded": counts["succeeded"],
                "failed": counts["failed"],
                "rejected": counts["rejected"],
                "pending": counts["pending"],
                "duplicates_refused": counts["duplicate"],
                "rejection_rate": round(counts["rejected"] / ended, 3) if ended else 0.0,
            }
        )
    ends = Counter(sum(s in TERMINAL for s in statuses) for statuses in told.values())
    pendings = sorted(statuses.count("pending") for statuses in told.values())
    return {
        "webhooks": webhooks.as_posix(),
        "tasks": len(told),
        "repeated_deliveries": repeats,
        "tasks_by_terminal_webhooks": {str(k): v for k, v in sorted(ends.items())},
        "pending_per_task_max": pendings[-1] if pendings else 0,
        "minutes": minutes,
    }


def show(report: dict[str, Any]) -> None:
    print(
        f"{report['tasks']} tasks; terminal webhooks per task: "
        f"{report['tasks_by_terminal_webhooks']}; most pending to one task: "
        f"{report['pending_per_task_max']}; repeated deliveries: "
        f"{report['repeated_deliveries']}"
    )
    print(
        f"{'minute':>6} {'placed':>7} {'done':>5} {'failed':>7} {'rejected':>9} {'pending':>8} "
        f"{'rejected %':>10}"
    )
    for m in report["minutes"]:
        print(
            f"{m['minute']:>6} {m['scheduled']:>7} {m['succeeded']:>5} {m['failed']:>7} "
            f"{m['rejected']:>9} {m['pending']:>8} {100 * m['rejection_rate']:>9.1f}%"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--data-dir", type=Path, default=Path("var/demo-stability"))
    parser.add_argument("--webhooks", type=Path, help="analyse this file instead of running")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    webhooks = args.webhooks or run_demo(args.minutes, args.data_dir)
    report = analyse(webhooks)
    show(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
