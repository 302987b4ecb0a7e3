"""The failover benchmark's figure: per kill, kill -> lease taken -> leading -> next allocation
(leader mode), or the longest gap in allocations around each NATS server kill (nats mode) or
host kill (host mode: the leader's host circled), with p50, p99 and the 3 s target."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

TARGET_SECONDS = 3.0


def plot_failover(report: dict[str, Any], out: Path) -> None:
    rows = report["failover"]["kills"]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7))
    xs = [r["n"] for r in rows]
    if report["mode"] == "leader":
        series = (
            ("lease_taken_seconds", "lease taken (KV write)", "tab:blue"),
            ("leading_seconds", "standby says it leads (/metrics)", "tab:orange"),
            ("next_allocation_seconds", "next allocation (new epoch)", "tab:red"),
        )
        key = "next_allocation_seconds"
    elif report["mode"] == "host":
        series = (
            ("next_allocation_seconds", "next allocation stored after the kill", "tab:blue"),
            ("heard_allocation_seconds", "next grant heard on the bus", "tab:cyan"),
            ("longest_gap_seconds", "longest gap in stored allocations around it", "tab:red"),
            ("baseline_longest_gap_seconds", "longest gap in the 10 s before", "tab:gray"),
        )
        key = "longest_gap_seconds"
        held = [r for r in rows if r.get("held_leader")]
        top.plot(
            [r["n"] for r in held],
            [r.get(key) for r in held],
            "o",
            markersize=13,
            markerfacecolor="none",
            color="black",
            label="the leader's host",
        )
    else:
        series = (
            ("next_allocation_seconds", "next allocation after the kill", "tab:blue"),
            ("longest_gap_seconds", "longest gap in allocations around the kill", "tab:red"),
            ("baseline_longest_gap_seconds", "longest gap in the 10 s before", "tab:gray"),
        )
        key = "longest_gap_seconds"
    for name, label, colour in series:
        top.plot(xs, [r.get(name) for r in rows], "o-", label=label, color=colour)
    stats = report["failover"][key]
    for q, style in (("p50", ":"), ("p99", "--")):
        if q in stats:
            top.axhline(stats[q], color="tab:red", linestyle=style, label=f"{q} {stats[q]} s")
    top.axhline(TARGET_SECONDS, color="black", linewidth=0.8, label="target 3 s")
    top.set_xlabel("kill")
    top.set_ylabel("seconds after the kill")
    top.legend(fontsize=8)
    checks = ", ".join(f"{n} {c['value']}" for n, c in report["checks"].items())
    top.set_title(textwrap.fill(f"failover ({report['mode']}): {checks}", 130), fontsize=8)
    top.xaxis.set_major_locator(MaxNLocator(integer=True))
    grants = sorted(report.get("stored_grant_times") or report["grant_times"])
    if grants:
        width = 1.0
        bins = int(grants[-1] // width) + 1
        counts = [0] * bins
        for t in grants:
            if t >= 0:
                counts[int(t // width)] += 1
        bottom.step([i * width for i in range(bins)], counts, where="post", label="grants / s")
    for action in report.get("actions", []):
        bottom.axvline(action["planned_at"], color="tab:red", linestyle="--", linewidth=0.6)
    bottom.set_xlabel("seconds since the first task (dashed: kills)")
    bottom.set_ylabel("allocations granted / s")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
